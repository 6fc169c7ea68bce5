"""Embedding an instruction DFG into an operator as a constraint satisfaction problem.

The CP paper's method (sections 4 and 7): one variable per node of the intrinsic's DFG
(:mod:`tvm_accel.cp.intrinsic`), whose domain is a subset of the operator's instance set or
of a tensor's index space (:mod:`tvm_accel.cp.operator`); the constraints of section 4.2
(:mod:`tvm_accel.cp.constraints`); a search that branches on the output nodes first and then
backwards through the DFG (the reduction chains), trying values lexicographically in a
dimension order. :class:`Options` switches each constraint on or off, so a relaxation is an
option, not a code change:

- ``linear_access=False`` admits stencil (im2col) embeddings: the reduction lanes may walk the
  kernel window;
- ``dense=False`` admits strided embeddings: a lane axis may step by a stride through an image
  dimension (image pack, with strides ``ceil(extent / pieces)``);
- ``padding=True`` pads the channel/batch dimensions that do not fill or divide the intrinsic
  axis they can map to (batch -> x, output channel -> y, input channel -> z; section 4.2.4).

Search robustness (section 7): ``portfolio`` ("A") runs one asset per ordered choice of the
intrinsic's spatial and reduction dimensions (formula 12), each with a dimension order that
puts the choice innermost, interleaved in one thread; ``bound`` ("B", formula 11) caps every
dimension of every domain at ``b * stride`` with ``b`` the largest intrinsic axis. Search nodes
(tried values) are counted.

An :class:`Embedding` is read off a solution: for each intrinsic axis, the operator dimensions
it walks with their size and stride (innermost first). Distinct embeddings are counted up to
the order of the reduction lanes (the sum is commutative: two solutions whose ``z`` lanes cover
the same reduction points in another order are one embedding).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

from tvm_accel.cp.constraints import (
    AccessEdge,
    AllDifferent,
    FixedAxes,
    HyperRectangle,
    ImagePackLanes,
    Parallel,
    ReductionStep,
)
from tvm_accel.cp.intrinsic import DFGNode, InstructionDFG
from tvm_accel.cp.operator import TensorOp, conv2d_op, conv_transpose2d_op, dense_op
from tvm_accel.cp.solver import Dom, Engine, Propagator, SearchLimit, Solver

__all__ = ["Embedding", "Options", "SearchResult", "enumerate_embeddings", "find_embedding",
           "pad_operator"]

AXES = ("x", "y", "z")
#: output image dimensions: the only ones a lane axis may walk with a stride (image pack)
IMAGE_DIMS = ("oh", "ow")


@dataclass(frozen=True)
class Options:
    """Which constraints are active and how the search runs."""

    fixed_origin: bool = True
    dense: bool = True
    linear_access: bool = True
    hyper_rectangle: bool = True
    commutative: bool = True
    padding: bool | str = False  # False, "multiple" (True) or "fit"
    portfolio: bool = True  # "A"
    bound: bool = True  # "B"
    bound_b: int | None = None  # default: the largest intrinsic axis
    time_limit: float = 60.0
    max_nodes: int = 2_000_000
    max_solutions: int = 400
    #: backend restrictions: ``(axis, dims)`` pairs, lane axis ``axis`` walks only ``dims``
    lane_dims: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: a lane axis may walk adjacent output pixels (False: only image-pack strides, and the x
    #: lanes are ordered and cover the image, :class:`~tvm_accel.cp.constraints.ImagePackLanes`)
    adjacent_pixels: bool = True

    @staticmethod
    def strict() -> Options:
        """The paper's section 5 model: only embeddings TVM's reference template could use."""
        return Options()

    @staticmethod
    def relaxed() -> Options:
        """Section 6: linear access and density relaxed, padding allowed."""
        return Options(dense=False, linear_access=False, padding="fit")


@dataclass(frozen=True)
class Embedding:
    """Which operator dimensions each intrinsic axis walks: ``axes[a]`` is a tuple of
    ``(dim, size, stride)``, innermost first; ``op`` is the (possibly padded) operator."""

    axes: dict
    op: TensorOp = field(compare=False, hash=False)
    padded: tuple[tuple[str, int, int], ...] = ()

    def dims(self, axis: str) -> tuple[str, ...]:
        return tuple(d for d, _, _ in self.axes[axis])

    @property
    def key(self) -> tuple:
        """Identity up to the order of the reduction lanes."""
        z = tuple(sorted(self.axes["z"]))
        return (self.axes["x"], self.axes["y"], z, self.padded)

    def describe(self) -> str:
        def ax(a):
            parts = [f"{d}{n}" + (f"/{s}" if s != 1 else "") for d, n, s in self.axes[a]]
            return "*".join(parts) or "1"
        pad = "".join(f" pad {d} {a}->{b}" for d, a, b in self.padded)
        return f"x={ax('x')} y={ax('y')} z={ax('z')}{pad}"


@dataclass
class SearchResult:
    embeddings: list[Embedding]
    nodes: int
    seconds: float
    status: str  # "ok" | "none" | "limit"
    reason: str = ""
    assets: int = 1


# --- padding (section 4.2.4) -------------------------------------------------------------------
def _pad_to(e: int, a: int, mode: str) -> int:
    """``"multiple"``: next multiple of the intrinsic axis ``a``; ``"fit"``: smallest
    ``e' >= e`` that divides ``a`` or is a multiple of it."""
    if mode == "fit":
        for v in range(e, a):
            if a % v == 0:
                return v
    return -(-e // a) * a


def _rect_fits(n: int, extents: tuple[int, ...]) -> bool:
    """``n`` is a product of one factor per extent, each at most that extent."""
    if not extents:
        return n == 1
    return any(n % f == 0 and _rect_fits(n // f, extents[1:])
               for f in range(1, min(n, extents[0]) + 1))


def pad_operator(op: TensorOp, dfg: InstructionDFG, mode: str = "multiple"
                 ) -> tuple[TensorOp, tuple]:
    """Section 4.2.4: pad the batch (for ``x``), the output channels per group (for ``y``) and
    the input channels per group (for ``z``) that do not fit their intrinsic axis: to the next
    multiple (``mode="multiple"``, TVM's template: 3 -> 16 on a 16-lane axis) or to the next
    size that divides the axis or is a multiple of it (``"fit"``: 3 -> 4, 24 -> 32, 1 stays);
    returns the operator and the list of ``(dim, extent, padded extent)``."""
    p = dict(op.params)

    pads = []
    if op.kind == "dense":
        n, c = _pad_to(p["n"], dfg.x, mode), _pad_to(p["c"], dfg.z, mode)
        k = _pad_to(p["k"], dfg.y, mode)
        for d, a, b in (("n", p["n"], n), ("k", p["k"], k), ("c", p["c"], c)):
            if a != b:
                pads.append((d, a, b))
        return (dense_op(n, c, k) if pads else op), tuple(pads)
    g = p["groups"]
    cg, kg = p["c"] // g, p["k"] // g
    n, cg2, kg2 = _pad_to(p["n"], dfg.x, mode), _pad_to(cg, dfg.z, mode), _pad_to(kg, dfg.y, mode)
    for d, a, b in (("n", p["n"], n), ("k", kg, kg2), ("c", cg, cg2)):
        if a != b:
            pads.append((d, a, b))
    if op.kind == "conv2d_transpose":  # channels and batch only: its kernel taps are spatial
        return (conv_transpose2d_op(n, cg2 * g, p["h"], p["w"], kg2 * g, p["kh"], p["kw"],
                                    p["strides"], p["padding"], p["output_padding"],
                                    p["dilation"], g) if pads else op), tuple(pads)
    pt, pl, pb, pr = p["padding"]
    kh, kw = p["kh"], p["kw"]
    (sh, sw), (dh, dw) = p["strides"], p["dilation"]
    if mode == "fit" and not _rect_fits(dfg.z, (cg2, kh, kw)):
        # no z-point rectangle in the window (1 channel, 3x3 on 8 or 16 lanes): zero taps widen
        # the kernel (3x3 -> 4x4) so a stencil embedding exists; the input grows by the extra
        # taps so the output keeps its size
        kh2, kw2 = _pad_to(kh, dfg.z, mode), _pad_to(kw, dfg.z, mode)
        for d, a, b in (("r", kh, kh2), ("s", kw, kw2)):
            if a != b:
                pads.append((d, a, b))
        pb, pr = pb + (kh2 - kh) * dh, pr + (kw2 - kw) * dw
        kh, kw = kh2, kw2
    if mode == "fit":  # image dims: room for an image pack whose pieces overhang the image
        pieces = [m for m in range(2, dfg.x + 1) if dfg.x % m == 0]
        for d, e, s_, k_, d_ in (("oh", p["ho"], sh, kh, dh), ("ow", p["wo"], sw, kw, dw)):
            e2 = max([e] + [m * -(-e // m) for m in pieces])
            if e2 != e:
                pads.append((d, e, e2))
                need = (e2 - 1) * s_ + (k_ - 1) * d_ + 1
                if d == "oh":
                    pb = max(pb, need - p["h"] - pt)
                else:
                    pr = max(pr, need - p["w"] - pl)
    if not pads:
        return op, ()
    new = conv2d_op(n, cg2 * g, p["h"], p["w"], kg2 * g, kh, kw, p["strides"],
                    (pt, pl, pb, pr), p["dilation"], g, p.get("layout", "NCHW"))
    return new, tuple(pads)


# --- the model ----------------------------------------------------------------------------------
class _Model:
    """Variables, domains and propagators of one embedding problem."""

    def __init__(self, op: TensorOp, dfg: InstructionDFG, opts: Options):
        self.op, self.dfg, self.opts = op, dfg, opts
        self.var, self.nodes = self._variables()
        spatial_strides = self._out_strides()
        self.doms = self._domains(spatial_strides)
        props = self._edge_constraints()
        self.rect = self._rectangles()
        props += self._rectangle_constraints(spatial_strides)
        props += self._lane_constraints()
        self.props = props
        self.fixed: list[tuple[int, tuple[int, ...], str]] = []
        if opts.fixed_origin:
            for kind, t in (("out", "out"), ("inp", "in"), ("wgt", "wgt")):
                self.fixed.append((self.rect[kind][0], (0,) * len(op.shapes[t]), "fixed origin"))
        X, Y, Z = dfg.x, dfg.y, dfg.z
        out_vars = self.rect["out"]
        chains = [self.var["add", (bb, o, i)] for bb in range(X) for o in range(Y)
                  for i in range(Z)]
        self.branch = out_vars + chains + self.rect["inp"] + self.rect["wgt"]

    def _variables(self) -> tuple[dict, list[DFGNode]]:
        """One variable per DFG node (kind, index), except that R1 is the identity: mul[l] and
        add[l] share one variable."""
        dfg = self.dfg
        var: dict = {}
        kinds: list[DFGNode] = []
        for node in dfg.nodes:
            if node.kind != "mul":
                var[node.kind, node.index] = len(kinds)
                kinds.append(node)
        for e in dfg.edges:  # the mul of an R1 ("same") edge is its add's variable
            if e.relation == "same":
                var[e.src.kind, e.src.index] = var[e.dst.kind, e.dst.index]
        return var, kinds

    def _domains(self, spatial_strides: dict[str, tuple[int, ...]]) -> list[Dom]:
        """A box per variable: the tensor's shape for data nodes, the loop extents for
        operations (bounded by ``bound_b`` lanes when ``opts.bound``)."""
        op, opts, dfg = self.op, self.opts, self.dfg
        b = opts.bound_b or max(dfg.x, dfg.y, dfg.z)
        space = {"inp": "in", "wgt": "wgt", "out": "out"}
        doms = []
        for node in self.nodes:
            if node.kind in space:
                t = space[node.kind]
                ext = list(op.shapes[t])
                if opts.bound:
                    ext = [min(e, b * self._tensor_max_stride(t, a, spatial_strides))
                           for a, e in enumerate(ext)]
                doms.append(Dom.box(ext))
            else:
                ext = list(op.extents)
                if opts.bound:
                    ext = [min(e, b * max(spatial_strides.get(op.dims[d], (1,)), default=1))
                           for d, e in enumerate(ext)]
                doms.append(Dom.box(ext))
        return doms

    def _edge_constraints(self) -> list[Propagator]:
        """The DFG edges' constraints (access, reduction order, parallel) and AllDiff."""
        op, opts, v = self.op, self.opts, self.var
        sp = tuple(op.index(d) for d in op.spatial_dims)
        red = tuple(op.index(d) for d in op.reduction_dims)
        props: list[Propagator] = []
        for e in self.dfg.edges:
            s, t = v[e.src.kind, e.src.index], v[e.dst.kind, e.dst.index]
            if e.relation == "access:in":
                props.append(AccessEdge(t, s, op.access["in"]))
            elif e.relation == "access:wgt":
                props.append(AccessEdge(t, s, op.access["wgt"]))
            elif e.relation == "reduce":
                props.append(ReductionStep(s, t, sp, red, op.extents, not opts.commutative))
            elif e.relation == "output":
                props.append(AccessEdge(s, t, op.access["out"]))
            elif e.relation == "parallel":
                props.append(Parallel(s, t, sp))
        groups = {k: [v[n.kind, n.index] for n in self.nodes if n.kind == k]
                  for k in ("out", "inp", "wgt", "add")}
        for gi, k in enumerate(("out", "inp", "wgt", "add")):
            props.append(AllDifferent(groups[k], gi))
        return props

    def _rectangles(self) -> dict[str, list[int]]:
        """The ordered variables of each tensor's points (the hyper-rectangle's ``V``)."""
        v, X, Y, Z = self.var, self.dfg.x, self.dfg.y, self.dfg.z
        return {
            "out": [v["out", (bb, o)] for bb in range(X) for o in range(Y)],
            "inp": [v["inp", (bb, i)] for bb in range(X) for i in range(Z)],
            "wgt": [v["wgt", (o, i)] for o in range(Y) for i in range(Z)],
        }

    def _rectangle_constraints(self, spatial_strides: dict[str, tuple[int, ...]]
                               ) -> list[Propagator]:
        """Per tensor: the hyper-rectangle and the linear-access restriction.

        Linear access is defined per group: every lane of one instruction lies in one group
        (the ``z`` lanes share the spatial point, ``y`` lanes an input element, ``x`` lanes a
        weight element, and each fixes ``g``), so ``g`` is an offset and a grouped conv's
        channel coordinate ``g * cg + c`` counts as linear in ``c``."""
        op, opts = self.op, self.opts
        per = (op.index("g"),) if "g" in op.dims else ()
        props: list[Propagator] = []
        for key, (kind, t) in enumerate((("out", "out"), ("inp", "in"), ("wgt", "wgt"))):
            acc = op.access[t]
            ndim = len(op.shapes[t])
            nonlinear = tuple(a for a in range(ndim) if not acc.is_linear(a, per))
            axes = tuple(a for a in range(ndim)
                         if not (opts.linear_access and a in nonlinear))
            cause = {a: "linear memory access" for a in nonlinear}
            strides = {a: self._rect_strides(t, a, spatial_strides) for a in range(ndim)}
            if opts.hyper_rectangle:
                split = op.shapes[t] if kind == "out" and not opts.dense else None
                shared = {} if opts.linear_access else {a: len(acc.iterators(a))
                                                        for a in nonlinear}
                props.append(HyperRectangle(self.rect[kind], axes, strides, cause, key, split,
                                            shared))
            if opts.linear_access and nonlinear:
                props.append(FixedAxes(self.rect[kind], nonlinear, "linear memory access"))
        return props

    def _lane_constraints(self) -> list[Propagator]:
        """Backend restrictions on the lanes: the operator dimensions each lane axis may walk,
        and image-pack lanes."""
        op, opts, v = self.op, self.opts, self.var
        X, Y, Z = self.dfg.x, self.dfg.y, self.dfg.z
        props: list[Propagator] = []
        lanes = {"x": [v["add", (bb, 0, 0)] for bb in range(X)],
                 "y": [v["add", (0, o, 0)] for o in range(Y)],
                 "z": [v["add", (0, 0, i)] for i in range(Z)]}
        for axis, dims in opts.lane_dims:
            fixed = tuple(d for d, name in enumerate(op.dims) if name not in dims)
            if len(lanes[axis]) > 1 and fixed:
                props.append(FixedAxes(lanes[axis], fixed, f"{axis} lanes on {'/'.join(dims)}"))
        if not opts.adjacent_pixels and X > 1 and any(d in op.dims for d in IMAGE_DIMS):
            acc = op.access["out"]
            image = {a: op.shapes["out"][a] for a in range(len(op.shapes["out"]))
                     if any(op.dims[d] in IMAGE_DIMS for d in acc.iterators(a))}
            props.append(ImagePackLanes([v["out", (bb, 0)] for bb in range(X)], image))
        return props

    # strides allowed for a lane axis walking an output image dimension
    def _out_strides(self) -> dict[str, tuple[int, ...]]:
        if self.opts.dense:
            return {}
        op, dfg = self.op, self.dfg
        pieces = sorted({m for a in (dfg.x, dfg.y) for m in range(2, a + 1) if a % m == 0})
        res = {}
        for d in op.spatial_dims:
            if d not in IMAGE_DIMS:
                continue
            e = op.extents[op.index(d)]
            packs = {-(-e // m) for m in pieces}
            res[d] = tuple(sorted(packs | {1} if self.opts.adjacent_pixels else packs))
        return res

    def _rect_strides(self, t: str, a: int, spatial: dict) -> tuple[int, ...]:
        """Steps a tensor axis may take: 1 when dense; relaxed, the axis coefficient of each
        iterator times that iterator's lane strides (1 for reduction dimensions, the image-pack
        strides for output image dimensions), e.g. ``sw * P`` on the input for a pack, ``dw`` for
        a dilated stencil."""
        if self.opts.dense:
            return (1,)
        acc = self.op.access[t]
        return tuple(sorted({abs(acc.coeffs[a][d]) * s for d in acc.iterators(a)
                             for s in spatial.get(self.op.dims[d], (1,))} or {1}))

    def _tensor_max_stride(self, t: str, a: int, spatial: dict) -> int:
        return max(self._rect_strides(t, a, spatial))

    def value_order(self, asset: tuple[int, ...]):
        """Per-variable dimension order (slowest first) for an asset (a loop-dim order)."""
        op = self.op
        pos = {d: i for i, d in enumerate(asset)}
        tensor_order = {}
        for t in ("in", "wgt", "out"):
            acc = op.access[t]
            keys = [max((pos[d] for d in acc.iterators(a)), default=-1)
                    for a in range(len(op.shapes[t]))]
            tensor_order[t] = tuple(sorted(range(len(keys)), key=lambda a: keys[a]))
        kind_t = {"inp": "in", "wgt": "wgt", "out": "out"}
        orders = [tensor_order[kind_t[n.kind]] if n.kind in kind_t else asset for n in self.nodes]
        return lambda var: orders[var]

    def assets(self) -> list[tuple[int, ...]]:
        """Formula (12): one dimension order per ordered choice of ``k_s`` spatial and ``k_r``
        reduction dimensions placed innermost (the natural order otherwise), after the
        workload's own order."""
        op, dfg = self.op, self.dfg
        nat = tuple(range(op.rank))
        if not self.opts.portfolio:
            return [nat]
        sp = [op.index(d) for d in op.spatial_dims]
        red = [op.index(d) for d in op.reduction_dims]
        ks = min(len(sp), sum(1 for a in (dfg.x, dfg.y) if a > 1))
        kr = min(len(red), 1 if dfg.z > 1 else 0)
        out = [nat]  # the workload's own order first: it is often already a good one
        for s in itertools.permutations(sp, ks):
            for r in itertools.permutations(red, kr):
                inner = (*s, *r)
                order = tuple(d for d in nat if d not in inner) + inner
                if order not in out:
                    out.append(order)
        return out

    def embedding(self, vals, padded) -> Embedding:
        """Read the lane axes off a solution (from the instance points of the add nodes)."""
        X, Y, Z = self.dfg.x, self.dfg.y, self.dfg.z
        v = self.var
        pt = lambda b, o, i: vals[v["add", (b, o, i)]]  # noqa: E731
        lanes = {"x": [pt(b, 0, 0) for b in range(X)], "y": [pt(0, o, 0) for o in range(Y)],
                 "z": [pt(0, 0, i) for i in range(Z)]}
        axes = {}
        for a, pts in lanes.items():
            axes[a] = _walk(pts, self.op.dims)
        return Embedding(axes, self.op, padded)


def _walk(pts: list, dims: tuple[str, ...]) -> tuple[tuple[str, int, int], ...]:
    """Decompose an ordered list of lattice points (a hyper-rectangle in lexicographic order)
    into ``(dim, size, stride)`` innermost first; a non-rectangular walk (rectangle constraint
    off) lists every distinct dimension it touches with its span and size 0."""
    n = len(pts)
    if n == 1:
        return ()
    v0 = pts[0]
    res, inner, j = [], 1, 1
    while j < n:
        diff = [(d, pts[j][d] - v0[d]) for d in range(len(v0)) if pts[j][d] != v0[d]]
        if len(diff) != 1:
            break
        d, s = diff[0]
        size = 1
        while size * inner < n and pts[size * inner][d] - v0[d] == size * s and all(
                pts[size * inner][e] == v0[e] for e in range(len(v0)) if e != d):
            size += 1
        res.append((dims[d], size, s))
        inner *= size
        j = inner
    if inner != n:
        touched = sorted({d for p in pts for d in range(len(v0)) if p[d] != v0[d]})
        return tuple((dims[d], 0, max(p[d] for p in pts) - v0[d]) for d in touched)
    return tuple(res)


# --- search -------------------------------------------------------------------------------------
def _prepare(op: TensorOp, dfg: InstructionDFG, opts: Options):
    padded: tuple = ()
    if opts.padding:
        op, padded = pad_operator(op, dfg, "fit" if opts.padding == "fit" else "multiple")
    model = _Model(op, dfg, opts)
    return model, padded


def _reason(solvers: list[Solver]) -> str:
    for s in solvers:
        if s.root_failure:
            return f"no embedding: {s.root_failure} emptied a domain"
    total = sum((s.failures for s in solvers), start=Counter())
    total.pop("branch", None)
    if not total:
        return "no embedding: the search space is empty"
    cause, _ = total.most_common(1)[0]
    return f"no embedding: every branch failed, mostly on {cause}"


def find_embedding(op: TensorOp, dfg: InstructionDFG, opts: Options = Options()) -> SearchResult:
    """First embedding found by the portfolio (assets interleaved in one thread, the first to
    finish wins); ``nodes`` counts the tried values of all assets."""
    t0 = time.monotonic()
    model, padded = _prepare(op, dfg, opts)
    deadline = t0 + opts.time_limit
    solvers: list[Solver] = []
    gens = []
    root = None
    for asset in model.assets():
        s = Solver(model.doms, model.props, model.branch, model.value_order(asset))
        if not solvers:  # the root propagation does not depend on the value order
            root = s.initial(model.fixed)
        solvers.append(s)
        if root is None:
            break
        gens.append((s, s.slices(root.copy(), deadline, opts.max_nodes, tick=64)))
    status = "none"
    found: Engine | None = None
    try:
        while gens and found is None:
            alive = []
            for s, g in gens:  # one slice of at most 64 nodes per asset and round
                try:
                    found = next(g)
                except StopIteration:
                    continue
                if found is not None:
                    break
                alive.append((s, g))
                if sum(x.nodes for x in solvers) > opts.max_nodes:
                    raise SearchLimit
            gens = alive
    except SearchLimit:
        status = "limit"
    nodes = sum(s.nodes for s in solvers)
    dt = time.monotonic() - t0
    if found is not None:
        return SearchResult([model.embedding(found.val, padded)], nodes, dt, "ok",
                            assets=len(solvers))
    reason = (f"no embedding: solver limit reached ({nodes} nodes, {dt:.1f} s)"
              if status == "limit" else _reason(solvers))
    return SearchResult([], nodes, dt, status, reason, len(solvers))


def enumerate_embeddings(op: TensorOp, dfg: InstructionDFG, opts: Options = Options()
                         ) -> SearchResult:
    """Every distinct embedding (complete search of one asset; up to ``max_solutions``)."""
    t0 = time.monotonic()
    model, padded = _prepare(op, dfg, opts)
    s = Solver(model.doms, model.props, model.branch, model.value_order(model.assets()[0]))
    root = s.initial(model.fixed)
    found: dict = {}
    status = "ok"
    if root is not None:
        try:
            for eng in s.solutions(root, t0 + opts.time_limit, opts.max_nodes):
                emb = model.embedding(eng.val, padded)
                found.setdefault(emb.key, emb)
                if len(found) >= opts.max_solutions:
                    break
        except SearchLimit:
            status = "limit"
    dt = time.monotonic() - t0
    embs = list(found.values())
    if not embs:
        reason = (f"no embedding: solver limit reached ({s.nodes} nodes, {dt:.1f} s)"
                  if status == "limit" else _reason([s]))
        return SearchResult([], s.nodes, dt, "none" if status == "ok" else status, reason)
    return SearchResult(embs, s.nodes, dt, status)


def solutions_raw(op: TensorOp, dfg: InstructionDFG, opts: Options = Options()) -> list[dict]:
    """Every complete assignment (node name -> point) of one complete search (for tests that
    compare the solver with a brute-force enumeration)."""
    model, _ = _prepare(op, dfg, opts)
    s = Solver(model.doms, model.props, model.branch, model.value_order(model.assets()[0]))
    root = s.initial(model.fixed)
    if root is None:
        return []
    return [{n.name: eng.val[model.var[n.kind, n.index]] for n in model.dfg.nodes}
            for eng in s.solutions(root, time.monotonic() + opts.time_limit, opts.max_nodes)]
