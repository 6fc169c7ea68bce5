"""Embeddings chosen for the network, not per layer (the "joint" layout choice).

:func:`~tvm_vta_cp.embedding.choose` measures each conv's candidates and keeps the lowest
accelerator cycles plus the host cycles of that layer's own passes, as if every layer were
alone: its input blocked or gathered from NCHW, its output unblocked or unpacked to NCHW. After
the choice, :func:`~tvm_vta_cp.carry.carry_layouts` lets consecutive VTA calls exchange their
blocked form and :func:`~tvm_vta_cp.propagate.propagate_pack` runs residual adds in their
operands' image-pack layout, so which passes remain depends on the neighbours' choices.

:func:`choose_jointly` re-picks, among the candidates each layer measured, the assignment with
the lowest modelled total over the network: the accelerator cycles of every conv plus the host
passes that remain given the neighbours (:func:`network_cost`, the rates of
:mod:`~tvm_vta_cp.host_cost`), with these rules mirroring what ``carry`` and ``propagate`` do:

- a conv whose rewrite gathers (``im2col`` / ``pack``) pays its gather whatever its producer
  (carried: it reads the producer's blocked output in the same pass);
- a conv on the static template pays no input pass when its producer's output is not
  image-packed (the same call, or the blocked array passed as it is), else one copy (the
  ``relayout``, priced as the blocking of its input);
- a residual add adopts its first image-packed operand's layout; an operand packed otherwise or
  not packed costs one ``repack`` copy (unpacked size read, packed size written); its output
  stays in that layout for the next add;
- a conv or add whose output also reaches something else (a CPU operator, a pool, the result)
  pays its unpack / unblocking once; an output only read by modelled convs and adds pays none.

The add's own accelerator cycles are taken as equal in every layout (they are measured only
with the call that holds them). The search is a greedy local improvement over the whole graph
(ResNets are chains with skip edges): from the per-layer choice, move one conv to another of
its measured candidates, or every conv that has it to one candidate name at once, whenever the
modelled total drops, until no move lowers it. The per-layer choice is the start, so the
modelled total never rises. Bit-exact either way: a layout only moves data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tvm import relax

from tvm_accel.layers import conv_output_shape
from tvm_accel.partition import static_shape
from tvm_vta_cp import host_cost
from tvm_vta_cp.embedding import Candidate, Decision
from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.propagate import _chain, binding_order, residual_adds
from tvm_vta_cp.rewrite import ConvInfo, var_users

__all__ = ["JOINT", "LAYOUT_CHOICES", "PER_LAYER", "Node", "choose_jointly", "network_cost",
           "network_graph"]

#: ``--target-vta-layout-choice``: re-pick the measured candidates for the network (default)
#: or keep each layer's own best
JOINT, PER_LAYER = "joint", "per-layer"
LAYOUT_CHOICES = (JOINT, PER_LAYER)
_MAX_SWEEPS = 50


@dataclass
class Node:
    """A conv (``info`` set) or a residual add of the network, with its producers (node names,
    None for anything not modelled) and whether its output reaches anything else."""

    name: str
    inputs: list
    info: ConvInfo | None = None
    shape: tuple = ()                # the add's (N, K, H, W)
    external: bool = False
    consumers: list = field(default_factory=list)


def network_graph(mod) -> dict[str, Node]:
    """The convs the layout rewrite sees and the residual adds between them, in program order,
    connected producer -> consumer (directly or through an add), as ``carry`` and
    ``propagate`` connect them."""
    from tvm_vta_cp.rewrite import _conv_matches

    nodes: dict[str, Node] = {}
    for _, func, matches in _conv_matches(mod):
        var2val = relax.analysis.get_var2val(func)
        users = var_users(func)
        order = binding_order(func)
        of_var: dict = {}     # root var -> node name
        inside: set = set()   # binding vars that belong to a modelled node
        pending = []
        for m in matches:
            if m.info.layer is None:
                continue
            root = m.chain[-1][0]
            of_var[root] = m.info.name
            inside.update(v for v, _ in m.chain)
            pending.append((m.info.name, root, [m.data], m.info, ()))
        for b, _, lhs, rhs in residual_adds(func, var2val):
            ops = [lhs, rhs]
            shape = static_shape(b.var)
            if not all(isinstance(v, relax.Var) and static_shape(v) == shape for v in ops):
                continue  # a broadcasting add: not the image on both sides
            chain = _chain(b.var, b.value, set(ops), var2val, order)
            if chain is None:
                continue  # propagate leaves it alone too
            name = f"add:{b.var.name}"
            of_var[b.var] = name
            inside.update(v for v, _ in chain)
            pending.append((name, b.var, ops, None, tuple(int(s) for s in shape)))
        for name, root, ins, info, shape in sorted(pending, key=lambda t: order[t[1]]):
            producers = [of_var.get(v) if isinstance(v, relax.Var) else None for v in ins]
            outside = {u for u in users.get(root, ()) if u == "return" or u not in inside}
            nodes[name] = Node(name, producers, info, shape, bool(outside))
    for n in nodes.values():
        for p in n.inputs:
            if p is not None:
                nodes[p].consumers.append(n.name)
    return nodes


def _packed(info: ConvInfo, c: Candidate) -> tuple | None:
    """The packed output layout of ``c`` (as ``propagate`` compares them), None if unpacked."""
    if c.rewrite.pack == (1, 1):
        return None
    final = conv_output_shape(info.layer, info.input_shape)
    return (tuple(info.geometry(c.rewrite).output_shape), c.rewrite.pack, tuple(final))


def _copy(cfg: VTAConfig, packed: tuple) -> float:
    """A copy between a packed layout and NCHW (a ``repack`` or an ``unpack``)."""
    out, _, final = packed
    return host_cost.cycles(cfg, math.prod(final) + math.prod(out))


def network_cost(nodes: dict[str, Node], assign: dict[str, Candidate], cfg: VTAConfig
                 ) -> float:
    """Modelled cycles of ``assign`` (conv name -> measured candidate): accelerator cycles of
    the convs plus the host passes that remain (module docstring)."""
    layout: dict[str, tuple | None] = {}
    total = 0.0
    for n in nodes.values():  # program order: producers first
        if n.info is not None:
            c = assign[n.name]
            layout[n.name] = _packed(n.info, c)
            total += c.cycles
            p = n.inputs[0]
            if c.gather_bytes or p is None or layout.get(p) is not None:
                total += c.input_host_cycles(cfg)
            if n.external:
                total += c.output_host_cycles(cfg)
            continue
        lay = [layout.get(p) if p is not None else None for p in n.inputs]
        g = next((x for x in lay if x is not None), None)
        layout[n.name] = g
        if g is None:
            continue
        total += sum(_copy(cfg, g) for i, x in enumerate(lay)
                     if x != g and n.inputs[i] not in n.inputs[:i])
        if n.external:
            total += _copy(cfg, g)
    return total


def choose_jointly(nodes: dict[str, Node], decisions: dict[str, Decision], cfg: VTAConfig
                   ) -> dict[str, Decision]:
    """The decisions re-picked for the network (module docstring): each conv of ``nodes`` gets
    one of its measured candidates (``Decision.options``); a changed decision says so in its
    ``reason``. Convs without a choice (one candidate, or not in ``nodes``) are kept."""
    pools = {name: [c for c in decisions[name].options if c.cycles is not None]
             for name, n in nodes.items() if n.info is not None and name in decisions}
    pools = {k: v for k, v in pools.items() if decisions[k].chosen in v}
    free = [k for k, v in pools.items() if len(v) > 1]
    if not free:
        return decisions
    kept = {k for k, n in nodes.items() if n.info is None or k in pools}
    graph = {k: replace(nodes[k], inputs=[p if p in kept else None for p in nodes[k].inputs])
             for k in nodes if k in kept}
    assign = {k: decisions[k].chosen for k in pools}
    best = network_cost(graph, assign, cfg)
    names = sorted({c.name for k in free for c in pools[k]})
    for _ in range(_MAX_SWEEPS):
        improved = False
        moves = [{k: c} for k in free for c in pools[k]]
        moves += [{k: c for k in free for c in pools[k] if c.name == nm} for nm in names]
        for move in moves:
            trial = {**assign, **move}
            cost = network_cost(graph, trial, cfg)
            if cost < best - 1e-9:
                assign, best, improved = trial, cost, True
        if not improved:
            break
    out = dict(decisions)
    for k, c in assign.items():
        if c is not decisions[k].chosen:
            out[k] = replace(decisions[k], chosen=c,
                             reason=f"joint choice (per layer: {decisions[k].chosen.name})")
    return out
