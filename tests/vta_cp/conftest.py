import numpy as np
import pytest
import tvm
from tvm import relax


def _run(ex, inputs):
    from tvm_accel.package import outputs_to_numpy

    vm = relax.VirtualMachine(ex, tvm.cpu())
    return outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(x) for x in inputs]))


class Compared:
    """Result of compiling a model for VTA and for the CPU reference and running both."""

    def __init__(self, model, config, seed=0):
        import tvm_vta_cp
        from tvm_accel.frontend import load_onnx, random_inputs
        from tvm_accel.pipeline import compile_model, compile_reference

        mod, info = load_onnx(model)
        self.inputs = list(random_inputs(info, seed=seed).values())
        self.ex, self.report = compile_model(mod, tvm_vta_cp.TARGET, config)
        self.ref = compile_reference(mod, tvm_vta_cp.TARGET)
        self.outputs = _run(self.ex, self.inputs)
        self.ref_outputs = _run(self.ref, self.inputs)

    @property
    def offloaded(self):
        return [r for r in self.report.offloads if r.placement == "vta"]

    def assert_bit_exact(self):
        assert len(self.outputs) == len(self.ref_outputs)
        for a, b in zip(self.outputs, self.ref_outputs, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.fixture
def compare():
    return Compared


@pytest.fixture(params=["vta_1x16x16", "vta_8x8x8"])
def config(request):
    return request.param
