"""Integer activations and the squeeze-excitation product on MARSELLUS (issue 24 item 4): the
canonical 256-entry table lookup of Sigmoid, SiLU, HardSigmoid, HardSwish, Tanh, LeakyRelu and
PRelu runs as CL.LUT on the cluster, its table in L1, bit-exact with the integer reference on
every code of every channel; a feature map times a per-channel vector runs as CL.MUL."""

import math

import numpy as np
import pytest

from helpers import models
from tvm_accel import quantize
from tvm_accel.errors import SimulatorError
from tvm_accel.layers import LayerGraph, LutLayer, MulLayer, reference_execute
from tvm_marsellus import codegen as cg
from tvm_marsellus import strategy
from tvm_marsellus.runtime import execute_program
from tvm_marsellus.simulator import simulate

from .test_marsellus_simulator import L1, run_cluster
from .test_marsellus_strategy import CFG, T, conv

ACTIVATIONS = ["Sigmoid", "SiLU", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "PRelu"]


def _every_code(dtype: str, c: int, batch: int = 1) -> np.ndarray:
    """Each of the 256 codes of ``dtype`` in every channel: (batch, c, 16, 16)."""
    lo = -128 if dtype == "int8" else 0
    return np.broadcast_to((np.arange(256) + lo).reshape(16, 16),
                           (batch, c, 16, 16)).astype(dtype)


def _table(rng, rows: int, dtype: str) -> np.ndarray:
    lo = -128 if dtype == "int8" else 0
    return rng.integers(lo, lo + 256, (rows, 256)).astype(dtype)


@pytest.mark.parametrize("din, dout, rows, batch", [("int8", "int8", 1, 1),
                                                    ("uint8", "int8", 24, 1),
                                                    ("int8", "uint8", 24, 2),
                                                    ("uint8", "uint8", 1, 1)])
def test_a_table_lookup_maps_every_code_of_every_channel_bit_exact(din, dout, rows, batch):
    rng = np.random.default_rng(rows + batch)
    lut = LutLayer("act", "x", "y", _table(rng, rows, dout))
    tensors = {"x": T("x", (batch, 24, 16, 16), dtype=din),
               "y": T("y", (batch, 24, 16, 16), dtype=dout)}
    g = LayerGraph(tensors, [lut], ["x"], ["y"])
    xs = {"x": _every_code(din, 24, batch)}
    prog = strategy.plan(g, CFG)
    outs, _ = execute_program(prog, xs, CFG, whole_stream=True)
    np.testing.assert_array_equal(outs["y"], reference_execute(g, xs)["y"])
    (lp,) = prog.layers
    assert (lp.op, lp.engine) == ("lut", "cluster")
    luts = [c for c in lp.commands if isinstance(c, cg.ClusterKernel)]
    assert luts and all(c.kernel == "LUT" and c.lambda_ == (256 if rows > 1 else 0)
                        for c in luts)


@pytest.mark.parametrize("signed", [True, False])
def test_a_table_lookup_between_convs_reads_the_stored_bytes_of_its_input(signed):
    """The conv's output may be stored offset (biased HWC) or two's complement: the table is
    permuted at compile time so CL.LUT maps stored bytes to stored bytes."""
    rng = np.random.default_rng(int(signed))
    dt = "int8" if signed else "uint8"
    a = conv(rng, "a", "x", "f", 16, 32, 3, osigned=signed)
    lut = LutLayer("act", "f", "g", _table(rng, 32, "int8"))
    b = conv(rng, "b", "g", "y", 32, 16, 1)
    tensors = {"x": T("x", (1, 16, 8, 8)), "f": T("f", (1, 32, 8, 8), dtype=dt),
               "g": T("g", (1, 32, 8, 8)), "y": T("y", (1, 16, 8, 8))}
    g = LayerGraph(tensors, [a, lut, b], ["x"], ["y"])
    xs = {"x": rng.integers(-128, 128, (1, 16, 8, 8)).astype("int8")}
    prog = strategy.plan(g, CFG)
    outs, _ = execute_program(prog, xs, CFG, whole_stream=True)
    np.testing.assert_array_equal(outs["y"], reference_execute(g, xs)["y"])
    assert [ly.op for ly in prog.layers] == ["conv2d", "lut", "conv2d"]


def test_cl_lut_costs_its_cycles_per_element_on_the_16_cores():
    m = L1()
    x = np.arange(5 * 7 * 24).reshape(5, 7, 24) % 256
    table = np.random.default_rng(0).integers(0, 256, (24, 256))
    xa, ta, ya = m.put(x), m.put(table), m.alloc(x.size)
    st, _ = run_cluster("LUT", m, in_bits=8, out_bits=8, in_addr=xa, out_addr=ya, w_addr=ta,
                        lambda_=256, h_in=5, w_in=7, c_in=24, h_out=5, w_out=7, c_out=24)
    np.testing.assert_array_equal(m.mem[ya:ya + x.size].reshape(x.shape),
                                  table[np.arange(24), x])
    want = CFG.CL_KERNEL_OVERHEAD_CYCLES + math.ceil(
        x.size * CFG.CL_LUT_CYCLES_PER_ELEMENT / CFG.CLUSTER_CORES)
    assert st.cluster_busy == want


@pytest.mark.parametrize("fields, match", [
    ({"lambda_": 7}, "channel stride 0 or 256"),
    ({"in_bits": 4}, "LUT: 8-bit bytes"),
    ({"shift": 3}, "LUT: 8-bit bytes"),
    ({"w_addr": CFG.L1_BYTES - 300, "lambda_": 256}, r"table .* exceeds L1"),
])
def test_a_corrupt_lut_command_fails_with_one_line_naming_the_field(fields, match):
    kw = dict(kernel="LUT", in_bits=8, out_bits=8, h_in=2, w_in=2, c_in=4, h_out=2, w_out=2,
              c_out=4, w_addr=1024, out_addr=2048)
    kw.update(fields)
    with pytest.raises(SimulatorError, match=match):
        simulate(CFG, cg.encode_stream([cg.ClusterKernel(**kw)]))


@pytest.mark.parametrize("act", ["int8", "uint8"])
@pytest.mark.parametrize("op", ACTIVATIONS)
def test_every_onnx_activation_runs_on_the_cluster_bit_exact(compare, op, act):
    q = quantize.ort_quantize(models.conv_unary(op, hw=16), act)
    r = compare(q)
    placed = {o.layer: (o.op, o.placement) for o in r.report.offloads}
    assert ("lut", "marsellus") in placed.values(), placed
    assert all(p == "marsellus" for o, p in placed.values() if o == "lut")
    r.assert_bit_exact()


def _gate_recipe(lo: int, hi: int, zp: int):
    from tvm_marsellus.numerics import requant_recipe

    return requant_recipe(np.array([0.7 / 255]), np.array([256 * 256]), zp, lo, hi)


@pytest.mark.parametrize("dt, vector_first, batch", [("int8", False, 1), ("uint8", True, 2),
                                                     ("int8", True, 2)])
def test_a_gate_product_scales_every_channel_of_every_pixel_bit_exact(dt, vector_first, batch):
    rng = np.random.default_rng(batch + vector_first)
    lo, hi = (-128, 127) if dt == "int8" else (0, 255)
    za, zb = (-3, 5) if dt == "int8" else (130, 7)
    ins = ("v", "x") if vector_first else ("x", "v")
    zps = (zb, za) if vector_first else (za, zb)
    mul = MulLayer("se_scale", ins, "y", *zps, _gate_recipe(lo, hi, zps[0] // 2))
    tensors = {"x": T("x", (batch, 40, 9, 7), dtype=dt), "v": T("v", (batch, 40, 1, 1), dtype=dt),
               "y": T("y", (batch, 40, 9, 7), dtype=dt)}
    g = LayerGraph(tensors, [mul], list(ins), ["y"])
    xs = {n: rng.integers(lo, hi + 1, tensors[n].shape).astype(dt) for n in ins}
    prog = strategy.plan(g, CFG)
    outs, _ = execute_program(prog, xs, CFG, whole_stream=True)
    np.testing.assert_array_equal(outs["y"], reference_execute(g, xs)["y"])
    (lp,) = prog.layers
    assert (lp.op, lp.engine) == ("multiply", "cluster")
    assert all(c.kernel == "MUL" for c in lp.commands if isinstance(c, cg.ClusterKernel))


def test_a_gate_product_reads_a_biased_feature_map_and_a_table_output():
    """The squeeze-excitation tail: conv -> (gate: table of the pooled branch) -> product ->
    conv; the feature map is stored offset (biased HWC), the vector two's complement."""
    rng = np.random.default_rng(3)
    a = conv(rng, "a", "x", "f", 16, 32, 3)
    gate = LutLayer("gate", "s", "v", _table(rng, 1, "int8"))
    mul = MulLayer("se_scale", ("f", "v"), "m", 2, -1, _gate_recipe(-128, 127, 0))
    b = conv(rng, "b", "m", "y", 32, 16, 1)
    tensors = {"x": T("x", (1, 16, 8, 8)), "f": T("f", (1, 32, 8, 8)),
               "s": T("s", (1, 32, 1, 1)), "v": T("v", (1, 32, 1, 1)),
               "m": T("m", (1, 32, 8, 8)), "y": T("y", (1, 16, 8, 8))}
    g = LayerGraph(tensors, [a, gate, mul, b], ["x", "s"], ["y"])
    xs = {n: rng.integers(-128, 128, tensors[n].shape).astype("int8") for n in ("x", "s")}
    prog = strategy.plan(g, CFG)
    outs, _ = execute_program(prog, xs, CFG, whole_stream=True)
    np.testing.assert_array_equal(outs["y"], reference_execute(g, xs)["y"])
    assert [ly.op for ly in prog.layers] == ["conv2d", "lut", "multiply", "conv2d"]


def test_cl_mul_broadcasts_its_vector_at_the_eltwise_rate():
    m = L1()
    rng = np.random.default_rng(1)
    x, v = rng.integers(-128, 128, (4, 5, 24)), rng.integers(0, 256, 24)
    xa, va, ya = m.put(x.astype(np.int8).view(np.uint8)), m.put(v), m.alloc(x.size)
    st, _ = run_cluster("MUL", m, in_bits=8, out_bits=8, in_signed=1, out_signed=1,
                        in_addr=xa, w_addr=va, out_addr=ya, kappa_a=300, kappa_b=(-2) & 0xFFFF,
                        lambda_=1 << 13, shift=14, pad_value=-5, h_in=4, w_in=5, c_in=24,
                        h_out=4, w_out=5, c_out=24)
    want = np.clip(((x + 5) * (v + 2) * 300 + (1 << 13)) >> 14, -128, 127)
    np.testing.assert_array_equal(m.mem[ya:ya + x.size].view(np.int8).reshape(x.shape), want)
    assert st.cluster_busy == CFG.CL_KERNEL_OVERHEAD_CYCLES + math.ceil(
        x.size / CFG.CL_ELTWISE_ELEMS_PER_CYCLE)


@pytest.mark.parametrize("fields, match", [
    ({"in_bits": 4}, "MUL reads 8-bit operands"),
    ({"w_addr": CFG.L1_BYTES - 2}, r"input B .* exceeds L1"),
])
def test_a_corrupt_mul_command_fails_with_one_line_naming_the_field(fields, match):
    kw = dict(kernel="MUL", in_bits=8, out_bits=8, h_in=2, w_in=2, c_in=4, h_out=2, w_out=2,
              c_out=4, w_addr=1024, out_addr=2048, kappa_a=1)
    kw.update(fields)
    with pytest.raises(SimulatorError, match=match):
        simulate(CFG, cg.encode_stream([cg.ClusterKernel(**kw)]))


@pytest.mark.parametrize("scheme", [{}, {"activation_type": "uint8"}])
def test_a_squeeze_excitation_block_runs_whole_on_marsellus_bit_exact(compare, scheme):
    r = compare(quantize.ort_quantize(models.squeeze_excitation(), **scheme))
    placed = {o.layer: (o.op, o.placement) for o in r.report.offloads}
    assert placed["se_scale"] == ("multiply", "marsellus")
    assert placed["se_gate"] == ("lut", "marsellus")
    assert all(p == "marsellus" for _, p in placed.values()), placed
    r.assert_bit_exact()
