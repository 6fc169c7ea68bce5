"""Host-side layout rewrites (stencil unroll / im2col, image pack) around a canonical conv:
bit-exact against the unrewritten canonical graph, still offloaded to VTA, and the geometry /
host-cost helpers agree with the rewritten module."""

import contextlib
import functools

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import tvm_vta_cp
from helpers import models
from tvm_accel import quantize, zoo
from tvm_accel.frontend import load_onnx, random_inputs
from tvm_accel.pipeline import CompileReport, canonicalize_for, offload
from tvm_vta_cp.rewrite import (
    LayoutRewrite,
    apply_layout_rewrites,
    host_bytes,
    layout_rewrite_pass,
    rewritten_conv_geometry,
)


def conv_model(cin, cout, kernel, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1),
               hw=(8, 8), batch=1, seed=0):
    """One float Conv named ``conv`` with a rectangular kernel (zoo's builder is square)."""
    rng = np.random.default_rng(seed)
    kh, kw = kernel
    w = rng.normal(0.0, np.sqrt(2.0 / (cin * kh * kw)), (cout, cin, kh, kw)).astype(np.float32)
    b = rng.normal(0.0, 0.1, cout).astype(np.float32)
    node = helper.make_node("Conv", ["input", "w", "b"], ["out"], name="conv",
                            kernel_shape=[kh, kw], strides=list(stride), pads=list(pads),
                            dilations=list(dilation))
    graph = helper.make_graph(
        [node], "rewrite_conv",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, cin, *hw])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", zoo.OPSET)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


@functools.cache
def canonical(act="int8", **kw):
    """(canonical module, inputs, CPU reference outputs) of a quantized ``conv_model``."""
    mod, info = load_onnx(quantize.ort_quantize(conv_model(**kw), act))
    canon = canonicalize_for(mod, tvm_vta_cp.TARGET)
    inputs = list(random_inputs(info, seed=1).values())
    return canon, inputs, run(tvm.compile(canon, target="llvm"), inputs)


def run(ex, inputs):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def bindings(mod, func="main"):
    return {b.var.name: b.value for blk in mod[func].body.blocks for b in blk.bindings}


def shape(expr):
    return tuple(int(d) for d in expr.ty.shape)


# (model kwargs, input activation type, rewrite)
CASES = {
    "im2col": (dict(cin=4, cout=8, kernel=(3, 3), pads=(1, 1, 1, 1), hw=(6, 6)), "int8",
               LayoutRewrite(("h", "w"))),
    "unroll_w": (dict(cin=3, cout=8, kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1),
                      hw=(7, 9)), "int8", LayoutRewrite(("w",))),
    "unroll_h": (dict(cin=3, cout=5, kernel=(3, 2), pads=(2, 0, 1, 1), hw=(6, 5)), "int8",
                 LayoutRewrite(("h",))),
    "pack_1x4": (dict(cin=4, cout=8, kernel=(3, 3), pads=(1, 1, 1, 1), hw=(6, 7)), "int8",
                 LayoutRewrite(pack=(1, 4))),
    "pack_2x2_stride2": (dict(cin=3, cout=8, kernel=(3, 3), stride=(2, 2), pads=(1, 1, 1, 1),
                              hw=(9, 9), batch=2), "int8", LayoutRewrite(pack=(2, 2))),
    "im2col_pack_1x8": (dict(cin=2, cout=8, kernel=(3, 3), pads=(1, 1, 1, 1), hw=(5, 10)),
                        "int8", LayoutRewrite(("h", "w"), (1, 8))),
    "uint8_zero_point": (dict(cin=3, cout=6, kernel=(3, 3), pads=(2, 1, 1, 2), hw=(6, 6)),
                         "uint8", LayoutRewrite(("h", "w"), (2, 2))),
    "dilated_unroll_w_pack_2x1": (dict(cin=2, cout=4, kernel=(3, 3), dilation=(2, 2),
                                       pads=(1, 2, 1, 2), hw=(9, 8)), "int8",
                                  LayoutRewrite(("w",), (2, 1))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rewritten_conv_is_bit_exact_with_the_canonical_graph(case):
    kw, act, spec = CASES[case]
    canon, inputs, ref = canonical(act, **kw)
    offered = []
    new, records = apply_layout_rewrites(canon, lambda info: offered.append(info) or spec)
    assert records == [("conv", spec)]
    assert [i.name for i in offered] == ["conv"]
    info = offered[0]
    assert info.input_dtype == act and info.input_zero_point != 0  # padding holds zx, not 0
    np.testing.assert_array_equal(run(tvm.compile(new, target="llvm"), inputs), ref)
    b = bindings(new)
    assert "conv" in b and str(b["conv"].op.name) == "relax.astype"  # requant keeps the name
    kind = "pack" if spec.pack != (1, 1) else "im2col"
    assert f"conv_{kind}" in b and (("conv_unpack" in b) == (kind == "pack"))


def test_conv_info_describes_the_layer():
    canon, _, _ = canonical("uint8", **CASES["uint8_zero_point"][0])
    seen = []
    apply_layout_rewrites(canon, seen.append)
    (info,) = seen
    assert (info.name, info.function, info.input_shape, info.weight_shape) == (
        "conv", "main", (1, 3, 6, 6), (6, 3, 3, 3))
    assert (info.strides, info.padding, info.dilation) == ((1, 1), (2, 1, 1, 2), (1, 1))
    assert (info.input_dtype, info.output_dtype) == ("uint8", "uint8")
    assert info.layer is not None and info.layer.padding == info.padding
    assert info.layer.input_zero_point == info.input_zero_point


def test_none_identity_and_mapping_decisions():
    canon, inputs, ref = canonical("int8", **CASES["im2col"][0])
    for decide in (lambda info: None, lambda info: LayoutRewrite(), {"other": LayoutRewrite(
            ("h", "w"))}):
        new, records = apply_layout_rewrites(canon, decide)
        assert records == [] and new.same_as(canon)
    spec = LayoutRewrite(pack=(2, 1))
    applied = []
    new = layout_rewrite_pass({"conv": spec}, applied)(canon)
    assert applied == [("conv", spec)]
    np.testing.assert_array_equal(run(tvm.compile(new, target="llvm"), inputs), ref)


def test_describe_and_validation():
    assert LayoutRewrite().describe() == ""
    assert LayoutRewrite(("w", "h")).describe() == "im2col(h,w)"
    assert LayoutRewrite(("w", "h")) == LayoutRewrite(("h", "w"))
    assert LayoutRewrite(("w",)).describe() == "unroll(w)"
    assert LayoutRewrite(pack=(1, 8)).describe() == "pack 1x8"
    assert LayoutRewrite(("h", "w"), (2, 4)).describe() == "im2col(h,w)+pack 2x4"
    for bad in (dict(unroll=("c",)), dict(unroll=("h", "h")), dict(pack=(0, 1)),
                dict(pack=(1, 2, 3))):
        with pytest.raises(ValueError):
            LayoutRewrite(**bad)


def _lowered(canon, spec, config):
    new, records = apply_layout_rewrites(canon, {"conv": spec})
    assert records == [("conv", spec)]
    report = CompileReport(target="vta")
    lowered = offload(new, tvm_vta_cp.TARGET, tvm_vta_cp.load_config(config), report=report)
    return lowered, report


def test_im2col_speech_conv_is_offloaded_as_a_1x1_conv_over_100_channels():
    """DeepBench speech layer shape (1 channel, 20x5 kernel, stride 2), small H/W."""
    canon, inputs, ref = canonical(cin=1, cout=16, kernel=(20, 5), stride=(2, 2), hw=(30, 12))
    lowered, report = _lowered(canon, LayoutRewrite(("h", "w")), None)
    assert [(r.layer, r.placement) for r in report.offloads if r.op == "conv2d"] == [
        ("conv", "vta")]
    (fn,) = report.functions
    assert fn.layers == ["conv"]
    layer = next(ly for ly in fn.graph.layers if ly.name == "conv")
    assert layer.weight.shape == (16, 100, 1, 1)
    assert (layer.strides, layer.padding) == ((1, 1), (0, 0, 0, 0))
    ex = tvm.compile(lowered, target="llvm")
    assert "tvm_vta_cp.run" in ex.as_text()
    np.testing.assert_array_equal(run(ex, inputs), ref)


def test_pack_1x8_is_bit_exact_and_offloaded_on_vta_8x8x8():
    canon, inputs, ref = canonical(cin=8, cout=8, kernel=(3, 3), pads=(1, 1, 1, 1),
                                   hw=(4, 16))
    lowered, report = _lowered(canon, LayoutRewrite(pack=(1, 8)), "vta_8x8x8")
    assert [(r.layer, r.placement) for r in report.offloads if r.op == "conv2d"] == [
        ("conv", "vta")]
    layer = next(ly for fn in report.functions for ly in fn.graph.layers if ly.name == "conv")
    # 8 pieces of 2 output columns (4-column windows); the unpacked rows keep their padding
    assert report.functions[0].graph.tensors[layer.input].shape == (8, 8, 4, 4)
    assert layer.padding == (1, 0, 1, 0)
    np.testing.assert_array_equal(run(tvm.compile(lowered, target="llvm"), inputs), ref)


def _valid(n, k, s, d, pad, unroll, pieces):
    """Positions read from the input along one axis, straight from the rules: taps x pieces x
    window positions whose source lies inside [0, n)."""
    out = (n + sum(pad) - (k - 1) * d - 1) // s + 1
    if unroll:
        src = [[o * s + r * d - pad[0] for o in range(out)] for r in range(k)]
        n_cur, k, s, d, pad, out = out, 1, 1, 1, (0, 0), out
    else:
        src, n_cur = [list(range(n))], n
    if pieces > 1:
        p = -(-out // pieces)
        win = (p - 1) * s + (k - 1) * d + 1
        src = [[row[i * p * s + t - pad[0]] if 0 <= i * p * s + t - pad[0] < n_cur else -1
                for i in range(pieces) for t in range(win)] for row in src]
    return sum(0 <= v < n for row in src for v in row)


@pytest.mark.parametrize("case", list(CASES))
def test_geometry_and_host_bytes_match_the_rewritten_module(case):
    kw, act, spec = CASES[case]
    canon, _, _ = canonical(act, **kw)
    new, _ = apply_layout_rewrites(canon, {"conv": spec})
    b = bindings(new)
    conv = b["conv_acc"]
    a = conv.attrs
    xin = shape(conv.args[0])
    n, c, h, w = shape(canon["main"].params[0])
    k = kw["cout"]
    kh, kwid = kw["kernel"]
    stride, pads = kw.get("stride", (1, 1)), kw.get("pads", (0, 0, 0, 0))
    dil = kw.get("dilation", (1, 1))
    geo = rewritten_conv_geometry(spec, (n, c, h, w), (k, c, kh, kwid), stride, pads, dil)
    assert geo.input_shape == xin
    assert geo.weight_shape == shape(conv.args[1])
    assert geo.strides == tuple(int(v) for v in a.strides)
    assert geo.padding == tuple(int(v) for v in a.padding)
    assert geo.dilation == tuple(int(v) for v in a.dilation)
    assert geo.output_shape == shape(conv)
    assert geo.final_shape == shape(b["conv_unpack"] if "conv_unpack" in b else b["conv"])
    kind = "pack" if spec.pack != (1, 1) else "im2col"
    written = int(np.prod(shape(b[f"conv_{kind}"])))
    rows = _valid(h, kh, stride[0], dil[0], (pads[0], pads[2]), "h" in spec.unroll,
                  spec.pack[0])
    cols = _valid(w, kwid, stride[1], dil[1], (pads[1], pads[3]), "w" in spec.unroll,
                  spec.pack[1])
    read = n * c * rows * cols
    if "conv_unpack" in b:
        out = int(np.prod(shape(b["conv_unpack"])))
        read, written = read + out, written + out
    got = host_bytes(spec, (n, c, h, w), (k, c, kh, kwid), stride, pads, dil)
    assert got == (read, written)


def test_identity_like_rewrites_cost_nothing():
    assert host_bytes(LayoutRewrite(), (1, 16, 8, 8), (16, 16, 3, 3), padding=(1,) * 4) == (0, 0)
    one_by_one = LayoutRewrite(("h", "w"))
    assert host_bytes(one_by_one, (1, 16, 8, 8), (16, 16, 1, 1)) == (0, 0)
    geo = rewritten_conv_geometry(one_by_one, (1, 16, 8, 8), (16, 16, 1, 1))
    assert geo.input_shape == (1, 16, 8, 8) and geo.weight_shape == (16, 16, 1, 1)
    strided = host_bytes(one_by_one, (1, 16, 8, 8), (16, 16, 1, 1), strides=(2, 2))
    assert strided == (16 * 4 * 4, 16 * 4 * 4)  # a strided 1x1 conv becomes a subsample


def test_convs_of_a_network_are_rewritten_offloaded_and_bit_exact():
    mod, info = load_onnx(models.quantized("tiny_cnn"))
    canon = canonicalize_for(mod, tvm_vta_cp.TARGET)
    inputs = list(random_inputs(info).values())
    ref = run(tvm.compile(canon, target="llvm"), inputs)
    specs = iter([LayoutRewrite(("h", "w")), LayoutRewrite(("w",), (2, 2)), None,
                  LayoutRewrite(pack=(4, 1))])
    new, records = apply_layout_rewrites(canon, lambda info: next(specs))
    assert len(records) == 3
    report = CompileReport(target="vta")
    lowered = offload(new, tvm_vta_cp.TARGET, tvm_vta_cp.load_config(None), report=report)
    convs = [r for r in report.offloads if r.op == "conv2d"]
    assert len(convs) == 4 and all(r.placement == "vta" for r in convs)
    assert {name for name, _ in records} < {r.layer for r in convs}
    np.testing.assert_array_equal(run(tvm.compile(lowered, target="llvm"), inputs), ref)


def _hand_built_conv(dataflow: bool, leak: bool = False, wmax: int = 20):
    """A canonical conv written with the canonicalizer's emitters, optionally outside a
    dataflow block or with its accumulator also returned (a leaking intermediate)."""
    from tvm_accel import numerics
    from tvm_accel.layers import Requant

    w = np.random.default_rng(0).integers(-wmax, wmax, (4, 3, 3, 3)).astype(np.int32)
    rq = Requant(0, np.full(4, 3), np.full(4, 128), 8, 2, -128, 127)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 6, 7), "int8"))
    R = relax.op
    with bb.function("main", [x]):
        with bb.dataflow() if dataflow else contextlib.nullcontext():
            t = bb.emit(R.astype(x, "int32"), "c_xi")
            t = bb.emit(R.subtract(t, relax.const(5, "int32")), "c_xc")
            t = bb.emit(R.nn.conv2d(t, relax.const(w), padding=[1, 0, 2, 1],
                                    out_dtype="int32"), "c_acc")
            acc = bb.emit(R.add(t, relax.const(np.arange(4, dtype=np.int32).reshape(
                1, 4, 1, 1))), "c_biased")
            y = numerics.emit_requant(bb, acc, rq, "int8", 1, name="c_rq", out_name="c")
            out = relax.Tuple([y, acc]) if leak else y
            if dataflow:
                out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def test_conv_outside_a_dataflow_block_is_rewritten():
    mod = _hand_built_conv(dataflow=False)
    x = [np.random.default_rng(1).integers(-128, 128, (1, 3, 6, 7)).astype(np.int8)]
    ref = run(tvm.compile(mod, target="llvm"), x)
    new, records = apply_layout_rewrites(mod, {"c": LayoutRewrite(("h",), (2, 3))})
    assert [name for name, _ in records] == ["c"]
    np.testing.assert_array_equal(run(tvm.compile(new, target="llvm"), x), ref)


def test_conv_with_a_leaking_intermediate_is_left_alone():
    mod = _hand_built_conv(dataflow=True, leak=True)
    new, records = apply_layout_rewrites(mod, lambda info: LayoutRewrite(("h", "w")))
    assert records == [] and new.same_as(mod)


def test_conv_vta_does_not_offload_is_not_rewritten():
    mod = _hand_built_conv(dataflow=True, wmax=300)  # weights beyond int8: stays on the CPU
    new, records = apply_layout_rewrites(mod, lambda info: LayoutRewrite(("h", "w")))
    assert records == [] and new.same_as(mod)
