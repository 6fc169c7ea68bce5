"""A small finite-domain constraint engine over integer points (the CP paper, section 4).

Variables take integer *points* (tuples) from a domain; a domain is either a box (one set of
allowed values per dimension, minus excluded points) or an explicit point set. Constraints come
with propagators that only ever remove values (monotonic filtering); a domain left with one
value assigns its variable (the paper's "subsumed" domain), an empty one fails the node.
Search is depth-first with copied state (no trail), branching on the first unassigned variable
of a given order and trying its values in the lexicographic order of a *dimension order* (the
asset of a portfolio, section 7). Every tried value is one search node.

Coordinates are Python integers, so domains of any size are exact (no 32-bit limit).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

__all__ = ["Dom", "Engine", "Fail", "Propagator", "SearchLimit", "Solver"]

Point = tuple[int, ...]
#: the allowed values of one dimension of a box domain
ValueSet = range | frozenset


class Fail(Exception):
    """A propagator emptied a domain or found a violated constraint (the node fails)."""

    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


class SearchLimit(Exception):
    """The node or time budget of a search ran out."""


def _vset(values) -> ValueSet:
    """A dimension's value set: a ``range`` when contiguous, else a ``frozenset`` (O(1)
    membership either way; iteration sorts)."""
    if isinstance(values, range) and values.step == 1:
        return values
    vs = values if isinstance(values, frozenset) else frozenset(values)
    if vs:
        lo, hi = min(vs), max(vs)
        if hi - lo + 1 == len(vs):
            return range(lo, hi + 1)
    return vs


def _sorted(v) -> range | list:
    return v if isinstance(v, range) else sorted(v)


class Dom:
    """Immutable domain: a box ``vals[0] x vals[1] x ...`` minus ``excl``, or explicit points.

    ``vals[d]`` is a ``range`` or a ``frozenset``; ``pts`` a ``frozenset`` of points."""

    __slots__ = ("vals", "pts", "excl")

    def __init__(self, vals: Sequence | None = None, pts=None, excl: frozenset = frozenset()):
        self.vals: tuple[ValueSet, ...] | None = (None if vals is None
                                                  else tuple(_vset(v) for v in vals))
        self.pts: frozenset | None = (None if pts is None else
                                      (pts if isinstance(pts, frozenset) else frozenset(pts)))
        self.excl = excl

    def value_sets(self) -> tuple[ValueSet, ...]:
        """The per-dimension value sets of a box domain (a point-set domain has none)."""
        if self.vals is None:
            raise TypeError("a point-set domain has no per-dimension value sets")
        return self.vals

    @staticmethod
    def box(extents: Sequence[int]) -> Dom:
        return Dom([range(e) for e in extents])

    @staticmethod
    def points(pts) -> Dom:
        return Dom(pts=frozenset(pts))

    def size(self) -> int:
        if self.pts is not None:
            return len(self.pts)
        return math.prod(len(v) for v in self.value_sets()) - len(self.excl)

    def contains(self, p: Point) -> bool:
        if self.pts is not None:
            return p in self.pts
        return p not in self.excl and all(x in v for x, v in
                                          zip(p, self.value_sets(), strict=True))

    def only(self) -> Point:
        if self.pts is not None:
            for p in self.pts:
                return p
        else:
            for p in itertools.product(*self.value_sets()):
                if p not in self.excl:
                    return p
        raise Fail("empty domain")

    def without(self, p: Point) -> Dom:
        if not self.contains(p):
            return self
        if self.pts is not None:
            return Dom(pts=self.pts - {p})
        return Dom(self.vals, excl=self.excl | {p})

    def restrict(self, d: int, allowed) -> Dom:
        """Keep points whose coordinate ``d`` is in ``allowed`` (a set, range or tuple)."""
        if self.pts is not None:
            return Dom(pts=frozenset(p for p in self.pts if p[d] in allowed))
        box = self.value_sets()
        cur = box[d]
        new: ValueSet
        if isinstance(allowed, range) and isinstance(cur, range) and allowed.step == 1:
            new = range(max(cur.start, allowed.start), min(cur.stop, allowed.stop))
        else:
            new = frozenset(v for v in allowed if v in cur) if len(allowed) < len(cur) \
                else frozenset(v for v in cur if v in allowed)
        if len(new) == len(cur):
            return self
        vals = list(box)
        vals[d] = new
        excl = frozenset(q for q in self.excl if q[d] in allowed) if self.excl else self.excl
        return Dom(vals, excl=excl)

    def intersect(self, pts) -> Dom:
        return Dom(pts=frozenset(p for p in pts if self.contains(p)))

    def meet(self, other: Dom) -> Dom:
        """Intersection with another domain of the same space."""
        if other.pts is not None:
            return self.intersect(other.pts)
        if self.pts is not None:
            return other.intersect(self.pts)
        vals: list[ValueSet] = []
        for a, b in zip(self.value_sets(), other.value_sets(), strict=True):
            if isinstance(a, range) and isinstance(b, range):
                vals.append(range(max(a.start, b.start), min(a.stop, b.stop)))
            else:
                vals.append(frozenset(x for x in a if x in b) if len(a) <= len(b)
                            else frozenset(x for x in b if x in a))
        excl = frozenset(p for p in self.excl | other.excl
                         if all(x in v for x, v in zip(p, vals, strict=True)))
        return Dom(vals, excl=excl)

    def iterate(self, order: Sequence[int] | None = None) -> Iterator[Point]:
        """Points in lexicographic order of the dimensions listed in ``order`` (slowest first,
        the last dimension varying fastest); ``None`` is the natural order."""
        if self.pts is not None:
            if not self.pts:
                return
            n = len(next(iter(self.pts)))
        else:
            n = len(self.value_sets())
        order = list(range(n)) if order is None else list(order)
        if self.pts is not None:
            yield from sorted(self.pts, key=lambda p: tuple(p[d] for d in order))
            return
        inv = [order.index(d) for d in range(n)]
        box = self.value_sets()
        for q in itertools.product(*(_sorted(box[d]) for d in order)):
            p = tuple(q[i] for i in inv)
            if p not in self.excl:
                yield p


class Propagator:
    """A constraint over ``vars`` (indices); ``propagate`` is called when one of them was
    assigned (``assigned=True``) or narrowed, and raises :class:`Fail` on a violation."""

    name = "constraint"
    vars: tuple[int, ...] = ()

    def propagate(self, eng: Engine, v: int, assigned: bool) -> None:  # pragma: no cover
        raise NotImplementedError


class Engine:
    """Search state: a domain and an optional value per variable, and the propagation queue."""

    def __init__(self, doms: list[Dom], watch: list[list[Propagator]], n_groups: int = 0):
        self.dom = doms
        self.val: list[Point | None] = [None] * len(doms)
        self.watch = watch
        self._queue: list[tuple[int, bool]] = []
        #: per AllDifferent group: value -> variable holding it
        self.taken: list[dict] = [{} for _ in range(n_groups)]
        #: per-propagator scratch (copied with the node)
        self.memo: dict = {}

    def copy(self) -> Engine:
        e = Engine.__new__(Engine)
        e.dom, e.val, e.watch, e._queue = list(self.dom), list(self.val), self.watch, []
        e.taken = [t.copy() for t in self.taken]
        e.memo = dict(self.memo)
        return e

    def assign(self, v: int, p: Point, cause: str) -> None:
        cur = self.val[v]
        if cur is not None:
            if cur != p:
                raise Fail(cause)
            return
        if not self.dom[v].contains(p):
            raise Fail(cause)
        self.val[v] = p
        self.dom[v] = Dom(pts=frozenset((p,)))
        self._queue.append((v, True))

    def point(self, v: int) -> Point:
        """The value of an assigned variable."""
        p = self.val[v]
        if p is None:
            raise TypeError(f"variable {v} is not assigned")
        return p

    def narrow(self, v: int, dom: Dom, cause: str) -> None:
        cur = self.val[v]
        if cur is not None:
            if not dom.contains(cur):
                raise Fail(cause)
            return
        if dom is self.dom[v]:
            return
        n = dom.size()
        if n == 0:
            raise Fail(cause)
        if n == self.dom[v].size():  # propagators only remove values: same size, same set
            return
        if n == 1:
            self.dom[v] = dom
            self.assign(v, dom.only(), cause)
            return
        self.dom[v] = dom
        self._queue.append((v, False))

    def propagate(self) -> None:
        q = self._queue
        while q:
            v, assigned = q.pop()
            for prop in self.watch[v]:
                prop.propagate(self, v, assigned)


class Solver:
    """Depth-first search over an :class:`Engine` with node/time limits and failure causes.

    ``branch`` lists the variables to branch on (in order); ``value_order(var)`` gives the
    dimension order in which the values of ``var`` are tried (lexicographic)."""

    def __init__(self, doms: list[Dom], props: list[Propagator], branch: Sequence[int],
                 value_order: Callable[[int], Sequence[int] | None]):
        watch: list[list[Propagator]] = [[] for _ in doms]
        for p in props:
            for v in p.vars:
                watch[v].append(p)
        groups = max((getattr(p, "group", -1) for p in props), default=-1) + 1
        self.root = Engine(list(doms), watch, groups)
        self.props = props
        self.branch = list(branch)
        self.value_order = value_order
        self.nodes = 0
        self.failures: Counter = Counter()
        self.root_failure: str | None = None

    def initial(self, fixed: list[tuple[int, Point, str]]) -> Engine | None:
        """Root node: post unary assignments and propagate; None (with the cause) on failure."""
        eng = self.root.copy()
        try:
            for v, p, cause in fixed:
                eng.assign(v, p, cause)
            for prop in self.props:  # first pass over every constraint (domain bounds etc.)
                for v in prop.vars[:1]:
                    prop.propagate(eng, v, eng.val[v] is not None)
            eng.propagate()
        except Fail as f:
            self.root_failure = f.cause
            self.failures[f.cause] += 1
            return None
        return eng

    def solutions(self, eng: Engine, deadline: float, max_nodes: int) -> Iterator[Engine]:
        """All solutions below ``eng``, depth first."""
        for node in self.slices(eng, deadline, max_nodes):
            if node is not None:
                yield node

    def slices(self, eng: Engine, deadline: float, max_nodes: int, tick: int = 0
               ) -> Iterator[Engine | None]:
        """All solutions below ``eng``, depth first (a generator: the caller can interleave
        several searches, which is how the portfolio runs its assets concurrently). With
        ``tick`` > 0 it also yields ``None`` every ``tick`` search nodes, so a caller can
        switch searches even while one finds nothing."""
        stack: list[Iterator[Engine]] = [iter([eng])]
        mark = self.nodes
        while stack:
            if tick and self.nodes - mark >= tick:
                mark = self.nodes
                yield None
            try:
                node = next(stack[-1])
            except StopIteration:
                stack.pop()
                continue
            v = next((b for b in self.branch if node.val[b] is None), None)
            if v is None:
                yield node
                continue
            stack.append(self._children(node, v, deadline, max_nodes))

    def _children(self, node: Engine, v: int, deadline: float, max_nodes: int
                  ) -> Iterator[Engine]:
        for p in node.dom[v].iterate(self.value_order(v)):
            self.nodes += 1
            if self.nodes > max_nodes or (self.nodes & 63 == 0 and time.monotonic() > deadline):
                raise SearchLimit
            child = node.copy()
            try:
                child.assign(v, p, "branch")
                child.propagate()
            except Fail as f:
                self.failures[f.cause] += 1
                continue
            yield child
