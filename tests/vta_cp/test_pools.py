"""Pooling and nearest upsample on VTA (``strategy.pool``, ``strategy.upsample``): layer graphs
planned and run on the C simulator equal ``layers.reference_execute``; ONNX models compiled for
VTA equal the CPU reference graph."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import models
from tvm_accel.errors import KnobError, MappingError
from tvm_accel.layers import (
    LayerGraph,
    PoolLayer,
    Requant,
    Tensor,
    UpsampleLayer,
    pool_output_shape,
    reference_execute,
)
from tvm_vta_cp.codegen import ALU_MAX, ISA, AluInsn
from tvm_vta_cp.hw_config import load_config
from tvm_vta_cp.runtime import execute_program
from tvm_vta_cp.strategy import plan

CONFIGS = ["vta_1x16x16", "vta_8x8x8"]
RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


def _requant(zp: int, dtype: str, multiplier: int = 20000, shift: int = 16) -> Requant:
    lo, hi = RANGE[dtype]
    return Requant(0, np.array([multiplier]), np.array([1 << (shift - 1)]), shift, zp, lo, hi)


def _pool_graph(kind, n, c, hw, kernel, stride, pad, dtype="int8", zx=0, rescale=False):
    h, w = hw if isinstance(hw, tuple) else (hw, hw)
    kh, kw = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    window = kh * kw
    rq = None
    if kind == "avg":  # the window divisor rides on the recipe, as canonicalize defines it
        rq = _requant(3 + (128 if dtype == "uint8" else 0), dtype, (1 << 16) // window, 16)
    elif rescale:
        rq = _requant(-5 + (128 if dtype == "uint8" else 0), dtype)
    layer = PoolLayer("pool", "x", "y", kind, (kh, kw), (stride, stride), pad, zx, rq)
    out = pool_output_shape(layer, (n, c, h, w))
    return LayerGraph({"x": Tensor("x", (n, c, h, w), dtype), "y": Tensor("y", out, dtype)},
                      [layer], ["x"], ["y"])


def _run_exact(graph, cfg_name, knobs=None, seed=0):
    rng = np.random.default_rng(seed)
    inputs = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        lo, hi = RANGE[t.dtype]
        inputs[name] = rng.integers(lo, hi + 1, size=t.shape).astype(t.dtype)
    cfg = load_config(cfg_name)
    prog = plan(graph, cfg, knobs)
    outs, _ = execute_program(prog, inputs, cfg)
    ref = reference_execute(graph, inputs)
    for name in graph.outputs:
        np.testing.assert_array_equal(outs[name], ref[name], err_msg=name)
    return prog


# --- max / average / global average pooling ----------------------------------------------------
# (kind, n, c, hw, kernel, stride, padding (top, left, bottom, right), dtype, zx)
POOL_CASES = [
    ("max", 1, 16, 8, 3, 2, (1, 1, 1, 1), "int8", 0),
    ("max", 2, 24, 9, 2, 2, (0, 0, 0, 0), "uint8", 0),
    ("max", 1, 8, 7, 3, 2, (0, 0, 1, 1), "int8", 0),       # a ceil-mode pool's extra padding
    ("max", 1, 20, (6, 11), (3, 5), 1, (1, 2, 1, 2), "uint8", 0),
    ("avg", 1, 16, 8, 3, 1, (1, 1, 1, 1), "uint8", 7),       # padding counts the zero point
    ("avg", 2, 40, 8, 2, 2, (0, 0, 0, 0), "int8", -3),
    ("avg", 1, 8, 9, 3, 3, (1, 1, 2, 2), "int8", 11),
]


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0]}-{c[3]}-k{c[4]}s{c[5]}")
def test_pools_with_padding_strides_and_zero_points_are_bit_exact(cfg_name, case):
    kind, n, c, hw, k, s, pad, dtype, zx = case
    prog = _run_exact(_pool_graph(kind, n, c, hw, k, s, pad, dtype, zx), cfg_name)
    assert prog.layers[0].op == f"{kind}_pool2d" and prog.layers[0].macs == 0


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_a_max_pool_that_changes_quantization_runs_the_requantize_tail(dtype):
    _run_exact(_pool_graph("max", 1, 16, 8, 3, 2, (1, 1, 1, 1), dtype,
                           zx=4 + (128 if dtype == "uint8" else 0), rescale=True), "vta_1x16x16")


@pytest.mark.parametrize("knobs", [
    {"tile_h": 1, "tile_w": 1},                       # every corner and edge its own tile
    {"tile_h": 2, "tile_w": 3, "tile_co": 1},
    {"tile_h": 3, "tile_kh": 1},                       # kernel rows reduced one at a time
    {"tile_w": 2, "tile_kh": 2, "tile_co": 2},
])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_small_tiles_touching_each_padding_corner_are_bit_exact(kind, knobs):
    graph = _pool_graph(kind, 1, 32, 7, 3, 2, (1, 1, 2, 1), "uint8", zx=130)
    prog = _run_exact(graph, "vta_1x16x16", {"pool": knobs})
    assert all(prog.layers[0].knobs[k] == v for k, v in knobs.items())


def test_a_tile_whose_kernel_row_chunk_lies_in_the_padding_is_bit_exact():
    graph = _pool_graph("avg", 1, 16, 5, 3, 1, (2, 0, 2, 0), "int8", zx=-9)
    _run_exact(graph, "vta_1x16x16", {"pool": {"tile_h": 1, "tile_kh": 1}})


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_global_average_pool_is_one_window_reduced_on_the_alu(cfg_name):
    layer = PoolLayer("gap", "x", "y", "avg", (7, 7), (1, 1), (0, 0, 0, 0), 5,
                      _requant(-2, "int8", (1 << 16) // 49, 16), op_name="global_avg_pool2d")
    graph = LayerGraph({"x": Tensor("x", (1, 40, 7, 7), "int8"),
                        "y": Tensor("y", (1, 40, 1, 1), "int8")}, [layer], ["x"], ["y"])
    prog = _run_exact(graph, cfg_name)
    cfg = load_config(cfg_name)
    alus = [i for i in ISA(cfg).decode_stream(prog.layers[0].insns) if isinstance(i, AluInsn)]
    assert len(alus) < 12  # reset, window sum and the requantize tail: no op per pixel


def test_a_global_pool_larger_than_the_acc_is_summed_in_kernel_row_chunks():
    layer = PoolLayer("gap", "x", "y", "avg", (64, 64), (1, 1), (0, 0, 0, 0), 0,
                      _requant(0, "int8", 1, 12), op_name="global_avg_pool2d")
    graph = LayerGraph({"x": Tensor("x", (1, 16, 64, 64), "int8"),
                        "y": Tensor("y", (1, 16, 1, 1), "int8")}, [layer], ["x"], ["y"])
    prog = _run_exact(graph, "vta_1x16x16")
    assert prog.layers[0].knobs["tile_kh"] < 64


def test_max_pool_reduces_all_window_positions_in_one_alu_instruction():
    prog = _run_exact(_pool_graph("max", 1, 16, 8, 3, 2, (1, 1, 1, 1)), "vta_1x16x16")
    cfg = load_config("vta_1x16x16")
    insns = ISA(cfg).decode_stream(prog.layers[0].insns)
    assert sum(isinstance(i, AluInsn) and i.alu_opcode == ALU_MAX for i in insns) == 1


def test_a_window_row_wider_than_the_acc_is_refused_with_its_reason():
    layer = PoolLayer("gap", "x", "y", "avg", (1, 600), (1, 1), (0, 0, 0, 0), 0,
                      _requant(0, "int8", 1, 12), op_name="global_avg_pool2d")
    graph = LayerGraph({"x": Tensor("x", (1, 8, 1, 600), "int8"),
                        "y": Tensor("y", (1, 8, 1, 1), "int8")}, [layer], ["x"], ["y"])
    with pytest.raises(MappingError, match="gap: .*ACC"):
        plan(graph, load_config("vta_8x8x8"))


def test_unknown_pool_knobs_are_refused():
    with pytest.raises(KnobError, match="tile_ci"):
        plan(_pool_graph("max", 1, 16, 8, 3, 2, (1, 1, 1, 1)), load_config("vta_1x16x16"),
             {"pool": {"tile_ci": 1}})


# --- nearest upsample ---------------------------------------------------------------------------
def _upsample_graph(n, c, hw, scale, dtype="int8", rescale=False):
    sh, sw = scale
    zx = 6 + (128 if dtype == "uint8" else 0)
    rq = _requant(-4 + (128 if dtype == "uint8" else 0), dtype) if rescale else None
    layer = UpsampleLayer("up", "x", "y", (sh, sw), zx if rescale else 0, rq)
    return LayerGraph({"x": Tensor("x", (n, c, hw, hw), dtype),
                       "y": Tensor("y", (n, c, hw * sh, hw * sw), dtype)},
                      [layer], ["x"], ["y"])


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("scale", [(2, 2), (3, 1), (1, 3), (2, 4)])
def test_nearest_upsample_by_integer_factors_is_bit_exact(cfg_name, scale):
    _run_exact(_upsample_graph(1, 24, 5, scale), cfg_name)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_an_upsample_that_changes_quantization_runs_the_requantize_tail(dtype):
    _run_exact(_upsample_graph(2, 16, 4, (2, 2), dtype, rescale=True), "vta_1x16x16")


def test_upsample_tiles_are_bit_exact():
    _run_exact(_upsample_graph(1, 48, 6, (2, 2)), "vta_1x16x16",
               {"up": {"tile_co": 2, "tile_h": 4, "tile_w": 5}})


# --- ONNX models against the CPU reference --------------------------------------------------------
@pytest.mark.parametrize("act", ["int8", "uint8"])
@pytest.mark.parametrize("kw", [
    dict(kind="max", k=3, stride=2, pad=0, hw=8, ceil_mode=True),   # SqueezeNet 1.1's pools
    dict(kind="max", k=3, stride=2, pad=1, hw=7),
    dict(kind="avg", k=3, stride=1, pad=1, hw=8),
    dict(kind="avg", k=2, stride=2, pad=0, hw=8, ceil_mode=True),   # no window overhangs
    dict(kind="gap", hw=8),
], ids=lambda kw: "-".join(f"{v}" for v in kw.values()))
def test_onnx_pools_are_offloaded_and_equal_the_cpu_reference(compare_on, act, kw):
    m = models.quantized("single_pool", activation_type=act, **kw)
    c = compare_on("vta")(m)
    c.assert_bit_exact()
    ops = {r.op for r in c.offloaded}
    assert {"max": "max_pool2d", "avg": "avg_pool2d", "gap": "global_avg_pool2d"}[
        kw["kind"]] in ops
    lsb = np.abs(c.outputs[0] - models.ort_run(m, c.inputs[0])).max() / models.output_step(m)
    assert lsb <= 2.0 + 1e-6  # VTA's recipes (conv and pool) against onnxruntime


def test_onnx_resize_nearest_is_offloaded_and_equals_the_cpu_reference(compare_on):
    c = compare_on("vta")(models.quantized("single_upsample", hw=6, scale=2),
                          config="vta_8x8x8")
    c.assert_bit_exact()
    assert "upsample" in {r.op for r in c.offloaded}


def test_an_average_pool_whose_ceil_mode_windows_overhang_runs_in_parts_on_vta(compare_on):
    """The canonical graph splits it into plain pools with their own divisors (inner part,
    last row, last column, corner); each runs on VTA's ALU, the join on the CPU."""
    m = models.quantized("single_pool", kind="avg", k=3, stride=2, pad=0, hw=8, ceil_mode=True)
    c = compare_on("vta")(m)
    c.assert_bit_exact()
    pools = [r for r in c.report.offloads if r.op == "avg_pool2d"]
    assert len(pools) == 4 and all(r.placement == "vta" for r in pools)
