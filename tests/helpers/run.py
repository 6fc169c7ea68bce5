"""Compiling a model for a target and running it the way the tests compare: on the simulator
with the host functions timed, checked bit-exact against the CPU reference."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_accel.frontend import random_inputs
from tvm_accel.pipeline import compile_model, compile_reference
from tvm_accel.profiler import profiling, time_host_functions


def compile_and_run(model, target, config: str | None = None, knobs: dict | None = None,
                    seed: int = 3):
    """``(output, report, profile)`` of ``model`` (``load_onnx``'s ``(mod, info)``) compiled
    for ``target``; asserts the output equals the reference compiled for the CPU."""
    mod, info = model
    ex, report = compile_model(mod, target, config, knobs)
    inputs = [tvm.runtime.tensor(x) for x in random_inputs(info, seed=seed).values()]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    with profiling() as prof:
        time_host_functions(vm, report.host_functions, prof)
        out = vm["main"](*inputs).numpy()
    ref = relax.VirtualMachine(compile_reference(mod, target), tvm.cpu())
    np.testing.assert_array_equal(out, ref["main"](*inputs).numpy())
    return out, report, prof
