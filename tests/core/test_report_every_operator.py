"""Every operator of the model has a row in the placement report (issue 24, item 7), float ones
too (a Softmax gate left in float between its Q/DQ nodes), integer ones on the CPU (an
EfficientNet-style SiLU: one table lookup), and the compile summary counts layers, not Q/DQ
nodes; ``metadata.json`` holds the same rows as the table."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers.cli import table_rows, tvmc
from tvm_accel import quantize
from tvm_accel.frontend import load_onnx
from tvm_accel.pipeline import compile_model
from tvm_accel.target import get_target

FLOAT_SOFTMAX = "no integer form for Softmax: runs in float on the CPU"


def _silu_model(named: bool = True, gate: str = "Softmax") -> onnx.ModelProto:
    """conv1 -> gate -> Mul(conv1, gate) -> conv2: a SiLU with ``gate="Sigmoid"``, a gate
    without an integer form with ``Softmax``; ``named=False`` leaves the gate and the Mul
    without a node name (onnx.helper's default)."""
    rng = np.random.default_rng(0)

    def init(name, shape, std):
        return numpy_helper.from_array(rng.normal(0, std, shape).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node(gate, ["c1"], ["s"], name="sig" if named else "",
                              **({"axis": 1} if gate == "Softmax" else {})),
             helper.make_node("Mul", ["c1", "s"], ["m"], name="silu" if named else ""),
             helper.make_node("Conv", ["m", "w2", "b2"], ["out"], name="conv2", pads=[1] * 4)]
    graph = helper.make_graph(
        nodes, "silu", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 8, 8])],
        [init("w1", (8, 3, 3, 3), .3), init("b1", (8,), .1), init("w2", (8, 8, 3, 3), .3),
         init("b2", (8,), .1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
def test_every_onnx_node_of_a_quantized_silu_model_has_one_row(named):
    q = quantize.ort_quantize(_silu_model(named))
    mod, _ = load_onnx(q)
    _, report = compile_model(mod, get_target("vta"))
    rows = [r.layer for r in report.nodes]
    sig, mul = ("sig", "silu") if named else ("s", "m")  # unnamed: after their output
    expected = [n.name or {"Softmax": sig, "Mul": mul}[n.op_type] for n in q.graph.node]
    assert sorted(rows) == sorted(expected)
    by = {r.layer: r for r in report.nodes}
    assert (by[sig].op, by[sig].placement, by[sig].kind, by[sig].reason) == (
        "softmax", "cpu", "layer", FLOAT_SOFTMAX)
    # the product of two quantized tensors is integer: VTA's ALU multiplies it
    assert (by[mul].placement, by[mul].kind, by[mul].reason) == (
        "vta", "layer", "matched vta.qmul")
    assert [(r.layer, r.placement) for r in report.offloads] == [
        ("conv1", "vta"), (sig, "cpu"), (mul, "vta"), ("conv2", "vta")]
    qdq = [r for r in report.nodes if r.op in ("quantize", "dequantize")]
    assert qdq and all(r.kind in ("qdq", "const") for r in qdq)
    on_cpu = {r.layer: r.reason for r in qdq if r.placement == "cpu"}
    assert on_cpu["input_QuantizeLinear"] == "quantizes the model input: runs on the CPU"
    assert on_cpu["c1_DequantizeLinear"] == "dequantizes for a float operator: runs on the CPU"
    assert on_cpu["out_DequantizeLinear"] == "dequantizes the model output: runs on the CPU"


def test_a_silu_is_one_integer_table_on_the_cpu_and_its_sigmoid_row_says_so():
    q = quantize.ort_quantize(_silu_model(gate="Sigmoid"))
    mod, _ = load_onnx(q)
    _, report = compile_model(mod, get_target("vta"))
    by = {r.layer: r for r in report.nodes}
    assert (by["sig"].op, by["sig"].placement, by["sig"].kind, by["sig"].reason) == (
        "sigmoid", "cpu", "fused", "fused into silu")
    assert (by["silu"].op, by["silu"].placement, by["silu"].kind) == ("lut", "cpu", "layer")
    on_cpu = [r.layer for r in report.nodes if r.kind == "qdq" and r.placement == "cpu"]
    assert on_cpu == ["input_QuantizeLinear", "out_DequantizeLinear"]  # no float left


def test_summary_counts_layers_and_metadata_holds_the_table_rows(tmp_path, capsys):
    q = quantize.ort_quantize(_silu_model())
    onnx.save(q, tmp_path / "silu.onnx")
    assert tvmc("compile", tmp_path / "silu.onnx", "--target", "vta, llvm", "-o",
                 tmp_path / "s.tar", "--dump-offloads", "all", "--wide") == 0
    out = capsys.readouterr().out.splitlines()
    n_qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in q.graph.node)
    # on the CPU: the input's quantize, the output's dequantize and the Softmax's conversions
    assert (f"3 of 4 layers on vta; 1 on the cpu; {n_qdq - 4} Q/DQ nodes folded, 4 convert "
            "to or from float on the cpu ->") in out[0]
    table = table_rows("\n".join(out))
    with tarfile.open(tmp_path / "s.tar") as tar:
        member = tar.extractfile("metadata.json")
        assert member is not None
        meta = json.load(member)
    assert [r["layer"] for r in meta["offloads"]] == list(table)
    for r in meta["offloads"]:
        cells = table[r["layer"]]
        assert cells[1:4] == [r["op"], r["shape"], r["placement"]]
        assert cells[-1] == r["reason"]
    assert meta["offloads"][[r["layer"] for r in meta["offloads"]].index("sig")]["reason"] \
        == FLOAT_SOFTMAX


def test_a_float_conv_has_one_row_named_after_its_node(tmp_path, capsys):
    """A float model: the conv's bias add used to give the conv a second row, named after
    the importer's temporary (``lv``)."""
    onnx.save(_silu_model(), tmp_path / "f.onnx")
    assert tvmc("compile", tmp_path / "f.onnx", "--target", "vta, llvm", "-o",
                 tmp_path / "f.tar", "--dump-offloads") == 0
    out = capsys.readouterr().out.splitlines()
    assert "0 of 4 layers on vta; 4 on the cpu ->" in out[0]
    assert list(table_rows("\n".join(out))) == ["conv1", "sig", "silu", "conv2"]
