"""Static VTA strategy: random layer graphs compiled with ``strategy.plan`` and run on the C
simulator with ``runtime.execute_program`` must equal ``layers.reference_execute`` exactly."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tvm_accel.errors import AccelError, MappingError
from tvm_accel.layers import (
    AddLayer,
    ConvLayer,
    LayerGraph,
    Requant,
    Tensor,
    conv_output_shape,
    reference_execute,
)
from tvm_vta_cp.codegen import ISA, FinishInsn, MemInsn
from tvm_vta_cp.hw_config import load_config
from tvm_vta_cp.runtime import execute_program
from tvm_vta_cp.strategy import plan
from tvm_vta_cp.strategy.knobs import knob_space

CONFIGS = ["vta_1x16x16", "vta_8x8x8"]
RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


# --- helpers ----------------------------------------------------------------------------------
def make_requant(rng, k, acc_bound, zero_point=0, qmin=-128, qmax=127, per_channel=True):
    """A valid recipe: multiplier <= 32767, pre_shift so |acc| bound x multiplier < 2^30,
    round_add = 2^(shift-1)."""
    shift = int(rng.integers(8, 16))
    m = rng.integers(1, 32768, size=k if per_channel else 1)
    pre = 0
    while (int(acc_bound) >> pre) * int(m.max()) + (1 << shift) >= 1 << 30:
        pre += 1
    return Requant(pre, m, np.full(m.shape, 1 << (shift - 1)), shift, zero_point, qmin, qmax)


def conv_layer(rng, name, src, dst, cin, cout, kernel, stride=1, pad=0, zx=0, in_dtype="int8",
               out_dtype="int8", relu=False, per_channel=True, dense=False, zp=None):
    kh, kw = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    w = rng.integers(-128, 128, size=(cout, cin, kh, kw))
    bias = rng.integers(-20000, 20000, size=cout)
    lo, hi = RANGE[in_dtype]
    reach = max(hi - zx, zx - lo)
    bound = int(np.abs(w).reshape(cout, -1).sum(1).max()) * reach + 20000
    qlo, qhi = RANGE[out_dtype]
    if zp is None:
        zp = int(rng.integers(-10, 10)) + (128 if out_dtype == "uint8" else 0)
    rq = make_requant(rng, cout, bound, zp, zp if relu else qlo, qhi, per_channel)
    pads = pad if isinstance(pad, tuple) else (pad,) * 4
    strides = stride if isinstance(stride, tuple) else (stride, stride)
    return ConvLayer(name, src, dst, w, bias, zx, strides, pads, rq, is_dense=dense)


def single_conv(seed, n, cin, h, w, cout, kernel, stride=1, pad=0, in_dtype="int8",
                out_dtype="int8", zx=0, **kw):
    rng = np.random.default_rng(seed)
    layer = conv_layer(rng, "conv", "x", "y", cin, cout, kernel, stride, pad, zx, in_dtype,
                       out_dtype, **kw)
    out = conv_output_shape(layer, (n, cin, h, w))
    graph = LayerGraph({"x": Tensor("x", (n, cin, h, w), in_dtype),
                        "y": Tensor("y", out, out_dtype)}, [layer], ["x"], ["y"])
    return graph, {"x": random_input(rng, (n, cin, h, w), in_dtype)}


def random_input(rng, shape, dtype):
    lo, hi = RANGE[dtype]
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


def run_exact(graph, inputs, cfg_name, knobs=None):
    cfg = load_config(cfg_name)
    prog = plan(graph, cfg, knobs)
    outs, stats = execute_program(prog, inputs, cfg)
    ref = reference_execute(graph, inputs)
    for name in graph.outputs:
        assert outs[name].dtype == ref[name].dtype
        np.testing.assert_array_equal(outs[name], ref[name], err_msg=name)
    return prog, stats


# --- convolutions -----------------------------------------------------------------------------
# (n, cin, hw, cout, kernel, stride, pad)
CONV_CASES = [
    (1, 16, 8, 16, 1, 1, 0),
    (1, 3, 9, 24, 3, 1, 1),
    (2, 24, 7, 16, 3, 2, 2),
    (1, 64, 6, 100, 5, 1, 2),
    (1, 100, 8, 64, 5, 2, 0),
    (1, 3, 11, 16, 7, 2, 3),
    (2, 16, 6, 3, 1, 2, 1),
    (1, 64, 9, 24, 7, 1, 3),
]


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("n, cin, hw, cout, kernel, stride, pad", CONV_CASES)
def test_conv_kernels_strides_padding_and_channels_are_bit_exact(cfg_name, n, cin, hw, cout,
                                                                 kernel, stride, pad):
    graph, inputs = single_conv(hash((n, cin, hw, cout, kernel)) % 1000, n, cin, hw, hw, cout,
                                kernel, stride, pad)
    prog, _ = run_exact(graph, inputs, cfg_name)
    ly = prog.layers[0]
    assert ly.op == "conv2d" and ly.macs > 0 and ly.padded_macs >= ly.macs
    assert ISA(load_config(cfg_name)).decode_stream(ly.insns)[-1] == FinishInsn()


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("in_dtype, zx, out_dtype", [
    ("uint8", 128, "uint8"),   # stored zero point 0: LOAD zero padding
    ("uint8", 101, "int8"),    # stored zero point -27: halo filled with -27
    ("int8", -7, "uint8"),     # halo filled with -7
    ("int8", 0, "int8"),
])
def test_uint8_tensors_and_nonzero_zero_points_are_bit_exact(cfg_name, in_dtype, zx, out_dtype):
    graph, inputs = single_conv(3, 2, 24, 7, 9, 16, 3, 1, 1, in_dtype, out_dtype, zx)
    prog, _ = run_exact(graph, inputs, cfg_name)
    stored_zx = zx - 128 if in_dtype == "uint8" else zx
    x = prog.tensors["x"]
    if stored_zx:
        assert x.halo == (1, 1, 1, 1) and x.fill == stored_zx
    else:
        assert x.halo == (0, 0, 0, 0)


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("per_channel", [True, False])
def test_per_channel_and_per_tensor_multipliers_are_bit_exact(cfg_name, per_channel):
    graph, inputs = single_conv(5, 1, 16, 6, 6, 24, 3, 1, 1, per_channel=per_channel)
    run_exact(graph, inputs, cfg_name)


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_conv_with_fused_relu_is_bit_exact(cfg_name):
    graph, inputs = single_conv(6, 1, 24, 8, 8, 24, 3, 1, 1, "uint8", "uint8", 128, relu=True)
    assert graph.layers[0].requant.qmin == graph.layers[0].requant.zero_point
    run_exact(graph, inputs, cfg_name)


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_speech_kernel_20x5_with_stride_2_is_bit_exact(cfg_name):
    graph, inputs = single_conv(7, 1, 1, 17, 60, 32, (5, 20), 2, 0)
    prog, _ = run_exact(graph, inputs, cfg_name)
    assert "k5x20 s2" in prog.layers[0].shape


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_padding_beyond_the_load_limit_reads_a_zero_halo(cfg_name):
    graph, inputs = single_conv(8, 1, 16, 4, 5, 16, 3, 1, (17, 16, 2, 0))
    prog, _ = run_exact(graph, inputs, cfg_name)
    assert prog.tensors["x"].halo == (17, 16, 2, 0) and prog.tensors["x"].fill == 0


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_tiles_lying_entirely_in_the_padding_produce_the_bias(cfg_name):
    # 1x1 kernel, stride 2, pad 3: the first output row/column reads only padding
    graph, inputs = single_conv(9, 1, 32, 7, 7, 32, 1, 2, 3)
    run_exact(graph, inputs, cfg_name, {"conv": {"tile_h": 1, "tile_w": 1}})


# --- dense, add, chains -------------------------------------------------------------------------
@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("n, cin, cout, in_dtype", [(1, 100, 24, "int8"), (2, 16, 3, "uint8"),
                                                    (9, 300, 100, "int8")])
def test_dense_is_bit_exact(cfg_name, n, cin, cout, in_dtype):
    rng = np.random.default_rng(n + cin)
    zx = 128 + 3 if in_dtype == "uint8" else 0
    layer = conv_layer(rng, "fc", "x", "y", cin, cout, 1, zx=zx, in_dtype=in_dtype, dense=True,
                       relu=True)
    graph = LayerGraph({"x": Tensor("x", (n, cin), in_dtype), "y": Tensor("y", (n, cout), "int8")},
                       [layer], ["x"], ["y"])
    prog, _ = run_exact(graph, {"x": random_input(rng, (n, cin), in_dtype)}, cfg_name)
    assert prog.layers[0].op == "dense"
    assert set(prog.layers[0].knobs) == {"tile_b", "tile_ci", "tile_co", "oc_nthread"}


def residual_graph(seed, n=1, c=24, hw=7, dtypes=("uint8", "int8", "uint8")):
    """conv(3x3) -> t ; conv(3x3, zero point != 0 -> halo on t) -> u ; add(t, u) -> v."""
    rng = np.random.default_rng(seed)
    d0, d1, d2 = dtypes
    z0 = 128 if d0 == "uint8" else 0
    c1 = conv_layer(rng, "c1", "x", "t", c, c, 3, 1, 1, z0, d0, d1)
    z1 = c1.requant.zero_point
    c2 = conv_layer(rng, "c2", "t", "u", c, c, 3, 1, 1, z1, d1, d1, relu=True)
    zo = 128 + 5 if d2 == "uint8" else 5
    shift = 12
    lo, hi = RANGE[d2]
    rq = Requant(0, np.array([1]), np.array([1 << (shift - 1)]), shift, zo, lo, hi)
    add = AddLayer("add", ("t", "u"), "v", z1, c2.requant.zero_point, 1500, 2900, rq)
    shape = (n, c, hw, hw)
    graph = LayerGraph({"x": Tensor("x", shape, d0), "t": Tensor("t", shape, d1),
                        "u": Tensor("u", shape, d1), "v": Tensor("v", shape, d2)},
                       [c1, c2, add], ["x"], ["v"])
    return graph, {"x": random_input(rng, shape, d0)}


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_conv_followed_by_residual_add_is_bit_exact(cfg_name):
    graph, inputs = residual_graph(11, n=2)
    prog, stats = run_exact(graph, inputs, cfg_name)
    assert [ly.op for ly in prog.layers] == ["conv2d", "conv2d", "add"]
    assert [name for name, _ in stats] == ["c1", "c2", "add"]
    assert stats[2][1].gemm_uop_iters == 0 and stats[2][1].alu_uop_iters > 0


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_two_layer_chain_reads_the_halo_of_the_intermediate_tensor(cfg_name):
    rng = np.random.default_rng(12)
    c1 = conv_layer(rng, "c1", "x", "t", 16, 24, 3, 1, 1, zp=-9)
    c2 = conv_layer(rng, "c2", "t", "y", 24, 16, 5, 1, 2, zx=-9)
    graph = LayerGraph({"x": Tensor("x", (1, 16, 8, 8), "int8"),
                        "t": Tensor("t", (1, 24, 8, 8), "int8"),
                        "y": Tensor("y", (1, 16, 8, 8), "int8")}, [c1, c2], ["x"], ["y", "t"])
    prog, _ = run_exact(graph, {"x": random_input(rng, (1, 16, 8, 8), "int8")}, cfg_name)
    assert prog.tensors["t"].halo == (2, 2, 2, 2) and prog.tensors["t"].fill == -9


# --- knobs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("knobs", [
    {"tile_h": 3, "tile_w": 5, "tile_ci": 1, "tile_co": 1, "oc_nthread": 2, "h_nthread": 1},
    {"tile_h": 2, "tile_w": 9, "tile_ci": 2, "tile_co": 2, "oc_nthread": 1, "h_nthread": 2},
    {"tile_h": 4, "tile_w": 3, "tile_ci": 1, "tile_co": 2, "oc_nthread": 1, "h_nthread": 1},
    {"tile_b": 1, "tile_h": 1, "tile_w": 9, "tile_ci": 3, "tile_co": 1, "oc_nthread": 2},
])
def test_non_default_knobs_and_both_virtual_threads_are_bit_exact(cfg_name, knobs):
    cfg = load_config(cfg_name)
    graph, inputs = single_conv(13, 2, 40, 10, 9, 40, 3, 1, 1, "int8", "int8", 4)
    prog, _ = run_exact(graph, inputs, cfg_name, {"conv": knobs})
    full = prog.layers[0].knobs
    assert knob_space(graph.layers[0], (2, 40, 10, 9), cfg).is_valid(full)
    assert {k: full[k] for k in knobs} == knobs
    if 2 in (full["oc_nthread"], full["h_nthread"]):
        # the two threads use the two halves of INP
        isa = ISA(cfg)
        inp = {i.sram_base for i in isa.decode_stream(prog.layers[0].insns)
               if isinstance(i, MemInsn) and i.opcode == 0 and i.memory_type == 2}
        assert min(inp) < cfg.inp_depth // 2 <= max(inp)


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_random_feasible_knobs_are_bit_exact(cfg_name):
    cfg = load_config(cfg_name)
    r = random.Random(14)
    for seed in range(6):
        graph, inputs = single_conv(seed, 1 + seed % 2, 24 + 8 * seed, 7, 6 + seed, 20, 3,
                                    1 + seed % 2, 1, "int8", "int8", seed % 3)
        space = knob_space(graph.layers[0], graph.tensors["x"].shape, cfg)
        run_exact(graph, inputs, cfg_name, {"conv": space.sample(r)})


def test_virtual_threads_overlap_loads_with_gemms():
    graph, inputs = single_conv(15, 1, 64, 16, 16, 64, 3, 1, 1)
    base = {"tile_h": 4, "tile_w": 16, "tile_ci": 2, "tile_co": 4}
    stats = {}
    for mode in [(1, 1), (2, 1), (1, 2)]:
        kn = dict(base, oc_nthread=mode[0], h_nthread=mode[1])
        _, st = run_exact(graph, inputs, "vta_1x16x16", {"conv": kn})
        stats[mode] = st[0][1]
    for mode in [(2, 1), (1, 2)]:
        # the compute module waits far less for loads, so the layer finishes earlier
        assert stats[mode].compute_stall < 0.5 * stats[(1, 1)].compute_stall
        assert stats[mode].cycles < stats[(1, 1)].cycles


def test_resnet_sized_layer_uses_few_instructions():
    cfg = load_config("vta_1x16x16")
    graph, _ = single_conv(16, 1, 64, 56, 56, 64, 3, 1, 1)
    prog = plan(graph, cfg)
    assert prog.layers[0].n_insns < 400  # one GEMM per tile and chunk, whole-tile ALU ops


def test_unmappable_layers_raise_an_accel_error_naming_the_layer():
    cfg = load_config("vta_1x16x16")
    graph, _ = single_conv(18, 1, 16, 6, 6, 16, 3, 1, 1)
    graph.layers[0].weight = graph.layers[0].weight * 4
    with pytest.raises(MappingError, match="conv") as e:
        plan(graph, cfg)
    assert isinstance(e.value, AccelError) and "int8" in str(e.value)


# --- runtime ------------------------------------------------------------------------
def test_execute_program_writes_one_trace_for_all_layers(tmp_path):
    graph, inputs = residual_graph(21)
    cfg = load_config("vta_1x16x16")
    prog = plan(graph, cfg)
    path = tmp_path / "trace.json"
    _, stats = execute_program(prog, inputs, cfg, trace_path=str(path))
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    n = sum(1 for e in events if e.get("ph") == "X")
    assert n == sum(s.load_insns + s.compute_insns + s.store_insns for _, s in stats)
    with pytest.raises(AccelError, match="x"):
        execute_program(prog, {}, cfg)


def test_micro_op_kernels_that_do_not_fit_together_are_loaded_on_demand():
    from tvm_vta_cp.hw_config import config_from_dict

    base = load_config("vta_1x16x16").to_json()
    cfg = config_from_dict(dict(base, LOG_UOP_BUFF_SIZE=8), name="small_uop")  # 64 micro-ops
    graph, inputs = single_conv(22, 1, 16, 9, 11, 40, 3, 1, 1)
    prog = plan(graph, cfg, {"conv": {"tile_h": 2, "tile_w": 3, "tile_co": 2, "h_nthread": 2}})
    outs, _ = execute_program(prog, inputs, cfg)
    np.testing.assert_array_equal(outs["y"], reference_execute(graph, inputs)["y"])
    uop_loads = [i for i in ISA(cfg).decode_stream(prog.layers[0].insns)
                 if isinstance(i, MemInsn) and i.opcode == 0 and i.memory_type == 0 and i.x_size]
    assert len(uop_loads) > 1


def test_a_program_beyond_vtas_4_gib_of_dram_is_refused_at_compile_time():
    """A 1x64x8192x8192 conv needs 8 GiB of activations: a mapping error (the compile falls
    back to the CPU), before any instruction is generated."""
    from tvm_accel.errors import MappingError

    layer = conv_layer(np.random.default_rng(0), "conv", "x", "y", 64, 64, 3, 1, 1)
    shape = (1, 64, 8192, 8192)
    graph = LayerGraph({"x": Tensor("x", shape, "int8"), "y": Tensor("y", shape, "int8")},
                       [layer], ["x"], ["y"])
    with pytest.raises(MappingError, match="bytes of DRAM"):
        plan(graph, load_config("vta_1x16x16"))
