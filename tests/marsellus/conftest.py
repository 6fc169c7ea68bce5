import numpy as np
import pytest
import tvm
from tvm import relax


def _run(ex, inputs):
    from tvm_accel.package import outputs_to_numpy

    vm = relax.VirtualMachine(ex, tvm.cpu())
    return outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(x) for x in inputs]))


class Compared:
    """A model compiled for MARSELLUS and for the CPU reference, both run on the same inputs."""

    def __init__(self, model, config=None, knobs=None, seed=0):
        import tvm_marsellus
        from tvm_accel.frontend import load_onnx, random_inputs
        from tvm_accel.pipeline import compile_model, compile_reference

        mod, info = load_onnx(model)
        self.inputs = list(random_inputs(info, seed=seed).values())
        self.ex, self.report = compile_model(mod, tvm_marsellus.TARGET, config, knobs)
        self.ref = compile_reference(mod, tvm_marsellus.TARGET)
        self.outputs = _run(self.ex, self.inputs)
        self.ref_outputs = _run(self.ref, self.inputs)

    @property
    def offloaded(self):
        return [r for r in self.report.offloads if r.placement == "marsellus"]

    def engines(self):
        """Engine of every layer of every offloaded function, by layer name."""
        from tvm_marsellus.codegen import load_blob

        out = {}
        for f in self.report.functions:
            prog, _, _ = load_blob(f.blob)
            out.update({ly.name: ly.engine for ly in prog.layers})
        return out

    def assert_bit_exact(self):
        assert len(self.outputs) == len(self.ref_outputs)
        for a, b in zip(self.outputs, self.ref_outputs, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.fixture
def compare():
    return Compared
