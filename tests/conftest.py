"""Shared test helpers: a model compiled for an accelerator target and for the CPU reference."""

import functools
import os
import shutil
import tempfile

import numpy as np
import pytest
import tvm
from tvm import relax


def run_vm(ex, inputs):
    from tvm_accel.package import outputs_to_numpy

    vm = relax.VirtualMachine(ex, tvm.cpu())
    return outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(x) for x in inputs]))


class Compared:
    """A model compiled for ``target`` and for the CPU reference, both run on the same inputs."""

    def __init__(self, target, model, config=None, knobs=None, seed=0):
        from tvm_accel.frontend import load_onnx, random_inputs
        from tvm_accel.pipeline import compile_model, compile_reference
        from tvm_accel.target import get_target

        self.target = get_target(target)
        mod, info = load_onnx(model)
        self.inputs = list(random_inputs(info, seed=seed).values())
        self.ex, self.report = compile_model(mod, self.target, config, knobs)
        self.ref = compile_reference(mod, self.target)
        self.outputs = run_vm(self.ex, self.inputs)
        self.ref_outputs = run_vm(self.ref, self.inputs)

    @property
    def offloaded(self):
        return [r for r in self.report.offloads if r.placement == self.target.name]

    def assert_bit_exact(self):
        assert len(self.outputs) == len(self.ref_outputs)
        for a, b in zip(self.outputs, self.ref_outputs, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.fixture
def compare_on():
    """``compare_on(target, cls)`` -> ``compare(model, config=None, knobs=None, seed=0)``."""
    def make(target, cls=Compared):
        return functools.partial(cls, target)
    return make


@pytest.fixture
def compared_class():
    return Compared


#: the run's quantized-model cache when TVM_ACCEL_CACHE is not set (removed after the run)
_TEMP_CACHE: list[str] = []


def pytest_configure(config):
    """The quantized-model cache of the run: a temporary directory, so the suite writes nothing
    under ``~/.cache``, unless ``TVM_ACCEL_CACHE`` names one (then it is used and kept). Set
    before collection, so any model quantized while collecting lands there too."""
    if not os.environ.get("TVM_ACCEL_CACHE"):
        _TEMP_CACHE.append(tempfile.mkdtemp(prefix="tvm_accel_zoo_"))
        os.environ["TVM_ACCEL_CACHE"] = _TEMP_CACHE[0]


def pytest_unconfigure(config):
    if _TEMP_CACHE:
        os.environ.pop("TVM_ACCEL_CACHE", None)
        shutil.rmtree(_TEMP_CACHE.pop(), ignore_errors=True)


@pytest.fixture
def zoo_cache() -> str:
    """The directory the run's quantized models are cached in."""
    return os.environ["TVM_ACCEL_CACHE"]
