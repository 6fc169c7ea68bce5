"""Activations and BatchNormalization between Q/DQ nodes become integer ops of the canonical
graph (issue 24, items 4 and 5): each activation one 256-entry table lookup built from the
QDQ scales, a BN a per-channel multiply-add (or folded into the conv it follows), so the CPU
path has no float op left; each agrees with onnxruntime within 1 LSB on every input code."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import Compared

from helpers import models
from tvm_accel import quantize
from tvm_accel.canonicalize import canonicalize
from tvm_accel.canonicalize.elementwise import apply_lut
from tvm_accel.compare import compare_layers, cut_at_layer_outputs, expose_layer_outputs
from tvm_accel.frontend import load_onnx
from tvm_accel.layers import DTYPE_RANGE
from tvm_accel.pipeline import compile_model
from tvm_accel.target import get_target

ACTIVATIONS = ["Sigmoid", "SiLU", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "PRelu"]


def _float_ops(mod) -> list[str]:
    """Calls of the canonical graph that compute a float tensor, other than the dequantize of
    the model output."""
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            op = getattr(getattr(b.value, "op", None), "name", "")
            if str(getattr(b.var.ty, "dtype", "")).startswith("float") and op and \
                    op != "relax.dequantize":
                out.append(f"{b.var.name} = {op}")
    return out


def _tensor_of(q: onnx.ModelProto, node_name: str) -> str:
    """The integer tensor (QuantizeLinear output) of the node named ``node_name``."""
    node = next(n for n in q.graph.node if n.name == node_name)
    return next(n.output[0] for n in q.graph.node
                if n.op_type == "QuantizeLinear" and n.input[0] == node.output[0])


def _input_tensor(q: onnx.ModelProto, node_name: str) -> str:
    """The integer tensor the node named ``node_name`` reads (through its DequantizeLinear)."""
    node = next(n for n in q.graph.node if n.name == node_name)
    return next(n.input[0] for n in q.graph.node
                if n.op_type == "DequantizeLinear" and n.output[0] == node.input[0])


def _every_code(q: onnx.ModelProto, tensor: str, channels: int) -> np.ndarray:
    """All 256 codes of ``tensor``'s dtype in each of ``channels`` channels, (1, C, 16, 16)."""
    zp = next(i for i in q.graph.initializer if i.name == next(
        n.input[2] for n in q.graph.node if n.output[0] == tensor))
    dtype = onnx.helper.tensor_dtype_to_np_dtype(zp.data_type)
    lo, hi = DTYPE_RANGE[np.dtype(dtype).name]
    return np.broadcast_to(np.arange(lo, hi + 1).reshape(16, 16),
                           (1, channels, 16, 16)).astype(dtype)


def _onnxruntime_on(q: onnx.ModelProto, tensor: str, codes: np.ndarray, out_tensor: str,
                    optimized: bool) -> np.ndarray:
    """onnxruntime's ``out_tensor`` computed from ``codes`` as the value of ``tensor``;
    ``optimized``: its default graph optimizations (QLinear lookup-table kernels)."""
    cut = cut_at_layer_outputs(expose_layer_outputs(q), {tensor: codes})
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(cut.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    feed = {i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
            for i in cut.graph.input if i.name == "input"}
    feed[tensor + ".ours"] = codes
    return sess.run([out_tensor], feed)[0]


@pytest.mark.parametrize("act", ["int8", "uint8"])
@pytest.mark.parametrize("op", ACTIVATIONS)
def test_activation_is_one_table_lookup_within_1_lsb_of_onnxruntime_on_every_code(op, act):
    q = quantize.ort_quantize(models.conv_unary(op, hw=16), act)
    mod, _ = load_onnx(q)
    canon, records = canonicalize(mod)
    assert _float_ops(canon) == []
    lut = [r for r in records if r.op == "lut"][-1]  # SiLU, HardSwish: the Mul's table
    assert lut.integer and lut.detail["table"].shape == (
        8 if op == "PRelu" else 1, 256)
    in_t, out_t = _tensor_of(q, "conv1"), _input_tensor(q, "conv2")
    codes = _every_code(q, in_t, 8)
    ours = apply_lut(codes, lut.detail["table"], lut.detail["input_dtype"])
    worst = {}
    for optimized in (False, True):
        theirs = _onnxruntime_on(q, in_t, codes, out_t, optimized)
        worst[optimized] = int(np.abs(ours.astype(np.int64) - theirs).max())
    print(f"{op} {act}: max LSB vs onnxruntime on every code: float ops {worst[False]}, "
          f"optimized {worst[True]}")
    assert max(worst.values()) <= 1
    # the compiled CPU reference runs the table: every layer of the model within 1 LSB
    layers = compare_layers(q, None).layers
    assert max(r.local_max_lsb for r in layers) <= 1


@pytest.mark.parametrize("op", ACTIVATIONS)
def test_every_activation_node_has_a_row_with_its_placement_and_reason(op):
    q = quantize.ort_quantize(models.conv_unary(op))
    mod, _ = load_onnx(q)
    _, report = compile_model(mod, get_target("vta"))
    rows = [r for r in report.nodes if r.kind in ("layer", "fused")
            and not r.layer.startswith("conv")]
    assert rows and all(r.reason for r in rows), rows
    # a table VTA's ALU reproduces on every code runs there; every other table says why not
    assert all(r.reason == "matched vta.alu_activation" if r.placement == "vta" else
               r.reason.startswith(("table lookup: VTA's ALU has no lookup", "fused into "))
               for r in rows), rows
    assert [r.layer for r in report.nodes if r.kind == "qdq" and r.placement == "cpu"] == [
        "input_QuantizeLinear", "conv2_out_DequantizeLinear"]  # nothing converts to float


def test_a_silu_keeps_its_sigmoid_table_only_while_something_reads_it():
    q = quantize.ort_quantize(models.conv_unary("SiLU"))
    mod, _ = load_onnx(q)
    canon, records = canonicalize(mod)
    silu = next(r for r in records if r.onnx_name == "silu")
    assert (silu.op, silu.detail["function"], silu.detail["composed"]) == (
        "lut", "multiply+sigmoid", ["silu_sigmoid"])
    takes = [b.var.name for blk in canon["main"].body.blocks for b in blk.bindings
             if getattr(getattr(b.value, "op", None), "name", "") == "relax.take"]
    assert takes == ["silu_acc"]  # the Sigmoid's own table is dead code


def test_batchnorm_between_qdq_nodes_is_an_integer_multiply_add_on_every_code():
    for act in ("int8", "uint8"):
        q = quantize.ort_quantize(models.relu_batchnorm(hw=16), act)
        assert "BatchNormalization" in [n.op_type for n in q.graph.node]
        mod, _ = load_onnx(q)
        canon, records = canonicalize(mod)
        assert _float_ops(canon) == []
        bn = next(r for r in records if r.onnx_name == "bn")
        assert (bn.op, bn.integer) == ("batch_norm", True)
        in_t, out_t = _input_tensor(q, "bn"), _tensor_of(q, "bn")
        codes = _every_code(q, in_t, 8)
        ours = bn.detail["requant"].apply(codes.astype(np.int64) - bn.detail["input_zero_point"])
        for optimized in (False, True):
            theirs = _onnxruntime_on(q, in_t, codes, out_t, optimized)
            worst = int(np.abs(ours - theirs).max())
            print(f"BatchNormalization {act} (optimized={optimized}): max LSB {worst}")
            assert worst <= 1
        assert max(r.local_max_lsb for r in compare_layers(q, None).layers) <= 1


def _conv_then_float_batchnorm() -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu quantized without onnxruntime's pre-processing, with
    the Q/DQ pair between the conv and the BN removed: the BN reads the conv's float output."""
    from tvm_accel.quantize import ort

    original = ort.pre_process
    ort.pre_process = lambda m: m  # keep the BN: the test wants it in the QDQ model
    try:
        q = quantize.ort_quantize(models.conv_batchnorm(), cache=False)
    finally:
        ort.pre_process = original
    return _without_qdq_after(q, "conv_out")


def test_a_batchnorm_fold_the_target_cannot_express_stays_float_with_the_reason():
    q = _conv_then_float_batchnorm()  # float scales: the DPU shifts by powers of two only
    mod, _ = load_onnx(q)
    _, report = compile_model(mod, get_target("dpu"))
    rows = {r.layer: r for r in report.nodes}
    for name in ("conv", "bn"):
        assert rows[name].placement == "cpu"
        assert rows[name].reason.startswith("left float by canonicalize: no integer recipe: "
                                            "scale ratio"), rows[name].reason


def _without_qdq_after(q: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    """``q`` without the QuantizeLinear / DequantizeLinear pair on ``tensor``: its readers read
    the float value."""
    g = q.graph
    qn = next(n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    dq = next(n for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] == qn.output[0])
    for n in g.node:
        n.input[:] = [tensor if i == dq.output[0] else i for i in n.input]
    g.node.remove(qn)
    g.node.remove(dq)
    return q


@pytest.mark.parametrize("act", ["int8", "uint8"])
def test_a_silu_without_qdq_after_its_sigmoid_is_one_table_too(act):
    q = onnx.ModelProto()
    q.CopyFrom(quantize.ort_quantize(models.conv_unary("SiLU", hw=16), act))
    q = _without_qdq_after(q, "silu_sigmoid_out")
    mod, _ = load_onnx(q)
    canon, records = canonicalize(mod)
    assert _float_ops(canon) == []
    (lut,) = [r for r in records if r.op == "lut"]
    assert (lut.onnx_name, lut.detail["function"], lut.detail["composed"]) == (
        "silu", "multiply+sigmoid", [])
    in_t, out_t = _tensor_of(q, "conv1"), _input_tensor(q, "conv2")
    codes = _every_code(q, in_t, 8)
    ours = apply_lut(codes, lut.detail["table"], lut.detail["input_dtype"])
    for optimized in (False, True):
        theirs = _onnxruntime_on(q, in_t, codes, out_t, optimized)
        worst = int(np.abs(ours.astype(np.int64) - theirs).max())
        print(f"SiLU (one Q/DQ pair) {act} (optimized={optimized}): max LSB {worst}")
        assert worst <= 1


@pytest.mark.parametrize("target", ["vta", "marsellus"])
def test_batchnorm_on_a_float_conv_output_folds_into_the_offloaded_conv(target):
    q = _conv_then_float_batchnorm()
    mod, _ = load_onnx(q)
    _, records = canonicalize(mod, target)
    conv = next(r for r in records if r.onnx_name == "conv")
    assert (conv.op, conv.detail["batchnorm"]) == ("conv2d", "folded")
    c = Compared(target, q)
    rows = {r.layer: r for r in c.report.nodes}
    assert rows["conv"].placement == target
    assert (rows["bn"].kind, rows["bn"].reason) == ("fused", "fused into conv")
    c.assert_bit_exact()
    assert max(r.local_max_lsb for r in compare_layers(q, target).layers) <= 1


@pytest.mark.slow
@pytest.mark.parametrize(("target", "config", "scheme"), [
    ("vta", None, {}), ("vta", "vta_8x8x8", {}), ("dpu", None, {"power_of_two": True}),
    ("marsellus", None, {"activation_type": "uint8"})])
def test_squeeze_excitation_block_compiles_with_no_float_op_on_the_cpu(target, config, scheme):
    q = quantize.ort_quantize(models.squeeze_excitation(), **scheme)
    mod, _ = load_onnx(q)
    accel = get_target(target)
    cfg = accel.load_config(config) if config else None
    _, report = compile_model(mod, accel, cfg)
    on_cpu = [r for r in report.nodes if r.placement == "cpu"]
    assert [r.layer for r in on_cpu if r.kind == "qdq"] == ["input_QuantizeLinear",
                                                            "project_out_DequantizeLinear"]
    assert not [r for r in on_cpu if "float" in r.reason and r.kind != "qdq"]
    ops = {r.layer: r for r in report.nodes}
    assert ops["se_scale"].kind == "layer" and ops["conv_silu_sigmoid"].reason == \
        "fused into conv_silu"
    c = Compared(target, q, cfg)
    c.assert_bit_exact()
    assert max(r.local_max_lsb for r in compare_layers(q, target, config=cfg).layers) <= 1


def test_target_patterns_find_every_table_and_product_of_the_canonical_graph():
    from tvm import relax

    from tvm_accel.partition import qlut_pattern, qmul_pattern

    q = quantize.ort_quantize(models.squeeze_excitation())
    mod, _ = load_onnx(q)
    canon, records = canonicalize(mod)
    func = canon["main"]
    var2val = relax.analysis.get_var2val(func)
    found = {}
    for block in func.body.blocks:
        for b in block.bindings:
            for kind, (pat, ann) in (("lut", qlut_pattern()), ("multiply", qmul_pattern())):
                m = pat.extract_matched_expr(b.value, var2val)
                if m is not None:
                    found[b.var.name] = (kind, m[ann["table"]].value.numpy() if kind == "lut"
                                         else None)
    by_name = {r.name: r for r in records}
    assert {k for k, (kind, _) in found.items() if kind == "lut"} == {"conv_silu_acc",
                                                                       "se_silu_acc",
                                                                       "se_gate_acc"}
    assert [k for k, (kind, _) in found.items() if kind == "multiply"] == ["se_scale"]
    for name, (kind, table) in found.items():
        if kind == "lut":
            np.testing.assert_array_equal(table, by_name[name[:-4]].detail["table"].ravel())


def test_tvmc_quantize_and_compile_of_an_efficientnet_block_list_its_integer_cpu_layers(
        tmp_path, capsys):
    from helpers.cli import tvmc

    onnx.save(models.squeeze_excitation(), tmp_path / "se.onnx")
    assert tvmc("quantize", tmp_path / "se.onnx", "-o", tmp_path / "q.onnx") == 0
    capsys.readouterr()
    assert tvmc("compile", tmp_path / "q.onnx", "--target", "marsellus, llvm", "-o",
                tmp_path / "se.tar", "--dump-offloads", "--wide") == 0
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("layer "))
    rows = {line.split()[0]: line for line in out[start + 2:] if line.strip()}
    assert "matched marsellus.lut" in rows["se_gate"]
    assert "matched marsellus.mul" in rows["se_scale"]
    assert "fused into se_silu" in rows["se_silu_sigmoid"]
    assert not any("float" in line for line in rows.values())
    assert "2 convert to or from float on the cpu" in out[0]
