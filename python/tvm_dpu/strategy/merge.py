"""Stream merging: the streams of a function in one stream, each instruction waiting by byte range
for the earlier groups' accesses, the next group placed in the FM/PM left free."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from tvm_dpu import codegen as cg
from tvm_dpu.hw_config import DPUConfig
from tvm_dpu.program import LayerProgram
from tvm_dpu.strategy.dependencies import resolve_tokens
from tvm_dpu.strategy.list_schedule import insn_cycles, list_schedule, reorder
from tvm_dpu.strategy.tiling import _cdiv

#: groups of the merged stream whose instructions
#: :func:`~tvm_dpu.strategy.list_schedule.list_schedule` may interleave on a unit
#: beyond the oldest one with work left there (0: every group keeps its place)
MERGE_WINDOW = 2
_GRAIN = 64  # bytes per entry of the footprint maps (buffers and PM blocks are 64-byte aligned)


class _Footprints:
    """Last writer and last reader per unit of every ``_GRAIN`` bytes of a memory (FM memory,
    PM, or a DDR region), as of the end of the groups merged so far. An access is one byte
    range ``[lo, hi)`` or, with arrays ``lo`` / ``hi``, several (a strided DDR access); ranges
    wrap around the memory (FM and PM are circular)."""

    def __init__(self, size: int):
        self.size = max(1, size)
        n = _cdiv(self.size, _GRAIN)
        self.writer = np.full(n, -1, dtype=np.int64)
        self.reader = np.full((len(cg.UNITS), n), -1, dtype=np.int64)

    def _grains(self, lo, hi) -> np.ndarray | slice:
        """Indices of the grains the ranges touch."""
        lo = np.maximum(np.atleast_1d(np.asarray(lo, dtype=np.int64)), 0)
        hi = np.maximum(np.atleast_1d(np.asarray(hi, dtype=np.int64)), lo + 1)
        if (hi - lo >= self.size).any():
            return slice(None)
        a, b = lo % self.size, (hi - 1) % self.size + 1
        wrap = a >= b
        a, b = np.concatenate([a, np.zeros(wrap.sum(), np.int64)]), \
            np.concatenate([np.where(wrap, self.size, b), b[wrap]])
        ga, gb = a // _GRAIN, -(-b // _GRAIN)
        n = gb - ga
        if len(n) == 1:
            return slice(int(ga[0]), int(gb[0]))
        return np.repeat(ga - np.cumsum(n) + n, n) + np.arange(n.sum())

    def conflicts(self, lo, hi, write: bool) -> list[int]:
        """Earlier instructions an access of bytes ``[lo, hi)`` must wait for: the last writer
        of every byte (read after write, write after write) and, for a write, its last reader
        of every unit (write after read). Every one of them, not only the latest: once
        :func:`~tvm_dpu.strategy.list_schedule.list_schedule` interleaves the groups, an earlier
        writer of part of the range
        may end after a later one."""
        g = self._grains(lo, hi)
        out = set(np.unique(self.writer[g]).tolist())
        if write:
            out.update(np.unique(self.reader[:, g]).tolist())
        out.discard(-1)
        return sorted(out)

    def last_reader(self, lo, hi, unit: int) -> list[int]:
        """The last reader of ``unit`` of bytes ``[lo, hi)``: a new read of that unit keeps
        its place after it, so the write-after-read dependencies (on the last reader per unit)
        still cover every earlier reader once :func:`~tvm_dpu.strategy.list_schedule.list_schedule`
        interleaves the groups."""
        r = int(self.reader[unit, self._grains(lo, hi)].max())
        return [r] if r >= 0 else []

    def record(self, lo, hi, write: bool, unit: int, idx: int) -> None:
        g = self._grains(lo, hi)
        if write:
            self.writer[g] = idx
            self.reader[:, g] = -1
        else:
            self.reader[unit, g] = idx


def _ext(rows: int, cols: int, pix: int, row: int, last: int) -> int:
    return (max(rows, 1) - 1) * row + (max(cols, 1) - 1) * pix + last


def _ddr_ranges(insn, cfg: DPUConfig) -> tuple[np.ndarray, np.ndarray]:
    """The DDR byte ranges ``(lo, hi)`` a LOAD / SAVE touches, of every PE's image: one per
    image when its rows are contiguous, else one per row, and one per pixel when the pixels
    are channel slices of wider ones (concat inputs saved in place), so that accesses to
    different channel slices of a tensor do not wait for each other."""
    rows, cols, pix, row = insn.rows, insn.cols, insn.ddr_pix_stride, insn.ddr_row_stride
    base = insn.ddr_offset + insn.img_stride * np.arange(cfg.NUM_PE, dtype=np.int64)
    if pix != insn.chans and cols > 1:
        starts = (base[:, None, None] + row * np.arange(rows)[None, :, None]
                  + pix * np.arange(cols)[None, None, :]).reshape(-1)
        return starts, starts + insn.chans
    if row != cols * pix and rows > 1:
        starts = (base[:, None] + row * np.arange(rows)[None, :]).reshape(-1)
        return starts, starts + _ext(1, cols, pix, row, insn.chans)
    return base, base + _ext(rows, cols, pix, row, insn.chans)


def _footprint(insn, cfg: DPUConfig) -> list[tuple[tuple, int, int, bool]]:
    """``(memory, lo, hi, write)`` byte ranges an instruction touches: ``("FM", mem)``, ``("PM",)``
    or ``("DDR", region)`` (DDR: one range per PE image; only regions a SAVE may write)."""
    out = []
    if isinstance(insn, (cg.Load, cg.Save)):
        if insn.rows * insn.cols * insn.chans == 0:
            return []
        if isinstance(insn, cg.Load) and insn.to_pm:
            return [(("PM",), insn.dst_addr, insn.dst_addr + insn.rows * insn.cols * insn.chans,
                     True)]
        if insn.region in (cg.REGION_OUTPUT, cg.REGION_SWAP):
            out.append((("DDR", insn.region), *_ddr_ranges(insn, cfg), isinstance(insn, cg.Save)))
        if isinstance(insn, cg.Load):
            rows = insn.rows + insn.pad_top + insn.pad_bottom
            cols = insn.cols + insn.pad_left + insn.pad_right
            pix = insn.chans * max(1, insn.fmt)
            out.append((("FM", insn.fm_mem), insn.dst_addr, insn.dst_addr
                        + _ext(rows, cols, max(pix, insn.fm_pix_stride), insn.fm_row_stride, pix),
                        True))
        else:
            out.append((("FM", insn.fm_mem), insn.src_addr, insn.src_addr
                        + _ext(insn.rows, insn.cols, insn.fm_pix_stride, insn.fm_row_stride,
                               insn.chans), False))
        return out
    if isinstance(insn, cg.End):
        return []
    if isinstance(insn, cg.Conv):
        chans_in, chans_out = insn.ic, insn.oc
    else:
        chans_in = chans_out = insn.chans
    if isinstance(insn, (cg.Conv, cg.Pool)):
        d = insn.dilation if isinstance(insn, cg.Conv) else 1  # the window a dilated CONV reads
        rows = ((insn.out_h - 1) * insn.stride_h + (insn.kernel_h - 1) * d + 1 - insn.pad_top
                - insn.pad_bottom)
        cols = ((insn.out_w - 1) * insn.stride_w + (insn.kernel_w - 1) * d + 1 - insn.pad_left
                - insn.pad_right)
    else:  # ELTADD / COPY read what they write; UPSAMPLE reads less (counted as much)
        rows, cols = insn.out_h, insn.out_w
    out.append((("FM", insn.in_mem), insn.in_addr, insn.in_addr
                + _ext(rows, cols, insn.in_pix_stride, insn.in_row_stride, chans_in), False))
    if isinstance(insn, cg.ELEMENTWISE):
        out.append((("FM", insn.b_mem), insn.b_addr, insn.b_addr
                    + _ext(rows, cols, insn.b_pix_stride, insn.b_row_stride, chans_in), False))
    if isinstance(insn, cg.Conv):
        per = insn.kernel_h * insn.kernel_w * (1 if insn.depthwise else insn.ic)
        out.append((("PM",), insn.param_addr, insn.param_addr + insn.oc * (per + 4), False))
    out.append((("FM", insn.out_mem), insn.out_addr, insn.out_addr
                + _ext(insn.out_h, insn.out_w, insn.out_pix_stride, insn.out_row_stride,
                       chans_out), True))
    return out


def _shift(insn, fm: int, pm: int, cfg: DPUConfig, mems: tuple[int, ...] | None = None) -> None:
    """Move an instruction's FM addresses by ``fm`` and PM addresses by ``pm`` and its FM
    memory ``m`` to ``mems[m]`` (the memories are alike and circular, so a whole stream moved
    alike computes the same)."""
    m, p = cfg.fm_memory_bytes, cfg.PM_BYTES
    mems = mems or tuple(range(cfg.FM_MEMORIES))
    if isinstance(insn, cg.Load):
        insn.dst_addr = (insn.dst_addr + (pm if insn.to_pm else fm)) % (p if insn.to_pm else m)
        if not insn.to_pm:
            insn.fm_mem = mems[insn.fm_mem]
    elif isinstance(insn, cg.Save):
        insn.src_addr = (insn.src_addr + fm) % m
        insn.fm_mem = mems[insn.fm_mem]
    elif not isinstance(insn, cg.End):
        insn.in_addr = (insn.in_addr + fm) % m
        insn.out_addr = (insn.out_addr + fm) % m
        insn.in_mem, insn.out_mem = mems[insn.in_mem], mems[insn.out_mem]
        if isinstance(insn, cg.Conv):
            insn.param_addr = (insn.param_addr + pm) % p
        elif isinstance(insn, cg.ELEMENTWISE):
            insn.b_addr = (insn.b_addr + fm) % m
            insn.b_mem = mems[insn.b_mem]


#: placements :func:`_place_next` tries for the next group: shifts by this fraction of an FM
#: memory and of the PM
PLACE_STEPS = 8
#: placements with the earliest leading LOADs whose group :func:`_place_next` estimates (with
#: the half-memory shifts), over its first ``PLACE_HORIZON`` instructions
PLACE_SHORTLIST = 16
PLACE_HORIZON = 64


def _place_next(part: list, maps: dict, cfg: DPUConfig, end: np.ndarray, free: list[int]
                ) -> None:
    """Place the next group's FM buffers and PM blocks where it can start early, given when
    the earlier instructions it would wait for end (``end``, estimated on the cycle model; the
    units are free at ``free``): e.g. in an FM memory, or part of one, and the part of the
    circular PM that the previous group's last tiles do not use. Of every permutation of the
    FM memories, FM shifts by ``1 / PLACE_STEPS`` of a memory and PM shifts by
    ``1 / PLACE_STEPS`` of the PM, the ``PLACE_SHORTLIST`` whose leading LOADs (weights and
    first input bands, before the first compute) finish first and the half-memory shifts are
    estimated over the group's first ``PLACE_HORIZON`` instructions; the earliest end wins."""
    head = part[:PLACE_HORIZON]
    n_lead = next((k for k, (insn, _) in enumerate(head) if not isinstance(insn, cg.Load)),
                  len(head))
    if n_lead == 0:
        return
    ident = tuple(range(cfg.FM_MEMORIES))
    fm_step, pm_step = cfg.fm_memory_bytes // PLACE_STEPS, cfg.PM_BYTES // PLACE_STEPS
    fm_opts = [(k * fm_step, mems) for mems in itertools.permutations(ident)
               for k in range(PLACE_STEPS)]
    pm_opts = [k * pm_step for k in range(PLACE_STEPS)]

    def latest(insn, kind: str) -> int:
        """When the earlier instructions an instruction's ``kind`` (FM, PM, DDR) accesses wait
        for end."""
        t = 0
        for mm, lo, hi, w in _footprint(insn, cfg):
            if mm[0] == kind and mm in maps:
                deps = maps[mm].conflicts(lo, hi, w)
                if deps:
                    t = max(t, int(end[deps].max()))
        return t
    cache: dict[tuple, int] = {}

    def wait(k: int, fo, po) -> int:
        """The cross-group wait of instruction ``k`` of the group placed at ``(fo, po)``: its
        DDR part does not move, its FM part depends on ``fo`` only, its PM part on ``po``."""
        insn = head[k][0]
        for kind, opt in (("DDR", None), ("FM", fo), ("PM", po)):
            if (k, kind, opt) not in cache:
                moved = dataclasses.replace(insn)
                if kind == "FM":
                    _shift(moved, opt[0], 0, cfg, opt[1])
                elif kind == "PM":
                    _shift(moved, 0, opt, cfg)
                cache[(k, kind, opt)] = latest(moved, kind)
        return max(cache[(k, "DDR", None)], cache[(k, "FM", fo)], cache[(k, "PM", po)])
    dur = [insn_cycles(insn, cfg) for insn, _ in head]

    def finish(fo, po, n: int) -> int:
        """Estimated end of the group's first ``n`` instructions placed at ``(fo, po)``."""
        at = list(free)
        ends: list[int] = []
        for k, (insn, deps) in enumerate(head[:n]):
            u = cg.unit_of(insn)
            at[u] = max([at[u], wait(k, fo, po), *(ends[d] for d in deps)]) + dur[k]
            ends.append(at[u])
        return max(ends)
    options = [(fo, po) for fo in fm_opts for po in pm_opts]
    ranked = sorted(options, key=lambda o: (finish(*o, n_lead), options.index(o)))
    halves = [o for o in options if o[0][0] % (cfg.fm_memory_bytes // 2) == 0
              and o[1] % (cfg.PM_BYTES // 2) == 0]
    shortlist = list(dict.fromkeys([*ranked[:PLACE_SHORTLIST], *halves]))
    (fm, mems), pm = min(shortlist, key=lambda o: (finish(*o, len(head)), options.index(o)))
    if fm or pm or mems != ident:
        for insn, _ in part:
            _shift(insn, fm, pm, cfg, mems)


def merge_streams(layers: list[LayerProgram], parts: list[list], cfg: DPUConfig,
                  region_sizes: dict[str, int], sides: list[list[int] | None] | None = None
                  ) -> None:
    """Compile the streams of consecutive layers / fused groups into **one** instruction stream
    (DPUV3INT8's whole-network schedule), in place: ``parts[i]`` is the ``(instruction,
    dependencies)`` list of ``layers[i]`` (:func:`~tvm_dpu.strategy.dependencies.schedule`). Each
    group keeps its own
    dependencies; across groups an instruction also waits, by byte range, for the earlier
    groups' last writer of every FM / PM / DDR byte it reads or writes and for their last
    reader (per unit) of every byte it writes (:class:`_Footprints`, 64-byte grain), and
    :func:`~tvm_dpu.strategy.dependencies.resolve_tokens` turns all of it into one set of DPON/DPBY
    tokens. So the next
    group's weight LOADs (into the PM half the current group does not use) and first input
    bands (into the FM buffer its last tiles do not use) are issued while the current group's
    tail (last CONVs, SAVEs) runs, and a group's first LOAD of a tensor waits only for the
    SAVE of the rows it reads (DDR ranges per pixel for channel slices, :func:`_ddr_ranges`).
    Each group is first placed in the FM memories and the PM where it starts earliest
    (:func:`_place_next`); then :func:`~tvm_dpu.strategy.list_schedule.list_schedule` reorders the
    units' queues on the cycle
    model (a band's LOAD before the next layer's weights, a parallel pair's two sides
    interleaved, the next ``MERGE_WINDOW`` groups' work in the idle gaps of the current one).
    Every dependency points backwards, so the merged stream cannot deadlock. Each layer gets
    an instruction range (``stream`` = 0, END after the last) ending after its last
    instruction, which may hold a younger group's instructions issued early, so the runtime
    reports marginal cycles per layer / group (:func:`tvm_dpu.simulator.simulate_ranges`).
    ``sides[i]`` marks the two independent sides of a parallel pair (None: one side)."""
    fm = {("FM", m): _Footprints(cfg.fm_memory_bytes) for m in range(cfg.FM_MEMORIES)}
    maps = {**fm, ("PM",): _Footprints(cfg.PM_BYTES)}
    for name, r in (("OUTPUT", cg.REGION_OUTPUT), ("SWAP", cg.REGION_SWAP)):
        maps[("DDR", r)] = _Footprints(region_sizes.get(name, 64))
    merged: list[tuple[object, list[int]]] = []
    groups: list[int] = []
    side_of: list[int] = []
    bounds = []
    end = np.zeros(sum(len(part) for part in parts), dtype=np.int64)  # estimated, in order
    free = [0] * len(cg.UNITS)
    for g, part in enumerate(parts):
        base = len(merged)
        side_of += (sides[g] if sides and sides[g] else None) or [0] * len(part)
        if base:
            _place_next(part, maps, cfg, end, free)
        prints = []
        for insn, deps in part:
            u = cg.unit_of(insn)
            fp = [(m, maps[m], lo, hi, w) for m, lo, hi, w in _footprint(insn, cfg) if m in maps]
            cross = [d for _, mp, lo, hi, w in fp for d in mp.conflicts(lo, hi, w)]
            cross += [d for m, mp, lo, hi, w in fp if not w and m[0] != "DDR"
                      for d in mp.last_reader(lo, hi, u)]
            merged.append((insn, [base + d for d in deps] + cross))
            prints.append([x[1:] for x in fp])
            groups.append(len(bounds))
            deps_all = merged[-1][1]
            free[u] = max(free[u], int(end[deps_all].max()) if deps_all else 0) \
                + insn_cycles(insn, cfg)
            end[len(merged) - 1] = free[u]
        for k, fp in enumerate(prints):
            u = cg.unit_of(merged[base + k][0])
            for mp, lo, hi, w in sorted(fp, key=lambda x: x[3]):  # reads, then writes
                mp.record(lo, hi, w, u, base + k)
        bounds.append((base, len(merged)))
    # a group's range ends after its last instruction (and holds the younger groups'
    # instructions issued before that); should a range come out empty, keep the merged order
    scheduled, where = reorder(merged, list_schedule(merged, groups, cfg, side_of, MERGE_WINDOW))
    cuts: list[int] = []
    for a, b in bounds:
        cuts.append(max(cuts[-1] + 1 if cuts else 1, max(where[a:b]) + 1))
    if cuts[-1] == len(merged):
        merged, bounds = scheduled, list(zip([0, *cuts[:-1]], cuts, strict=True))
    insns = resolve_tokens(merged)
    for i, (ly, (a, b)) in enumerate(zip(layers, bounds, strict=True)):
        body = insns[a:b] + ([cg.End()] if i == len(layers) - 1 else [])
        ly.insns, ly.n_insns, ly.stream = cg.encode_stream(body), len(body), 0
