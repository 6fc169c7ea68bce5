import pytest


@pytest.fixture
def compare(compare_on, compared_class):
    class MarsellusCompared(compared_class):
        def engines(self):
            """Engine of every layer of every offloaded function, by layer name."""
            from tvm_marsellus.program import load_blob

            out = {}
            for f in self.report.functions:
                prog, _, _ = load_blob(f.blob)
                out.update({ly.name: ly.engine for ly in prog.layers})
            return out
    return compare_on("marsellus", MarsellusCompared)
