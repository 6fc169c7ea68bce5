"""List scheduling on the cycle model: the order of every unit's queue, so idle units pick up
ready work."""

from __future__ import annotations

import numpy as np

from tvm_dpu import codegen as cg
from tvm_dpu.hw_config import DPUConfig
from tvm_dpu.strategy.tiling import _cdiv


def insn_cycles(insn, cfg: DPUConfig) -> int:
    """Cycles of one instruction on its unit, the cycle model of ``sim/dpu`` (see
    :mod:`tvm_dpu.hw_config`): what :func:`list_schedule` orders the units' queues by."""
    if isinstance(insn, (cg.Load, cg.Save)):
        moved = insn.rows * insn.cols * insn.chans
        if moved == 0:
            return 1
        if not (isinstance(insn, cg.Load) and insn.to_pm):
            moved *= cfg.NUM_PE
        lat = cfg.LOAD_LATENCY_CYCLES if isinstance(insn, cg.Load) else cfg.SAVE_LATENCY_CYCLES
        return max(1, lat + int(np.ceil(moved / cfg.DDR_BYTES_PER_CYCLE)))
    if isinstance(insn, cg.Conv):
        if insn.out_h * insn.out_w * insn.oc == 0:
            return 1
        steps = (_cdiv(insn.out_h, cfg.CONV_ROW_PAR) * insn.out_w * _cdiv(insn.oc, cfg.CONV_OC_PAR)
                 * (1 if insn.depthwise else _cdiv(insn.ic, cfg.CONV_IC_PAR))
                 * insn.kernel_h * insn.kernel_w)
        return max(1, steps + cfg.CONV_LATENCY_CYCLES)
    if isinstance(insn, cg.End) or insn.out_h * insn.out_w * insn.chans == 0:
        return 1
    taps = insn.kernel_h * insn.kernel_w if isinstance(insn, cg.Pool) else 1
    steps = _cdiv(insn.out_h, cfg.MISC_ROW_PAR) * insn.out_w * _cdiv(insn.chans, cfg.MISC_CH_PAR)
    return max(1, steps * taps + cfg.MISC_LATENCY_CYCLES)


def list_schedule(items: list[tuple[object, list[int]]], groups: list[int], cfg: DPUConfig,
                  sides: list[int] | None = None, window: int = 1) -> list[int]:
    """Reorder a stream the way DPUV3INT8's scheduler fills its parallel units: list scheduling
    on the cycle model (:func:`insn_cycles`).

    ``items`` are ``(instruction, dependencies)`` in a valid program order, ``groups[i]`` the
    (non-decreasing) group of item ``i`` and ``sides[i]`` its side within the group (the two
    independent streams of a parallel pair; default 0); the dependencies must hold every
    ordering that different groups and sides need from each other. A unit keeps the order of
    each queue: a side's PM LOADs (weights), its FM LOADs (feature maps, from read-only or
    already saved DDR) and its instructions of every other unit. Among the queue heads whose
    dependencies are placed, the one that could start first (on its unit, after its
    dependencies end) comes next (ties: the shorter, then program order), where a queue of a
    younger group than the oldest with work on that unit (at most ``window`` groups younger)
    only fills a gap: its instruction must end before the oldest group's next one there could
    start. So the CONVs of a pair's conv stream run while its pool stream's CONVs wait for
    their MAXPOOLs, a band's LOAD passes the next layer's weights, and the next group's work
    fills the idle units of the current group's tail. Returns the new order (item indices);
    every dependency still points backwards."""
    n_units = len(cg.UNITS)
    sides = sides or [0] * len(items)
    unit = [cg.unit_of(insn) for insn, _ in items]
    key = [(groups[i], sides[i], isinstance(insn, cg.Load) and insn.to_pm)
           for i, (insn, _) in enumerate(items)]
    queues: list[dict[tuple, list[int]]] = [{} for _ in range(n_units)]
    for i, u in enumerate(unit):
        queues[u].setdefault(key[i], []).append(i)
    order_of = [sorted(q) for q in queues]  # queues of each unit, oldest group first
    first = [0] * n_units  # first queue of order_of[u] with work left
    head = [dict.fromkeys(q, 0) for q in queues]
    users: list[list[int]] = [[] for _ in items]
    missing = [0] * len(items)
    for i, (_, deps) in enumerate(items):
        ds = set(deps)
        missing[i] = len(ds)
        for d in ds:
            users[d].append(i)
    ready = [0] * len(items)
    free = [0] * n_units
    cost = [insn_cycles(insn, cfg) for insn, _ in items]
    pos = [-1] * len(items)

    def earliest(i: int) -> int:
        """When item ``i`` could start at the earliest (exact once its dependencies are placed;
        else a lower bound over the unplaced ones)."""
        t = max(free[unit[i]], ready[i])
        if missing[i]:
            t = max([t, *(free[unit[d]] + cost[d] for d in items[i][1] if pos[d] < 0)])
        return t

    def heads_of(u: int) -> list[int]:
        """The next instruction of every queue of unit ``u`` within the window."""
        out: list[int] = []
        for k in order_of[u][first[u]:]:
            if out and k[0] > groups[out[0]] + window:
                break
            if head[u][k] < len(queues[u][k]):
                out.append(queues[u][k][head[u][k]])
        return out
    order: list[int] = []
    for _ in range(len(items)):
        best = None
        for u in range(n_units):
            heads = heads_of(u)
            if not heads:
                continue
            oldest = min(earliest(i) for i in heads if groups[i] == groups[heads[0]])
            for i in heads:
                t = earliest(i)
                fits = groups[i] == groups[heads[0]] or t + cost[i] <= oldest
                if not missing[i] and fits and (best is None or (t, cost[i], i) < best):
                    best = (t, cost[i], i)
        start, _, i = best
        u = unit[i]
        pos[i] = len(order)
        order.append(i)
        free[u] = end = start + cost[i]
        head[u][key[i]] += 1
        while first[u] < len(order_of[u]) and \
                head[u][order_of[u][first[u]]] >= len(queues[u][order_of[u][first[u]]]):
            first[u] += 1
        for j in users[i]:
            missing[j] -= 1
            ready[j] = max(ready[j], end)
    return order


def reorder(items: list[tuple[object, list[int]]], order: list[int]
            ) -> tuple[list[tuple[object, list[int]]], list[int]]:
    """``items`` in the new ``order`` with their dependencies renumbered, and where each went."""
    where = [0] * len(items)
    for k, i in enumerate(order):
        where[i] = k
    return [(items[i][0], [where[d] for d in items[i][1]]) for i in order], where
