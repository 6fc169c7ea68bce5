"""Layouts carried across VTA calls (``tvm_vta_cp.carry``): consecutive calls exchange their
blocked DRAM form, with at most one host pass between them."""

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_vta_cp
from helpers import models
from tvm_accel.frontend import load_onnx, random_inputs
from tvm_accel.pipeline import compile_model, compile_reference
from tvm_accel.profiler import profiling, time_host_functions
from tvm_vta_cp import carry
from tvm_vta_cp.codegen import load_blob


def _compile_and_run(mod, info, knobs):
    ex, report = compile_model(mod, tvm_vta_cp.TARGET, "vta_8x8x8", knobs)
    inputs = [tvm.runtime.tensor(x) for x in random_inputs(info, seed=3).values()]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    with profiling() as prof:
        time_host_functions(vm, report.host_functions, prof)
        out = vm["main"](*inputs).numpy()
    ref = relax.VirtualMachine(compile_reference(mod, tvm_vta_cp.TARGET), tvm.cpu())
    return out, ref["main"](*inputs).numpy(), report, prof


@pytest.fixture(scope="module")
def chain():
    """conv a on the static template, conv b image-packed (auto on BATCH=8), Add of both."""
    mod, info = load_onnx(models.quantized("conv_chain_residual"))
    return mod, info, {"a": {"embedding": "static"}}


def test_vta_calls_exchange_blocked_tensors_without_unpack_and_repack(chain):
    mod, info, knobs = chain
    out, ref, report, prof = _compile_and_run(mod, info, knobs)
    np.testing.assert_array_equal(out, ref)
    ops = sorted(h["op"] for h in report.host_functions)
    # b's pack reads a's blocked output; b's unpack and the Add's blocking are one relayout
    assert ops == ["pack", "relayout"]
    programs = {f.name: load_blob(f.blob)[0] for f in report.functions}
    add = next(p for name, p in programs.items() if name.endswith("_add"))
    assert all(add.tensors[t].blocked for t in add.inputs)
    conv_a = next(p for name, p in programs.items() if name.endswith("_a"))
    assert conv_a.tensors[conv_a.outputs[0]].blocked
    # the runtime blocks only the network input and unblocks only the network output
    assert sorted(h.op for h in prof.host if h.op in ("block", "unblock")) == [
        "block", "unblock"]


def test_same_placement_is_passed_without_a_host_pass(chain):
    """a's output and the Add's input have the same DRAM form: the call result is the Add's
    argument itself."""
    mod, info, knobs = chain
    from tvm_accel.pipeline import canonicalize_for, offload

    lowered = offload(canonicalize_for(mod, tvm_vta_cp.TARGET), tvm_vta_cp.TARGET,
                      tvm_vta_cp.load_config("vta_8x8x8"), knobs)
    calls = {b.var: b.value for blk in lowered["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call)
             and getattr(b.value.op, "name", "") == "relax.call_dps_packed"}
    names = {v: load_blob(c.args[1].fields[0].value.numpy().tobytes())[2]
             for v, c in calls.items()}
    (a_var,) = [v for v, n in names.items() if n.endswith("_a")]
    (add_call,) = [c for v, c in calls.items() if names[v].endswith("_add")]
    assert any(arg.same_as(a_var) for arg in add_call.args[1].fields[1:])


def test_carrying_layouts_lowers_the_modelled_host_cycles(chain, monkeypatch):
    mod, info, knobs = chain
    out, ref, _, prof = _compile_and_run(mod, info, knobs)
    carried = sum(h.model_cycles for h in prof.host)
    monkeypatch.setattr(carry, "carry_layouts", lambda m, f: (m, [], {}))
    out0, _, report0, prof0 = _compile_and_run(mod, info, knobs)
    np.testing.assert_array_equal(out, out0)
    assert "unpack" in {h["op"] for h in report0.host_functions}
    assert carried < sum(h.model_cycles for h in prof0.host)


def test_same_layout_compares_shape_dtype_halo_and_fill():
    from tvm_vta_cp.program import TensorPlacement

    p = TensorPlacement("t", (1, 16, 8, 8), "int8", 0, (0, 0, 0, 0), 0, 1024)
    assert carry.same_layout(p, TensorPlacement("u", (1, 16, 8, 8), "int8", 64, (0, 0, 0, 0),
                                                0, 1024))
    for other in (TensorPlacement("u", (1, 16, 8, 8), "uint8", 0, (0, 0, 0, 0), 0, 1024),
                  TensorPlacement("u", (1, 16, 8, 8), "int8", 0, (1, 1, 1, 1), 0, 1600),
                  TensorPlacement("u", (1, 16, 8, 8), "int8", 0, (0, 0, 0, 0), 3, 1024),
                  TensorPlacement("u", (1, 16, 4, 16), "int8", 0, (0, 0, 0, 0), 0, 1024)):
        assert not carry.same_layout(p, other)
