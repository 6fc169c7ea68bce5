"""DNNVM fusion: template embeddings by subgraph isomorphism (:func:`find_candidates`), the
cheapest execution strategy between barriers by shortest path over measured costs
(:func:`choose`), and the search that measures every candidate on the simulator
(:func:`search`, :func:`parallel_pass`), given a planner of :mod:`tvm_dpu.strategy`. Templates
and algorithms: ``docs/dpu.md`` (Fusion)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from tvm_accel.errors import MappingError
from tvm_accel.layers import AddLayer, ConcatLayer, ConvLayer, LayerGraph, PoolLayer
from tvm_dpu import codegen as cg
from tvm_dpu.hw_config import DPUConfig
from tvm_dpu.program import LayerProgram
from tvm_dpu.simulator import simulate

MAX_CLUSTER = 12  # crossing candidates decided jointly; a larger cluster keeps its most beneficial
MAX_CHAIN = 3  # convs in an on-chip chain candidate (a bottleneck branch is 3)


@dataclass(frozen=True)
class Candidate:
    """One embedding of a fusion template: ``layers`` in execution order."""

    template: str
    layers: tuple[str, ...]

    @property
    def name(self) -> str:
        return "+".join(self.layers)


# --- graph view ---------------------------------------------------------------------------------
class _View:
    """Producer/consumer maps of a layer graph (edges through named tensors)."""

    def __init__(self, graph: LayerGraph):
        self.g = graph
        self.layer = {ly.name: ly for ly in graph.layers}
        self.order = {ly.name: i for i, ly in enumerate(graph.layers)}
        self.producer: dict[str, str] = {ly.output: ly.name for ly in graph.layers}
        self.consumers: dict[str, list[str]] = {}
        for ly in graph.layers:
            for t in inputs_of(ly):
                self.consumers.setdefault(t, []).append(ly.name)

    def single_consumer(self, name: str) -> str | None:
        """The only consumer of ``name``'s output, if it has exactly one and is not an output."""
        out = self.layer[name].output
        cons = self.consumers.get(out, [])
        return cons[0] if len(cons) == 1 and out not in self.g.outputs else None


def inputs_of(layer) -> list[str]:
    return list(getattr(layer, "inputs", None) or [layer.input])


# --- subgraph isomorphism ------------------------------------------------------------------------
@dataclass
class Template:
    """Query graph: vertex predicates and edges ``("flow", i, j)`` (j reads i's output, which
    nothing else reads) or ``("share", i, j)`` (i and j read the same tensor)."""

    name: str
    vertices: list[Callable[[object], bool]]
    edges: list[tuple[str, int, int]]


def _edge_ok(v: _View, kind: str, a: str, b: str) -> bool:
    if kind == "flow":
        return v.single_consumer(a) == b
    return inputs_of(v.layer[a])[0] == inputs_of(v.layer[b])[0]


def match(tpl: Template, v: _View) -> list[tuple[str, ...]]:
    """Every embedding of ``tpl`` in the graph (query vertex i -> layer name), automorphic
    duplicates (same layer set) reported once."""
    cand = [[n for n, ly in v.layer.items() if pred(ly)] for pred in tpl.vertices]
    if any(not c for c in cand):
        return []
    nq = len(tpl.vertices)
    adj: dict[int, list[tuple[str, int, int]]] = {i: [] for i in range(nq)}
    for e in tpl.edges:
        adj[e[1]].append(e)
        adj[e[2]].append(e)
    start = min(range(nq), key=lambda i: len(cand[i]))
    order, seen = [start], {start}
    for q in order:  # breadth-first NextQueryVertex
        for _, i, j in adj[q]:
            for nxt in (i, j):
                if nxt not in seen:
                    seen.add(nxt)
                    order.append(nxt)
    order += [i for i in range(nq) if i not in seen]
    found: dict[frozenset, tuple[str, ...]] = {}
    m: dict[int, str] = {}

    def search(depth: int) -> None:
        if depth == nq:
            key = frozenset(m.values())
            found.setdefault(key, tuple(m[i] for i in range(nq)))
            return
        q = order[depth]
        for u in cand[q]:  # RefineCandidates: unused and adjacent to the matched vertices
            if u in m.values():
                continue
            ok = all(_edge_ok(v, kind, m[i] if i != q else u, m[j] if j != q else u)
                     for kind, i, j in adj[q] if (i == q or i in m) and (j == q or j in m))
            if ok:
                m[q] = u
                search(depth + 1)
                del m[q]

    search(0)
    return list(found.values())


def _is_conv(ly) -> bool:
    return isinstance(ly, ConvLayer) and not ly.is_dense


def _same_geometry(a: ConvLayer, b: ConvLayer) -> bool:
    return (a.kernel == b.kernel and tuple(a.strides) == tuple(b.strides)
            and tuple(a.padding) == tuple(b.padding)
            and tuple(a.dilation) == tuple(b.dilation))


def _undilated_conv(ly) -> bool:
    """A conv without dilation: the on-chip chains and the pool templates line up row bands
    and pool windows with the conv's dense kernel (a dilated conv runs alone, in a conv+add or
    a horizontal group, whose tiles read its dilated window)."""
    return _is_conv(ly) and tuple(ly.dilation) == (1, 1)


def _chain_conv(ly) -> bool:
    return _undilated_conv(ly) and (ly.groups == 1 or ly.is_depthwise)


def templates(max_horizontal: int) -> list[Template]:
    conv = _is_conv
    tpls = [
        Template("conv+pool", [_undilated_conv, lambda ly: isinstance(ly, PoolLayer)],
                 [("flow", 0, 1)]),
        Template("conv+add", [conv, lambda ly: isinstance(ly, AddLayer)], [("flow", 0, 1)]),
        Template("pool+conv", [lambda ly: isinstance(ly, PoolLayer), _undilated_conv],
                 [("flow", 0, 1)]),
    ]
    for k in range(2, max_horizontal + 1):
        plain = [lambda ly: conv(ly) and ly.groups == 1] * k
        tpls.append(Template("horizontal", plain, [("share", 0, j) for j in range(1, k)]))
    for k in range(2, MAX_CHAIN + 1):
        flow = [("flow", i, i + 1) for i in range(k - 1)]
        tpls.append(Template("chain", [_chain_conv] * k, flow))
        tpls.append(Template("chain", [*[_chain_conv] * k, lambda ly: isinstance(ly, AddLayer)],
                             [*flow, ("flow", k - 1, k)]))
        tpls.append(Template("chain", [*[_chain_conv] * k, lambda ly: isinstance(ly, PoolLayer)],
                             [*flow, ("flow", k - 1, k)]))
        # a first bottleneck block: the projection shortcut (vertex k) reads the chain's input
        tpls.append(Template("chain", [*[_chain_conv] * (k + 1),
                                       lambda ly: isinstance(ly, AddLayer)],
                             [*flow, ("share", 0, k), ("flow", k - 1, k + 1),
                              ("flow", k, k + 1)]))
    return tpls


def find_candidates(graph: LayerGraph, accept: Callable[[Candidate], bool] | None = None
                    ) -> list[Candidate]:
    """All embeddings of the fusion templates in ``graph`` that ``accept`` (hardware fit) allows."""
    v = _View(graph)
    fan = max((len(c) for c in v.consumers.values()), default=1)
    out: list[Candidate] = []
    for tpl in templates(max(2, fan)):
        for emb in match(tpl, v):
            layers = [v.layer[n] for n in emb]
            name = tpl.name
            if name == "horizontal":
                if not all(_same_geometry(layers[0], ly) for ly in layers[1:]):
                    continue
                emb = tuple(sorted(emb, key=v.order.__getitem__))
            elif name == "conv+pool" and layers[0].requant.qmin > -128:
                name = "conv+relu+pool"
            c = Candidate(name, emb)
            if accept is None or accept(c):
                out.append(c)
    return out


# --- execution strategy -----------------------------------------------------------------------
def _chains(v: _View) -> list[list[str]]:
    nxt: dict[str, str] = {}
    for n in v.layer:
        c = v.single_consumer(n)
        if c is not None and len(inputs_of(v.layer[c])) == 1:
            nxt[n] = c
    heads = set(v.layer) - set(nxt.values())
    chains = []
    for h in sorted(heads, key=v.order.__getitem__):
        ch = [h]
        while ch[-1] in nxt:
            ch.append(nxt[ch[-1]])
        chains.append(ch)
    return chains


def _chain_cost(chain: list[str], lo: int, hi: int, single: dict[str, float],
                inner: dict[tuple[str, ...], float]) -> tuple[float, list[tuple[str, ...]]]:
    """Shortest path over positions ``lo .. hi`` of a chain: edges are single nodes and fused
    candidates inside the chain (``inner``: layer tuple -> cost); returns (cost, groups)."""
    best: dict[int, tuple[float, list]] = {lo: (0.0, [])}
    for i in range(lo, hi):
        if i not in best:
            continue
        base, groups = best[i]
        for j in range(i + 1, hi + 1):
            seg = tuple(chain[i:j])
            cost = single[seg[0]] if j == i + 1 else inner.get(seg)
            if cost is None:
                continue
            if j not in best or base + cost < best[j][0]:
                best[j] = (base + cost, [*groups, seg])
    return best[hi]


def _prefix_or_suffix(chain: list[str], part: set[str]) -> bool:
    """``part`` (nodes of ``chain``) is a contiguous run that starts or ends the chain."""
    idx = sorted(chain.index(n) for n in part)
    return idx == list(range(idx[0], idx[-1] + 1)) and (idx[0] == 0 or idx[-1] == len(chain) - 1)


def choose(graph: LayerGraph, cands: list[Candidate], single: dict[str, float],
           fused: dict[Candidate, float], forced: dict[str, bool] | None = None
           ) -> tuple[list[tuple[str, ...]], float]:
    """Groups (tuples of layer names) covering every layer with the least total cost.

    ``single[layer]`` and ``fused[candidate]`` are measured cycles (a layer in no candidate may
    be missing from ``single``: it is alone whatever the choice); ``forced`` maps candidate names
    to True (must be used: it gets a bonus larger than any cost) or False (never used). Returns
    the groups and their total measured cost (unmeasured layers count 0)."""
    forced = forced or {}
    v = _View(graph)
    single = {n: single.get(n, 0.0) for n in v.layer}
    cands = [c for c in cands if c in fused and forced.get(c.name, True)]
    bonus = 2.0 * (sum(single.values()) + sum(fused.values()) + 1.0)
    cost_of = {c: fused[c] - (bonus if forced.get(c.name) else 0.0) for c in cands}
    chains = _chains(v)
    where = {n: (ci, k) for ci, ch in enumerate(chains) for k, n in enumerate(ch)}
    inner: dict[tuple[str, ...], float] = {}
    crossing: list[Candidate] = []
    for c in cands:
        pos = [where[n] for n in c.layers]
        ci, k0 = pos[0]
        if all(p == (ci, k0 + i) for i, p in enumerate(pos)):
            inner[c.layers] = cost_of[c]
        elif all(_prefix_or_suffix(chains[cj], {n for n in c.layers if where[n][0] == cj})
                 for cj in {p[0] for p in pos}):
            crossing.append(c)
    touched = {c: {where[n][0] for n in c.layers} for c in crossing}

    clusters: list[list[Candidate]] = []  # crossing candidates linked by a shared chain
    for c in crossing:
        linked = [cl for cl in clusters if any(touched[c] & touched[d] for d in cl)]
        clusters = [cl for cl in clusters if cl not in linked]
        clusters.append([c] + [d for cl in linked for d in cl])

    def chain_with(ci: int, taken: set[str]) -> tuple[float, list]:
        ch = chains[ci]
        lo = 0
        while lo < len(ch) and ch[lo] in taken:
            lo += 1
        hi = len(ch)
        while hi > lo and ch[hi - 1] in taken:
            hi -= 1
        if hi <= lo:
            return 0.0, []
        if any(n in taken for n in ch[lo:hi]):
            return float("inf"), []
        return _chain_cost(ch, lo, hi, single, inner)

    groups: list[tuple[str, ...]] = []
    done_chains: set[int] = set()
    for cl in clusters:
        def benefit(c: Candidate) -> float:
            return sum(single[n] for n in c.layers) - cost_of[c]
        cl = sorted(cl, key=benefit, reverse=True)[:MAX_CLUSTER]
        chs = sorted(set().union(*(touched[c] for c in cl)))
        best: tuple[float, list] = (float("inf"), [])
        for r in range(len(cl) + 1):
            for sub in combinations(cl, r):
                taken = [n for c in sub for n in c.layers]
                if len(taken) != len(set(taken)):
                    continue
                cost = sum(cost_of[c] for c in sub)
                gs = [c.layers for c in sub]
                for ci in chs:
                    cc, more = chain_with(ci, set(taken))
                    cost += cc
                    gs += more
                if cost < best[0]:
                    best = (cost, gs)
        groups += best[1]
        done_chains |= set(chs)
    for ci in range(len(chains)):
        if ci not in done_chains:
            groups += chain_with(ci, set())[1]
    chosen = set(groups)
    missing = [c.name for c in cands if forced.get(c.name) and c.layers not in chosen]
    if missing:
        raise ValueError(f"forced fusion candidates overlap or cannot be used: {missing}")
    by_layers = {c.layers: fused[c] for c in cands}
    total = sum(by_layers[g] if len(g) > 1 else single[g[0]] for g in groups)
    return groups, total


def order_groups(graph: LayerGraph, groups: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Groups in an execution order that respects every data dependency (Kahn's algorithm on
    the group graph, ties broken by the original layer order)."""
    v = _View(graph)
    gid = {n: i for i, g in enumerate(groups) for n in g}
    deps: list[set[int]] = [set() for _ in groups]
    for i, g in enumerate(groups):
        for n in g:
            for t in inputs_of(v.layer[n]):
                p = v.producer.get(t)
                if p is not None and gid[p] != i:
                    deps[i].add(gid[p])
    key = [min(v.order[n] for n in g) for g in groups]
    done: set[int] = set()
    out = []
    while len(out) < len(groups):
        ready = [i for i in range(len(groups)) if i not in done and deps[i] <= done]
        if not ready:
            raise ValueError("fusion groups form a cycle")
        i = min(ready, key=key.__getitem__)
        done.add(i)
        out.append(groups[i])
    return out


# --- the search: candidates measured on the simulator --------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


FUSION_KNOB = "@fusion"


@dataclass
class FusionReport:
    """What the fusion search saw: every candidate with its measured cycles and the summed
    cycles of its layers alone, and the chosen groups."""

    candidates: list[tuple[str, str, int, int]]  # (name, template, fused, unfused) cycles
    chosen: list[str]
    search_cycles: int  # total measured cycles of the chosen strategy over the measured layers
    parallel: list = field(default_factory=list)  # (pair, sequential, parallel) cycles


#: hill-climbing moves over ``tile_h`` per fusion candidate in the search (0: default knobs only)
LOCAL_SEARCH_MOVES = 3


def search(p: Any, graph: LayerGraph, cfg: DPUConfig, knobs: dict, forced: dict[str, bool]
           ) -> tuple[list[tuple[str | None, tuple[str, ...]]], FusionReport, dict]:
    """DNNVM's search (``tvm_dpu.fusion``): candidates by subgraph isomorphism, each planned and
    simulated (cycles on a zeroed DDR image; the timing does not depend on the data) together
    with its layers alone, then the cheapest strategy between barriers. Each candidate without
    user knobs is measured in a good version, not only with the heuristic defaults: a small
    local search (hill climbing over the ``tile_h`` options, ``LOCAL_SEARCH_MOVES`` moves from
    the default, each point simulated) keeps its fastest knobs, which the chosen groups then
    compile with (returned as the third value). ``p`` is a fresh planner of ``graph``
    (:class:`tvm_dpu.strategy.planner.Planner`)."""
    by = {ly.name: ly for ly in p.g.layers}
    progs: dict = {}

    def accept(c) -> bool:
        try:
            progs[c] = p.group(c.template, [by[n] for n in c.layers], knobs.get(c.name))
            return True
        except MappingError:
            if c.name in knobs:  # the user's knobs for this group are wrong: say so
                raise
            return False  # the group does not fit the hardware: not a candidate
    cands = find_candidates(p.g, accept)  # an alias input has no producer to fuse
    unknown = sorted(set(forced) - {c.name for c in cands})
    if unknown:
        raise MappingError(f"{FUSION_KNOB}: no fusion candidate named {unknown[0]} (candidates: "
                           f"{', '.join(c.name for c in cands) or 'none'})")
    if not cands:
        return [(None, (ly.name,)) for ly in graph.layers], FusionReport([], [], 0), {}
    names = sorted({n for c in cands for n in c.layers}, key=[ly.name for ly in graph.layers].index)
    singles = {n: p.layer(by[n], knobs.get(n)) for n in names}
    # the search's variants re-plan a candidate's parameters at the end of the PARAM image and
    # drop them after the run: room for the largest candidate's parameters
    room = max(_cdiv(sum(ld.rows * ld.cols * ld.chans for ld in cg.decode_stream(pr.insns)
                         if isinstance(ld, cg.Load) and ld.to_pm), 64) * 64
               for pr in progs.values())
    sizes = {r: max(64, v) for r, v in p.region_use.items()}
    sizes.update(PARAM=max(64, len(p.params) + room), INSN=64)
    layout = cfg.region_layout(sizes)
    ddr = np.zeros(cfg.ddr_bytes(layout), dtype=np.uint8)

    def cycles(prog: LayerProgram) -> int:
        return simulate(cfg, prog.insns, ddr, regions=layout).cycles
    single = {n: cycles(pr) for n, pr in singles.items()}
    fused, tuned = {}, {}
    for c in cands:
        fused[c], kn = _local_search(p, c, [by[n] for n in c.layers], cycles(progs[c]), cycles)
        if kn is not None and c.name not in knobs:
            tuned[c.name] = kn
    try:
        groups, total = choose(graph, cands, single, fused, forced)
    except ValueError as e:
        raise MappingError(f"{FUSION_KNOB}: {e}") from None
    template = {c.layers: c.template for c in cands}
    ordered = order_groups(graph, groups)
    report = FusionReport(
        [(c.name, c.template, fused[c], sum(single[n] for n in c.layers)) for c in cands],
        ["+".join(g) for g in ordered if len(g) > 1], int(total))
    chosen = {"+".join(g) for g in ordered}
    return ([(template.get(g) if len(g) > 1 else None, g) for g in ordered], report,
            {k: v for k, v in tuned.items() if k in chosen})


def _local_search(p: Any, c: Candidate, layers: list, base: int, cycles) -> tuple[int, dict | None]:
    """Hill climbing over ``tile_h`` for fusion candidate ``c`` from its default knobs
    (measured at ``base`` cycles): try the neighbouring options, move to the fastest while it
    improves, at most ``LOCAL_SEARCH_MOVES`` moves. A conv+pool candidate first measures its
    other ``halo`` form (keep / recompute) at that form's default and climbs from the faster
    one (keep: over bands that are multiples of the CONV's row passes). Returns the best cycles
    and the knobs that gave them (None: the default is best or the space has no ``tile_h``)."""
    try:
        space = p.group_knob_space(c.template, layers)
    except (MappingError, ValueError, KeyError):
        return base, None
    if "tile_h" not in space or LOCAL_SEARCH_MOVES <= 0:
        return base, None

    def measure(kn: dict) -> int | None:
        mark = len(p.params)
        try:
            return cycles(p.group(c.template, layers, kn))
        except MappingError:
            return None
        finally:
            del p.params[mark:]

    opts = space["tile_h"].options
    best_kn, best = space.default(), base
    found = None
    if "halo" in space:  # conv+pool: also measure the other halo form at its default tile
        kn = p.group_knob_space(c.template, layers, halo="recompute").default()
        cyc = measure(kn)
        if cyc is not None and cyc < best:
            best, best_kn, found = cyc, kn, kn
    if best_kn.get("halo") == "keep":  # bands aligned to the CONV's row passes
        opts = [t for t in opts if t % p.cfg.CONV_ROW_PAR == 0 or t in (opts[-1],
                                                                        best_kn["tile_h"])]
    i, tried = opts.index(best_kn["tile_h"]), {opts.index(best_kn["tile_h"])}
    for _ in range(LOCAL_SEARCH_MOVES):
        step = None
        for k in (i - 1, i + 1):
            if k in tried or not 0 <= k < len(opts):
                continue
            tried.add(k)
            kn = {**best_kn, "tile_h": opts[k]}
            cyc = measure(kn)
            if cyc is not None and cyc < best:
                best, step = cyc, (k, kn)
        if step is None:
            break
        i, best_kn = step
        found = best_kn
    return best, found


PARALLEL_WINDOW = 8  # partners of a pool stream are looked for this many streams around it


def parallel_pass(new_planner: Callable[[], Any], graph: LayerGraph, cfg: DPUConfig, knobs: dict,
                  specs: list) -> tuple[list, list[tuple[str, int, int]]]:
    """Pair a stream holding a pool (MISC-bound: an Inception max pool, alone or fused) with an
    independent stream holding a conv when running them concurrently (the planner's ``parallel``)
    measures faster than one after the other; greedy, most expensive pool stream first, partners
    within ``PARALLEL_WINDOW`` streams. Returns the new specs (a pair is ``("parallel", (a,
    b))``) and the accepted pairs ``(name, sequential cycles, parallel cycles)``; the pairs are
    planned by ``new_planner()``."""

    by = {ly.name: ly for ly in graph.layers}
    n = len(specs)
    owner = {name: i for i, (_, g) in enumerate(specs) for name in g}
    producer = {ly.output: ly.name for ly in graph.layers}
    succ: list[set[int]] = [set() for _ in specs]
    for i, (_, g) in enumerate(specs):
        for name in g:
            for t in inputs_of(by[name]):
                if t in producer and owner[producer[t]] != i:
                    succ[owner[producer[t]]].add(i)
    reach = [set() for _ in specs]
    for i in reversed(range(n)):  # specs are in topological order
        for j in succ[i]:
            reach[i] |= {j} | reach[j]

    def has(i: int, kind) -> bool:
        return any(isinstance(by[name], kind) for name in specs[i][1])
    pools = [i for i in range(n) if has(i, PoolLayer)]
    pairs = [(i, j) for i in pools for j in range(max(0, i - PARALLEL_WINDOW),
                                                  min(n, i + PARALLEL_WINDOW + 1))
             if j != i and has(j, ConvLayer) and not has(j, PoolLayer)
             and j not in reach[i] and i not in reach[j]]
    if not pairs:
        return specs, []
    p = new_planner()
    progs = {i: p.spec(specs[i], knobs) for i in {x for pr in pairs for x in pr}}
    merged = {}
    for i, j in pairs:
        try:
            merged[(i, j)] = p.parallel(specs[i], specs[j], knobs)
        except MappingError:
            continue
    sizes = {r: max(64, v) for r, v in p.region_use.items()}
    sizes.update(PARAM=max(64, len(p.params)), INSN=64)
    layout = cfg.region_layout(sizes)
    ddr = np.zeros(cfg.ddr_bytes(layout), dtype=np.uint8)

    def cycles(prog: LayerProgram) -> int:
        return simulate(cfg, prog.insns, ddr, regions=layout).cycles
    alone = {i: cycles(pr) for i, pr in progs.items()}
    both = {k: cycles(pr) for k, pr in merged.items()}
    used: set[int] = set()
    chosen = []
    for i in sorted(pools, key=lambda x: -alone.get(x, 0)):
        if i in used:
            continue
        best = None
        for (a, b), c in both.items():
            if a == i and b not in used and c < alone[a] + alone[b]:
                if best is None or alone[a] + alone[b] - c > best[0]:
                    best = (alone[a] + alone[b] - c, b, c)
        if best:
            used |= {i, best[1]}
            chosen.append((i, best[1], best[2]))
    if not chosen:
        return specs, []
    partner = {i: j for i, j, _ in chosen} | {j: i for i, j, _ in chosen}
    units = [[k] if k not in partner else sorted((k, partner[k])) for k in range(n)
             if k not in partner or k < partner[k]]
    flat = order_groups(graph, [tuple(x for k in u for x in specs[k][1]) for u in units])
    by_names = {tuple(x for k in u for x in specs[k][1]): u for u in units}
    out = []
    for names in flat:
        u = by_names[names]
        out.append(specs[u[0]] if len(u) == 1 else
                   ("parallel", (specs[u[0]], specs[u[1]]) if u[0] in pools
                    else (specs[u[1]], specs[u[0]])))
    report = [(merged[(i, j)].name, alone[i] + alone[j], c) for i, j, c in chosen]
    return out, report


def concat_in_place(graph: LayerGraph, groups: list, on_chip: set[str]
                     ) -> dict[str, tuple[str, int]]:
    """Concats whose inputs their producers can write straight into the concat's output (DNNVM:
    reorganization fused into the SAVE of the previous operator): channel concat of identically
    quantized inputs, each input made by a DPU layer here (not a concat), read by nothing else,
    not a function input or output. Returns the input -> (output, first channel) placements."""
    single = {g[0] for t, g in groups if t is None}
    producer = {ly.output: ly for ly in graph.layers}
    readers: dict[str, int] = {}
    for ly in graph.layers:
        for t in getattr(ly, "inputs", None) or [ly.input]:
            readers[t] = readers.get(t, 0) + 1
    views: dict[str, tuple[str, int]] = {}
    for ly in graph.layers:
        if not isinstance(ly, ConcatLayer) or ly.name not in single:
            continue
        ins = list(ly.inputs)
        if (ly.axis != 1 or any(rq is not None for rq in ly.requants) or len(set(ins)) != len(ins)
                or len(graph.tensors[ly.output].shape) != 4):
            continue
        if all(t in producer and not isinstance(producer[t], ConcatLayer) and readers[t] == 1
               and t not in graph.outputs and t not in on_chip for t in ins):
            ch0 = 0
            for t in ins:
                views[t] = (ly.output, ch0)
                ch0 += int(graph.tensors[t].shape[1])
    return views
