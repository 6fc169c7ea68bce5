"""On-chip chains (DPUV3INT8): consecutive convs, and a whole ResNet bottleneck block, kept in
the feature-map memories band by band with halo keep; bit-exact against ``reference_execute``
and fewer DDR bytes than layer by layer (the simulator's byte counters)."""

import numpy as np
import pytest

from tvm_accel.layers import AddLayer, conv_output_shape
from tvm_dpu import codegen as cg
from tvm_dpu import fusion
from tvm_dpu.strategy import plan
from tvm_dpu.strategy.chains import _chain_knob_space

from .test_dpu_strategy import _conv, _graph, _rq, _run

OFF = {"@fusion": {"enabled": False}}


def _chain(specs, batch, hw, c0, add=None, seed=0):
    """Convs ``specs`` = [(out channels, kernel, stride, pad, depthwise)] in a row on an
    ``hw x hw x c0`` input; ``add``: close with an add of the last conv and the input ``"x"``
    (identity shortcut) or a second function input ``"b"``."""
    rng = np.random.default_rng(seed)
    layers, shapes, t, c = [], {"x": (batch, c0, hw, hw)}, "x", c0
    for i, (k, ksz, stride, pad, dw) in enumerate(specs):
        ly = _conv(rng, f"c{i}", t, f"t{i}", c, c if dw else k, ksz=ksz, stride=stride, pad=pad,
                   relu=i % 2 == 0, shift=10, dw=dw, zx=3 if i == 0 else 0)
        shapes[f"t{i}"] = conv_output_shape(ly, shapes[t])
        layers.append(ly)
        t, c = f"t{i}", shapes[f"t{i}"][1]
    inputs, outputs = ["x"], [t]
    if add:
        if add == "b":
            shapes["b"] = shapes[t]
            inputs.append("b")
        operands = (add, t) if seed % 2 else (t, add)
        layers.append(AddLayer("add", operands, "y", 0, 0, 1, 2, _rq(1, 1, lo=0)))
        shapes["y"], outputs = shapes[t], ["y"]
    return _graph(layers, shapes, inputs, outputs)


def _ddr_bytes(stats) -> int:
    return sum(s.ddr_read_bytes + s.ddr_write_bytes for _, s in stats)


def _name(g) -> str:
    return "+".join(ly.name for ly in g.layers)


def test_two_conv_chain_keeps_the_intermediate_on_chip_with_halo_keep(cfg):
    g = _chain([(32, 3, 1, 1, False), (24, 3, 1, 1, False)], batch=4, hw=24, c0=16)
    prog, st = _run(g, cfg, {"@fusion": {"c0+c1": True}, "c0+c1": {"tile_h": 8}})
    _, st_off = _run(g, cfg, OFF)
    assert [ly.op for ly in prog.layers] == ["conv2d+conv2d (on-chip chain)"]
    assert "t0" not in prog.tensors  # no DDR placement: the intermediate lives in FM
    assert _ddr_bytes(st) < _ddr_bytes(st_off)
    insns = cg.decode_stream(prog.layers[0].insns)
    saves = [i for i in insns if isinstance(i, cg.Save)]
    assert sum(s.rows for s in saves) == 24  # only the last conv's rows leave the chip
    # halo keep: the 3x3 consumer's 2 overlap rows are copied on chip, never recomputed
    copies = [i for i in insns if isinstance(i, cg.Copy)]
    assert copies and {c.out_h for c in copies} == {2}
    convs = [i for i in insns if isinstance(i, cg.Conv)]
    assert sum(c.out_h for c in convs) == 2 * 24


@pytest.mark.parametrize("specs, batch, hw, c0, add", [
    ([(32, 1, 1, 0, False), (32, 3, 2, 1, False), (48, 1, 1, 0, False)], 4, 20, 16, None),
    ([(16, 3, 2, 1, False), (16, 3, 1, 1, True), (24, 1, 1, 0, False)], 5, 33, 16, None),
    ([(16, 5, 1, 2, False), (16, 3, 2, 0, False)], 3, 23, 8, None),
    ([(32, 1, 1, 0, False), (32, 3, 2, 1, False), (64, 1, 1, 0, False)], 4, 20, 16, "b"),
], ids=["1x1-3x3s2-1x1", "two-image-groups-depthwise", "5x5-3x3s2", "projection-add"])
def test_three_and_two_conv_chains_are_bit_exact_for_every_band(cfg, specs, batch, hw, c0, add):
    g = _chain(specs, batch, hw, c0, add, seed=len(specs) + batch)
    name = _name(g)
    space = _chain_knob_space(g.layers, g.tensors["x"].shape, cfg)
    _, st_off = _run(g, cfg, OFF)
    for th in space["tile_h"].options:
        for pipe in (True, False):
            prog, st = _run(g, cfg, {"@fusion": {name: True}, name: {"tile_h": th,
                                                                     "pipeline": pipe}})
            assert [ly.name for ly in prog.layers] == [name]
            assert _ddr_bytes(st) < _ddr_bytes(st_off)


def _bottleneck(batch=4, hw=24, c=128, mid=32):
    rng = np.random.default_rng(21)
    c1 = _conv(rng, "conv1", "x", "t1", c, mid, ksz=1, pad=0, relu=True, shift=11)
    c2 = _conv(rng, "conv2", "t1", "t2", mid, mid, relu=True, shift=10)
    c3 = _conv(rng, "conv3", "t2", "t3", mid, c, ksz=1, pad=0, shift=9)
    add = AddLayer("add", ("t3", "x"), "y", 0, 0, 1, 2, _rq(1, 1, lo=0))
    s, m = (batch, c, hw, hw), (batch, mid, hw, hw)
    return _graph([c1, c2, c3, add], {"x": s, "t1": m, "t2": m, "t3": s, "y": s}, ["x"], ["y"])


def test_resnet_bottleneck_block_runs_on_chip_with_the_shortcut_kept_on_chip(cfg):
    g = _bottleneck()
    prog, st = _run(g, cfg)  # the search picks the whole block because it measures faster
    _, st_off = _run(g, cfg, OFF)
    assert [ly.name for ly in prog.layers] == ["conv1+conv2+conv3+add"]
    assert not {"t1", "t2", "t3"} & set(prog.tensors)
    assert sum(s.cycles for _, s in st) < sum(s.cycles for _, s in st_off)
    assert _ddr_bytes(st) < 0.5 * _ddr_bytes(st_off)
    # the shortcut is not re-read: every input row is LOADed once (the add reads the rows the
    # first conv read, kept in the input window), every output row SAVEd once
    insns = cg.decode_stream(prog.layers[0].insns)
    fm_loads = [i for i in insns if isinstance(i, cg.Load) and not i.to_pm]
    x_bytes = 4 * 24 * 24 * 128
    assert sum(i.rows * i.cols * i.chans for i in fm_loads) * cfg.NUM_PE == x_bytes
    pm_bytes = sum(i.rows * i.cols * i.chans for i in insns if isinstance(i, cg.Load) and i.to_pm)
    assert sum(s.ddr_read_bytes for _, s in st) == x_bytes + pm_bytes
    assert sum(s.ddr_write_bytes for _, s in st) == x_bytes
    assert any(isinstance(i, cg.EltAdd) for i in insns)


def test_bottleneck_is_a_crossing_candidate_the_search_can_forbid(cfg):
    g = _bottleneck(hw=16)
    cands = {c.layers: c.template for c in fusion.find_candidates(g)}
    assert cands[("conv1", "conv2", "conv3", "add")] == "chain"
    assert cands[("conv1", "conv2")] == "chain" and cands[("conv3", "add")] == "conv+add"
    prog, _ = _run(g, cfg, {"@fusion": {"conv1+conv2+conv3+add": False}})
    assert "conv1+conv2+conv3+add" not in [ly.name for ly in prog.layers]
    assert {c[0] for c in prog.fusion.candidates} >= {"conv1+conv2+conv3+add", "conv2+conv3"}


def test_chain_bands_must_fit_the_fm(cfg):
    from tvm_accel.errors import MappingError

    g = _chain([(64, 3, 1, 1, False), (64, 3, 1, 1, False)], batch=8, hw=64, c0=64)
    with pytest.raises(MappingError, match="tile_h 64: the chain's ping-pong band buffers"):
        plan(g, cfg, {"@fusion": {"c0+c1": True}, "c0+c1": {"tile_h": 64}})
    assert _chain_knob_space(g.layers, g.tensors["x"].shape, cfg).default()["tile_h"] < 64


def test_chain_streams_weights_that_exceed_the_pm(cfg):
    """Weights larger than the PM (here 2 x 2.4 MB, like a ResNet-50 res5 3x3 conv) stream
    through the two PM halves in output-channel chunks, once per step, bit-exact."""
    big = _chain([(512, 3, 1, 1, False), (512, 3, 1, 1, False)], batch=4, hw=8, c0=512)
    prog, st = _run(big, cfg, {"@fusion": {"c0+c1": True}})
    assert [ly.name for ly in prog.layers] == ["c0+c1"]
    insns = cg.decode_stream(prog.layers[0].insns)
    pm = [i for i in insns if isinstance(i, cg.Load) and i.to_pm]
    half = cfg.PM_BYTES // 2
    assert len(pm) > 4 and all(i.rows * i.cols * i.chans <= half for i in pm)
    assert {i.dst_addr for i in pm} == {0, half}  # double buffered
    convs = [i for i in insns if isinstance(i, cg.Conv)]
    assert len(convs) == len(pm) and sum(c.oc for c in convs) == 2 * 512
    assert {c.param_addr for c in convs} == {0, half}
    weights = 2 * 512 * 512 * 9
    assert weights < sum(i.rows * i.cols * i.chans for i in pm) < weights * 1.01  # once


def test_fusion_search_measures_candidates_with_tiles_from_a_local_search(cfg, monkeypatch):
    from tvm_dpu import fusion as strategy

    g = _chain([(32, 3, 1, 1, False), (24, 3, 1, 1, False)], batch=4, hw=40, c0=16)
    default = _chain_knob_space(g.layers, g.tensors["x"].shape, cfg).default()["tile_h"]
    prog, _ = _run(g, cfg)
    tuned = {c[0]: c[2] for c in prog.fusion.candidates}["c0+c1"]
    monkeypatch.setattr(strategy, "LOCAL_SEARCH_MOVES", 0)
    base = {c[0]: c[2] for c in plan(g, cfg).fusion.candidates}["c0+c1"]
    assert tuned < base  # the default band is not the fastest here; the hill climb finds one
    assert [ly.name for ly in prog.layers] == ["c0+c1"]
    assert prog.layers[0].knobs["tile_h"] != default  # the group compiles with the knobs found


def _conv_pool(batch=4, hw=28, c=32, k=64, ksz=5, pool=(3, 1, 1), convs=1, seed=5):
    """``convs`` convs (the first ``ksz`` x ``ksz``, then 3x3) and a max pool ``(kernel, stride,
    pad)`` on ``hw x hw x c``."""
    from tvm_accel.layers import PoolLayer, pool_output_shape

    rng = np.random.default_rng(seed)
    layers, shapes, t, ch = [], {"x": (batch, c, hw, hw)}, "x", c
    for i in range(convs):
        kk = ksz if i == 0 else 3
        ly = _conv(rng, f"c{i}", t, f"t{i}", ch, k, ksz=kk, pad=kk // 2, relu=True, shift=11)
        shapes[f"t{i}"] = conv_output_shape(ly, shapes[t])
        layers.append(ly)
        t, ch = f"t{i}", k
    pk, ps, pp = pool
    layers.append(PoolLayer("pool", t, "y", "max", (pk, pk), (ps, ps), (pp,) * 4, 0, None))
    shapes["y"] = pool_output_shape(layers[-1], shapes[t])
    return _graph(layers, shapes, ["x"], ["y"])


def test_conv_pool_keeps_the_pool_halo_instead_of_recomputing(cfg):
    g = _conv_pool()
    prog, st = _run(g, cfg)  # default: halo keep
    assert [ly.name for ly in prog.layers] == ["c0+pool"]
    assert prog.layers[0].knobs["halo"] == "keep"
    insns = cg.decode_stream(prog.layers[0].insns)
    convs = [i for i in insns if isinstance(i, cg.Conv)]
    assert sum(c.out_h for c in convs) == 28  # every conv row once: nothing recomputed
    # bands aligned to the CONV's 8-row passes while the pool lags one row behind
    assert [c.out_h for c in convs] == [8, 8, 8, 4]
    copies = [i for i in insns if isinstance(i, cg.Copy)]
    # kept halos: the 5x5 conv's 4 input rows, the 3x3 pool window's 2 conv rows
    assert {(c.chans, c.out_h) for c in copies} == {(32, 4), (64, 2)}
    pools = [i for i in insns if isinstance(i, cg.Pool)]
    assert sum(p.out_h for p in pools) == 28
    prog_r, st_r = _run(g, cfg, {"c0+pool": {"halo": "recompute", "tile_h": 8}})
    convs_r = [i for i in cg.decode_stream(prog_r.layers[0].insns) if isinstance(i, cg.Conv)]
    assert sum(c.out_h for c in convs_r) > 28  # the recompute form computes overlap rows twice
    assert sum(s.conv_busy for _, s in st) < sum(s.conv_busy for _, s in st_r)
    assert sum(s.cycles for _, s in st) < sum(s.cycles for _, s in st_r)


@pytest.mark.parametrize("convs, pool", [(2, (2, 2, 0)), (2, (3, 2, 1)), (3, (3, 1, 1))],
                         ids=["conv-conv-pool2s2", "conv-conv-pool3s2", "3conv-pool3"])
def test_chains_closed_by_a_pool_are_bit_exact(cfg, convs, pool):
    g = _conv_pool(batch=4, hw=18, c=8, k=16, ksz=3, pool=pool, convs=convs, seed=convs)
    name = _name(g)
    space = _chain_knob_space(g.layers, g.tensors["x"].shape, cfg)
    for th in space["tile_h"].options:
        prog, _ = _run(g, cfg, {"@fusion": {name: True}, name: {"tile_h": th}})
        assert [ly.name for ly in prog.layers] == [name]
        assert not any(t.startswith("t") for t in prog.tensors)  # all on chip


@pytest.mark.parametrize("specs, batch, hw, pm", [
    ([(64, 3, 1, 1, False), (64, 3, 1, 1, False)], 4, 16, 20480),
    ([(64, 1, 1, 0, False), (64, 3, 1, 1, True), (96, 1, 1, 0, False)], 8, 12, 8192),
    ([(64, 3, 1, 1, False), (32, 1, 1, 0, False)], 8, 12, 20480),
], ids=["3x3-3x3", "two-groups-depthwise", "3x3-1x1-two-groups"])
def test_streamed_chain_weights_are_bit_exact_for_every_band(specs, batch, hw, pm):
    from .test_dpu_strategy import _small_cfg

    small = _small_cfg(PM_BYTES=pm)  # every chain here streams its weights
    g = _chain(specs, batch, hw, 64, seed=len(specs) + batch)
    name = _name(g)
    for th in _chain_knob_space(g.layers, g.tensors["x"].shape, small)["tile_h"].options:
        prog, _ = _run(g, small, {"@fusion": {name: True}, name: {"tile_h": th}})
        pm = [i for i in cg.decode_stream(prog.layers[0].insns)
              if isinstance(i, cg.Load) and i.to_pm]
        assert {i.dst_addr for i in pm} == {0, small.PM_BYTES // 2}


@pytest.mark.parametrize("stride, out, pm", [(1, 64, None), (2, 64, None), (2, 128, 4864)],
                         ids=["s1", "s2", "s2-streamed"])
def test_bottleneck_with_projection_shortcut_runs_on_chip(cfg, stride, out, pm):
    """A first bottleneck block: the projection shortcut conv reads the chain's input window
    (LOADed once) and the add reads both convs' bands; nothing but the block's input, weights
    and output moves over DDR (also with streamed weights: the shortcut's chunks are added and
    SAVEd one by one)."""
    from .test_dpu_strategy import _small_cfg

    cfg = _small_cfg(PM_BYTES=pm) if pm else cfg
    rng = np.random.default_rng(8)
    b, hw, c, mid = 4, 16, 32, 16
    ho = (hw - 1) // stride + 1
    c1 = _conv(rng, "conv1", "x", "t1", c, mid, ksz=1, pad=0, relu=True, shift=10)
    c2 = _conv(rng, "conv2", "t1", "t2", mid, mid, stride=stride, relu=True, shift=10)
    c3 = _conv(rng, "conv3", "t2", "t3", mid, out, ksz=1, pad=0, shift=9)
    ds = _conv(rng, "down", "x", "td", c, out, ksz=1, stride=stride, pad=0, shift=9)
    add = AddLayer("add", ("t3", "td"), "y", 0, 0, 1, 2, _rq(1, 1, lo=0))
    m, o = (b, mid, hw, hw), (b, out, ho, ho)
    g = _graph([c1, c2, c3, ds, add], {"x": (b, c, hw, hw), "t1": m, "t2": (b, mid, ho, ho),
                                       "t3": o, "td": o, "y": o}, ["x"], ["y"])
    name = "conv1+conv2+conv3+down+add"
    assert name in {c.name for c in fusion.find_candidates(g)}
    prog, st = _run(g, cfg, {"@fusion": {name: True}})
    assert [ly.name for ly in prog.layers] == [name]
    assert not {"t1", "t2", "t3", "td"} & set(prog.tensors)
    insns = cg.decode_stream(prog.layers[0].insns)
    fm_loads = [i for i in insns if isinstance(i, cg.Load) and not i.to_pm]
    assert sum(i.rows * i.cols * i.chans for i in fm_loads) * cfg.NUM_PE == b * hw * hw * c
    assert sum(s.ddr_write_bytes for _, s in st) == b * ho * ho * out


def test_streamed_bottleneck_adds_and_saves_each_weight_chunk_bit_exact():
    """Weights streamed in chunks: the closing add and the SAVE of each chunk's channels follow
    its CONV (channel slices are separate buffers), for every band."""
    from .test_dpu_strategy import _small_cfg

    small = _small_cfg(PM_BYTES=4864)  # conv3 (16 -> 128) streams in two chunks of 64
    g = _bottleneck(hw=16, mid=16)
    name = "conv1+conv2+conv3+add"
    for th in _chain_knob_space(g.layers, g.tensors["x"].shape, small)["tile_h"].options:
        prog, _ = _run(g, small, {"@fusion": {name: True}, name: {"tile_h": th}})
        insns = cg.decode_stream(prog.layers[0].insns)
        adds = [i for i in insns if isinstance(i, cg.EltAdd)]
        saves = [i for i in insns if isinstance(i, cg.Save)]
        assert adds and {a.chans for a in adds} == {64}
        assert sum(s.rows * s.chans for s in saves) == 16 * 128  # every output byte once
