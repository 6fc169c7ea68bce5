"""Dilated and grouped/depthwise convolutions on VTA's static template: bit-exact against the
CPU reference end to end (ONNX QDQ -> VTA), and at the strategy level (random layer graphs
through ``strategy.plan`` and the simulator against ``layers.reference_execute``)."""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_accel import quantize, zoo
from tvm_accel.layers import ConvLayer, LayerGraph, Tensor, conv_accumulate, conv_output_shape
from tvm_vta_cp.hw_config import load_config
from tvm_vta_cp.strategy import plan
from tvm_vta_cp.strategy.knobs import knob_space

from .test_strategy import RANGE, make_requant, random_input, run_exact

CONFIGS = ["vta_1x16x16", "vta_8x8x8"]


# --- end to end through ONNX ------------------------------------------------------------------
def conv_model(cin: int, cout: int, k: int = 3, stride: int = 1, pad: int = 1,
               dilation: int = 1, groups: int = 1, hw: int = 8, relu: bool = True,
               seed: int = 0) -> onnx.ModelProto:
    """One float Conv (+ Relu) with ``dilations``/``group`` on a (1, cin, hw, hw) input."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0.0, np.sqrt(2.0 / (cin // groups * k * k)), (cout, cin // groups, k, k))
    w *= rng.uniform(0.5, 1.5, (cout, 1, 1, 1))
    inits = [numpy_helper.from_array(w.astype(np.float32), "conv.weight"),
             numpy_helper.from_array(rng.normal(0.0, 0.1, cout).astype(np.float32), "conv.bias")]
    nodes = [helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["conv_out"],
                              name="conv", kernel_shape=[k, k], strides=[stride, stride],
                              pads=[pad] * 4, dilations=[dilation, dilation], group=groups)]
    out = "conv_out"
    if relu:
        nodes.append(helper.make_node("Relu", [out], ["relu_out"], name="relu"))
        out = "relu_out"
    graph = helper.make_graph(
        nodes, f"conv_d{dilation}_g{groups}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, cin, hw, hw])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", zoo.OPSET)])
    m.ir_version = 8
    m = onnx.shape_inference.infer_shapes(m)
    onnx.checker.check_model(m)
    return m


# (cin, cout, stride, pad, dilation, groups, hw)
E2E_CASES = {
    "dilation2": (16, 24, 1, 2, 2, 1, 10),
    "dilation4": (16, 16, 1, 4, 4, 1, 12),
    "depthwise32": (32, 32, 1, 1, 1, 32, 8),
    "depthwise32_s2": (32, 32, 2, 1, 1, 32, 9),
    "depthwise24": (24, 24, 1, 1, 1, 24, 8),
    "depthwise24_s2": (24, 24, 2, 1, 1, 24, 9),
    "groups4": (64, 64, 1, 1, 1, 4, 6),
    "groups2_unaligned": (48, 48, 1, 1, 1, 2, 6),
    "depthwise_dilation2": (24, 24, 1, 2, 2, 24, 8),
}


@pytest.mark.parametrize("config", [None, "vta_8x8x8"])
@pytest.mark.parametrize("case", list(E2E_CASES))
def test_dilated_and_grouped_convs_run_on_vta_bit_exactly(compare, config, case):
    cin, cout, stride, pad, dil, groups, hw = E2E_CASES[case]
    r = compare(quantize.ort_quantize(conv_model(cin, cout, 3, stride, pad, dil, groups, hw)),
                config)
    assert [o.op for o in r.offloaded] == ["conv2d"]
    (layer,) = r.report.functions[0].graph.layers
    assert layer.groups == groups and tuple(layer.dilation) == (dil, dil)
    r.assert_bit_exact()


# --- strategy level ---------------------------------------------------------------------------
def grouped_conv(seed, n, cin, hw, cout, kernel, stride=1, pad=0, groups=1, dilation=1,
                 in_dtype="int8", zx=0, out_dtype="int8"):
    """A one-layer graph with a random grouped/dilated conv and its random input."""
    rng = np.random.default_rng(seed)
    kh, kw = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    h, w = hw if isinstance(hw, tuple) else (hw, hw)
    wt = rng.integers(-128, 128, size=(cout, cin // groups, kh, kw))
    bias = rng.integers(-20000, 20000, size=cout)
    lo, hi = RANGE[in_dtype]
    bound = int(np.abs(wt).reshape(cout, -1).sum(1).max()) * max(hi - zx, zx - lo) + 20000
    zp = int(rng.integers(-10, 10)) + (128 if out_dtype == "uint8" else 0)
    rq = make_requant(rng, cout, bound, zp, *RANGE[out_dtype])
    layer = ConvLayer("conv", "x", "y", wt, bias, zx,
                      stride if isinstance(stride, tuple) else (stride, stride),
                      pad if isinstance(pad, tuple) else (pad,) * 4, rq, groups=groups,
                      dilation=dilation if isinstance(dilation, tuple) else (dilation, dilation))
    out = conv_output_shape(layer, (n, cin, h, w))
    graph = LayerGraph({"x": Tensor("x", (n, cin, h, w), in_dtype),
                        "y": Tensor("y", out, out_dtype)}, [layer], ["x"], ["y"])
    return graph, {"x": random_input(rng, (n, cin, h, w), in_dtype)}


def test_reference_conv_honours_dilation_and_groups():
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, size=(2, 6, 9, 11))
    layer = ConvLayer("c", "x", "y", rng.integers(-9, 9, size=(4, 3, 3, 2)),
                      rng.integers(-50, 50, size=4), 3, (2, 1), (2, 1, 0, 3),
                      make_requant(rng, 4, 1 << 16), groups=2, dilation=(3, 2))
    acc = conv_accumulate(x, layer)
    assert acc.shape == conv_output_shape(layer, x.shape) == (2, 4, 3, 13)
    xp = np.pad(x - 3, ((0, 0), (0, 0), (2, 0), (1, 3)))
    ref = np.zeros(acc.shape, dtype=np.int64)
    for k in range(4):
        for c in range(3):
            for i in range(3):
                for j in range(2):
                    ref[:, k] += layer.weight[k, c, i, j] * xp[:, (k // 2) * 3 + c,
                                                              3 * i: 3 * i + 5: 2,
                                                              2 * j: 2 * j + 13]
    np.testing.assert_array_equal(acc, ref + layer.bias.reshape(1, -1, 1, 1))


# (n, cin, hw, cout, kernel, stride, pad, groups, dilation, in_dtype, zx)
STRATEGY_CASES = [
    (1, 16, 11, 16, 3, 1, 2, 1, 2, "int8", 0),
    (2, 24, (13, 10), 20, 3, 2, 4, 1, 4, "uint8", 131),      # halo filled with zx' = 3
    (1, 16, 9, 24, (3, 2), (1, 2), (1, 2, 3, 0), 1, (2, 3), "int8", -4),
    (1, 32, 8, 32, 3, 1, 1, 32, 1, "int8", 0),                # depthwise
    (2, 24, 9, 24, 3, 2, 1, 24, 1, "uint8", 128),
    (1, 24, 8, 48, 3, 1, 2, 24, 2, "int8", 5),                # depthwise multiplier 2, dilated
    (1, 64, 6, 64, 3, 1, 1, 4, 1, "int8", 0),
    (1, 48, 7, 48, 3, 1, 1, 2, 1, "int8", -2),                # groups straddle channel blocks
    (3, 36, 5, 24, 1, 2, 0, 12, 1, "int8", 1),                # 1x1 with a vertical stride
    (1, 40, 6, 80, 5, 1, 4, 5, 2, "uint8", 120),
]


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("case", range(len(STRATEGY_CASES)))
def test_dilated_and_grouped_layers_are_bit_exact_with_default_knobs(cfg_name, case):
    n, cin, hw, cout, kernel, stride, pad, groups, dil, in_dtype, zx = STRATEGY_CASES[case]
    graph, inputs = grouped_conv(case, n, cin, hw, cout, kernel, stride, pad, groups, dil,
                                 in_dtype, zx)
    prog, _ = run_exact(graph, inputs, cfg_name)
    shape = prog.layers[0].shape
    assert (f" g{groups}" in shape) == (groups > 1)
    assert (" d" in shape) == (dil != 1)


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_random_feasible_knobs_of_grouped_and_dilated_layers_are_bit_exact(cfg_name):
    cfg = load_config(cfg_name)
    r = random.Random(3)
    for case in (3, 5, 7, 8, 9, 1):
        n, cin, hw, cout, kernel, stride, pad, groups, dil, in_dtype, zx = STRATEGY_CASES[case]
        graph, inputs = grouped_conv(case, n, cin, hw, cout, kernel, stride, pad, groups, dil,
                                     in_dtype, zx)
        space = knob_space(graph.layers[0], graph.tensors["x"].shape, cfg, (in_dtype, "int8"))
        for _ in range(4):
            run_exact(graph, inputs, cfg_name, {"conv": space.sample(r)})


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_depthwise_conv_skips_the_all_zero_weight_blocks(cfg_name):
    cfg = load_config(cfg_name)
    blocks = 64 // cfg.block_out
    dw, x = grouped_conv(1, 1, 64, 8, 64, 3, 1, 1, groups=64)
    prog, stats = run_exact(dw, x, cfg_name)
    dense, xd = grouped_conv(1, 1, 64, 8, 64, 3, 1, 1)
    _, dstats = run_exact(dense, xd, cfg_name)
    # one input-channel block per output-channel block: 1/blocks of the dense GEMM work (the
    # bias lanes' pass, one iteration per output entry like the reset, aside)
    sd, sn = stats[0][1], dstats[0][1]
    assert sd.gemm_reset_iters == sn.gemm_reset_iters
    assert (sd.gemm_uop_iters - sd.gemm_reset_iters) * blocks == (
        sn.gemm_uop_iters - sn.gemm_reset_iters)
    assert prog.layers[0].macs == 64 * 64 * 9
    assert prog.layers[0].padded_macs == cfg.batch * 64 * cfg.block_in * 64 * 9


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_grouped_conv_with_virtual_threads_and_uneven_chunks_is_bit_exact(cfg_name):
    # groups of 24 channels straddle the channel blocks, so output-channel tiles read different
    # numbers of input-channel chunks; both threads interleave such tiles
    graph, inputs = grouped_conv(4, 2, 48, 7, 48, 3, 1, 1, groups=2, in_dtype="uint8", zx=100)
    for kn in ({"tile_co": 1, "tile_ci": 1, "oc_nthread": 2},
               {"tile_co": 1, "tile_ci": 2, "oc_nthread": 2},
               {"tile_co": 2, "tile_ci": 1, "h_nthread": 2, "tile_h": 4}):
        prog, _ = run_exact(graph, inputs, cfg_name, {"conv": kn})
        assert {k: prog.layers[0].knobs[k] for k in kn} == kn


def test_depthwise_then_pointwise_chain_is_bit_exact():
    """Dilated depthwise 3x3 -> pointwise 1x1 -> strided dilated depthwise 3x3 whose padding
    reads the pointwise output's zero-point halo."""
    rng = np.random.default_rng(7)
    g1, _ = grouped_conv(8, 1, 24, 9, 24, 3, 1, 2, groups=24, dilation=2)
    g2, _ = grouped_conv(9, 1, 24, 9, 40, 1, 1, 0)
    g3, _ = grouped_conv(10, 1, 40, 9, 40, 3, 2, 3, groups=40, dilation=3)
    dw, pw, dw2 = g1.layers[0], g2.layers[0], g3.layers[0]
    dw.output, pw.name, pw.input, pw.output = "t", "pw", "t", "u"
    dw2.name, dw2.input, dw2.input_zero_point = "dw2", "u", int(pw.requant.zero_point)
    graph = LayerGraph({"x": Tensor("x", (1, 24, 9, 9), "int8"),
                        "t": Tensor("t", (1, 24, 9, 9), "int8"),
                        "u": Tensor("u", (1, 40, 9, 9), "int8"),
                        "y": Tensor("y", conv_output_shape(dw2, (1, 40, 9, 9)), "int8")},
                       [dw, pw, dw2], ["x"], ["y"])
    prog, _ = run_exact(graph, {"x": random_input(rng, (1, 24, 9, 9), "int8")}, "vta_1x16x16")
    assert prog.tensors["u"].halo == ((3, 3, 3, 3) if dw2.input_zero_point else (0, 0, 0, 0))


def test_knob_space_of_a_grouped_conv_counts_only_the_blocks_it_loads():
    cfg = load_config("vta_1x16x16")
    graph, _ = grouped_conv(11, 1, 256, 14, 256, 3, 1, 1, groups=256)
    space = knob_space(graph.layers[0], (1, 256, 14, 14), cfg)
    d = space.default()
    assert space.is_valid(d)
    # a dense 256 -> 256 3x3 weight tile of every block would need 16 x 16 x 9 WGT entries
    # (> 1024); the depthwise one needs one block per output-channel block
    assert space.is_valid(dict(d, tile_co=16, tile_ci=16, oc_nthread=1, h_nthread=1,
                               tile_h=1, tile_w=1))
    assert plan(graph, cfg).layers[0].knobs == d
