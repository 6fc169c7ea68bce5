"""Transpose convolution (ONNX ConvTranspose) on VTA: stride-1 sub-convolutions on the static
template whose STOREs interleave the phases into the output. Bit-exact against the CPU reference
end to end (ONNX QDQ -> VTA) and at the strategy level (``strategy.plan`` + simulator against
``layers.reference_execute``); dilation falls back to the CPU with its reason."""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_accel import quantize, zoo
from tvm_accel.layers import DeconvLayer, LayerGraph, Tensor, deconv_output_shape
from tvm_vta_cp import strategy
from tvm_vta_cp.codegen import ISA, OP_STORE, MemInsn, load_blob
from tvm_vta_cp.hw_config import load_config
from tvm_vta_cp.strategy.alu_tail import conv_numerics
from tvm_vta_cp.strategy.geometry import conv_geom, deconv_phases
from tvm_vta_cp.strategy.knobs import knob_space

from .test_strategy import RANGE, make_requant, random_input, run_exact

CONFIGS = ["vta_1x16x16", "vta_8x8x8"]


# --- end to end through ONNX ------------------------------------------------------------------
def deconv_model(cin: int, cout: int, k: int, stride: int, pad: int, output_padding: int = 0,
                 dilation: int = 1, groups: int = 1, hw: int = 5, batch: int = 1,
                 seed: int = 0) -> onnx.ModelProto:
    """One float ConvTranspose + Relu on a (batch, cin, hw, hw) input."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0.0, np.sqrt(2.0 / (cin // groups * k * k)), (cin, cout // groups, k, k))
    w *= rng.uniform(0.5, 1.5, (1, cout // groups, 1, 1))
    inits = [numpy_helper.from_array(w.astype(np.float32), "deconv.weight"),
             numpy_helper.from_array(rng.normal(0.0, 0.1, cout).astype(np.float32),
                                     "deconv.bias")]
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                 dilations=[dilation, dilation], group=groups)
    if output_padding:
        attrs["output_padding"] = [output_padding] * 2
    nodes = [helper.make_node("ConvTranspose", ["input", "deconv.weight", "deconv.bias"],
                              ["deconv_out"], name="deconv", **attrs),
             helper.make_node("Relu", ["deconv_out"], ["relu_out"], name="relu")]
    graph = helper.make_graph(
        nodes, f"deconv_k{k}_s{stride}_p{pad}_op{output_padding}_d{dilation}_g{groups}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, cin, hw, hw])],
        [helper.make_tensor_value_info("relu_out", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", zoo.OPSET)])
    m.ir_version = 8
    m = onnx.shape_inference.infer_shapes(m)
    onnx.checker.check_model(m)
    return m


def deconv_program(r):
    """The offloaded function's single transpose-conv layer program and its config."""
    (fn,) = r.report.functions
    program, cfg, _ = load_blob(fn.blob)
    (ly,) = program.layers
    assert ly.op == "conv2d_transpose"
    return ly, cfg


# name: (cin, cout, k, stride, pad, output_padding, phases)
E2E_CASES = {
    "k3_s2_p1_op1": (8, 8, 3, 2, 1, 1, 4),
    "k4_s2_p1": (8, 16, 4, 2, 1, 0, 4),
    "k3_s1_p1": (8, 8, 3, 1, 1, 0, 1),
    "k2_s2_p0": (8, 8, 2, 2, 0, 0, 4),
}


@pytest.mark.parametrize("case", list(E2E_CASES))
def test_deconv_is_offloaded_and_bit_exact(compare, config, case):
    cin, cout, k, stride, pad, opad, phases = E2E_CASES[case]
    r = compare(quantize.ort_quantize(deconv_model(cin, cout, k, stride, pad, opad)), config)
    assert [o.op for o in r.offloaded] == ["conv2d_transpose"]
    ly, cfg = deconv_program(r)
    assert ly.shape.endswith(f"({phases} phases)") and len(ly.knobs) == phases
    if stride > 1:  # every STORE interleaves one pixel per DMA row: along a phase row (DRAM
        # step = stride pixels) or, for a one-column tile, down it (step = stride output rows)
        wo = r.outputs[0].shape[3]
        stores = [i for i in ISA(cfg).decode_stream(ly.insns)
                  if isinstance(i, MemInsn) and i.opcode == OP_STORE and i.x_size]
        assert stores and all(s.x_size == 1 and s.x_stride in (stride, stride * wo)
                              for s in stores)
    r.assert_bit_exact()


def test_grouped_deconv_with_uint8_activations_is_bit_exact(compare):
    model = quantize.ort_quantize(deconv_model(16, 16, 3, 2, 1, 1, groups=2, batch=2), "uint8",
                         per_channel=False)
    r = compare(model, "vta_1x16x16")
    assert [o.op for o in r.offloaded] == ["conv2d_transpose"]
    (layer,) = r.report.functions[0].graph.layers
    assert isinstance(layer, DeconvLayer) and layer.groups == 2
    r.assert_bit_exact()


def test_dilated_deconv_falls_back_with_its_reason(compare):
    r = compare(quantize.ort_quantize(deconv_model(8, 8, 3, 2, 1, dilation=2)), "vta_1x16x16")
    (de,) = [o for o in r.report.offloads if o.op == "conv2d_transpose"]
    assert de.placement == "cpu"
    assert "dilated transpose conv" in de.reason and "Error" not in de.reason
    assert not r.offloaded
    r.assert_bit_exact()


# --- strategy level ---------------------------------------------------------------------------
def deconv_graph(seed, n, cin, hw, cout, kernel, stride, pad, opad=(0, 0), groups=1,
                 in_dtype="int8", zx=0):
    """A one-layer graph with a random transpose conv and its random input."""
    rng = np.random.default_rng(seed)
    h, w = hw
    wt = rng.integers(-128, 128, size=(cin, cout // groups, *kernel))
    bias = rng.integers(-20000, 20000, size=cout)
    lo, hi = RANGE[in_dtype]
    bound = int(np.abs(wt).sum()) * max(hi - zx, zx - lo) + 20000
    rq = make_requant(rng, cout, bound, int(rng.integers(-10, 10)))
    layer = DeconvLayer("de", "x", "y", wt, bias, zx, stride, pad, opad, rq, groups)
    out = deconv_output_shape(layer, (n, cin, h, w))
    graph = LayerGraph({"x": Tensor("x", (n, cin, h, w), in_dtype),
                        "y": Tensor("y", out, "int8")}, [layer], ["x"], ["y"])
    return graph, {"x": random_input(rng, (n, cin, h, w), in_dtype)}


def random_phase_knobs(graph, cfg, rnd: random.Random) -> dict:
    """A random valid knob point (virtual threads included) for every phase."""
    layer, shape = graph.layers[0], graph.tensors["x"].shape
    dtypes = (graph.tensors["x"].dtype, "int8")
    out = {}
    for sc in deconv_phases(layer, shape):
        g = conv_geom(sc.conv, shape, cfg, sc, tuple(layer.strides))
        _, ops = conv_numerics(sc.conv, *dtypes, cfg)
        space = knob_space(sc.conv, shape, cfg, _ctx=(g, ops))
        for _ in range(100):
            kn = {k.name: rnd.choice(k.options) for k in space.knobs}
            if space.is_valid(kn):
                out[sc.conv.name] = kn
                break
    return out


# (n, cin, (h, w), cout, kernel, stride, pad (t, l, b, r), output_padding, groups, dtype, zx)
STRATEGY_CASES = [
    (1, 8, (5, 5), 8, (3, 3), (2, 1), (1, 0, 1, 0), (0, 0), 1, "int8", 5),
    (1, 8, (5, 5), 8, (3, 2), (1, 2), (0, 1, 2, 0), (0, 1), 1, "int8", -7),
    (1, 8, (4, 4), 8, (2, 2), (3, 3), (0, 0, 0, 0), (2, 1), 1, "int8", 0),
    (1, 8, (8, 7), 8, (3, 3), (1, 1), (3, 3, 3, 2), (0, 0), 1, "int8", 0),
    (1, 8, (6, 6), 8, (3, 3), (2, 2), (3, 4, 3, 2), (1, 0), 1, "uint8", 132),
    (1, 8, (6, 6), 8, (5, 5), (3, 3), (2, 2, 1, 3), (1, 2), 1, "int8", 3),
    (1, 16, (5, 5), 16, (4, 4), (2, 2), (1, 1, 1, 1), (0, 0), 16, "int8", 0),
    (3, 40, (7, 9), 36, (4, 4), (2, 2), (1, 1, 1, 1), (1, 1), 2, "uint8", 128),
]


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("case", range(len(STRATEGY_CASES)))
def test_deconv_strides_padding_and_groups_are_bit_exact(cfg_name, case):
    graph, inputs = deconv_graph(case, *STRATEGY_CASES[case])
    run_exact(graph, inputs, cfg_name)
    knobs = random_phase_knobs(graph, load_config(cfg_name), random.Random(case))
    prog, _ = run_exact(graph, inputs, cfg_name, {"de": knobs})
    assert prog.layers[0].knobs == knobs


def test_deconv_knobs_name_its_phases():
    graph, _ = deconv_graph(0, 1, 8, (4, 4), 8, (3, 3), (2, 2), (1, 1, 1, 1))
    with pytest.raises(ValueError, match="de_sub00"):
        strategy.plan(graph, load_config("vta_1x16x16"), {"de": {"tile_h": 2}})
