"""The CP embedding (tvm_accel.cp): operator model, intrinsic DFG, constraint search."""

import csv
import itertools

import islpy
import numpy as np
import pytest

from tvm_accel.cp import (
    Options,
    conv2d_op,
    conv_transpose2d_op,
    dense_op,
    enumerate_embeddings,
    find_embedding,
)
from tvm_accel.cp.embedding import solutions_raw
from tvm_accel.cp.intrinsic import gemm_intrinsic
from tvm_accel.deepbench import DEFAULT_CSV as DEEPBENCH


def test_isl_access_relation_matches_the_closed_form():
    op = conv2d_op(2, 6, 7, 7, 4, 3, 2, strides=(2, 1), padding=(1, 0, 1, 1), dilation=(1, 2),
                   groups=2)
    rel = op.isl_access("in")
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = tuple(int(rng.integers(0, e)) for e in op.extents)
        img = op.access["in"].apply(p)
        point = ", ".join(map(str, p))
        target = rel.intersect_domain(islpy.Set(f"{{ S[{point}] }}")).range()
        assert str(target) == f"{{ In[{', '.join(map(str, img))}] }}"
    assert op.isl_instance_set().is_bounded()
    assert set(op.isl_dataflow()) == {"R1", "R2"}


def test_gemm_dfg_is_generated_from_the_intrinsic_sizes():
    dfg = gemm_intrinsic(2, 3, 4)
    kinds = {k: len(dfg.of_kind(k)) for k in ("inp", "wgt", "mul", "add", "out")}
    assert kinds == {"inp": 8, "wgt": 12, "mul": 24, "add": 24, "out": 6}
    seq = [e for e in dfg.edges if e.label == "sequential"]
    assert sum(e.relation == "reduce" for e in seq) == 2 * 3 * 3
    assert sum(e.relation == "parallel" for e in dfg.edges) == 4 * (2 * 3 - 1)


@pytest.mark.parametrize("gemm, batch", [((1, 16, 16), 1), ((8, 8, 8), 8)])
def test_strict_model_finds_exactly_the_static_template_mapping(gemm, batch):
    op = conv2d_op(batch, 32, 10, 10, 32, 3, 3, padding=(1, 1, 1, 1))
    res = enumerate_embeddings(op, gemm_intrinsic(*gemm), Options.strict())
    assert [e.describe() for e in res.embeddings] == [
        ("x=1 " if gemm[0] == 1 else f"x=n{gemm[0]} ") + f"y=k{gemm[1]} z=c{gemm[2]}"]


@pytest.mark.parametrize("gemm, batch", [((1, 16, 16), 1), ((8, 8, 8), 8)])
@pytest.mark.parametrize("groups", [2, 4])
def test_strict_model_finds_the_static_mapping_of_a_grouped_conv(gemm, batch, groups):
    """Linear access per group: within a group the channel access ``g * cg + c`` is linear, so
    the strict model finds the static template's per-group mapping (channels per group a
    multiple of the block: each output block reads the input blocks of its own group)."""
    op = conv2d_op(batch, 32 * groups, 8, 8, 32 * groups, 3, 3, padding=(1, 1, 1, 1),
                   groups=groups)
    assert op.kind == "group_conv2d"
    res = enumerate_embeddings(op, gemm_intrinsic(*gemm), Options.strict())
    assert [e.describe() for e in res.embeddings] == [
        ("x=1 " if gemm[0] == 1 else f"x=n{gemm[0]} ") + f"y=k{gemm[1]} z=c{gemm[2]}"]


def test_depthwise_conv_embeds_per_group_with_channel_padding():
    """A depthwise conv reduces only over its kernel window (a stencil), so the strict model
    needs the per-group padding of section 4.2.4; the static template's block-diagonal
    mapping (16 groups in one block) is no embedding: its zero weights are no instances."""
    op = conv2d_op(1, 32, 8, 8, 32, 3, 3, padding=(1, 1, 1, 1), groups=32)
    assert op.kind == "depthwise_conv2d"
    dfg = gemm_intrinsic(1, 16, 16)
    assert enumerate_embeddings(op, dfg, Options.strict()).status == "none"
    res = enumerate_embeddings(op, dfg, Options(padding=True))
    assert [e.describe() for e in res.embeddings] == ["x=1 y=k16 z=c16 pad k 1->16 pad c 1->16"]


@pytest.mark.parametrize("gemm, batch", [((1, 16, 16), 1), ((8, 8, 8), 8)])
def test_strict_model_embeds_a_transpose_conv_in_its_scatter_form(gemm, batch):
    """The transpose conv as one operator (kernel taps spatial, channels reduced): the strict
    model maps batch, output and input channels, the static template's lanes per phase."""
    op = conv_transpose2d_op(batch, 32, 6, 6, 32, 3, 3, strides=(2, 2), padding=(1, 1, 1, 1),
                             output_padding=(1, 1))
    assert op.shapes["out"] == (batch, 32, 13, 13) and op.params["ho"] == 12
    res = enumerate_embeddings(op, gemm_intrinsic(*gemm), Options.strict())
    assert [e.describe() for e in res.embeddings] == [
        ("x=1 " if gemm[0] == 1 else f"x=n{gemm[0]} ") + f"y=k{gemm[1]} z=c{gemm[2]}"]
    padded = find_embedding(conv_transpose2d_op(batch, 3, 6, 6, 16, 3, 3, strides=(2, 2)),
                            gemm_intrinsic(*gemm), Options(padding=True))
    assert padded.embeddings[0].describe().endswith(f"pad c 3->{gemm[2]}")


def test_batch_one_on_8x8x8_needs_padding_or_a_relaxation():
    op = conv2d_op(1, 16, 8, 8, 16, 3, 3, padding=(1, 1, 1, 1))
    dfg = gemm_intrinsic(8, 8, 8)
    none = find_embedding(op, dfg, Options.strict())
    assert none.status == "none" and none.reason.startswith("no embedding:")
    padded = find_embedding(op, dfg, Options(padding=True))
    assert padded.embeddings[0].describe() == "x=n8 y=k8 z=c8 pad n 1->8"
    packs = enumerate_embeddings(op, dfg, Options(dense=False, linear_access=False,
                                                  max_solutions=3))
    assert packs.embeddings and all(set(e.dims("x")) <= {"oh", "ow"} and e.dims("x")
                                    for e in packs.embeddings)


def test_relaxing_linear_access_admits_stencil_embeddings():
    op = conv2d_op(1, 1, 40, 30, 32, 20, 5, strides=(2, 2))
    dfg = gemm_intrinsic(1, 16, 16)
    strict = find_embedding(op, dfg, Options.strict())
    assert strict.status == "none"
    relaxed = enumerate_embeddings(op, dfg, Options(linear_access=False))
    found = {e.describe() for e in relaxed.embeddings}
    assert "x=1 y=k16 z=r16" in found  # the r4*s4 window, up to the order of the z lanes:
    assert found & {"x=1 y=k16 z=r4*s4", "x=1 y=k16 z=s4*r4"}


def test_dense_batch_one_embeds_with_padding():
    res = find_embedding(dense_op(1, 64, 40), gemm_intrinsic(8, 8, 8), Options(padding=True))
    assert res.embeddings[0].describe() == "x=n8 y=k8 z=c8 pad n 1->8"


def _rectangles(n, ndim, v0, strides=(1,)):
    """Every ordered axis-parallel hyper-rectangle of n points from v0 (brute force)."""
    out = set()

    def rec(dims, inner):
        if inner == n:
            pts = []
            for j in range(n):
                p, r = list(v0), j
                for a, s, size in dims:
                    p[a] += (r % size) * s
                    r //= size
                pts.append(tuple(p))
            out.add(tuple(pts))
            return
        for a in range(ndim):
            if any(a == d[0] for d in dims):
                continue
            for size in range(2, n // inner + 1):
                if (n // inner) % size == 0:
                    for s in strides:
                        rec([*dims, (a, s, size)], inner * size)
    rec([], 1)
    return out


def _brute_force(op, X, Y, Z, linear):
    """All embeddings of an X x Y x Z GEMM by enumeration + a direct check of every constraint
    (independent of the propagators)."""
    acc = op.access
    out_rects = _rectangles(X * Y, 4, (0,) * 4)
    in_rects = _rectangles(X * Z, 4, (0,) * 4)
    w_rects = _rectangles(Y * Z, 4, (0,) * 4)
    # linear access per group: the group iterator is an offset, not a second iterator
    group = [op.index(d) for d in op.dims if d == "g"]
    nonlin = {t: [a for a in range(4)
                  if len([d for d in acc[t].iterators(a) if d not in group]) > 1]
              for t in ("in", "wgt", "out")}
    red = [op.index(d) for d in op.reduction_dims]
    sols = []
    spaces = [range(e) for e in op.extents]
    points = list(itertools.product(*spaces))
    by_out = {}
    for p in points:
        by_out.setdefault(acc["out"].apply(p), []).append(p)
    for orect in out_rects:
        if any(q not in by_out for q in orect):
            continue
        chains = [list(itertools.permutations(by_out[q], Z)) for q in orect]
        for combo in itertools.product(*chains):
            mul = {(b, o, i): combo[b * Y + o][i] for b in range(X) for o in range(Y)
                   for i in range(Z)}
            inp, wgt, ok = {}, {}, True
            for (b, o, i), p in mul.items():
                for d, key, t in ((inp, (b, i), "in"), (wgt, (o, i), "wgt")):
                    v = acc[t].apply(p)
                    if d.setdefault(key, v) != v:
                        ok = False
            if not ok:
                continue
            ivec = tuple(inp[b, i] for b in range(X) for i in range(Z))
            wvec = tuple(wgt[o, i] for o in range(Y) for i in range(Z))
            if ivec not in in_rects or wvec not in w_rects:
                continue
            if linear and any(v[a] != vec[0][a] for t, vec in (("in", ivec), ("wgt", wvec),
                                                               ("out", orect))
                              for v in vec for a in nonlin[t]):
                continue
            if len(set(mul.values())) != len(mul) or any(
                    all(mul[b, o, i][r] == mul[b, o, j][r] for r in red)
                    for (b, o, i) in mul for j in range(i)):
                continue
            sols.append(mul)
    return sols


@pytest.mark.parametrize("kind", ["conv", "group_conv", "conv_transpose"])
@pytest.mark.parametrize("linear", [True, False])
def test_solver_finds_exactly_the_brute_force_embeddings(linear, kind):
    """Symmetry factored out: none at this level. Both sides list complete assignments with a
    fixed origin and the lanes of each axis in lexicographic order; with a commutative
    reduction every order of the z lanes that keeps the rectangles is its own solution."""
    op = {"conv": lambda: conv2d_op(1, 2, 3, 3, 2, 2, 2),
          "group_conv": lambda: conv2d_op(1, 4, 3, 3, 4, 2, 2, groups=2),
          "conv_transpose": lambda: conv_transpose2d_op(1, 2, 2, 3, 2, 2, 2, strides=(2, 1))
          }[kind]()
    X, Y, Z = 1, 2, 2
    solver = solutions_raw(op, gemm_intrinsic(X, Y, Z), Options(linear_access=linear,
                                                                portfolio=False, bound=False))
    got = {tuple(sorted((k, v) for k, v in s.items() if k.startswith("mul"))) for s in solver}
    brute = _brute_force(op, X, Y, Z, linear)
    want = {tuple(sorted((f"mul[{b},{o},{i}]", p) for (b, o, i), p in m.items())) for m in brute}
    assert got == want
    assert len(want) >= 1


def _deepbench_rows(step):
    rows = list(csv.DictReader(open(DEEPBENCH)))
    return rows[::step]


@pytest.mark.parametrize("gemm", [(1, 16, 16), (8, 8, 8)])
def test_deepbench_layers_all_get_an_embedding(gemm):
    dfg = gemm_intrinsic(*gemm)
    for row in _deepbench_rows(9):
        w, h, c, n, k = (int(row[x]) for x in ("w", "h", "c", "n", "k"))
        fw, fh, pw, ph = (int(row[x]) for x in ("filter_w", "filter_h", "pad_w", "pad_h"))
        sw, sh = int(row["stride_w"]), int(row["stride_h"])
        op = conv2d_op(n, c, h, w, k, fh, fw, (sh, sw), (ph, pw, ph, pw))
        res = find_embedding(op, dfg, Options(padding=True, time_limit=30))
        if res.status != "ok":
            res = find_embedding(op, dfg, Options.relaxed())
        assert res.status == "ok", (row["id"], res.reason)


def test_instance_set_order_changes_the_search_not_the_embeddings():
    dfg = gemm_intrinsic(8, 8, 8)
    relaxed = Options(dense=False, linear_access=False, max_solutions=10_000)
    found = {}
    for layout in ("NCHW", "NHWC", "HWNC"):
        op = conv2d_op(1, 8, 4, 4, 8, 3, 3, (1, 1), (1, 1, 1, 1), layout=layout)
        assert op.dims[-1] == ("s" if layout == "NCHW" else "c")
        res = enumerate_embeddings(op, dfg, relaxed)
        assert res.status == "ok"
        found[layout] = {e.key for e in res.embeddings}
    assert found["NCHW"] == found["NHWC"] == found["HWNC"] and len(found["NCHW"]) > 1
    with pytest.raises(ValueError, match="layout 'NWCH'"):
        conv2d_op(1, 16, 6, 6, 16, 3, 3, layout="NWCH")
