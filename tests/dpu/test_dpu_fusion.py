"""DPU fusion: template embeddings, the search between barriers, fused streams bit-exact."""

import itertools

import numpy as np
import pytest

from tvm_accel.errors import MappingError
from tvm_accel.layers import (
    AddLayer,
    ConcatLayer,
    PoolLayer,
)
from tvm_dpu import fusion
from tvm_dpu.strategy import plan

from .test_dpu_strategy import _conv, _graph, _rq, _run


def _fusable(batch=2, hw=12, c=16):
    """x -> a (3x3) -> pool; x -> b, c (1x1) and d (3x3): horizontal {b, c} and {a, d} (a is
    also in conv+pool); b -> e -> add(e, c2), c -> c2: two conv+add embeddings share the add."""
    rng = np.random.default_rng(5)
    s = (batch, c, hw, hw)
    a = _conv(rng, "a", "x", "ta", c, c, relu=True, shift=10)
    pool = PoolLayer("pool", "ta", "tp", "max", (3, 3), (2, 2), (1,) * 4, 0, None)
    b = _conv(rng, "b", "x", "tb", c, c, ksz=1, pad=0, shift=9)
    cc = _conv(rng, "c", "x", "tc", c, c, ksz=1, pad=0, shift=9)
    d = _conv(rng, "d", "x", "td", c, c, shift=10)
    e = _conv(rng, "e", "tb", "te", c, c, shift=10)
    c2 = _conv(rng, "c2", "tc", "tc2", c, c, shift=10)
    add = AddLayer("add", ("te", "tc2"), "y", 0, 0, 1, 2, _rq(1, 1))
    ho = (hw + 2 - 3) // 2 + 1
    shapes = {n: s for n in ("x", "ta", "tb", "tc", "td", "te", "tc2", "y")}
    shapes["tp"] = (batch, c, ho, ho)
    return _graph([a, pool, b, cc, d, e, c2, add], shapes, ["x"], ["tp", "td", "y"])


def test_subgraph_isomorphism_finds_every_embedding_not_a_greedy_subset():
    cands = {(c.template, c.layers) for c in fusion.find_candidates(_fusable())}
    assert cands == {("conv+relu+pool", ("a", "pool")), ("conv+add", ("e", "add")),
                     ("conv+add", ("c2", "add")), ("horizontal", ("b", "c")),
                     ("horizontal", ("a", "d")), ("chain", ("b", "e")), ("chain", ("c", "c2")),
                     ("chain", ("b", "e", "add")), ("chain", ("c", "c2", "add"))}


def test_shortest_path_search_matches_brute_force_over_all_strategies():
    g = _fusable()
    cands = fusion.find_candidates(g)
    rng = np.random.default_rng(0)
    for _ in range(30):
        single = {ly.name: float(rng.integers(50, 150)) for ly in g.layers}
        fused = {c: float(rng.integers(60, 300)) for c in cands}
        groups, total = fusion.choose(g, cands, single, fused)
        best = float("inf")
        for r in range(len(cands) + 1):
            for sub in itertools.combinations(cands, r):
                names = [n for c in sub for n in c.layers]
                if len(names) == len(set(names)):
                    best = min(best, sum(fused[c] for c in sub)
                               + sum(v for n, v in single.items() if n not in names))
        assert total == best
        assert sorted(n for grp in groups for n in grp) == sorted(single)


@pytest.mark.parametrize("knobs", [{}, {"a+pool": {"oc_tile": 16, "tile_h": 2, "tile_w": 3},
                                        "b+c": {"tile_h": 8, "tile_w": 5, "pipeline": False}}])
def test_every_fusion_template_runs_bit_exact(cfg, knobs):
    g = _fusable(batch=3)
    forced = {"a+pool": True, "b+c": True, "c2+add": True, "parallel": False}
    prog, _ = _run(g, cfg, {"@fusion": forced, **knobs})
    ops = sorted(ly.op for ly in prog.layers)
    assert ops == ["2xconv2d (horizontal)", "conv2d", "conv2d", "conv2d+add",
                   "conv2d+max_pool2d"]
    assert "ta" not in prog.tensors and "tc2" not in prog.tensors  # kept in FM


def test_conv_add_with_the_conv_as_second_operand_and_weight_tiling_is_bit_exact(cfg):
    g = _fusable(batch=4, hw=10, c=40)
    prog, _ = _run(g, cfg, {"@fusion": {"e+add": True}, "e+add": {"oc_tile": 16}})
    assert any("e+add" in ly.name.split("||") for ly in prog.layers)


def test_search_never_loses_to_layer_by_layer_and_honours_forbidden_candidates(cfg):
    g = _fusable(batch=4, hw=24, c=32)
    fused, st_f = _run(g, cfg)
    _, st_u = _run(g, cfg, {"@fusion": {"enabled": False}})
    assert sum(s.cycles for _, s in st_f) <= sum(s.cycles for _, s in st_u)
    rep = fused.fusion
    assert {c[0] for c in rep.candidates} == {"a+pool", "e+add", "c2+add", "b+c", "a+d", "b+e",
                                              "c+c2", "b+e+add", "c+c2+add"}
    no, _ = _run(g, cfg, {"@fusion": dict.fromkeys(rep.chosen, False)})
    assert not set(rep.chosen) & {n for ly in no.layers for n in ly.name.split("||")}


def test_unknown_fusion_candidate_is_a_clear_error(cfg):
    with pytest.raises(MappingError, match="no fusion candidate named a\\+b.*candidates: "):
        plan(_fusable(), cfg, {"@fusion": {"a+b": True}})


def test_concat_inputs_are_saved_in_place_by_their_producers(cfg):
    from tvm_dpu.codegen import build_blob, load_blob

    rng = np.random.default_rng(7)
    s = (4, 16, 10, 10)
    a = _conv(rng, "a", "x", "ta", 16, 24, shift=10)
    b = _conv(rng, "b", "x", "tb", 16, 8, ksz=1, pad=0, shift=9)
    up = PoolLayer("p", "x", "tp", "max", (3, 3), (1, 1), (1,) * 4, 0, None)
    cat = ConcatLayer("cat", ("ta", "tp", "tb"), "tc", (0, 0, 0), (None,) * 3)
    d = _conv(rng, "d", "tc", "y", 48, 16, shift=11)
    shapes = {"x": s, "ta": (4, 24, 10, 10), "tb": (4, 8, 10, 10), "tp": s,
              "tc": (4, 48, 10, 10), "y": s}
    g = _graph([a, up, b, cat, d], shapes, ["x"], ["y"])
    prog, _ = _run(g, cfg)
    assert "concat" not in {ly.op for ly in prog.layers}
    assert [prog.tensors[t].pix_stride for t in ("ta", "tp", "tb")] == [48, 48, 48]
    assert prog.tensors["tb"].offset == prog.tensors["tc"].offset + 40
    again, _, _ = load_blob(build_blob(prog, cfg, "f"))
    assert again.tensors["tp"].pix_stride == 48
    off, _ = _run(g, cfg, {"@fusion": {"enabled": False}})
    assert "concat" in {ly.op for ly in off.layers}


@pytest.mark.parametrize("kind, k, s, pad, ksz, cpad, knobs", [
    ("max", 3, 1, 1, 1, 0, {}),
    ("max", 3, 2, 1, 3, 1, {"tile_h": 7, "tile_w": 2, "oc_tile": 16}),
    ("avg", 2, 2, 0, 3, 1, {"pipeline": False}),
])
def test_pool_then_conv_fuses_bit_exact(cfg, kind, k, s, pad, ksz, cpad, knobs):
    rng = np.random.default_rng(11)
    rq = None if kind == "max" else _rq(1, 2)
    pool = PoolLayer("p", "x", "tp", kind, (k, k), (s, s), (pad,) * 4, 0, rq)
    hp = (13 + 2 * pad - k) // s + 1
    conv = _conv(rng, "q", "tp", "y", 24, 40, ksz=ksz, pad=cpad, shift=10, relu=True)
    g = _graph([pool, conv], {"x": (3, 24, 13, 13), "tp": (3, 24, hp, hp),
                              "y": (3, 40, hp, hp)}, ["x"], ["y"])
    assert [c.template for c in fusion.find_candidates(g)] == ["pool+conv"]
    prog, _ = _run(g, cfg, {"@fusion": {"p+q": True}, "p+q": knobs})
    assert [ly.op for ly in prog.layers] == [f"{kind}_pool2d+conv2d"]
    assert "tp" not in prog.tensors


def test_pool_stream_runs_beside_an_independent_conv_stream_bit_exact(cfg):
    rng = np.random.default_rng(13)
    s = (4, 64, 16, 16)
    pool = PoolLayer("p", "x", "tp", "max", (3, 3), (1, 1), (1,) * 4, 0, None)
    a = _conv(rng, "a", "x", "ta", 64, 96, shift=11, relu=True)
    b = _conv(rng, "b", "ta", "tb", 96, 64, shift=11)
    cat = ConcatLayer("cat", ("tp", "tb"), "y", (0, 0), (None, None))
    g = _graph([pool, a, b, cat], {"x": s, "tp": s, "ta": (4, 96, 16, 16), "tb": s,
                                   "y": (4, 128, 16, 16)}, ["x"], ["y"])
    prog, st = _run(g, cfg)
    pair = [ly for ly in prog.layers if "||" in ly.name]
    assert pair and pair[0].op.startswith("max_pool2d || conv2d")
    assert prog.fusion.parallel and prog.fusion.parallel[0][2] < prog.fusion.parallel[0][1]
    off, st_off = _run(g, cfg, {"@fusion": {"parallel": False}})
    assert not any("||" in ly.name for ly in off.layers)
    # without the pair, the merged stream's list scheduling overlaps the two groups as well
    assert sum(x.cycles for _, x in st) <= sum(x.cycles for _, x in st_off)


def _aspp_like(batch=2, hw=14, c=16):
    """x -> p, q (3x3, dilation 2, the same geometry: horizontal), r (dilation 6) -> pool,
    s (dilation 2) -> add(s, x): the dilated window in fused tiles."""
    rng = np.random.default_rng(6)
    sh = (batch, c, hw, hw)
    p = _conv(rng, "p", "x", "tp", c, c, pad=2, dilation=2, shift=10)
    q = _conv(rng, "q", "x", "tq", c, c, pad=2, dilation=2, shift=10)
    r = _conv(rng, "r", "x", "tr", c, c, pad=6, dilation=6, shift=10)
    pool = PoolLayer("pool", "tr", "to", "max", (2, 2), (2, 2), (0,) * 4, 0, None)
    s = _conv(rng, "s", "x", "ts", c, c, pad=2, dilation=2, shift=10)
    add = AddLayer("add", ("ts", "x"), "y", 0, 0, 1, 2, _rq(1, 1))
    shapes = {n: sh for n in ("x", "tp", "tq", "tr", "ts", "y")}
    shapes["to"] = (batch, c, hw // 2, hw // 2)
    return _graph([p, q, r, pool, s, add], shapes, ["x"], ["tp", "tq", "to", "y"])


def test_dilated_convs_fuse_horizontally_and_with_an_add_bit_exact(cfg):
    g = _aspp_like(batch=3)
    cands = {(c.template, c.layers) for c in fusion.find_candidates(g)}
    # one geometry per horizontal group; no pool template or chain with a dilated conv
    assert ("horizontal", ("p", "q")) in cands and ("conv+add", ("s", "add")) in cands
    assert not any(t in ("conv+pool", "pool+conv", "chain") or "r" in ly and t == "horizontal"
                   for t, ly in cands)
    prog, _ = _run(g, cfg, {"@fusion": {"p+q": True, "s+add": True, "parallel": False},
                            "p+q": {"tile_h": 8, "tile_w": 5}, "s+add": {"tile_h": 8}})
    assert sorted(ly.op for ly in prog.layers) == ["2xconv2d (horizontal)", "conv2d",
                                                   "conv2d+add", "max_pool2d"]
