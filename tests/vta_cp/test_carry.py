"""Layouts carried across VTA calls (``tvm_vta_cp.carry``): consecutive calls exchange their
blocked DRAM form, with at most one host pass between them; residual adds run in their packed
operands' layout (``tvm_vta_cp.propagate``)."""

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_vta_cp
from helpers import models
from helpers.run import compile_and_run
from tvm_accel.frontend import load_onnx
from tvm_accel.pipeline import canonicalize_for, offload
from tvm_vta_cp import carry, propagate
from tvm_vta_cp.codegen import load_blob

#: conv a on the static template, conv b image-packed (auto on BATCH=8)
STATIC_A = {"a": {"embedding": "static"}}


@pytest.fixture(scope="module")
def chain():
    """``relu(b(a(x)) + a(x))`` on vta_8x8x8."""
    return load_onnx(models.quantized("conv_chain_residual"))


def _compile_and_run(chain, knobs=None):
    return compile_and_run(chain, tvm_vta_cp.TARGET, "vta_8x8x8", knobs)


def _programs(report) -> dict:
    return {f.name: load_blob(f.blob)[0] for f in report.functions}


def test_vta_calls_exchange_blocked_tensors_without_unpack_and_repack(chain):
    _, report, prof = _compile_and_run(chain, STATIC_A)
    # b's pack reads a's blocked output; a's output reaches the Add (run packed, inside b's
    # call) in one relayout; the Add's result leaves through its unpack
    assert sorted(h["op"] for h in report.host_functions) == ["pack", "relayout", "unpack"]
    conv_a = next(p for name, p in _programs(report).items() if name.endswith("_a"))
    assert conv_a.tensors[conv_a.outputs[0]].blocked
    add = next(p for p in _programs(report).values() if any(ly.op == "add" for ly in p.layers))
    assert all(add.tensors[t].blocked for t in add.inputs)
    # the runtime blocks only the network input; nothing is unblocked by it
    assert [h.op for h in prof.host if h.op in ("block", "unblock")] == ["block"]


def test_same_placement_is_passed_without_a_host_pass(chain):
    """Both convs packed alike: a's packed output is the Add's operand as it is (the call
    result is the argument, no host function between)."""
    mod, _ = chain
    lowered = offload(canonicalize_for(mod, tvm_vta_cp.TARGET), tvm_vta_cp.TARGET,
                      tvm_vta_cp.load_config("vta_8x8x8"))
    calls = {b.var: b.value for blk in lowered["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call)
             and getattr(b.value.op, "name", "") == "relax.call_dps_packed"}
    progs = {v: load_blob(c.args[1].fields[0].value.numpy().tobytes())
             for v, c in calls.items()}
    (a_var,) = [v for v, (_, _, name) in progs.items() if name.endswith("_a")]
    (add_call,) = [calls[v] for v, (p, _, _) in progs.items()
                   if any(ly.op == "add" for ly in p.layers)]
    assert any(arg.same_as(a_var) for arg in add_call.args[1].fields[1:])


def test_carrying_layouts_lowers_the_modelled_host_cycles(chain, monkeypatch):
    out, _, prof = _compile_and_run(chain, STATIC_A)
    carried = sum(h.model_cycles for h in prof.host)
    monkeypatch.setattr(carry, "carry_layouts", lambda m, f: (m, [], {}))
    out0, report0, prof0 = _compile_and_run(chain, STATIC_A)
    np.testing.assert_array_equal(out, out0)
    assert "unpack" in {h["op"] for h in report0.host_functions}
    assert carried < sum(h.model_cycles for h in prof0.host)


def test_residual_add_runs_on_the_packed_layout_with_every_batch_lane(chain, monkeypatch):
    def add_batch(report) -> int:
        """The batch of the add's output in its VTA function (the packed pieces' count)."""
        (n,) = [f.graph.tensors[ly.output].shape[0] for f in report.functions
                for ly in f.graph.layers if ly.op_name == "add"]
        return n

    out, report, prof = _compile_and_run(chain)
    (add,) = [r for r in prof.records if r.op == "add"]
    assert add_batch(report) == 8  # the pieces of the image fill BATCH = 8
    monkeypatch.setattr(propagate, "propagate_pack", lambda m: (m, []))
    out0, report0, prof0 = _compile_and_run(chain)
    np.testing.assert_array_equal(out, out0)
    (add0,) = [r for r in prof0.records if r.op == "add"]
    assert add_batch(report0) == 1 and add.cycles < add0.cycles
    assert add.shape == add0.shape and add.shape.startswith("1x16x")  # the add's own shape


def test_repack_is_the_inverse_of_the_unpack():
    from tvm_vta_cp.rewrite import LayoutRewrite, resolve_layout, unpack_steps

    lay = resolve_layout(LayoutRewrite(pack=(2, 4)), (1, 5, 7, 9), (6, 5, 3, 3), (1, 1),
                         (1, 1, 1, 1), (1, 1))
    g = propagate.PackedGeometry(lay.geometry.output_shape, lay.spec.pack,
                                 lay.geometry.final_shape)
    x = np.random.default_rng(0).integers(-128, 128, g.final_shape).astype("int8")
    bb = relax.BlockBuilder()
    v = relax.Var("x", relax.TensorType(g.final_shape, "int8"))
    with bb.function("main", [v]):
        with bb.dataflow():
            t = v
            for _, make in propagate.repack_steps(g) + unpack_steps(lay):
                t = bb.emit(make(t))
            out = bb.emit_output(t)
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), x)


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


def test_chained_residual_adds_stay_in_the_packed_layout():
    """The second Add reads the first one's packed result as it is: no repack, no relayout,
    both Adds on every batch lane."""
    mod, info = load_onnx(models.quantized("residual_blocks", blocks=2))
    knobs = {"a": {"embedding": "pack 2x4"}, "b0": {"embedding": "pack 2x4"},
             "b1": {"embedding": "pack 2x4"}}
    out, report, _ = _compile_and_run((mod, info), knobs)
    assert not {"relayout", "repack"} & {h["op"] for h in report.host_functions}
    adds = [f.graph.tensors[ly.output].shape[0] for f in report.functions
            for ly in f.graph.layers if ly.op_name == "add"]
    assert adds == [8, 8]
