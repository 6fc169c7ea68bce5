"""QDQ import + canonicalization: integer graph vs onnxruntime, recipe exactness, bad input.

The LSB differences against onnxruntime (``ORT_DISABLE_ALL``, i.e. float DQ -> op -> Q) are
information, not the contract (docs/architecture.md section 4); they are printed (``pytest -s``) and
bounded loosely.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from helpers import models
from tvm_accel import numerics, quantize, zoo
from tvm_accel.canonicalize import canonicalize, format_report
from tvm_accel.errors import ModelError
from tvm_accel.frontend import fold_constants_keep_qweights, load_onnx
from tvm_accel.layers import DTYPE_RANGE, Requant


class _VTA:
    """VTA's recipe as a target object (what canonicalize asks of a target)."""

    name = "vta"

    def requant_recipe(self, *a):
        from tvm_vta_cp.numerics import requant_recipe

        return requant_recipe(*a)

    def add_recipe(self, *a):
        from tvm_vta_cp.numerics import add_recipe

        return add_recipe(*a)

    def recipe_for(self, op):
        return None


# --- helpers ---------------------------------------------------------------------------------
def _ort(q: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {q.graph.input[0].name: x})[0]


def _output_scale(q: onnx.ModelProto) -> float:
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    node = next(n for n in q.graph.node if n.output[0] == q.graph.output[0].name)
    assert node.op_type == "DequantizeLinear"
    return float(inits[node.input[1]])


def _vm(mod: tvm.IRModule) -> relax.VirtualMachine:
    return relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())


def _lsb_vs_ort(q, target=None, seeds=(0, 1)):
    """Canonicalize ``q``, run it and onnxruntime on seeded inputs; max |diff| in output LSBs."""
    mod, _ = load_onnx(q)
    cmod, report = canonicalize(mod, target)
    vm = _vm(cmod)
    worst = 0.0
    for seed in seeds:
        x = zoo.random_input(q, seed)[0]
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        worst = max(worst, float(np.abs(got - _ort(q, x)).max()) / _output_scale(q))
    return round(worst, 3), cmod, report


def _ops(mod: tvm.IRModule) -> list[tuple[str, str]]:
    """(var name, op name) of every call binding in main, in order."""
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
                out.append((b.var.name, v.op.name))
    return out


def _value(mod, name):
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if b.var.name == name:
                return b.value
    raise KeyError(name)


# --- operators vs onnxruntime ----------------------------------------------------------------
CONV_CASES = [  # (k, stride, relu, activation, per_channel)
    (1, 1, False, "int8", True),
    (1, 1, True, "uint8", False),
    (1, 2, False, "uint8", True),
    (3, 1, False, "uint8", True),
    (3, 1, True, "int8", False),
    (3, 2, False, "int8", False),
    (3, 2, True, "uint8", True),
    (3, 2, True, "int8", True),
]


@pytest.mark.parametrize("k,stride,relu,act,per_channel", CONV_CASES)
def test_conv_matches_onnxruntime(k, stride, relu, act, per_channel, record_property):
    q = quantize.ort_quantize(models.single_conv(16, 24, k, stride, hw=9, relu=relu), act,
                              per_channel)
    lsb, _, report = _lsb_vs_ort(q)
    print(f"conv {k}x{k}/{stride} relu={relu} {act} per_channel={per_channel}: {lsb} LSB")
    record_property("max_lsb_vs_ort", lsb)
    assert [(r.op, r.integer) for r in report] == [("conv2d", True)]
    assert report[0].out_dtype == act
    assert lsb <= 2


@pytest.mark.parametrize("act", ["int8", "uint8"])
def test_conv_with_vta_recipe_matches_onnxruntime(act, record_property):
    q = quantize.ort_quantize(models.single_conv(32, 16, 3, 1, hw=8, relu=True), act)
    lsb, _, report = _lsb_vs_ort(q, _VTA())
    print(f"conv 3x3 {act}, VTA recipe: {lsb} LSB, rel err {report[0].max_rel_error:.2e}")
    record_property("max_lsb_vs_ort", lsb)
    assert lsb <= 2


def test_depthwise_conv_is_canonicalized_like_any_conv():
    q = quantize.ort_quantize(models.single_conv(8, 8, 3, 1, hw=8, groups=8))
    lsb, cmod, report = _lsb_vs_ort(q)
    print(f"depthwise conv: {lsb} LSB")
    assert report[0].op == "conv2d" and report[0].detail["groups"] == 8
    assert lsb <= 2


def test_conv_with_weight_zero_points_matches_onnxruntime():
    q = quantize.ort_quantize(models.single_conv(16, 16, 3, 1, hw=8), "uint8", per_channel=False,
                     symmetric_weights=False)
    zw = [numpy_helper.to_array(t) for t in q.graph.initializer
          if t.name == "conv.weight_zero_point"][0]
    assert np.any(zw != 0), "the quantizer should have produced a weight zero point"
    lsb, _, _ = _lsb_vs_ort(q)
    print(f"conv with weight zero point {int(zw)}: {lsb} LSB")
    assert lsb <= 2


@pytest.mark.parametrize("act,relu,bias", [("int8", True, True), ("uint8", False, True),
                                           ("int8", False, False)])
def test_dense_matches_onnxruntime(act, relu, bias, record_property):
    q = quantize.ort_quantize(models.single_dense(64, 32, batch=2, relu=relu, bias=bias), act)
    lsb, _, report = _lsb_vs_ort(q)
    print(f"dense {act} relu={relu} bias={bias}: {lsb} LSB")
    record_property("max_lsb_vs_ort", lsb)
    assert [(r.op, r.integer) for r in report] == [("dense", True)]
    assert lsb <= 2


@pytest.mark.parametrize("act", ["int8", "uint8"])
@pytest.mark.parametrize("target", [None, _VTA()], ids=["cpu", "vta"])
def test_conv_residual_add_matches_onnxruntime(act, target, record_property):
    q = quantize.ort_quantize(models.conv_residual(16, 8), act)
    lsb, _, report = _lsb_vs_ort(q, target)
    print(f"conv + residual add {act} ({target and target.name}): {lsb} LSB")
    record_property("max_lsb_vs_ort", lsb)
    assert [r.op for r in report] == ["conv2d", "add"]
    assert all(r.integer for r in report)
    assert lsb <= 2


@pytest.mark.parametrize("kind,op", [("max", "max_pool2d"), ("avg", "avg_pool2d"),
                                     ("gap", "global_avg_pool2d")])
@pytest.mark.parametrize("act", ["int8", "uint8"])
def test_pools_match_onnxruntime(kind, op, act, record_property):
    q = quantize.ort_quantize(models.conv_pool(kind, 16, 8), act)
    lsb, cmod, report = _lsb_vs_ort(q)
    print(f"{op} {act}: {lsb} LSB")
    record_property("max_lsb_vs_ort", lsb)
    assert [(r.op, r.integer) for r in report] == [("conv2d", True), (op, True)]
    # max pool runs on the int8 tensor itself; no float op is left
    assert not any(o in ("relax.dequantize", "relax.nn.max_pool2d") and "float" in str(
        _value(cmod, n).ty.dtype) for n, o in _ops(cmod)[:-1])
    assert lsb <= 2


@pytest.mark.parametrize("act", ["int8", "uint8"])
def test_concat_and_flatten_match_onnxruntime(act, record_property):
    q = quantize.ort_quantize(models.conv_concat(8, 8), act)
    lsb, _, report = _lsb_vs_ort(q)
    concat = next(r for r in report if r.op == "concat")
    print(f"concat {act}: {lsb} LSB ({concat.detail['rescaled_inputs']} input(s) requantized)")
    assert all(r.integer for r in report) and lsb <= 2
    q = quantize.ort_quantize(models.conv_flatten_dense(8, 4), act)
    lsb, cmod, report = _lsb_vs_ort(q)
    print(f"flatten + dense {act}: {lsb} LSB")
    record_property("max_lsb_vs_ort", lsb)
    assert [r.op for r in report] == ["conv2d", "reshape", "dense"]
    assert str(_value(cmod, "flatten").ty.dtype) == act  # reshape of the integer tensor
    assert lsb <= 2


@pytest.mark.parametrize("op", ["Relu", "Clip"])
def test_standalone_relu_and_clip_become_integer_clamps(op):
    # symmetric activations keep the ReLU / Clip(0, 6) node between its DQ and Q
    q = quantize.ort_quantize(models.conv_unary(op), "int8", symmetric_activations=True)
    assert op in [n.op_type for n in q.graph.node]
    lsb, cmod, report = _lsb_vs_ort(q)
    print(f"standalone {op}: {lsb} LSB")
    rec = report[1]
    assert (rec.op, rec.integer, rec.onnx_name) == (op.lower(), True, op.lower())
    assert rec.detail["qmin"] == 0  # zero point 0: ReLU clamps at 0
    if op == "Clip":
        assert rec.detail["qmax"] == min(127, round(6.0 / rec.output_scale))
    assert lsb <= 2


def test_relu_between_conv_and_quantize_is_folded_into_qmin():
    q = quantize.ort_quantize(models.conv_unary("Relu"), "int8", symmetric_activations=True)
    # drop the Q/DQ pair between conv1 and the Relu: DQ -> Conv -> Relu -> Q
    g = q.graph
    qn = next(n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == "conv1_out")
    dq = next(n for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] == qn.output[0])
    relu = next(n for n in g.node if n.op_type == "Relu")
    relu.input[0] = "conv1_out"
    g.node.remove(qn)
    g.node.remove(dq)
    lsb, cmod, report = _lsb_vs_ort(q)
    print(f"conv + relu folded: {lsb} LSB")
    assert report[0].op == "conv2d" and report[0].detail["activation"] == "relu"
    assert report[0].detail["qmin"] == 0 and report[0].output_zero_point == 0
    assert "relax.nn.relu" not in [o for _, o in _ops(cmod)]
    assert lsb <= 2


# --- the canonical form (partition patterns match it op by op) -------------------------------
def _chain(cmod, start: str, length: int) -> list[tuple[str, str]]:
    ops = _ops(cmod)
    i = next(k for k, (n, _) in enumerate(ops) if n == start)
    return ops[i:i + length]


REQUANT_TAIL = ["relax.astype", "relax.right_shift", "relax.multiply", "relax.add",
                "relax.right_shift", "relax.add", "relax.maximum", "relax.minimum",
                "relax.astype"]


def _const_sig(call) -> list[tuple[str, tuple]]:
    return [(str(a.ty.dtype), tuple(int(d) for d in a.ty.shape)) for a in call.args
            if isinstance(a, tvm.ir.GenericConst)]


def test_conv_and_dense_have_the_exact_canonical_op_sequence():
    q = quantize.ort_quantize(models.conv_flatten_dense(8, 4, cout=10), "uint8")
    cmod, report = canonicalize(load_onnx(q)[0])
    conv = _chain(cmod, "conv_xi", 4 + len(REQUANT_TAIL))
    assert [o for _, o in conv] == ["relax.astype", "relax.subtract", "relax.nn.conv2d",
                                    "relax.add", *REQUANT_TAIL]
    assert [n for n, _ in conv][2:4] == ["conv_acc", "conv_biased"]
    assert conv[-1][0] == "conv"
    sigs = [_const_sig(_value(cmod, n)) for n, _ in conv]
    k = 8
    assert sigs[1] == [("int32", ())]
    assert sigs[2] == [("int32", (k, 8, 3, 3))]
    assert sigs[3] == [("int32", (1, k, 1, 1))]
    assert sigs[5:] == [[("int64", ())], [("int64", (1, k, 1, 1))], [("int64", (1, k, 1, 1))],
                        [("int64", ())], [("int64", ())], [("int64", ())], [("int64", ())], []]
    c = _value(cmod, "conv_acc")
    assert (str(c.attrs.out_dtype), c.attrs.data_layout, c.attrs.kernel_layout) == (
        "int32", "NCHW", "OIHW")
    dense = _chain(cmod, "fc_xi", 4 + len(REQUANT_TAIL))
    assert [o for _, o in dense] == ["relax.astype", "relax.subtract", "relax.matmul",
                                     "relax.add", *REQUANT_TAIL]
    sigs = [_const_sig(_value(cmod, n)) for n, _ in dense]
    assert sigs[2] == [("int32", (8 * 4 * 4, 10))] and sigs[3] == [("int32", (1, 10))]
    assert sigs[6] == [("int64", (1, 10))] and sigs[7] == [("int64", (1, 10))]
    assert str(_value(cmod, "fc").ty.dtype) == "uint8"


def test_residual_add_has_the_exact_canonical_op_sequence():
    q = quantize.ort_quantize(models.conv_residual(16, 8), "int8")
    cmod, report = canonicalize(load_onnx(q)[0], _VTA())
    ops = _ops(cmod)
    i = next(k for k, (n, _) in enumerate(ops) if n == "add_acc")
    seq = [o for _, o in ops[i - 6:i + 7]]
    assert seq == ["relax.astype", "relax.subtract", "relax.multiply"] * 2 + [
        "relax.add", "relax.add", "relax.right_shift", "relax.add", "relax.maximum",
        "relax.minimum", "relax.astype"]
    for n, _ in ops[i - 6:i + 7]:
        assert all(s == ("int64", ()) for s in _const_sig(_value(cmod, n)))
    rec = report[1]
    assert rec.detail["a_multiplier"] <= 32767 and rec.detail["b_multiplier"] <= 32767


def test_model_input_quantize_and_output_dequantize_stay():
    q = quantize.ort_quantize(models.single_conv(8, 8, 3, hw=6))
    cmod, _ = canonicalize(load_onnx(q)[0])
    ops = [o for _, o in _ops(cmod)]
    assert ops[0] == "relax.quantize" and ops[-1] == "relax.dequantize"
    assert ops.count("relax.quantize") == 1 and ops.count("relax.dequantize") == 1
    relax.analysis.well_formed(cmod)


# --- whole models ----------------------------------------------------------------------------
@pytest.mark.parametrize("target", [None, _VTA()], ids=["cpu", "vta"])
def test_resnet20_matches_onnxruntime(target, record_property):
    q = quantize.ort_quantize(zoo.resnet20(), "int8")
    lsb, cmod, report = _lsb_vs_ort(q, target, seeds=(0, 1))
    print(f"\nResNet-20 ({target and target.name or 'cpu'} recipe): {lsb} LSB at the output")
    print(format_report(report))
    record_property("max_lsb_vs_ort", lsb)
    ops = [r.op for r in report]
    assert ops.count("conv2d") == 21 and ops.count("add") == 9 and ops.count("dense") == 1
    assert all(r.integer for r in report)
    if target is None:
        assert max(r.max_rel_error for r in report) < 1e-6
    else:  # VTA's cost-aware recipe trades scale precision for ALU ops up to its budget
        from tvm_vta_cp.numerics import CHEAP_RECIPE_BUDGET_LSB

        assert max(r.max_lsb_error for r in report) <= CHEAP_RECIPE_BUDGET_LSB
    assert lsb <= 4


def test_layers_carry_onnx_node_names():
    q = quantize.ort_quantize(zoo.resnet20(), "int8")
    mod, info = load_onnx(q)
    assert info.naming == "onnx"
    cmod, report = canonicalize(mod)
    names = [r.onnx_name for r in report]
    assert names[:4] == ["conv1", "layer1.0.conv1", "layer1.0.conv2", "layer1.0.add"]
    assert "layer2.0.downsample" in names and names[-1] == "fc"
    var_names = {n for n, _ in _ops(cmod)}
    assert {"layer1_0_conv1_acc", "layer1_0_conv1", "layer1_0_add_acc", "fc_acc"} <= var_names


def test_layers_without_onnx_names_are_numbered():
    from tvm.relax.frontend.onnx import from_onnx

    q = quantize.ort_quantize(models.conv_residual(8, 6))
    mod = fold_constants_keep_qweights(from_onnx(q))  # no naming hook: vars are lv, lv1, ...
    cmod, report = canonicalize(mod)
    assert [r.name for r in report] == ["conv2d_0", "add_1"]
    assert "conv2d_0_acc" in {n for n, _ in _ops(cmod)}


# --- recipe exactness ------------------------------------------------------------------------
def _compile_chain(build, *shapes_dtypes):
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(shapes_dtypes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    mod = bb.get()
    relax.analysis.well_formed(mod)
    return relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())


@pytest.mark.parametrize("limits", [numerics.CPU_LIMITS, "vta"])
@pytest.mark.parametrize("layout", ["conv", "dense"])
def test_emit_requant_equals_requant_apply(limits, layout):
    if limits == "vta":
        from tvm_vta_cp.numerics import VTA_LIMITS as limits
    rng = np.random.default_rng(7)
    k = 24
    shape = (2, k, 5, 5) if layout == "conv" else (6, k)
    for trial in range(3):
        bound = rng.integers(1 << 10, 1 << 26, k)
        scale = 2.0 ** rng.uniform(-18, -8, k)
        zp, dtype = (int(rng.integers(-20, 20)), "int8") if trial % 2 else (
            int(rng.integers(0, 40)), "uint8")
        lo, hi = DTYPE_RANGE[dtype]
        rq = numerics.solve_requant(scale, bound, zp, lo + trial, hi, limits)
        cshape = [1] * len(shape)
        cshape[1] = k
        acc = rng.integers(-1, 2, shape) * rng.integers(0, bound.reshape(cshape) + 1, shape)
        acc.reshape(shape[0], k, -1)[0, :, 0] = bound          # the extremes
        acc.reshape(shape[0], k, -1)[1, :, 0] = -bound
        acc = acc.astype(np.int32)
        vm = _compile_chain(lambda bb, a, rq=rq, dt=dtype: numerics.emit_requant(bb, a, rq, dt),
                            (shape, "int32"))
        got = vm["main"](tvm.runtime.tensor(acc)).numpy()
        np.testing.assert_array_equal(got, rq.apply(acc).astype(dtype))


def test_emit_add_equals_numpy_add_recipe():
    from tvm_vta_cp.numerics import add_recipe

    rng = np.random.default_rng(3)
    shape = (1, 16, 6, 6)
    for dtype in ("int8", "uint8"):
        lo, hi = DTYPE_RANGE[dtype]
        a = rng.integers(lo, hi + 1, shape).astype(dtype)
        b = rng.integers(lo, hi + 1, shape).astype(dtype)
        za, zb, zy = (int(z) for z in rng.integers(lo, hi + 1, 3))
        ma, mb, rq = add_recipe(0.7, 1.9, zy, lo, hi)
        vm = _compile_chain(
            lambda bb, x, y, p=(za, zb, ma, mb, rq, dtype): numerics.emit_add(bb, x, y, *p),
            (shape, dtype), (shape, dtype))
        got = vm["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b)).numpy()
        want = numerics.apply_add(a, b, za, zb, ma, mb, rq).astype(dtype)
        np.testing.assert_array_equal(got, want)


def _chain_extremes(rq: Requant, bound: np.ndarray) -> list[np.ndarray]:
    """Every intermediate of the requant chain at acc = +-bound and a few values between
    (exact, in Python integers)."""
    m = np.asarray(rq.multiplier, dtype=object)
    r = np.broadcast_to(np.asarray(rq.round_add, dtype=object), m.shape)
    b = np.asarray(bound, dtype=object)
    vals = []
    for acc in (b, -b, b // 3, -(b // 7), b * 0):
        t = acc >> rq.pre_shift
        t1 = t * m
        t2 = t1 + r
        t3 = (t2 >> rq.shift) + rq.zero_point
        vals += [acc, t, t1, t2, t3]
    return vals


def test_vta_recipe_never_exceeds_int32_at_the_accumulator_bound():
    from tvm_vta_cp.numerics import add_recipe, requant_recipe

    rng = np.random.default_rng(11)
    lim = 1 << 31
    for _ in range(300):
        k = int(rng.integers(1, 65))
        # scale <= 1/2 and |acc| < 2^31: a recipe always exists (acc * scale fits int32)
        scale = 2.0 ** rng.uniform(-24, -1, k) * rng.uniform(0.5, 1, k)
        bound = rng.integers(0, 1 << int(rng.integers(4, 32)), k)
        zp = int(rng.integers(-128, 128))
        rq = requant_recipe(scale, bound, zp, -128, 127)
        assert 0 <= rq.pre_shift <= 31 and 0 <= rq.shift <= 31
        assert np.all((rq.multiplier >= 1) & (rq.multiplier <= 32767))
        # round half up, or moved by at most m/2 to round before the multiply (VTA's GEMM)
        half = (1 << (rq.shift - 1)) if rq.shift else 0
        assert np.all(np.abs(rq.round_add - half) <= rq.multiplier // 2)
        for v in _chain_extremes(rq, bound):
            assert all(-lim <= int(x) < lim for x in np.ravel(v)), (scale, bound, rq)
        ma, mb, arq = add_recipe(*(2.0 ** rng.uniform(-6, 3, 2)), zp, -128, 127)
        assert 1 <= ma <= 32767 and 1 <= mb <= 32767
        assert 255 * ma + 255 * mb + int(arq.round_add[0]) < lim


def test_recipe_error_is_tiny_for_typical_scales(record_property):
    from tvm_vta_cp.numerics import CHEAP_RECIPE_BUDGET_LSB, VTA_LIMITS, requant_recipe

    rng = np.random.default_rng(5)
    worst = {}
    for _ in range(150):
        k = 64
        # accumulator bounds of 1x1x4 .. 3x3x512 convs; the worst-case output (bound * scale)
        # 2^8..2^13 LSBs as in real layers; per-channel spread within 2x
        lb = rng.uniform(10, 26)
        bound = (2.0 ** lb * rng.uniform(0.5, 1, k)).astype(np.int64)
        scale = 2.0 ** rng.uniform(8, 13) / bound.max() * rng.uniform(1, 2, k)
        size = "small" if lb < 15 else "large"
        for name, rq in (("cpu", numerics.solve_requant(scale, bound, 0, -128, 127)),
                         ("vta", numerics.solve_requant(scale, bound, 0, -128, 127, VTA_LIMITS)),
                         ("vtacheap", requant_recipe(scale, bound, 0, -128, 127))):
            e = numerics.recipe_error(rq, bound)
            w = worst.setdefault(f"{name}_{size}_acc", [0.0, 0.0])
            w[0], w[1] = max(w[0], e.max_rel_error), max(w[1], e.max_lsb_error)
    print("recipe error [max relative, max LSB]:", worst)
    record_property("recipe_error", worst)
    assert worst["cpu_small_acc"][0] < 1e-8 and worst["cpu_large_acc"][0] < 1e-8
    assert worst["vta_small_acc"][0] < 1e-4
    # large accumulators: VTA pre-shifts to keep int32; the output stays within 0.1 LSB
    assert worst["vta_large_acc"][0] < 1e-3 and worst["vta_large_acc"][1] < 0.1
    # the recipe VTA runs: the cheapest within its budget
    assert worst["vtacheap_large_acc"][1] <= CHEAP_RECIPE_BUDGET_LSB


def test_layers_the_target_cannot_represent_stay_float():
    class Tiny(_VTA):
        def requant_recipe(self, *a):
            raise numerics.RecipeError("scale out of range")

    q = quantize.ort_quantize(models.conv_residual(8, 6))
    lsb, cmod, report = _lsb_vs_ort(q, Tiny(), seeds=(0,))
    assert [(r.op, r.integer) for r in report] == [("conv2d", False), ("add", True)]
    assert "no integer recipe" in report[0].detail["reason"]
    assert lsb <= 2
    # and VTA's own limits refuse a scale no int32 chain can apply to such accumulators
    with pytest.raises(numerics.RecipeError):
        _VTA().requant_recipe(np.array([10.7]), np.array([532265248]), 0, -128, 127)


def test_solver_respects_a_hardware_without_pre_shift():
    limits = numerics.RecipeLimits(multiplier_max=(1 << 15) - 1, intermediate_bits=32,
                                   max_shift=31, max_pre_shift=0)
    rq = numerics.solve_requant([1e-3, 2e-3], [1 << 20, 1 << 20], 0, -128, 127, limits)
    assert rq.pre_shift == 0 and not numerics.check_limits(rq, [1 << 20, 1 << 20], limits)
    with pytest.raises(numerics.RecipeError):  # accumulators wider than the lanes
        numerics.solve_requant([1e-3], [1 << 40], 0, -128, 127, limits)


# --- bad input -------------------------------------------------------------------------------
def test_non_onnx_file_is_a_model_error_naming_the_file(tmp_path):
    bad = tmp_path / "weights.onnx"
    bad.write_bytes(b"\x00\x01not a protobuf at all\xff" * 10)
    with pytest.raises(ModelError, match=re.escape(str(bad))) as e:
        load_onnx(bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ModelError, match="no such file"):
        load_onnx(tmp_path / "missing.onnx")


def test_dynamic_input_shape_needs_an_override():
    m = models.single_conv(4, 4, 3, hw=6)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    with pytest.raises(ModelError, match=r"input 'input' has a dynamic shape \[N, 4, 6, 6\]"):
        load_onnx(m)
    mod, info = load_onnx(m, shapes={"input": [2, 4, 6, 6]})
    assert info.inputs["input"] == ((2, 4, 6, 6), "float32")


def test_inconsistent_bias_scale_is_a_model_error_naming_the_layer():
    q = onnx.ModelProto()
    q.CopyFrom(quantize.ort_quantize(models.single_conv(8, 8, 3, hw=6)))
    for t in q.graph.initializer:
        if t.name == "conv.bias_quantized_scale":
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 2, t.name))
    mod, _ = load_onnx(q)
    with pytest.raises(ModelError, match=r"layer 'conv': bias scale .* != input scale"):
        canonicalize(mod)


def test_non_constant_weights_are_a_model_error_naming_the_layer():
    q = onnx.ModelProto()
    q.CopyFrom(quantize.ort_quantize(models.single_conv(8, 8, 3, hw=6)))
    w = next(t for t in q.graph.initializer if t.name == "conv.weight_quantized")
    q.graph.initializer.remove(w)
    q.graph.input.append(helper.make_tensor_value_info(w.name, w.data_type, list(w.dims)))
    mod, _ = load_onnx(q)
    with pytest.raises(ModelError, match="layer 'conv': quantized weights are not constants"):
        canonicalize(mod)


@pytest.mark.parametrize("op", ["Softmax"])
def test_unknown_op_stays_float_and_the_model_compiles(op):
    q = quantize.ort_quantize(models.conv_unary(op), "int8")
    lsb, cmod, report = _lsb_vs_ort(q, seeds=(0,))
    print(f"conv -> {op} (float) -> conv: {lsb} LSB")
    assert [(r.op.split(".")[-1], r.integer) for r in report] == [
        ("conv2d", True), (op.lower(), False), ("conv2d", True)]
    assert "not a recognised" in report[1].detail["reason"]
    ops = [o for _, o in _ops(cmod)]
    assert ops.count("relax.nn.conv2d") == 2  # both convs integer
    assert ops.count("relax.quantize") == 2 and ops.count("relax.dequantize") == 2
    assert lsb <= 2
