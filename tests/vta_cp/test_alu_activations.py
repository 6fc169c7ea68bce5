"""Activations on VTA's ALU: LeakyReLU as MUL/ADD/MAX/SHR (bit-exact with its canonical table
on all 256 codes), the squeeze-excitation product, and table lookups (Sigmoid, SiLU, ...)
falling back with the reason that VTA has no lookup."""

from __future__ import annotations

import numpy as np
import pytest
from vta_cp.test_strategy import CONFIGS, random_input, run_exact

from helpers.models import quantized
from tvm_accel.canonicalize.elementwise import dequantize_f32, quantize_f32
from tvm_accel.errors import MappingError
from tvm_accel.layers import DTYPE_RANGE, LayerGraph, LutLayer, MulLayer, Requant, Tensor
from tvm_vta_cp.alu_activation import CODES, fit_leaky
from tvm_vta_cp.hw_config import load_config
from tvm_vta_cp.layout import stored_offset
from tvm_vta_cp.strategy import plan


def leaky_table(sx, zx, alpha, sy, zy, in_dtype="int8", out_dtype="int8"):
    """The canonical LeakyRelu table (float32 as onnxruntime computes it)."""
    lo, hi = DTYPE_RANGE[in_dtype]
    v = dequantize_f32(np.arange(lo, hi + 1), sx, zx)
    v = np.where(v >= 0, v, np.float32(alpha) * v).astype(np.float32)
    olo, ohi = DTYPE_RANGE[out_dtype]
    return quantize_f32(v, sy, zy, olo, ohi).astype(out_dtype)


def random_leaky(rng, in_dtype, out_dtype):
    lo, hi = DTYPE_RANGE[in_dtype]
    olo, ohi = DTYPE_RANGE[out_dtype]
    sx = float(rng.uniform(0.002, 0.2))
    return leaky_table(sx, int(rng.integers(lo, hi + 1)), float(rng.choice([0.01, 0.1, 0.2,
                                                                             0.3])),
                       sx * float(rng.uniform(0.3, 2.0)), int(rng.integers(olo, ohi + 1)),
                       in_dtype, out_dtype)


@pytest.mark.parametrize("in_dtype, out_dtype", [("int8", "int8"), ("uint8", "uint8"),
                                                 ("int8", "uint8")])
def test_leaky_relu_tables_compose_exactly_on_every_code(in_dtype, out_dtype):
    rng = np.random.default_rng(0)
    for _ in range(12):
        table = random_leaky(rng, in_dtype, out_dtype)
        form = fit_leaky(table, in_dtype, out_dtype)
        assert form is not None and form.fits_int32()
        want = table.astype(np.int64) + stored_offset(out_dtype)
        np.testing.assert_array_equal(form.apply(CODES), want)  # all 256 codes


@pytest.mark.parametrize("fn", [lambda v: 1 / (1 + np.exp(-v)), np.tanh,
                                lambda v: v / (1 + np.exp(-v))])
def test_sigmoid_tanh_and_silu_tables_have_no_alu_form(fn):
    v = dequantize_f32(np.arange(-128, 128), 0.05, 3)
    table = quantize_f32(fn(v).astype(np.float32), 1 / 200, -20, -128, 127).astype("int8")
    assert fit_leaky(table, "int8", "int8") is None


def lut_graph(table, shape, in_dtype, out_dtype):
    graph = LayerGraph({"x": Tensor("x", shape, in_dtype), "y": Tensor("y", shape, out_dtype)},
                       [LutLayer("act", "x", "y", table.reshape(1, 256))], ["x"], ["y"])
    return graph


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("in_dtype, out_dtype", [("int8", "int8"), ("uint8", "uint8")])
def test_leaky_relu_runs_on_the_alu_bit_exact(cfg_name, in_dtype, out_dtype):
    rng = np.random.default_rng(1)
    table = random_leaky(rng, in_dtype, out_dtype)
    shape = (2, 20, 5, 7)
    x = random_input(rng, shape, in_dtype)
    lo = DTYPE_RANGE[in_dtype][0]
    x.reshape(-1)[:256] = np.arange(lo, lo + 256)  # every code
    prog, stats = run_exact(lut_graph(table, shape, in_dtype, out_dtype), {"x": x}, cfg_name)
    assert prog.layers[0].op == "alu_activation" and stats[0][1].gemm_uop_iters == 0


def test_a_sigmoid_table_is_refused_because_vta_has_no_lookup():
    v = dequantize_f32(np.arange(-128, 128), 0.05, 0)
    table = quantize_f32((1 / (1 + np.exp(-v))).astype(np.float32), 1 / 256, -128, -128, 127)
    graph = lut_graph(table.astype("int8"), (1, 16, 4, 4), "int8", "int8")
    with pytest.raises(MappingError, match="no table lookup"):
        plan(graph, load_config("vta_1x16x16"))


def mul_graph(rng, shape, gate_first, dtypes=("int8", "uint8", "int8")):
    n, c = shape[:2]
    gshape = (n, c, 1, 1)
    da, db, dout = dtypes
    za, zb = (int(rng.integers(-10, 10)) + (128 if d == "uint8" else 0) for d in (da, db))
    lo, hi = DTYPE_RANGE[dout]
    zo = int(rng.integers(lo + 20, hi - 20))
    rq = Requant(0, np.array([int(rng.integers(3000, 30000))]), np.array([1 << 17]), 18, zo,
                 lo, hi)
    ins = ("g", "a") if gate_first else ("a", "g")
    zps = (zb, za) if gate_first else (za, zb)
    mul = MulLayer("se_scale", ins, "y", *zps, rq)
    graph = LayerGraph({"a": Tensor("a", shape, da), "g": Tensor("g", gshape, db),
                        "y": Tensor("y", shape, dout)}, [mul], ["a", "g"], ["y"])
    return graph, {"a": random_input(rng, shape, da), "g": random_input(rng, gshape, db)}


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("gate_first", [False, True])
def test_squeeze_excitation_product_runs_on_the_alu_bit_exact(cfg_name, gate_first):
    rng = np.random.default_rng(2)
    graph, inputs = mul_graph(rng, (2, 40, 6, 5), gate_first)
    prog, stats = run_exact(graph, inputs, cfg_name)
    assert prog.layers[0].op == "multiply" and stats[0][1].alu_uop_iters > 0


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_product_of_two_equal_maps_is_bit_exact(cfg_name):
    rng = np.random.default_rng(3)
    graph, inputs = mul_graph(rng, (1, 24, 4, 4), False, ("uint8", "uint8", "uint8"))
    graph.tensors["g"] = Tensor("g", (1, 24, 4, 4), "uint8")
    inputs["g"] = random_input(rng, (1, 24, 4, 4), "uint8")
    run_exact(graph, inputs, cfg_name)


def test_leaky_relu_of_a_quantized_model_runs_on_vta(compare):
    r = compare(quantized("conv_unary", op="LeakyRelu", c=16, alpha=0.1))
    row = next(x for x in r.report.offloads if x.op == "lut")
    assert row.placement == "vta", row.reason
    r.assert_bit_exact()


@pytest.mark.parametrize("op", ["Sigmoid", "SiLU", "Tanh"])
def test_table_activations_stay_on_the_cpu_with_the_reason(compare, op):
    r = compare(quantized("conv_unary", op=op, c=16))
    row = next(x for x in r.report.offloads if x.op == "lut" and x.kind == "layer")
    assert row.placement == "cpu" and row.reason.startswith("table lookup: VTA's ALU has no lookup")
    r.assert_bit_exact()


@pytest.mark.slow
def test_squeeze_excitation_block_offloads_its_product(compare):
    r = compare(quantized("squeeze_excitation", c=16))
    row = next(x for x in r.report.offloads if x.op == "multiply" and x.kind == "layer")
    assert row.placement == "vta", row.reason
    r.assert_bit_exact()


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_a_map_of_many_uneven_tiles_reloads_its_operand_vectors_bit_exact(cfg_name):
    rng = np.random.default_rng(4)
    graph, inputs = mul_graph(rng, (1, 24, 37, 41), False)  # round add 2^17: an ACC vector
    prog, _ = run_exact(graph, inputs, cfg_name)
    assert prog.layers[0].n_insns > 20  # several tiles
