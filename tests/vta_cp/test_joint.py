"""Embeddings chosen for the network (``tvm_vta_cp.joint``): the measured candidates re-picked
so neighbouring VTA calls share their layout, never more modelled cycles than the per-layer
choice, bit-exact."""

import pytest

import tvm_vta_cp
from helpers import models
from helpers.run import compile_and_run
from tvm_accel.errors import AccelError
from tvm_accel.frontend import load_onnx
from tvm_accel.pipeline import canonicalize_for, compile_model
from tvm_vta_cp import joint


@pytest.fixture(scope="module")
def stem_chain():
    """``relu(b(a(x)) + a(x))`` with a 3-channel stem ``a``: alone, ``a`` packs its image
    otherwise than ``b`` on vta_8x8x8, so the Add would repack one operand."""
    return load_onnx(models.quantized("conv_chain_residual", c=16, hw=16, cin=3))


def _run(model, choice: str):
    _, report, prof = compile_and_run(
        model, tvm_vta_cp.TARGET, "vta_8x8x8",
        tvm_vta_cp.strategy_knobs(None, "auto", layout_choice=choice))
    total = sum(r.cycles for r in prof.records) + sum(h.model_cycles for h in prof.host)
    return {d.layer: d for d in report.layouts}, report, total


def test_network_graph_connects_convs_directly_and_through_the_residual_add(stem_chain):
    mod, _ = stem_chain
    nodes = joint.network_graph(canonicalize_for(mod, tvm_vta_cp.TARGET))
    (add,) = [n for n in nodes.values() if n.info is None]
    assert nodes["a"].inputs == [None] and nodes["b"].inputs == ["a"]
    assert sorted(add.inputs) == ["a", "b"] and add.external  # the result leaves through relu
    assert sorted(nodes["a"].consumers) == sorted([add.name, "b"])
    assert not nodes["a"].external and not nodes["b"].external


def test_joint_choice_shares_the_pack_of_the_next_conv_and_costs_no_more(stem_chain):
    per_layer, report0, total0 = _run(stem_chain, joint.PER_LAYER)
    chosen, report, total = _run(stem_chain, joint.JOINT)
    assert total <= total0
    # the stem takes b's image pack, so the Add reads both operands as they are
    assert chosen["a"].rewrite.pack == chosen["b"].rewrite.pack
    assert not {"relayout", "repack"} & {h["op"] for h in report.host_functions}
    changed = [k for k in chosen if chosen[k].chosen.name != per_layer[k].chosen.name]
    assert all("joint choice" in chosen[k].reason for k in changed)


def test_unknown_layout_choice_is_a_one_line_error():
    mod, _ = load_onnx(models.quantized("single_conv"))
    with pytest.raises(AccelError, match="layout choice"):
        compile_model(mod, tvm_vta_cp.TARGET, "vta_8x8x8",
                      tvm_vta_cp.strategy_knobs(None, "auto", layout_choice="greedy"))


def test_layout_choice_option_reaches_the_strategy_knobs():
    knobs = tvm_vta_cp.TARGET.knobs_from_options({"layout-choice": "per-layer"})
    assert knobs[tvm_vta_cp.STRATEGY_KNOB]["layout_choice"] == joint.PER_LAYER


def test_network_graph_lists_producers_before_their_consumers():
    mod, _ = load_onnx(models.quantized("residual_blocks", blocks=2))
    nodes = joint.network_graph(canonicalize_for(mod, tvm_vta_cp.TARGET))
    seen: set = set()
    for n in nodes.values():
        assert all(p is None or p in seen for p in n.inputs), n.name
        seen.add(n.name)
    (first_add,) = [n.name for n in nodes.values() if n.info is None and n.inputs[1] == "a"]
    assert nodes["b1"].inputs == [first_add]  # the second block reads the first Add
