"""Dependencies of a stream: tiles -> per-buffer dependency lists -> DPON/DPBY tokens (one
counting FIFO per unit pair)."""

from __future__ import annotations

from dataclasses import dataclass

from tvm_dpu import codegen as cg


@dataclass
class _Tile:
    """One step of a stream: its LOADs, its computes (CONV / MISC, in order) and its SAVEs."""

    loads: list
    computes: list
    saves: list


def resolve_tokens(items: list[tuple[object, list[int]]]) -> list:
    """DPON/DPBY for a stream given as ``(instruction, [indices of earlier instructions it must
    wait for])`` in program order.

    Per ordered unit pair (A, B) the FIFO is a counting semaphore whose k-th pop matches its k-th
    push, so for every B instruction (in order) we wait for the latest A instruction it needs,
    unless an earlier B instruction already waited for that one or a later one (then B's
    in-order execution covers it): the waited-for A instructions strictly increase, each pushes
    one token, and pops equal pushes (balanced at END). Dependencies on the same unit are
    program order. Every dependency points backwards, so the stream order is a valid schedule and
    the result cannot deadlock."""
    units = [cg.UNITS[cg.unit_of(i)] for i, _ in items]
    dpon = [set() for _ in items]
    dpby = [set() for _ in items]
    mark: dict[tuple[str, str], int] = {}
    for b, (_, deps) in enumerate(items):
        ub = units[b]
        latest: dict[str, int] = {}
        for d in deps:
            if d >= b:
                raise ValueError(f"dependency {d} of instruction {b} is not earlier")
            ua = units[d]
            if ua != ub and d > latest.get(ua, -1):
                latest[ua] = d
        for ua, a in latest.items():
            if a > mark.get((ua, ub), -1):
                dpon[b].add(ua)
                dpby[a].add(ub)
                mark[(ua, ub)] = a
    out = []
    for k, (insn, _) in enumerate(items):
        insn.dpon, insn.dpby = frozenset(dpon[k]), frozenset(dpby[k])
        out.append(insn)
    return out


def _buffers(insn, pm_keys: dict[int, list], fm_keys: dict[int, tuple[list, list]]
             ) -> tuple[list, list]:
    """``(read, written)`` buffer keys of an instruction: ``("FM", mem, base address)`` and
    ``("PM", slot)``. Buffers are identified by their base address (the planner never places two
    live buffers that overlap at different bases), unless ``fm_keys[id(insn)]`` names the FM
    buffers explicitly (a chain's band windows, written and read at row offsets)."""
    if id(insn) in fm_keys:
        reads, writes = fm_keys[id(insn)]
        if isinstance(insn, cg.Conv):
            reads = [*reads, *pm_keys.get(insn.param_addr, [("PM", insn.param_addr)])]
        return list(reads), list(writes)
    if isinstance(insn, cg.Load):
        if insn.to_pm:  # a PM LOAD inside a tile (not a segment's) is its own slot
            return [], pm_keys.setdefault(insn.dst_addr, [("PM", insn.dst_addr)])
        return [], [("FM", insn.fm_mem, insn.dst_addr)]
    if isinstance(insn, cg.Save):
        return [("FM", insn.fm_mem, insn.src_addr)], []
    reads = [("FM", insn.in_mem, insn.in_addr)]
    if isinstance(insn, cg.Conv):
        reads += pm_keys.get(insn.param_addr, [("PM", insn.param_addr)])
    elif isinstance(insn, cg.ELEMENTWISE):
        reads.append(("FM", insn.b_mem, insn.b_addr))
    return reads, [("FM", insn.out_mem, insn.out_addr)]


#: a chain window's buffer is keyed as two parts (halo rows, new rows) whose rows differ from
#: step to step: a write to one part also waits for the readers of the other (write after read)
_PARTS = {"halo": "new", "new": "halo"}


class _Stream(list):
    """A scheduled stream; ``items`` keeps ``(instruction, dependencies)`` for merging."""

    items: list


def schedule(segments: list[tuple[list, list[_Tile]]], unit: str, pipeline: bool,
             pm_half: int = 1 << 30, fm_keys: dict[int, tuple[list, list]] | None = None
             ) -> list:
    """Instruction stream for segments ``(pm_loads, tiles)`` with DPON/DPBY tokens (see
    ``docs/dpu.md``, Software pipelining); returns the instructions including the final END.

    Dependencies are by buffer (FM memory + base address, PM slot): an instruction waits for
    the last writer of every buffer it reads (RAW) and for the last writer and the readers since
    of every buffer it writes (WAW, WAR). So a tile's LOAD waits for the last compute that read
    its buffer, a compute for its inputs and for the SAVE (or MISC) that last read its output
    buffer, a SAVE for its compute, a PM LOAD for the last CONV of its PM slot; fused computes
    chain through FM. A PM block larger than ``pm_half`` covers both slots. A segment
    ``(pm_loads, tiles, True)`` reads what earlier SAVEs wrote to DDR: its first tile's LOAD
    waits for the last SAVE so far (in-order units make that wait for every earlier SAVE).
    ``pipeline=False`` additionally makes every tile's first LOAD wait for the previous tile's
    last SAVE (serial). ``fm_keys`` overrides the FM buffers of some instructions
    (:func:`_buffers`)."""
    fm_keys = fm_keys or {}
    items: list[tuple[object, list[int]]] = []
    writer: dict[tuple, int] = {}
    readers: dict[tuple, list[int]] = {}
    pm_keys: dict[int, list] = {}
    prev_save = None

    def add(insn, extra: list[int]) -> int:
        reads, writes = _buffers(insn, pm_keys, fm_keys)
        deps = list(extra)
        deps += [writer[k] for k in reads if k in writer]
        for k in writes:
            deps += readers.get(k, [])
            if k in writer:
                deps.append(writer[k])
            if len(k) == 3 and k[2] in _PARTS:  # the rows of the other part may overlap
                deps += readers.get((*k[:2], _PARTS[k[2]]), [])
        items.append((insn, deps))
        i = len(items) - 1
        for k in reads:
            readers.setdefault(k, []).append(i)
        for k in writes:
            writer[k] = i
            readers[k] = []
        return i

    for seg in segments:
        pm_loads, tiles = seg[0], seg[1]
        ddr_barrier = len(seg) > 2 and seg[2] and prev_save is not None
        for ld in pm_loads:
            big = ld.rows * ld.cols * ld.chans > pm_half
            pm_keys[ld.dst_addr] = ([("PM", 0), ("PM", pm_half)] if big
                                    else [("PM", ld.dst_addr)])
            add(ld, [])
        for i, t in enumerate(tiles):
            for j, ld in enumerate(t.loads):
                serial = (not pipeline or (ddr_barrier and i == 0)) and prev_save is not None \
                    and j == 0
                add(ld, [prev_save] if serial else [])
            for c in t.computes:
                add(c, [])
            for sv in t.saves:
                prev_save = add(sv, [])
    out = _Stream([*resolve_tokens(items), cg.End()])
    out.items = items
    return out
