"""Three-level memory (L3/L2/L1): activations and weights that do not fit L2 live in L3 and are
streamed through L2 bounce slots by the I/O DMA, bit-exact on both engines."""

import numpy as np
import pytest

from tvm_accel.errors import MappingError
from tvm_accel.layers import LayerGraph, reference_execute
from tvm_marsellus import codegen as cg
from tvm_marsellus import strategy
from tvm_marsellus.runtime import execute_program

from .test_marsellus_strategy import CFG, T, conv

# (input N, C, H, W, output channels, kernel, stride): the layers beyond L2
BIG = {
    "64x112x112-3x3": ((1, 64, 112, 112), 64, 3, 1),
    "512x28x28-1x1-s2": ((1, 512, 28, 28), 1024, 1, 2),
    "2048x7x7-1x1": ((1, 2048, 7, 7), 512, 1, 1),
}


def _run(g, xs, cfg=CFG, knobs=None):
    prog = strategy.plan(g, cfg, knobs)
    outs, [(_, stats)] = execute_program(prog, xs, cfg, whole_stream=True)
    return prog, outs, stats


@pytest.mark.parametrize("case, engine", [(c, e) for c in BIG for e in ("rbe", "cluster")])
def test_layers_beyond_l2_run_bit_exact_through_l3(case, engine):
    shape, k, kernel, stride = BIG[case]
    rng = np.random.default_rng(3)
    layer = conv(rng, "c", "x", "y", shape[1], k, kernel, s=stride)
    ho = (shape[2] + 2 * (kernel // 2) - kernel) // stride + 1
    g = LayerGraph({"x": T("x", shape), "y": T("y", (1, k, ho, ho))}, [layer], ["x"], ["y"])
    xs = {"x": rng.integers(-128, 128, shape).astype(np.int8)}
    prog, outs, stats = _run(g, xs, knobs={"c": {"engine": engine}})
    np.testing.assert_array_equal(outs["y"], reference_execute(g, xs)["y"])
    assert prog.l2_bytes <= CFG.L2_BYTES and prog.l3_bytes > 0
    assert stats.iodma_busy > 0 and stats.l3_read_bytes > 0
    assert {c.engine for c in prog.layers[0].commands if not isinstance(c, cg.Nop)} >= {
        "IODMA", "RBE" if engine == "rbe" else "CLUSTER"}


def test_a_chain_spills_its_largest_tensors_to_l3_and_streams_them():
    """Two convs on a small L2: the largest tensors go to L3 (inputs, outputs and the
    intermediate alike), each tile is fetched / drained through the bounce slots, and the
    intermediate written to L3 by one layer is read back by the next."""
    from dataclasses import replace

    rng = np.random.default_rng(4)
    small = replace(CFG, L2_BYTES=48 * 1024)
    layers = [conv(rng, "c1", "x", "y", 32, 32, 3), conv(rng, "c2", "y", "z", 32, 32, 3)]
    sh = (1, 32, 32, 32)
    g = LayerGraph({n: T(n, sh) for n in "xyz"}, layers, ["x"], ["z"])
    xs = {"x": rng.integers(-128, 128, sh).astype(np.int8)}
    prog, outs, stats = _run(g, xs, small)
    np.testing.assert_array_equal(outs["z"], reference_execute(g, xs)["z"])
    in_l3 = {n for n, t in prog.tensors.items() if t.mem == "L3"}
    assert "y" in in_l3 and prog.l2_bytes <= small.L2_BYTES
    assert stats.l3_write_bytes >= 32 * 32 * 32  # at least the intermediate went out


def test_without_l3_a_function_beyond_l2_is_a_mapping_error():
    from dataclasses import replace

    shape, k, kernel, stride = BIG["512x28x28-1x1-s2"]
    rng = np.random.default_rng(5)
    g = LayerGraph({"x": T("x", shape), "y": T("y", (1, k, 14, 14))},
                   [conv(rng, "c", "x", "y", shape[1], k, kernel, s=stride)], ["x"], ["y"])
    with pytest.raises(MappingError, match="no L3"):
        strategy.plan(g, replace(CFG, L3_BYTES=0))


@pytest.mark.parametrize("engine", ["rbe", "cluster"])
@pytest.mark.parametrize("forced", [False, True])
def test_w_tiling_when_a_full_width_tile_does_not_fit_l1_is_bit_exact(engine, forced):
    """A wide layer on a small L1: the tile spans part of the width (input windows with their
    column halo, strided stores; with tile_k < K the stores are 3-D) or, on the cores, maybe
    part of the input channels; bit-exact on both engines, also with the output in L3."""
    from dataclasses import replace

    rng = np.random.default_rng(6)
    # the smallest L1 each engine's tile needs with W tiling (RBE weights come 32 channels
    # at a time), too small for a full-width tile
    cfg = replace(CFG, L1_BYTES=(48 if engine == "rbe" else 16) * 1024, L2_BYTES=40 * 1024)
    shape = (1, 32, 6, 96)
    layer = conv(rng, "c", "x", "y", 32, 64, 3)
    g = LayerGraph({"x": T("x", shape), "y": T("y", (1, 64, 6, 96))}, [layer], ["x"], ["y"])
    xs = {"x": rng.integers(-128, 128, shape).astype(np.int8)}
    knobs = {"tile_w": 5, "tile_k": 32 if engine == "rbe" else 8} if forced else {}
    prog, outs, stats = _run(g, xs, cfg, {"c": {"engine": engine, **knobs}})
    np.testing.assert_array_equal(outs["y"], reference_execute(g, xs)["y"])
    meta = prog.layers[0].meta
    assert stats.iodma_busy > 0
    # the cores may split the input channels instead (Kin tiling at the full width)
    assert meta["tile_w"] < 96 or (engine == "cluster" and not forced and meta["tile_c"] < 32)
    if forced:
        assert (meta["tile_w"], meta["tile_k"]) == (5, knobs["tile_k"])


@pytest.mark.parametrize("tile_k, tile_w", [(8, 7), (16, 4)])
def test_subword_output_tiles_keep_wide_3x3_layers_on_the_rbe(tile_k, tile_w):
    """A 3x3 conv over 512 channels (ResNet-18's stage 4): 32 output channels of 4-bit weights
    are 73.7 KiB, too many to double-buffer in L1, so the RBE runs 8- or 16-channel jobs whose
    outputs fill part of each bit-plane word of the next RBE layer's input, bit-exact (tiles
    of the full width and narrower)."""
    rng = np.random.default_rng(6)
    sh = (1, 512, 7, 7)
    layers = [conv(rng, "c1", "x", "y", 512, 512, 3, wbits=4, obits=4),
              conv(rng, "c2", "y", "z", 512, 64, 1, wbits=4)]
    g = LayerGraph({"x": T("x", sh, 4), "y": T("y", sh, 4), "z": T("z", (1, 64, 7, 7))},
                   layers, ["x"], ["z"])
    xs = {"x": rng.integers(-8, 8, sh).astype(np.int8)}
    default = strategy.plan(g, CFG)
    assert default.layers[0].engine == "rbe" and default.layers[0].meta["tile_k"] < 32
    prog, outs, _ = _run(g, xs, knobs={"c1": {"tile_k": tile_k, "tile_w": tile_w}})
    np.testing.assert_array_equal(outs["z"], reference_execute(g, xs)["z"])
    assert prog.tensors["y"].layout == "rbe" and prog.layers[0].engine == "rbe"
    jobs = [c for c in prog.layers[0].commands if isinstance(c, cg.RbeJob)]
    assert {j.k_out for j in jobs} == {tile_k}


def test_the_l3_link_keeps_its_bandwidth_in_time_when_the_cluster_clock_drops():
    slow = CFG.at_clock(100.0)
    assert slow.CLOCK_MHZ == 100.0 and CFG.at_clock(CFG.CLOCK_MHZ) is CFG
    assert slow.L3_BYTES_PER_CYCLE == pytest.approx(CFG.L3_BYTES_PER_CYCLE * 4.2)
    assert slow.L3_LATENCY_CYCLES == -(-CFG.L3_LATENCY_CYCLES * 100 // 420)
    assert slow.DMA_BYTES_PER_CYCLE == CFG.DMA_BYTES_PER_CYCLE  # the CLUSTER DMA: own cycles
    shape, k, kernel, stride = BIG["2048x7x7-1x1"]  # 1 MiB of weights through the I/O DMA
    rng = np.random.default_rng(4)
    g = LayerGraph({"x": T("x", shape), "y": T("y", (1, k, 7, 7))},
                   [conv(rng, "c", "x", "y", shape[1], k, kernel, s=stride)], ["x"], ["y"])
    xs = {"x": rng.integers(-128, 128, shape).astype(np.int8)}
    _, fast_out, fast = _run(g, xs)
    _, slow_out, at_100 = _run(g, xs, cfg=slow)
    np.testing.assert_array_equal(slow_out["y"], fast_out["y"])
    assert at_100.cycles < fast.cycles  # fewer CLUSTER cycles wait for the same bytes


def test_a_compile_at_an_operating_point_carries_its_clock_in_the_blob():
    from tvm_marsellus import OP_KNOB, TARGET
    from tvm_marsellus.runtime import decode_blob

    shape, k, kernel, stride = BIG["2048x7x7-1x1"]
    rng = np.random.default_rng(5)
    g = LayerGraph({"x": T("x", shape), "y": T("y", (1, k, 7, 7))},
                   [conv(rng, "c", "x", "y", shape[1], k, kernel, s=stride)], ["x"], ["y"])
    blob = TARGET.compile_function(g, CFG, {OP_KNOB: {"vdd": 0.5}})
    _, cfg, _ = decode_blob(np.frombuffer(blob, np.uint8))
    assert cfg.CLOCK_MHZ == 100.0 and cfg.L3_BYTES_PER_CYCLE == pytest.approx(4.2)
