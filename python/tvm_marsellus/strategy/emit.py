"""Emit stage: the double-buffered command stream of every layer (DMA_IN / compute / DMA_OUT
per step, the I/O DMA for L3 tensors and staged weights, semaphores balanced per layer;
``docs/marsellus.md``, Synchronisation)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

import tvm_marsellus.codegen as cg
from tvm_accel.errors import MappingError
from tvm_marsellus.hw_config import RBE_CHANNELS
from tvm_marsellus.program import LayerProgram, MarsProgram
from tvm_marsellus.strategy.layers import Geometry, TensorInfo, _al
from tvm_marsellus.strategy.tiling import _Layer

FREE_IN, FULL_IN, FREE_OUT, FULL_OUT, DONE, CL2RBE, RBE2CL, DONE_IO, STAGED = range(9)


#: L3: L2 bounce slot of an input tile free / filled by the I/O DMA, of an output tile free /
#: filled by DMA_OUT, of a weight group free (STAGED: filled)
IO_IN_FREE, IO_IN_FULL, IO_OUT_FREE, IO_OUT_FULL, STAGE_FREE = range(9, 14)


#: "input full" for a step whose first compute command is an RBE job (FULL_IN: the cluster)
FULL_IN_RBE = 14

#: a layer's output rows that the next layer's first input window reads are stored
#: (:meth:`Emit._prefetch`)
ROWS_STORED = 15


@dataclass
class _EmitState:
    """What the steps of one layer's emission share."""

    lay: _Layer
    l1: dict[str, tuple[int, int]]  # buffer -> L1 addresses of its two copies
    chunks: list[tuple[int, int]]  # (first channel, channels) of each input-channel chunk
    steps: list[tuple]  # (tile, chunk index, first channel, channels) in order
    staged: bool  # the weights are staged from L3
    io_in: bool  # an input lives in L3
    io_out: bool  # the output lives in L3
    last_w: dict[int, int]  # weight group -> index of its last step (frees a staged L2 slot)
    n_w: int = 0  # weight loads so far (they alternate between the two L1 weight buffers)
    #: the first weight group is already in L1: the previous layer's stream loaded it
    #: (:meth:`Emit._prefetch`)
    prefetched: bool = False
    #: so is the first step's input window
    input_prefetched: bool = False
    #: the step whose store lets the next layer's first input window be prefetched
    rows_step: int | None = None


def _chain(loads: list, comps: list, free_at: int, final: bool) -> None:
    """Semaphores of a step's compute commands: the last load marks the input full for the
    engine of the first compute command, the commands wait for each other across engines,
    ``comps[free_at]`` (the last reading input and weights) frees the input buffer and, after
    an output tile's last chunk, the last one marks the output full."""
    full = FULL_IN_RBE if comps[0].engine == "RBE" else FULL_IN
    loads[-1].signal = tuple(loads[-1].signal) + (full,)
    comps[0].wait = (full, FREE_OUT) if final else (full,)
    for a, b in zip(comps, comps[1:], strict=False):
        if a.engine != b.engine:
            sem = CL2RBE if a.engine == "CLUSTER" else RBE2CL
            a.signal = tuple(a.signal) + (sem,)
            b.wait = tuple(b.wait) + (sem,)
    comps[free_at].signal = tuple(comps[free_at].signal) + (FREE_IN,)
    if final:
        comps[-1].signal = tuple(comps[-1].signal) + (FULL_OUT,)
    for c in comps:
        c.wait, c.signal = cg._sems(c.wait), cg._sems(c.signal)


def _interleave(body: list[list], io_loads: list[list]) -> list:
    """The steps' commands with the I/O DMA fetches of step i + 2 after step i: the I/O DMA
    runs its commands in order, so the inputs of step i + 2 are fetched after the output of
    step i is drained, and fetches run two steps ahead of the compute."""
    cmds = [c for f in io_loads[:2] for c in f]
    for i, part in enumerate(body):
        cmds += part + [c for f in io_loads[i + 2:i + 3] for c in f]
    return cmds


def _whole_tensors(ly, viewed: set[str]) -> bool:
    """Whether a layer reads and writes whole tensors (no phase view, no concat slice): the
    input prefetch's row arithmetic (:meth:`Emit._prefetch_input`) holds only for those."""
    reads = ly.inputs if hasattr(ly, "inputs") else (ly.input,)
    return (not getattr(ly, "parent", "") and ly.output not in viewed
            and not any(t in viewed for t in reads))


class Emit:
    """Planner stage: the double-buffered commands of every layer."""

    def emit_program(self, progs: list[LayerProgram], l2_bytes: int, l3_bytes: int
                     ) -> MarsProgram:
        """The commands of every layer program, and the program with its memory map."""
        states = self._place_l1(self.g.layers)
        for i, (lp, ly) in enumerate(zip(progs, self.g.layers, strict=True)):
            nxt = states[i + 1] if i + 1 < len(states) else None
            lp.commands = self._emit(ly, lp, states[i], nxt)
        img = bytes(self.image)
        return MarsProgram(
            layers=progs, tensors={n: t.placement() for n, t in self.t.items()},
            inputs=list(self.g.inputs), outputs=list(self.g.outputs),
            l2_image=b"" if self.l3 else img, l3_image=img if self.l3 else b"",
            l2_bytes=l2_bytes, l3_bytes=l3_bytes)

    def _place_l1(self, layers: list) -> list[_EmitState]:
        """The emit state of every layer with its L1 map, and which layers get their first
        weight group from the previous layer's stream (:meth:`_prefetch`). A layer's buffers
        go at the bottom of L1, or at the top when that keeps them clear of the previous
        layer's; a layer clear of its predecessor, with its weights (if any) in L2 and no Kin
        tiling, is prefetched (global knob ``prefetch_weights``, default on): its first weight
        group and, unless it reads an L3 tensor, its first input window."""
        states: list[_EmitState] = []
        prev: tuple[int, int] | None = None  # the previous layer's L1 range
        viewed = self._viewed()
        prev_ly = None
        for ly in layers:
            lay = self.layers[ly.name]
            size = self._l1_size(lay)
            base = 0
            if prev is not None and prev[0] < size and self.cfg.L1_BYTES - size >= prev[1]:
                base = self.cfg.L1_BYTES - size  # the bottom overlaps it, the top does not
            st = self._emit_state(ly, lay, base)
            clear = (self.user.get("prefetch_weights", True) and prev is not None
                     and not st.staged and not lay.chunked
                     and (base >= prev[1] or base + size <= prev[0]))
            st.prefetched = clear and "w" in st.l1
            if clear and not st.io_in and _whole_tensors(prev_ly, viewed) \
                    and _whole_tensors(ly, viewed):
                self._prefetch_input(states[-1], st)
            states.append(st)
            prev, prev_ly = (base, base + size), ly
        return states

    @staticmethod
    def _prefetch_input(prev: _EmitState, st: _EmitState) -> None:
        """Whether ``prev``'s stream also loads ``st``'s first input window, and after which of
        its own steps' store: the last one whose output tile (image 0) meets that window, when
        ``st`` reads ``prev``'s output (in L2), else none."""
        _, _, _, n, ho0, hh, wo0, ww = st.steps[0][0]
        lay, g = st.lay, st.lay.geo
        if lay.kind in ("add", "mul"):
            lo, hi, clo, chi = ho0, ho0 + hh, wo0, wo0 + ww
        else:
            lo, hi, _, _ = g.in_rows(ho0, hh)
            clo, chi, _, _ = g.in_cols(wo0, ww)
        if prev.lay.tout.name in {t.name for t in lay.tins}:
            if prev.io_out:
                return
            meets = [i for i, ((_, _, _, pn, r0, rh, c0, cw), j, _, _) in enumerate(prev.steps)
                     if pn == n and j == len(prev.chunks) - 1 and r0 < hi and r0 + rh > lo
                     and c0 < chi and c0 + cw > clo]
            prev.rows_step = max(meets, default=len(prev.steps) - 1)
        st.input_prefetched = True

    @staticmethod
    def _l1_size(lay: _Layer) -> int:
        """Bytes of a layer's L1 map (:meth:`_emit_state`)."""
        b = lay.buffers(lay.plan.tile_h, lay.plan.tile_k)
        return sum(_al(v, 64) * (1 if k == "psum" else 2) for k, v in b.items())

    def _prefetch(self, prev: _EmitState, st: _EmitState) -> list:
        """DMA_IN of a layer's first weight group into its first L1 weight buffer, issued by
        the previous layer (``prev``) after its last loads: weights depend on no tensor, and
        the two layers' L1 maps are disjoint (:meth:`_place_l1`), so the copy overlaps the
        previous layer's last tiles instead of opening this layer's fill. Then, when
        :meth:`_prefetch_input` allows, its first input window, waiting for the store of the
        rows it reads (``ROWS_STORED``, signalled by ``prev``'s step ``rows_step``). The
        DMA_IN engine runs in order, so both are complete before this layer's first step
        (whose input-full token a NOP gives) starts."""
        cmds = []
        if st.prefetched:
            off, size = st.lay.wsrc[st.steps[0][0][0]]
            cmds.append(cg.Dma(src_mem="L2", dst_mem="L1", src=off, dst=st.l1["w"][0],
                               length=size))
        if st.input_prefetched:  # its first input window, once the rows it reads are stored
            _, _, _, n, ho0, hh, wo0, ww = st.steps[0][0]
            acts, _ = self._loads(st.lay, n, ho0, hh, wo0, ww, st.l1["in"][0], 0)
            acts[0].wait = (ROWS_STORED,) if prev.rows_step is not None else ()
            cmds += acts
        return cmds

    def _emit(self, ly, lp: LayerProgram, st: _EmitState, nxt: _EmitState | None = None
              ) -> list:
        """Commands of one layer. A step is one output tile or, under Kin tiling, one input-
        channel chunk of it: every step loads its input window (and weight chunk) into one of
        the two input / weight buffers; the output buffers, stores and L3 drains go by output
        tile, after the step of its last chunk. The stream ends with the next layer's first
        weight group and input window when ``nxt`` is prefetched."""
        cmds = self._credits(st)
        io_loads: list[list] = []  # per step: its I/O DMA L3 -> L2 copies
        body = []
        o = -1  # output tiles so far
        for i, (_, j, _, _) in enumerate(st.steps):
            o += j == 0
            part, io = self._step(st, i, o)
            body.append(part)
            io_loads.append(io)
        cmds += _interleave(body, io_loads)
        if nxt is not None:
            cmds += self._prefetch(st, nxt)
        cmds += self._closing_waits(st)
        lp.meta["tiles"] = o + 1
        lp.meta["chunks"] = len(st.chunks)
        return cmds

    def _emit_state(self, ly, lay: _Layer, base: int = 0) -> _EmitState:
        """The L1 map of a layer's buffers from ``base`` (two copies of every buffer but the
        partial sums), its steps in order, and where its weights and tensors live."""
        g, plan = lay.geo, lay.plan
        th, kt = plan.tile_h, plan.tile_k
        l1, addr = {}, base
        for name, size in lay.buffers(th, kt).items():
            one = _al(size, 64)
            l1[name] = (addr, addr) if name == "psum" else (addr, addr + one)
            addr += one if name == "psum" else 2 * one
        if addr > self.cfg.L1_BYTES:
            raise MappingError(f"layer {ly.name}: tile does not fit L1")
        chunks = [(c0, min(lay.tc, g.c - c0)) for c0 in range(0, g.c, lay.tc)] \
            if lay.chunked else [(0, g.c)]
        steps = []
        for gi, k0 in enumerate(range(0, g.k, kt)):
            kk = min(kt, g.k - k0)
            for n in range(lay.tin.n):
                for ho0 in range(0, g.ho, th):
                    for wo0 in range(0, g.wo, lay.tw):
                        tile = (gi, k0, kk, n, ho0, min(th, g.ho - ho0), wo0,
                                min(lay.tw, g.wo - wo0))
                        steps += [(tile, j, c0, cc) for j, (c0, cc) in enumerate(chunks)]
        return _EmitState(lay, l1, chunks, steps, staged=self.l3 and ly.name in self.wrange,
                          io_in=any(t.mem == "L3" for t in lay.tins),
                          io_out=lay.tout.mem == "L3",
                          last_w={step[0][0]: i for i, step in enumerate(steps)})

    def _credits(self, st: _EmitState) -> list:
        """The layer's opening NOPs: two credits for the L1 input and output buffers, and for
        the L2 weight slots and bounce slots the layer uses."""
        cmds: list = [cg.Nop(engine="DMA_IN", signal=FREE_IN), cg.Nop(engine="DMA_IN",
                                                                       signal=FREE_IN),
                      cg.Nop(engine="DMA_IN", signal=FREE_OUT), cg.Nop(engine="DMA_IN",
                                                                       signal=FREE_OUT)]
        if st.staged:  # L2 slots for weight groups, filled by the I/O DMA from L3
            cmds += [cg.Nop(engine="IODMA", signal=STAGE_FREE)] * len(self.stage)
        if st.io_in:  # two L2 bounce slots for input tiles, filled by the I/O DMA
            cmds += [cg.Nop(engine="IODMA", signal=IO_IN_FREE)] * 2
        if st.io_out:  # two for output tiles, drained by the I/O DMA
            cmds += [cg.Nop(engine="DMA_OUT", signal=IO_OUT_FREE)] * 2
        return cmds

    def _closing_waits(self, st: _EmitState) -> list:
        """The layer's closing NOPs: every credit taken back, so the layer leaves the
        semaphores as it found them."""
        cmds = [cg.Nop(engine="DMA_IN", wait=FREE_IN), cg.Nop(engine="DMA_IN", wait=FREE_IN),
                cg.Nop(engine="DMA_OUT", wait=FREE_OUT), cg.Nop(engine="DMA_OUT", wait=FREE_OUT),
                cg.Nop(engine="DMA_IN", wait=DONE)]
        if st.io_in:
            cmds += [cg.Nop(engine="IODMA", wait=IO_IN_FREE)] * 2
        if st.io_out:
            cmds += [cg.Nop(engine="DMA_OUT", wait=IO_OUT_FREE)] * 2
        if st.staged:  # the next layer's I/O DMA may overwrite the staging area only now
            cmds += [cg.Nop(engine="IODMA", wait=STAGE_FREE)] * len(self.stage)
            cmds.append(cg.Nop(engine="IODMA", wait=DONE_IO))
        return cmds

    def _step(self, st: _EmitState, i: int, o: int) -> tuple[list, list]:
        """The commands of step ``i`` (of output tile ``o``): weight and input loads, compute
        and, after an output tile's last chunk, its stores and L3 drains; and the step's I/O
        DMA fetches (issued separately, ahead of the step)."""
        lay, l1 = st.lay, st.l1
        tile, j, c0, cc = st.steps[i]
        gi, k0, kk, n, ho0, hh, wo0, ww = tile
        final = j == len(st.chunks) - 1
        s = i % 2

        def buf(name, step_slot=s, out_slot=o % 2):
            return l1[name][out_slot if name in ("out", "t3") else step_slot]

        loads, wfetch, wslot, nq = self._weight_loads(st, i)
        if i == 0 and st.input_prefetched:  # in L1 already: a NOP marks the step full
            acts, fetch = [cg.Nop(engine="DMA_IN")], []
        else:
            acts, fetch = self._loads(lay, n, ho0, hh, wo0, ww, buf("in"), self.bounce_in[s]
                                      if st.io_in else 0, c0, cc)
        loads += acts
        self._sync_loads(loads, wfetch, fetch)
        comps, free_at = self._computes(lay, n, ho0, hh, wo0, ww, k0, kk, buf, wslot,
                                        (j, len(st.chunks), cc, nq))
        _chain(loads, comps, free_at, final)
        if not final:
            return loads + comps, wfetch + fetch
        return loads + comps + self._tile_stores(st, i, o, buf("out")), wfetch + fetch

    def _weight_loads(self, st: _EmitState, i: int) -> tuple[list, list, int, int | None]:
        """Step ``i``'s DMA_IN of its weight group (or, under Kin tiling, of its chunk; the
        last one brings the NormQuant records too), the I/O DMA staging of a group from L3,
        the L1 weight slot the step reads and the L1 NormQuant address of a last chunk."""
        lay, l1 = st.lay, st.l1
        tile, j, _, _ = st.steps[i]
        gi = tile[0]
        final = j == len(st.chunks) - 1
        loads, wfetch = [], []
        new_group = i == 0 or st.steps[i - 1][0][0] != gi
        wslot = l1["w"][st.n_w % 2] if "w" in l1 else 0
        nq = None  # L1 NormQuant address of a chunked layer's last chunk
        if i == 0 and st.prefetched:  # the previous layer's stream brought it
            st.n_w = 1
        elif "w" in l1 and (new_group or lay.chunked):
            off, size = lay.wsrc[gi]
            src = off
            if st.staged:  # I/O DMA: this group's weights L3 -> an L2 slot, then to L1
                src = self.stage[gi % len(self.stage)]
                if new_group:
                    wfetch.append(cg.Dma(src_mem="L3", dst_mem="L2", src=off, dst=src,
                                         length=size, wait=(STAGE_FREE,), signal=(STAGED,)))
            if lay.chunked:  # this chunk's weights; the last one brings the NormQuant too
                rel, length = lay.wparts[gi][j]
                if final:
                    nq, length = wslot + lay.wparts[gi][-1] - rel, size - rel
                src, size = src + rel, length
            wslot = l1["w"][st.n_w % 2]
            st.n_w += 1
            free = st.staged and (not lay.chunked or st.last_w[gi] == i)
            loads.append(cg.Dma(src_mem="L2", dst_mem="L1", src=src, dst=wslot, length=size,
                                signal=(STAGE_FREE,) if free else ()))
        elif "w" in l1:
            wslot = l1["w"][(st.n_w - 1) % 2]
        return loads, wfetch, wslot, nq

    def _sync_loads(self, loads: list, wfetch: list, fetch: list) -> None:
        """Semaphores of a step's loads: a free input buffer (and a staged weight group)
        first; an L2 bounce slot filled before its first read and freed after its last."""
        loads[0].wait = (FREE_IN, STAGED) if wfetch else (FREE_IN,)
        if fetch:
            fetch[0].wait, fetch[-1].signal = (IO_IN_FREE,), (IO_IN_FULL,)
            reads = [c for c in loads if c.src_mem == "L2" and self._in_bounce(c.src)]
            reads[0].wait = tuple(reads[0].wait) + (IO_IN_FULL,)
            reads[-1].signal = tuple(reads[-1].signal) + (IO_IN_FREE,)

    def _tile_stores(self, st: _EmitState, i: int, o: int, src: int) -> list:
        """DMA_OUT of output tile ``o`` (after step ``i``, its last chunk) from L1 at ``src``
        and, for an L3 output, its I/O DMA drain; the last one signals the layer done."""
        gi, k0, kk, n, ho0, hh, wo0, ww = st.steps[i][0]
        stores, drain = self._stores(st.lay, n, ho0, hh, wo0, ww, k0, kk, src,
                                     self.bounce_out[o % 2] if st.io_out else None)
        stores[0].wait = (FULL_OUT,) + ((IO_OUT_FREE,) if drain else ())
        last = i == len(st.steps) - 1
        stores[-1].signal = (FREE_OUT,) + ((DONE,) if last else ()) + (
            (ROWS_STORED,) if i == st.rows_step else ()) + (
            (DONE_IO,) if last and st.staged else ()) + ((IO_OUT_FULL,) if drain else ())
        if drain:
            drain[0].wait, drain[-1].signal = (IO_OUT_FULL,), (IO_OUT_FREE,)
        return stores + drain

    def _loads(self, lay: _Layer, n: int, ho0: int, hh: int, wo0: int, ww: int, dst: int,
               bounce: int, c0: int = 0, cc: int = 0) -> tuple[list, list]:
        """DMA_IN copies of one tile's input window into L1 (one strided copy of its rows when
        the tile is narrower than the tensor, a 3-D copy of its pixels' channels
        ``[c0, c0 + cc)`` under Kin tiling) and the I/O DMA copies that first bring the window
        of L3 tensors into the L2 bounce slot at ``bounce`` (contiguous there)."""
        g = lay.geo
        if lay.kind in ("add", "mul"):
            lo, hi, clo, chi = ho0, ho0 + hh, wo0, wo0 + ww
        else:
            lo, hi, _, _ = g.in_rows(ho0, hh)
            clo, chi, _, _ = g.in_cols(wo0, ww)
        out, fetch, d, b = [], [], dst, bounce
        for i, t in enumerate(lay.tins):
            row = g.w * t.pix_bytes()
            src = t.offset + int((n * g.h + lo) * row + clo * t.pix_bytes())
            if lay.kind == "mul" and i == 1:  # the per-channel vector of image n, whole
                size = int(np.ceil(t.pix_bytes()))
                window = cg.Dma(src_mem="L2", dst_mem="L1", src=t.offset + n * size, dst=d,
                                length=size)
            elif cc and cc < t.c:  # one chunk of the channels of every pixel: a 3-D copy
                length = cc * t.cbits // 8
                size = length * (chi - clo) * (hi - lo)
                window = cg.Dma(src_mem="L2", dst_mem="L1", src=src + c0 * t.cbits // 8, dst=d,
                                length=length, rows=chi - clo, planes=hi - lo,
                                src_row_stride=int(t.pix_bytes()), src_plane_stride=int(row),
                                dst_row_stride=length, dst_plane_stride=length * (chi - clo))
            elif chi - clo == g.w:  # whole rows: one contiguous block
                size = int(np.ceil((hi - lo) * row))
                window = cg.Dma(src_mem="L2", dst_mem="L1", src=src, dst=d, length=size)
            else:  # a strided copy of the rows' column range, contiguous at the destination
                length = int((chi - clo) * t.pix_bytes())
                size = length * (hi - lo)
                window = cg.Dma(src_mem="L2", dst_mem="L1", src=src, dst=d, length=length,
                                rows=hi - lo, src_row_stride=int(row), dst_row_stride=length)
            if t.mem == "L3":  # the window goes to the bounce slot first, then on as a block
                fetch.append(replace(window, src_mem="L3", dst_mem="L2", dst=b))
                window = cg.Dma(src_mem="L2", dst_mem="L1", src=b, dst=d, length=size)
                b += _al(size)
            if lay.pair:  # the odd pixels' channels into the upper half of the even ones'
                out += [window, _pair_overlay(window, t, (hi - lo) * (chi - clo) // 2, d)]
            elif lay.packed and i == 0:  # whole words: b's copy then overwrites its bytes
                out.append(window)
            elif lay.packed:  # the operand's bytes of every bit-plane word
                out += self._packed(window, t, chi - clo, dst + i * t.c // 8)
            elif lay.stacked:  # the operand's tiles into its half of every stacked tile pair
                out += self._stacked(window, t, chi - clo, dst + i * t.bits * 4)
            else:
                out.append(window)
            d += _al(size)
        return out, fetch

    @staticmethod
    def _stacked(window: cg.Dma, t: TensorInfo, cols: int, dst: int) -> list[cg.Dma]:
        """An add on the RBE: the copy of one operand's tile (``window``: a block of pixels, or
        rows of ``cols`` pixels) rewritten as 3-D copies of its 32-channel tiles (``bits``
        words each) to ``dst``, ``dst + 2 x tile``, ... in every pixel. With ``dst`` at byte 0
        for the first operand and one tile further for the second, each L1 pixel holds the
        pairs ``[a tile j, b tile j]`` that RBE job j reads as 64 input channels."""
        tb = t.bits * 4
        nt = -(-t.c // RBE_CHANNELS)
        pix = nt * tb
        return [cg.Dma(src_mem=window.src_mem, dst_mem="L1", src=src, dst=d, length=tb, rows=nt,
                       planes=n, src_row_stride=tb, src_plane_stride=pix, dst_row_stride=2 * tb,
                       dst_plane_stride=2 * pix)
                for src, n, d in _pixel_runs(window, cols, pix, 2 * pix, dst)]

    @staticmethod
    def _packed(window: cg.Dma, t: TensorInfo, cols: int, dst: int) -> list[cg.Dma]:
        """A packed add (:attr:`_Layer.packed`): the copy of the second operand's tile
        (``window``, as in :meth:`_stacked`) rewritten as 3-D copies of its ``C / 8`` bytes of
        each bit-plane word (bytes x planes x pixels) to byte ``C / 8`` of the L1 words, after
        the first operand's tile was copied whole (its words with their idle upper lanes, the
        copy's usual one or a burst per row): each word then holds ``[a, b]``, and the bytes
        above ``2C / 8`` hold channels the job does not read (Kin = 2C)."""
        pix = t.bits * 4
        return [cg.Dma(src_mem=window.src_mem, dst_mem="L1", src=src, dst=d, length=t.c // 8,
                       rows=t.bits, planes=n, src_row_stride=4, src_plane_stride=pix,
                       dst_row_stride=4, dst_plane_stride=pix)
                for src, n, d in _pixel_runs(window, cols, pix, pix, dst)]

    def _in_bounce(self, addr: int) -> bool:
        return self.bounce_in[0] <= addr < self.bounce_out[0]

    def _stores(self, lay: _Layer, n: int, ho0: int, hh: int, wo0: int, ww: int, k0: int,
                kk: int, src: int, bounce: int | None) -> tuple[list, list]:
        """DMA_OUT copies of one output tile from L1 to its place in L2 or, for an L3 tensor,
        to the L2 bounce slot at ``bounce``, and the I/O DMA copies from there to L3."""
        if lay.pair:
            stores = _pair_stores(lay, n, ho0, hh, src)
            if bounce is None:
                return stores, []
            # the L1 tile as it is: W / 2 pair words per row, then the plain job's columns
            size = hh * (ww // 2 + ww - 2 * lay.pair_pp) * lay.tout.bits * 4
            drain = [replace(c, src_mem="L2", dst_mem="L3", src=bounce + c.src - src)
                     for c in stores]
            return [cg.Dma(src_mem="L1", dst_mem="L2", src=src, dst=bounce, length=size)], drain
        stores = self._placed_stores(lay, n, ho0, hh, wo0, ww, k0, kk, src)
        if bounce is None:
            return stores, []
        size = sum(c.nbytes for c in stores)
        drain = [replace(c, src_mem="L2", dst_mem="L3", src=bounce,
                         src_row_stride=c.length if c.rows > 1 else 0,
                         src_plane_stride=c.length * c.rows if c.planes > 1 else 0)
                 for c in stores]
        return [cg.Dma(src_mem="L1", dst_mem="L2", src=src, dst=bounce, length=size)], drain

    def _placed_stores(self, lay: _Layer, n: int, ho0: int, hh: int, wo0: int, ww: int,
                       k0: int, kk: int, src: int) -> list:
        """DMA_OUT copies of one output tile (contiguous in L1) to its place in the tensor:
        one block for whole rows of all channels, else strided rows (a row per output row
        when the tile is narrower than the tensor) and pixels (some of the channels)."""
        g, t = lay.geo, lay.tout
        base = t.offset
        if t.layout == "rbe":
            pix = int(t.pix_bytes())
            tp = -(-kk // RBE_CHANNELS) * t.bits * 4
            dst = base + ((n * g.ho + ho0) * g.wo + wo0) * pix + (k0 // RBE_CHANNELS) * t.bits * 4
            if k0 % RBE_CHANNELS or (kk % RBE_CHANNELS and k0 + kk < g.k):
                return self._subword_stores(g, t, n, ho0, hh, wo0, ww, k0, kk, src)
        else:
            pix = g.k * t.cbits / 8
            tp = kk * t.cbits / 8
            dst = base + int(((n * g.ho + ho0) * g.wo + wo0) * pix + k0 * t.cbits / 8)
        if kk == g.k and ww == g.wo:
            size = int(np.ceil(hh * g.wo * pix))
            return [cg.Dma(src_mem="L1", dst_mem="L2", src=src, dst=dst, length=size)]
        if kk == g.k:
            return [cg.Dma(src_mem="L1", dst_mem="L2", src=src, dst=dst, length=int(ww * pix),
                           rows=hh, src_row_stride=int(ww * pix),
                           dst_row_stride=int(g.wo * pix))]
        if ww == g.wo:
            return [cg.Dma(src_mem="L1", dst_mem="L2", src=src, dst=dst, length=int(tp),
                           rows=hh * g.wo, src_row_stride=int(tp), dst_row_stride=int(pix))]
        return [cg.Dma(src_mem="L1", dst_mem="L2", src=src, dst=dst, length=int(tp),
                       rows=ww, planes=hh, src_row_stride=int(tp), dst_row_stride=int(pix),
                       src_plane_stride=int(ww * tp), dst_plane_stride=int(g.wo * pix))]

    @staticmethod
    def _subword_stores(g: Geometry, t: TensorInfo, n: int, ho0: int, hh: int, wo0: int,
                        ww: int, k0: int, kk: int, src: int) -> list:
        """DMA_OUT of a tile of fewer than 32 channels (``SUBWORD_TILES``) into a bit-plane
        tensor: ``kk / 8`` bytes of every bit-plane word, the rest of each word belonging to the
        neighbouring tiles; one 3-D copy (bytes x planes x pixels) per output row, or one for
        all rows when the tile spans the width. The L1 tile holds one 32-channel word per
        plane."""
        pix, wb = int(t.pix_bytes()), t.bits * 4
        dst = (t.offset + ((n * g.ho + ho0) * g.wo + wo0) * pix + (k0 // RBE_CHANNELS) * wb
               + (k0 % RBE_CHANNELS) // 8)
        runs = [(0, hh * ww)] if ww == g.wo else [(r, ww) for r in range(hh)]
        return [cg.Dma(src_mem="L1", dst_mem="L2", src=src + r * ww * wb,
                       dst=dst + r * g.wo * pix, length=kk // 8, rows=t.bits, planes=npix,
                       src_row_stride=4, dst_row_stride=4, src_plane_stride=wb,
                       dst_plane_stride=pix) for r, npix in runs]


def _pixel_runs(window: cg.Dma, cols: int, src_pix: int, dst_pix: int, dst: int
                ) -> list[tuple[int, int, int]]:
    """``(source, pixels, destination)`` runs of contiguous source pixels in the input window
    copy ``window`` (one block, or one run per row of ``cols`` pixels), the destination
    advancing ``dst_pix`` bytes per pixel from ``dst``."""
    if window.rows == 1:  # a contiguous block of pixels
        return [(window.src, window.length // src_pix, dst)]
    return [(window.src + r * window.src_row_stride, cols, dst + r * cols * dst_pix)
            for r in range(window.rows)]


def _pair_overlay(window: cg.Dma, t: TensorInfo, pairs: int, dst: int) -> cg.Dma:
    """The second copy of a column-pair conv's input window (``window``: whole rows, one
    block): bytes 0..1 of every bit-plane word of each odd pixel (its channels 0..15) into
    bytes 2..3 of the even pixel before it (channels 16..31, idle in a 16-channel tensor),
    a 2-byte burst per plane and pair; the job then reads the even pixels only."""
    pix = int(t.pix_bytes())
    return cg.Dma(src_mem=window.src_mem, dst_mem="L1", src=window.src + pix, dst=dst + 2,
                  length=2, rows=t.bits, planes=pairs, src_row_stride=4, dst_row_stride=4,
                  src_plane_stride=2 * pix, dst_plane_stride=2 * pix)


def _pair_stores(lay, n: int, ho0: int, hh: int, src: int) -> list[cg.Dma]:
    """DMA_OUT of a column-pair conv's output tile (whole rows; ``W / 2`` pair words per row
    at ``src``, the even pixel's 16 channels in bytes 0..1 of each plane word, the odd one's
    in 2..3) to the 16-channel bit-plane tensor: two 3-D copies (2 bytes x planes x pairs),
    the even and the odd pixels, each into bytes 0..1 of its pixel's words; then the plain
    job's columns (:meth:`_Layer.pair_jobs`), whole words, one row of them per output row."""
    g, t = lay.geo, lay.tout
    pix, wb = int(t.pix_bytes()), t.bits * 4
    dst = t.offset + (n * g.ho + ho0) * g.wo * pix
    pairs = hh * g.wo // 2
    stores = [cg.Dma(src_mem="L1", dst_mem="L2", src=src + half * 2, dst=dst + half * pix,
                     length=2, rows=t.bits, planes=pairs, src_row_stride=4, dst_row_stride=4,
                     src_plane_stride=wb, dst_plane_stride=2 * pix) for half in (0, 1)]
    rest = g.wo - 2 * lay.pair_pp
    if rest:  # the plain job's columns, over what the pair slots it skipped wrote there
        stores.append(cg.Dma(src_mem="L1", dst_mem="L2", src=src + pairs * wb,
                             dst=dst + 2 * lay.pair_pp * pix, length=rest * pix, rows=hh,
                             src_row_stride=rest * pix, dst_row_stride=g.wo * pix))
    return stores
