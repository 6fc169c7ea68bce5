"""Strategy on layer graphs built directly (no TVM): RBE / cluster mapping, tiling, double
buffering, mixed precision (sub-byte ``Tensor.bits`` / ``ConvLayer.weight_bits``), bit-exact
against ``reference_execute`` on the simulator."""

import numpy as np
import pytest

from tvm_accel.errors import MappingError
from tvm_accel.layers import (
    AddLayer,
    ConvLayer,
    LayerGraph,
    PoolLayer,
    Tensor,
    reference_execute,
)
from tvm_marsellus import codegen as cg
from tvm_marsellus import numerics, strategy
from tvm_marsellus.hw_config import load_config
from tvm_marsellus.runtime import execute_program
from tvm_marsellus.simulator import simulate

CFG = load_config()


def _rng(bits, signed):
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def conv(rng, name, inp, out, cin, cout, k, s=1, wbits=8, obits=8, osigned=True, izp=0,
         groups=1, dense=False, relu=False):
    lo_w, hi_w = _rng(wbits, True)
    w = rng.integers(lo_w, hi_w + 1, (cout, cin // groups, k, k))
    b = rng.integers(-300, 300, cout)
    lo, hi = _rng(obits, osigned)
    sums = np.abs(w).reshape(cout, -1).sum(1)
    scale = rng.uniform(0.5, 1.5, cout) * (hi - lo) / (sums * 30 + 1)
    rq = numerics.requant_recipe(scale, sums * 255 + np.abs(b), lo // 3 if osigned else 1,
                                 0 if relu else lo, hi)
    return ConvLayer(name, inp, out, w, b, izp, (s, s), (k // 2,) * 4, rq, groups=groups,
                     weight_bits=wbits, is_dense=dense)


def check(rng, layers, tensors, inputs, outputs, knobs=None):
    g = LayerGraph(tensors, layers, inputs, outputs)
    xs = {}
    for n in inputs:
        t = tensors[n]
        lo, hi = _rng(t.bits, t.dtype == "int8")
        xs[n] = rng.integers(lo, hi + 1, t.shape).astype(t.dtype)
    ref = reference_execute(g, xs)
    prog = strategy.plan(g, CFG, knobs)
    outs, [(_, stats)] = execute_program(prog, xs, CFG, whole_stream=True)
    for n in outputs:
        np.testing.assert_array_equal(outs[n], ref[n])
    return prog, stats


def T(name, shape, bits=8, dtype="int8"):
    return Tensor(name, shape, dtype, bits)


@pytest.mark.parametrize("w", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("i", [2, 3, 4, 5, 8])
def test_rbe_precision_grid_is_bit_exact(w, i):
    """W x I over {2,3,4,5,8}, O cycling over the same set; a 3x3 into a 1x1/2 keeps the
    intermediate in the RBE bit-plane layout (offset-unsigned)."""
    rng = np.random.default_rng(10 * w + i)
    o = [2, 3, 4, 5, 8][(w + i) % 5]
    signed = bool((w + i) % 2)
    dt = "int8" if signed else "uint8"
    zp = -1 if signed else 1
    layers = [conv(rng, "c1", "x", "y", 32, 40, 3, wbits=w, obits=o, osigned=signed, izp=zp),
              conv(rng, "c2", "y", "z", 40, 24, 1, s=2, wbits=w, obits=o, osigned=signed,
                   izp=0)]
    prog, _ = check(rng, layers, {"x": T("x", (1, 32, 6, 6), i, dt),
                                  "y": T("y", (1, 40, 6, 6), o, dt),
                                  "z": T("z", (1, 24, 3, 3), o, dt)}, ["x"], ["z"])
    assert [ly.engine for ly in prog.layers] == ["rbe", "rbe"]
    assert prog.tensors["y"].layout == "rbe" and prog.tensors["y"].bits == o
    job = next(c for c in prog.layers[0].commands if isinstance(c, cg.RbeJob))
    assert (job.w_bits, job.in_bits, job.out_bits) == (w, i, o)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_cluster_kernels_at_sub_byte_widths(bits):
    """Depthwise, 5x5 conv, add and pools on the cores at 2 / 4 / 8 bits."""
    rng = np.random.default_rng(bits)
    a_rq = numerics.add_recipe(0.6, 0.45, -1, *_rng(bits, True))
    avg = numerics.avgpool_recipe(np.full(1, 0.25), 4 * 255, 0, *_rng(bits, True))
    layers = [conv(rng, "dw", "x", "a", 16, 16, 3, wbits=bits, obits=bits, groups=16),
              conv(rng, "c5", "a", "b", 16, 16, 5, wbits=min(bits, 4) + (bits == 3),
                   obits=bits),
              AddLayer("add", ("a", "b"), "c", 0, 1, a_rq[0], a_rq[1], a_rq[2]),
              PoolLayer("mp", "c", "d", "max", (3, 3), (2, 2), (1, 1, 1, 1)),
              PoolLayer("ap", "d", "e", "avg", (2, 2), (2, 2), (0, 0, 0, 0), requant=avg)]
    sh = {"x": (1, 16, 8, 8), "a": (1, 16, 8, 8), "b": (1, 16, 8, 8), "c": (1, 16, 8, 8),
          "d": (1, 16, 4, 4), "e": (1, 16, 2, 2)}
    prog, _ = check(rng, layers, {n: T(n, s, bits) for n, s in sh.items()}, ["x"], ["e"])
    assert {ly.engine for ly in prog.layers} == {"cluster"}
    kern = next(c for c in prog.layers[0].commands if isinstance(c, cg.ClusterKernel))
    assert kern.in_bits == kern.out_bits == bits


def test_odd_widths_round_up_to_the_cluster_container():
    """3-bit activations and weights run at 4 bits on the cores; a dense head on the cluster."""
    rng = np.random.default_rng(3)
    layers = [conv(rng, "c", "x", "y", 12, 16, 3, wbits=3, obits=4),
              conv(rng, "fc", "f", "z", 20, 10, 1, wbits=3, obits=8, dense=True)]
    layers[0].strides = (1, 1)
    g_t = {"x": T("x", (1, 12, 5, 5), 3), "y": T("y", (1, 16, 5, 5), 4),
           "f": T("f", (2, 20), 5), "z": T("z", (2, 10))}
    knobs = {"c": {"engine": "cluster"}}
    prog, _ = check(rng, layers, g_t, ["x", "f"], ["y", "z"], knobs)
    k = next(c for c in prog.layers[0].commands if isinstance(c, cg.ClusterKernel))
    assert (k.in_bits, k.w_bits, k.out_bits) == (4, 4, 4)


def test_tiles_and_double_buffering_overlap_dma_and_compute():
    rng = np.random.default_rng(1)
    layers = [conv(rng, "c1", "x", "y", 16, 64, 3), conv(rng, "c2", "y", "z", 64, 40, 3, s=2)]
    knobs = {"c1": {"tile_h": 3, "tile_k": 32}, "c2": {"tile_h": 2, "tile_k": 32}}
    prog, st = check(rng, layers, {"x": T("x", (1, 16, 12, 12)), "y": T("y", (1, 64, 12, 12)),
                                   "z": T("z", (1, 40, 6, 6))}, ["x"], ["z"], knobs)
    assert [ly.meta["tiles"] for ly in prog.layers] == [8, 6]
    # each layer alone is a valid, balanced stream; DMA overlaps the RBE
    one = simulate(CFG, cg.encode_stream(prog.layers[0].commands))
    assert one.cycles < one.rbe_busy + one.dma_in_busy + one.dma_out_busy + one.cluster_busy


def test_solver_tile_fits_l1_and_prefers_rbe_friendly_shapes():
    rng = np.random.default_rng(2)
    layer = conv(rng, "c", "x", "y", 64, 64, 3)
    g = LayerGraph({"x": T("x", (1, 64, 32, 32)), "y": T("y", (1, 64, 32, 32))}, [layer],
                   ["x"], ["y"])
    spaces = strategy.layer_knob_spaces(g, CFG)
    d = spaces["c"].default()
    assert d["engine"] == "rbe" and d["tile_k"] % 32 == 0
    p = strategy.Planner(g, CFG)
    p._choose()
    p._layer(layer)
    lay = p.layers["c"]
    assert lay.fits(d["tile_h"], d["tile_k"])
    assert all(lay.cost(d["tile_h"], d["tile_k"]) <= lay.cost(th, kt) + 1e-9
               for th, kt in lay.candidates())
    with pytest.raises(MappingError, match="does not fit L1"):
        strategy.plan(g, CFG, {"c": {"tile_h": 32, "tile_k": 64}})


def test_invalid_knobs_and_unmappable_layers_are_reported():
    rng = np.random.default_rng(4)
    layer = conv(rng, "c", "x", "y", 8, 8, 5)
    g = LayerGraph({"x": T("x", (1, 8, 6, 6)), "y": T("y", (1, 8, 6, 6))}, [layer], ["x"], ["y"])
    with pytest.raises(MappingError, match="not a valid option"):
        strategy.plan(g, CFG, {"c": {"tile_h": 99}})
    with pytest.raises(MappingError, match="engine rbe: kernel 5x5"):
        strategy.plan(g, CFG, {"c": {"engine": "rbe"}})
    # a 3-bit result cannot come from the cluster (it clamps at 2/4/8 bits)
    layer = conv(rng, "c", "x", "y", 8, 8, 5, obits=3)
    g = LayerGraph({"x": T("x", (1, 8, 6, 6)), "y": T("y", (1, 8, 6, 6), 3)}, [layer], ["x"],
                   ["y"])
    with pytest.raises(MappingError, match="4-bit signed range"):
        strategy.plan(g, CFG)


def test_normquant_recipe_is_the_engine_arithmetic():
    rng = np.random.default_rng(5)
    scale = rng.uniform(1e-4, 1e-2, 16)
    rq = numerics.requant_recipe(scale, 200_000, -7, -128, 127)
    assert rq.pre_shift == 0 and rq.multiplier.max() <= numerics.KAPPA_MAX
    err = numerics.approximation_error(rq, 200_000)
    assert err.max_rel_error < 5e-3 and err.max_lsb_error < 0.5
    folded = rng.integers(-20_000, 20_000, 16)
    kappa, lam, shift = numerics.normquant_params(rq, folded)
    acc = rng.integers(-200_000, 200_000, (64, 16))
    ref = rq.apply(acc + folded, channel_axis=1)
    np.testing.assert_array_equal(cg.normquant(acc, kappa, lam, shift, 8, True, False), ref)
    ma, mb, arq = numerics.add_recipe(0.7, 1.3, 3, -128, 127)
    assert max(ma, mb) <= numerics.KAPPA_MAX and abs(ma / 2 ** arq.shift - 0.7) < 1e-3


def test_weights_that_do_not_fit_l2_are_staged_from_l3():
    from dataclasses import replace

    rng = np.random.default_rng(6)
    small = replace(CFG, L2_BYTES=96 * 1024)
    layers = [conv(rng, "c1", "x", "y", 64, 96, 3), conv(rng, "c2", "y", "z", 96, 64, 3)]
    g = LayerGraph({"x": T("x", (1, 64, 8, 8)), "y": T("y", (1, 96, 8, 8)),
                    "z": T("z", (1, 64, 8, 8))}, layers, ["x"], ["z"])
    prog = strategy.plan(g, small)
    assert prog.l3_bytes > 0 and not prog.l2_image and prog.l2_bytes <= small.L2_BYTES
    xs = {"x": rng.integers(-128, 128, (1, 64, 8, 8)).astype(np.int8)}
    outs, [(_, st)] = execute_program(prog, xs, small, whole_stream=True)
    np.testing.assert_array_equal(outs["z"], reference_execute(g, xs)["z"])
    # one I/O DMA copy per weight group (each read from L3 once) into its L2 slot
    fetches = [c for ly in prog.layers for c in ly.commands
               if isinstance(c, cg.Dma) and c.src_mem == "L3"]
    groups = sum(-(-k // lp.meta["tile_k"]) for k, lp in zip((96, 64), prog.layers, strict=True))
    assert len(fetches) == groups
    assert 0.99 * prog.l3_bytes < st.l3_read_bytes <= prog.l3_bytes


@pytest.mark.parametrize("biased", [True, False])
def test_signed_hwc_between_kernels_is_stored_biased(biased):
    """A signed tensor from a cluster conv into an RBE conv and a residual add on the cluster
    (the knob: on the RBE the tensor would be in bit planes) is stored unsigned with the offset
    2^(bits-1), so the RBE input needs no CL.ADD marshaling step."""
    rng = np.random.default_rng(7)
    a_rq = numerics.add_recipe(0.5, 0.5, 0, -128, 127)
    layers = [conv(rng, "c5", "x", "a", 16, 32, 5), conv(rng, "c3", "a", "b", 32, 32, 3),
              AddLayer("add", ("a", "b"), "c", 2, -1, a_rq[0], a_rq[1], a_rq[2]),
              conv(rng, "c1", "c", "d", 32, 16, 1)]
    sh = {"x": (1, 16, 8, 8), "a": (1, 32, 8, 8), "b": (1, 32, 8, 8), "c": (1, 32, 8, 8),
          "d": (1, 16, 8, 8)}
    prog, _ = check(rng, layers, {n: T(n, s) for n, s in sh.items()}, ["x"], ["d"],
                    {"biased_hwc": biased, "add": {"engine": "cluster"}})
    assert prog.tensors["a"].layout == "hwc"
    assert (not prog.tensors["a"].signed) == biased
    adds = [c for c in prog.layers[1].commands if isinstance(c, cg.ClusterKernel)
            and c.kernel == "ADD"]
    assert len(adds) == (0 if biased else 1)


@pytest.mark.parametrize("engine", ["rbe", "cluster"])
def test_fused_relu_on_signed_outputs(engine):
    """A signed output clipped at 0 (ReLU) uses the engine's ReLU flag on RBE and cluster."""
    rng = np.random.default_rng(8)
    layers = [conv(rng, "c", "x", "y", 32, 32, 3, relu=True)]
    prog, _ = check(rng, layers, {"x": T("x", (1, 32, 6, 6)), "y": T("y", (1, 32, 6, 6))},
                    ["x"], ["y"], {"c": {"engine": engine}})
    cmd = next(c for c in prog.layers[0].commands
               if isinstance(c, (cg.RbeJob, cg.ClusterKernel)) and c.relu)
    assert cmd.engine == engine.upper()


def test_a_stem_the_cores_run_faster_goes_to_the_cores_under_both_objectives():
    """A 3-channel stem fills 3 of the RBE's 32 BinConv channels: the cores run it ~2x
    faster, and since the RBE's power is mostly time-proportional (Fig. 15) that also costs
    less energy than on the RBE, though the cores then write its output in bit planes for the
    RBE reader. Both objectives pick the cores; the simulator agrees against the stem pinned
    to the RBE: fewer cycles and less energy. All bit-exact."""
    from tvm_marsellus.energy import NOMINAL, energy_uj

    runs = {}
    for name, knobs in (("energy", {"objective": "energy"}),
                        ("latency", {"objective": "latency"}),
                        ("rbe", {"stem": {"engine": "rbe"}})):
        rng = np.random.default_rng(2)
        layers = [conv(rng, "stem", "x", "y", 3, 16, 3), conv(rng, "c1", "y", "z", 16, 16, 3)]
        ts = {"x": T("x", (1, 3, 16, 16)), "y": T("y", (1, 16, 16, 16)),
              "z": T("z", (1, 16, 16, 16))}
        prog, stats = check(rng, layers, ts, ["x"], ["z"], knobs)
        runs[name] = ([ly.engine for ly in prog.layers], stats.cycles, energy_uj(stats, NOMINAL))
    assert runs["energy"][0] == runs["latency"][0] == ["cluster", "rbe"]
    assert runs["rbe"][0] == ["rbe", "rbe"]
    assert runs["energy"][1] < runs["rbe"][1] and runs["energy"][2] < runs["rbe"][2]


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_next_layers_first_weights_and_window_load_during_the_previous_layer(prefetch):
    """Weights depend on no tensor: when two layers' L1 maps are disjoint (the second at the
    top of L1), the first layer's stream ends by loading the second's first weight group and,
    once the rows it reads are stored (semaphore 15, signalled by that store), its first input
    window; the second layer's first step then starts on a NOP. Bit-exact run per layer (L1
    carries over) and as one stream; ``prefetch_weights: False`` keeps the loads apart."""
    rng = np.random.default_rng(5)
    layers = [conv(rng, "c1", "x", "y", 32, 32, 3, wbits=4, obits=4, osigned=False),
              conv(rng, "c2", "y", "z", 32, 64, 3, wbits=4, obits=4, osigned=False)]
    ts = {"x": T("x", (1, 32, 12, 12), 4, "uint8"), "y": T("y", (1, 32, 12, 12), 4, "uint8"),
          "z": T("z", (1, 64, 12, 12), 4, "uint8")}
    prog, _ = check(rng, layers, ts, ["x"], ["z"], {"prefetch_weights": prefetch})
    c1, c2 = prog.layers
    assert [c1.engine, c2.engine] == ["rbe", "rbe"]
    job = next(c for c in c2.commands if isinstance(c, cg.RbeJob))
    into = [c for c in c1.commands if isinstance(c, cg.Dma) and c.dst in (job.w_ptr, job.x_ptr)]
    before_job = c2.commands[:c2.commands.index(job)]
    own = [c for c in before_job if isinstance(c, cg.Dma) and c.dst_mem == "L1"]
    if prefetch:
        assert [c.dst for c in into] == [job.w_ptr, job.x_ptr] and own == []
        assert into[1].wait == (15,)
        assert sum(15 in c.signal for c in c1.commands if isinstance(c, cg.Dma)) == 1
    else:
        assert into == [] and [c.dst for c in own] == [job.w_ptr, job.x_ptr]
    g = LayerGraph(ts, layers, ["x"], ["z"])
    xs = {"x": rng.integers(0, 16, (1, 32, 12, 12)).astype("uint8")}
    outs, stats = execute_program(prog, xs, CFG)
    np.testing.assert_array_equal(outs["z"], reference_execute(g, xs)["z"])
    assert [n for n, _ in stats] == ["c1", "c2"]
