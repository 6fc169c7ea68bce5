"""The embedding constraints of the CP paper (section 4.2) as propagators.

- :class:`AccessEdge`: an edge of the instruction DFG matched to an access relation of the
  operator (``inp -> mul``, ``wgt -> mul``, ``add -> out``): functional from the operation to
  the data element (assigns it), a preimage from the data element back to the operation
  (Fig. 2b: fixes what the relation determines, prunes the rest by support).
- :class:`ReductionStep`: ``add[i] -> add[i+1]`` keeps the output point; strict order steps to
  the lexicographic successor of the reduction point, commutative order only needs another one
  (``R2``; AllDiff keeps the points distinct).
- :class:`Parallel`: spatial edges; parallel multiplications compute different outputs (one
  end assigned prunes the other end's domain).
- :class:`AllDifferent`: no instance or tensor element is used twice (an assigned value leaves
  the group's other domains of at most two points).
- :class:`HyperRectangle`: the ordered points of a tensor form an axis-parallel hyper-rectangle
  in lexicographic order (Fig. 3), with the allowed axes (the linear-access restriction removes
  stencil axes) and strides (dense: 1). Its propagator infers the steps and sizes from the
  assigned prefix, restricts the next point to "continue" or "jump" candidates and bounds every
  later point by the inferred box (formula 10).
- :class:`FixedAxes`: the points of a tensor may not move along axes whose access is not one
  iterator with a constant stride (linear memory access); the same propagator keeps a lane axis
  on the operator dimensions a backend can implement.
- :class:`ImagePackLanes`: image-pack lanes (a backend restriction) are ordered and cover the
  image.
"""

from __future__ import annotations

import math

from tvm_accel.cp.operator import Access
from tvm_accel.cp.solver import Dom, Engine, Fail, Propagator

Point = tuple[int, ...]
_EMPTY = Dom(pts=frozenset())
_SUPPORT_LIMIT = 4096


def preimage(dom: Dom, acc: Access, q: Point) -> Dom:
    """Points of ``dom`` whose access is ``q``: coordinates with one free iterator fix it,
    coordinates with several prune each by support."""
    if dom.pts is not None:
        fn = acc.fn
        return Dom(pts=frozenset(p for p in dom.pts if fn(p) == q))
    vals: list[range | frozenset | tuple[int, ...]] = list(dom.value_sets())
    changed = True
    while changed:
        changed = False
        for row, off, qj in zip(acc.terms, acc.offsets, q, strict=True):
            rest = qj - off
            active = []
            for d, c in row:
                vd = vals[d]
                if len(vd) == 1:
                    rest -= c * next(iter(vd))
                elif not vd:
                    return _EMPTY
                else:
                    active.append((d, c))
            if not active:
                if rest:
                    return _EMPTY
                continue
            if len(active) == 1:
                d, c = active[0]
                x, r = divmod(rest, c)
                if r or x not in vals[d]:
                    return _EMPTY
                vals[d] = range(x, x + 1)
                changed = True
                continue
            for d, c in active:
                others = [(e, ce) for e, ce in active if e != d]
                if math.prod(len(vals[e]) for e, _ in others) > _SUPPORT_LIMIT:
                    continue
                sums = {0}
                for e, ce in others:
                    sums = {t + ce * x for t in sums for x in vals[e]}
                keep = tuple(x for x in vals[d] if rest - c * x in sums)
                if not keep:
                    return _EMPTY
                if len(keep) < len(vals[d]):
                    vals[d] = keep
                    changed = True
    excl = frozenset(p for p in dom.excl if all(x in v for x, v in zip(p, vals, strict=True)))
    return Dom(vals, excl=excl)


class AccessEdge(Propagator):
    name = "subgraph isomorphism"

    def __init__(self, op: int, data: int, acc: Access, limit: int = 64):
        self.vars = (op, data)
        self.op, self.data, self.acc, self.limit = op, data, acc, limit

    def propagate(self, eng: Engine, v: int, assigned: bool) -> None:
        op, data = self.op, self.data
        pv = eng.val[op]
        if pv is not None:
            eng.assign(data, self.acc.fn(pv), self.name)
            return
        dv = eng.val[data]
        if dv is not None:
            eng.narrow(op, preimage(eng.dom[op], self.acc, dv), self.name)
            return
        data_pts = eng.dom[data].pts
        if v == data and data_pts is not None and len(data_pts) <= self.limit:
            pts: list[Point] = []
            for q in data_pts:
                pre = preimage(eng.dom[op], self.acc, q)
                if pre.size() > self.limit:
                    return
                pts.extend(pre.iterate())
            eng.narrow(op, Dom.points(pts), self.name)
        elif v == op and (op_pts := eng.dom[op].pts) is not None:
            eng.narrow(data, eng.dom[data].intersect(map(self.acc.fn, op_pts)), self.name)


class ImagePackLanes(Propagator):
    """Image-pack lanes of one intrinsic axis (backend restriction, ``adjacent_pixels=False``).

    Symmetry breaking: the rewrite numbers the pieces itself, so any permutation of the lanes is
    the same program; only the one whose output points increase lexicographically is kept.
    Cover: a lane walk over an output image axis steps by the piece size ``P`` and must reach
    every piece, i.e. ``last - first + P >= extent`` (four lanes 1 apart on an 8-row image are a
    per-lane stencil copy, not a pack)."""

    name = "image pack"

    def __init__(self, lanes: list[int], image_axes: dict[int, int]):
        self.vars = tuple(lanes)
        self.image_axes = image_axes  # output tensor axis -> extent

    def propagate(self, eng: Engine, v: int, assigned: bool) -> None:
        if not assigned:
            return
        lanes, val = self.vars, eng.val
        i = lanes.index(v)
        p = eng.point(v)
        if i:
            before = val[lanes[i - 1]]
            if before is not None and not before < p:
                raise Fail(self.name)
        if i + 1 < len(lanes):
            after = val[lanes[i + 1]]
            if after is not None and not p < after:
                raise Fail(self.name)
        if any(val[u] is None for u in lanes):
            return
        for a, extent in self.image_axes.items():
            coords = sorted({eng.point(u)[a] for u in lanes})
            if len(coords) > 1 and coords[-1] - coords[0] + coords[1] - coords[0] < extent:
                raise Fail(self.name)


class ReductionStep(Propagator):
    name = "reduction order"

    def __init__(self, prev: int, nxt: int, spatial: tuple[int, ...], reduction: tuple[int, ...],
                 extents: tuple[int, ...], strict: bool):
        self.vars = (prev, nxt)
        self.spatial, self.reduction, self.extents, self.strict = (spatial, reduction, extents,
                                                                   strict)

    def _step(self, p: Point, delta: int) -> Point | None:
        q = list(p)
        for d in reversed(self.reduction):
            q[d] += delta
            if 0 <= q[d] < self.extents[d]:
                return tuple(q)
            q[d] = 0 if delta > 0 else self.extents[d] - 1
        return None

    def propagate(self, eng: Engine, v: int, assigned: bool) -> None:
        prev, nxt = self.vars
        other = nxt if v == prev else prev
        if assigned:
            p = eng.point(v)
            if self.strict:
                q = self._step(p, 1 if v == prev else -1)
                if q is None:
                    raise Fail(self.name)
                eng.assign(other, q, self.name)
                return
            o = eng.val[other]
            if o is not None:
                if any(o[d] != p[d] for d in self.spatial):
                    raise Fail(self.name)
                return
            dom = eng.dom[other]
            for d in self.spatial:
                dom = dom.restrict(d, (p[d],))
            eng.narrow(other, dom, self.name)
            return
        src = eng.dom[v]
        if src.pts is not None or eng.val[other] is not None:
            return
        dom = eng.dom[other]
        src_vals = src.value_sets()
        for d in self.spatial:
            if len(src_vals[d]) == 1 and len(dom.value_sets()[d] if dom.pts is None else ()) != 1:
                dom = dom.restrict(d, src_vals[d])
        eng.narrow(other, dom, self.name)


class Parallel(Propagator):
    """Spatial edge: two parallel multiplications differ on some spatial dimension. With one
    end assigned, the other end's domain loses that end's spatial point: a point set drops the
    points sharing it; a box fails when it is that spatial point on every spatial dimension
    and, when it is on all but one, that dimension drops the value (exact, never a split)."""

    name = "subgraph isomorphism"

    def __init__(self, anchor: int, other: int, spatial: tuple[int, ...]):
        self.vars = (anchor, other)
        self.spatial = spatial

    def propagate(self, eng: Engine, v: int, assigned: bool) -> None:
        x, y = self.vars
        val, sp = eng.val, self.spatial
        a, b = val[x], val[y]
        if a is None:
            if b is None:
                return
            p, u = b, x
        elif b is None:
            p, u = a, y
        else:
            for d in sp:
                if a[d] != b[d]:
                    return
            raise Fail(self.name)
        dom = eng.dom[u]
        if dom.pts is not None:
            eng.narrow(u, Dom(pts=frozenset(q for q in dom.pts
                                            if any(q[d] != p[d] for d in sp))), self.name)
            return
        vals = dom.value_sets()
        free = None
        for d in sp:
            vd = vals[d]
            if p[d] not in vd:
                return
            if len(vd) > 1:
                if free is not None:
                    return
                free = d
        if free is None:
            raise Fail(self.name)
        eng.narrow(u, dom.restrict(free, frozenset(vals[free]) - {p[free]}), self.name)


class AllDifferent(Propagator):
    """No two variables of the group take the same value. Value elimination where it is exact
    and decisive: an assigned value leaves the point-set domains of at most two points of the
    group's unassigned variables (the other point is assigned, or the node fails). Wider
    elimination cost more than it saved: recording the value as an excluded point in every
    box of the group made the Fig. 8 searches up to 14x slower in CPU time, and dropping it
    from every point set 2.3x on a DeepBench layer (each narrowing re-runs the access
    preimages), with no search node saved."""

    name = "AllDiff"

    def __init__(self, vars_: list[int], group: int):
        self.vars = tuple(vars_)
        self.group = group

    def propagate(self, eng: Engine, v: int, assigned: bool) -> None:
        if not assigned:
            return
        p = eng.val[v]
        taken = eng.taken[self.group]
        holder = taken.get(p)
        if holder is not None:
            if holder != v:
                raise Fail(self.name)
            return
        taken[p] = v
        val, dom = eng.val, eng.dom
        for u in self.vars:
            if val[u] is not None or u == v:
                continue
            pts = dom[u].pts
            if pts is not None and len(pts) <= 2 and p in pts:
                eng.narrow(u, Dom(pts=pts - {p}), self.name)


class FixedAxes(Propagator):
    """Every point shares the first point's coordinates on ``fixed_axes``: the linear-access
    restriction (no movement along stencil axes) and a backend's lane restriction (a lane
    axis walks only the operator dimensions its codegen can implement)."""

    def __init__(self, vars_: list[int], fixed_axes: tuple[int, ...], name: str):
        self.vars = tuple(vars_)
        self.axes = fixed_axes
        self.name = name

    def propagate(self, eng: Engine, v: int, assigned: bool) -> None:
        if not assigned or not self.axes:
            return
        p = eng.point(v)
        for u in self.vars:
            pu = eng.val[u]
            if pu is not None:
                if any(pu[a] != p[a] for a in self.axes):
                    raise Fail(self.name)
                continue
            dom = eng.dom[u]
            for a in self.axes:
                dom = dom.restrict(a, (p[a],))
            eng.narrow(u, dom, self.name)


class HyperRectangle(Propagator):
    """``V`` (ordered) forms an axis-parallel hyper-rectangle in lexicographic order.

    ``axes`` are the tensor axes the rectangle may extend along; ``strides[a]`` the allowed
    step lengths along axis ``a`` (``None``: any positive stride, checked but not enumerated).
    """

    name = "hyper-rectangle"

    def __init__(self, vars_: list[int], axes: tuple[int, ...], strides: dict, cause: dict,
                 key: int, split: tuple[int, ...] | None = None, shared: dict | None = None):
        self.vars = tuple(vars_)
        #: axis -> how many rectangle dimensions may run along it (default 1); a stencil axis
        #: ``oh * sh + r * dh`` under relaxed linear access carries one per iterator (the
        #: im2col view: pixel lanes and kernel-tap lanes both move along the image row)
        self.shared = shared or {}
        self.n = len(vars_)
        self.axes = axes
        self.strides = strides
        self.cause = cause  # axis -> constraint name blamed when a step uses it illegally
        self.key = key
        #: tensor extents when a strided dimension must split its axis into equal pieces
        #: (image pack: ``size`` pieces of ``stride = ceil(extent / size)``)
        self.split = split

    def _check_split(self, a: int, s: int, size: int) -> None:
        if self.split is not None and s > 1 and s != -(-self.split[a] // size):
            raise Fail("image pack split")

    def _vector(self, p: Point, v0: Point, used: list[int]) -> tuple[int, int]:
        diff = [(a, x - y) for a, (x, y) in enumerate(zip(p, v0, strict=True)) if x != y]
        if len(diff) != 1 or diff[0][1] <= 0:
            raise Fail(self.name)
        a, s = diff[0]
        if a not in self.axes:
            raise Fail(self.cause.get(a, self.name))
        if used.count(a) >= self.shared.get(a, 1):
            raise Fail(self.name)
        allowed = self.strides.get(a)
        if allowed is not None and s not in allowed:
            raise Fail(self.cause.get(("stride", a), "dense"))
        return a, s

    def infer(self, pts: list[Point]) -> tuple[list[list], int]:
        """Dimensions ``[axis, stride, size or None]`` (innermost first) and the product of the
        closed ones, from a prefix of assigned points; raises Fail when they break the shape."""
        v0, n = pts[0], self.n
        dims: list[list] = []
        used: list[int] = []
        inner = 1
        for j in range(1, len(pts)):
            p = pts[j]
            if not dims:
                a, s = self._vector(p, v0, used)
                dims.append([a, s, None])
                used.append(a)
                continue
            q, rem = divmod(j, inner)
            if rem:
                base, off = pts[q * inner], pts[rem]
                if p != tuple(b + o - z for b, o, z in zip(base, off, v0, strict=True)):
                    raise Fail(self.name)
                continue
            a, s, _ = dims[-1]
            if p[a] - v0[a] == q * s and all(x == y for i, (x, y) in enumerate(
                    zip(p, v0, strict=True)) if i != a):
                if q + 1 > n // inner:
                    raise Fail(self.name)
                continue
            if (n // inner) % q:
                raise Fail(self.name)
            self._check_split(a, s, q)
            dims[-1][2] = q
            inner *= q
            a, s = self._vector(p, v0, used)
            dims.append([a, s, None])
            used.append(a)
        return dims, inner

    def propagate(self, eng: Engine, v: int, assigned: bool) -> None:
        if not assigned:
            return
        V, n = self.vars, self.n
        v0 = eng.val[V[0]]
        if v0 is None:
            return
        m = 0
        while m + 1 < n and eng.val[V[m + 1]] is not None:
            m += 1
        if eng.memo.get(self.key) == m:
            return
        eng.memo[self.key] = m
        pts = [eng.point(V[j]) for j in range(m + 1)]
        dims, inner = self.infer(pts)
        if m + 1 == n:
            if dims and (dims[-1][2] is None):
                if n % inner:
                    raise Fail(self.name)
                self._check_split(dims[-1][0], dims[-1][1], n // inner)
            return
        j = m + 1
        used = [d[0] for d in dims]
        cands: list[Point] = []
        any_stride = False  # a jump along an axis of unconstrained stride: no candidate list
        if not dims:
            q, rem = 1, 0
        else:
            q, rem = divmod(j, inner)
        if dims and rem:
            base, off = pts[q * inner], pts[rem]
            cands = [tuple(b + o - z for b, o, z in zip(base, off, v0, strict=True))]
        else:
            if dims:
                a, s, _ = dims[-1]
                if q + 1 <= n // inner:
                    c = list(v0)
                    c[a] += q * s
                    cands.append(tuple(c))
            can_jump = not dims or ((n // inner) % q == 0 and n // (inner * q) >= 2)
            if can_jump:
                for a in self.axes:
                    if used.count(a) >= self.shared.get(a, 1):
                        continue
                    allowed = self.strides.get(a)
                    if allowed is None:
                        any_stride = True
                        break
                    for s in allowed:
                        c = list(v0)
                        c[a] += s
                        cands.append(tuple(c))
        if not any_stride:
            dom = eng.dom[V[j]]
            eng.narrow(V[j], dom.intersect(cands) if dom.pts is None or len(cands) < 64
                       else dom, self.name)
        self._bound(eng, v0, dims, inner, q if dims else 1, j + 1)

    def _bound(self, eng: Engine, v0: Point, dims: list, inner: int, count: int, start: int):
        """Formula (10): a box for the points not yet assigned."""
        n = self.n
        spanned: dict[int, int] = {}  # axis -> extent covered by the inferred dimensions
        for k, (a, s, size) in enumerate(dims):
            if size is not None:
                spanned[a] = spanned.get(a, 0) + (size - 1) * s
            elif k == len(dims) - 1:
                spanned[a] = spanned.get(a, 0) + (n // inner - 1) * s
        rest = n // (inner * max(count, 2)) if dims else n
        hi: dict[int, int | None] = dict(spanned)
        for a in self.axes:  # distinct axes
            if a in spanned and sum(d[0] == a for d in dims) >= self.shared.get(a, 1):
                continue
            allowed = self.strides.get(a)
            hi[a] = (None if allowed is None
                     else spanned.get(a, 0) + (rest - 1) * max(allowed, default=1))
        sig = (v0, tuple(sorted(hi.items())))
        if eng.memo.get((self.key, "box")) == sig:  # same box as the last call on this path
            return
        eng.memo[self.key, "box"] = sig
        for u in self.vars[start:]:
            if eng.val[u] is not None:
                continue
            dom = eng.dom[u]
            for a in range(len(v0)):
                if a not in hi:
                    dom = dom.restrict(a, (v0[a],))
                elif (top := hi[a]) is not None:
                    dom = dom.restrict(a, range(v0[a], v0[a] + top + 1))
            eng.narrow(u, dom, self.name)
