"""Strided tensor views in the planner: the DMA copies that let a layer read or write a tensor
that is not a whole contiguous L2 tensor (``docs/marsellus.md``, Transpose and dilated
convolutions, Concat by placement).

- a *phase* (:class:`~tvm_marsellus.strategy.phases.PhaseConv`, or an upsample's
  :class:`~tvm_marsellus.strategy.resize.PhaseCopy`) reads every ``d``-th row and column of its
  input (gather) or writes every ``s``-th of its output (scatter);
- a *channel slice* (``slices``: tensor -> (concat output, first channel)) is a concat input
  that lives inside the concat's output: its producer writes, and its readers read, its
  channels of every pixel of that tensor.

Both are 3-D DMA copies, a pixel per row and an image row per plane, between the view and a
dense L1 tile, so the compute commands never see them. Views are HWC (whole bytes per pixel);
the tensors they live in are kept in HWC and unbiased, and a slice has no L2 space of its own.
"""

from __future__ import annotations

from dataclasses import replace

import tvm_marsellus.codegen as cg
from tvm_accel.errors import MappingError
from tvm_marsellus.program import LayerProgram, MarsProgram
from tvm_marsellus.strategy.layers import TensorInfo, _al
from tvm_marsellus.strategy.phases import PhaseConv


def _phase(ly) -> tuple[int, int, int, int]:
    """(first row, first column, row step, column step) of a layer's output view (a phase
    conv's or an upsample's phase copy's)."""
    return (*getattr(ly, "out_phase", (0, 0)), *getattr(ly, "out_step", (1, 1)))


def _scatters(ly) -> bool:
    return _phase(ly)[2:] != (1, 1)


class Views:
    """Planner stage mixin: phase views and channel slices (loads, stores, layouts, memory),
    weights shared by phases stored once, and the phases' programs marked for merging. The
    planner's ``slices`` maps each slice to (the tensor it lives in, its first channel)."""

    def _home(self, t: TensorInfo) -> tuple[TensorInfo, int]:
        """The tensor holding ``t``'s bytes and the byte offset of ``t``'s channels in each of
        its pixels."""
        s = self.slices.get(t.name)
        if s is None:
            return t, 0
        return self.t[s[0]], s[1] * t.cbits // 8

    def _viewed(self) -> set[str]:
        """Tensors written or read through a view, and the tensors slices live in."""
        out = set(self.slices) | {p for p, _ in self.slices.values()}
        for ly in self.g.layers:
            if _scatters(ly):
                out.add(ly.output)
            if isinstance(ly, PhaseConv) and ly.gathers and self.t[ly.input].layout == "hwc":
                out.add(ly.input)
        return out

    def _layouts(self) -> None:
        """Scattered tensors, slices and the tensors they live in stay in bit-packed HWC: a
        view copies whole pixels, which a bit-plane tensor written by sub-word tiles does not
        have (our choice, docs/marsellus.md); a gathered input may be either."""
        super()._layouts()
        for ly in self.g.layers:
            if _scatters(ly):
                self.t[ly.output].layout = "hwc"
        for n, (p, _) in self.slices.items():
            self.t[n].layout = self.t[p].layout = "hwc"

    def _choose(self) -> None:
        """Engines and layouts; then slices and the tensors they live in stay unbiased (one
        storage form for the bytes of all the concat's producers), and a phase embedded in an
        RBE kernel that the cores run gets its compact kernel back (no zero taps)."""
        super()._choose()
        for n, (p, _) in self.slices.items():
            self.t[n].biased = self.t[p].biased = False
        swap = {ly.name for ly in self.g.layers if getattr(ly, "compact", None) is not None
                and self.engines[ly.name] == "cluster"}
        if swap:
            self.g.layers = [ly.compact if ly.name in swap else ly for ly in self.g.layers]
            for n in swap & set(self.user):  # its engine knob is honoured: the cores
                self.user[n] = {k: v for k, v in self.user[n].items() if k != "engine"}

    def _layer(self, ly) -> LayerProgram:
        lp = super()._layer(ly)
        parent = getattr(ly, "parent", "")
        if not parent:
            return lp
        t = self.t[ly.output]
        lp.meta["phase_of"] = parent
        if getattr(ly, "useful_taps", None) is not None:
            geo = self.layers[ly.name].geo
            lp.macs = t.n * geo.ho * geo.wo * geo.k * ly.useful_taps * (
                geo.c if ly.groups == 1 else 1)
        for tn in {ly.input, ly.output} & self._viewed():
            if self.t[tn].layout == "hwc" and (self.t[tn].c * self.t[tn].cbits) % 8:
                raise MappingError(f"layer {parent}: a pixel of {tn} is not whole bytes (a "
                                   "strided view copies whole pixels)")
        if isinstance(ly, PhaseConv) and ly.gathers and self.layers[ly.name].chunked:
            raise MappingError(f"layer {parent}: its phases would need Kin tiling, which the "
                               "gathering input view does not have")
        return lp

    def _place(self) -> tuple[int, int]:
        """The memory map without the slices, which then take their concat output's place."""
        saved = {n: self.t.pop(n) for n in self.slices}
        try:
            res = super()._place()
        finally:
            self.t.update(saved)
        for n, (p, _) in self.slices.items():
            self.t[n].mem, self.t[n].offset = self.t[p].mem, self.t[p].offset
        return res

    def _bounce(self, in_l3: set[str]) -> tuple[int, int]:
        return super()._bounce(in_l3 | {n for n, (p, _) in self.slices.items() if p in in_l3})

    def emit_program(self, progs: list[LayerProgram], l2_bytes: int, l3_bytes: int
                     ) -> MarsProgram:
        prog = super().emit_program(progs, l2_bytes, l3_bytes)
        for n in self.slices:  # no tensor of its own
            prog.tensors.pop(n, None)
        return prog

    def _weights(self, lay, k0: int, kt: int):
        """Phases with the same weights (a dilated conv's) share one copy in the image."""
        if not isinstance(lay.layer, PhaseConv):
            return super()._weights(lay, k0, kt)
        self._shared_blobs = getattr(self, "_shared_blobs", {})
        self._sharing = True
        try:
            return super()._weights(lay, k0, kt)
        finally:
            self._sharing = False

    def _blob(self, data: bytes) -> int:
        if not getattr(self, "_sharing", False):
            return super()._blob(data)
        key = bytes(data)
        off = self._shared_blobs.get(key)
        if off is not None and bytes(self.image[off:off + len(key)]) == key:
            return off
        off = super()._blob(data)
        self._shared_blobs[key] = off
        return off

    def _loads(self, lay, n: int, ho0: int, hh: int, wo0: int, ww: int, dst: int,
               bounce: int, c0: int = 0, cc: int = 0) -> tuple[list, list]:
        """A tile's input windows when one is a view: per input one 3-D copy of the window's
        pixels (their channels ``[c0, c0 + cc)`` under Kin tiling) into a dense L1 tile; an L3
        input goes to the bounce slot that way first."""
        ly = lay.layer
        gathers = isinstance(ly, PhaseConv) and ly.gathers
        if not gathers and not any(t.name in self.slices for t in lay.tins):
            return super()._loads(lay, n, ho0, hh, wo0, ww, dst, bounce, c0, cc)
        if lay.stacked:
            raise MappingError(f"layer {ly.name}: an RBE add cannot read a channel slice")
        g = lay.geo
        if lay.kind == "add":
            lo, hi, clo, chi = ho0, ho0 + hh, wo0, wo0 + ww
        else:
            lo, hi, _, _ = g.in_rows(ho0, hh)
            clo, chi, _, _ = g.in_cols(wo0, ww)
        py, px, dy, dx = (*ly.in_phase, *ly.in_step) if gathers else (0, 0, 1, 1)
        cols = chi - clo
        loads, fetch, d, b = [], [], dst, bounce
        for t in lay.tins:
            home, choff = self._home(t)
            pix = home.pix_bytes()
            if t.layout == "rbe":
                length = int(pix)
            else:
                chunk = cc if cc and cc < t.c else t.c
                length, choff = chunk * t.cbits // 8, choff + (c0 if chunk < t.c else 0) * \
                    t.cbits // 8
            src = home.offset + int(((n * home.h + py + dy * lo) * home.w + px + dx * clo) * pix) \
                + choff
            window = cg.Dma(src_mem="L2", dst_mem="L1", src=src, dst=d, length=length,
                            rows=cols, planes=hi - lo, src_row_stride=int(dx * pix),
                            src_plane_stride=int(dy * home.w * pix), dst_row_stride=length,
                            dst_plane_stride=length * cols)
            if t.mem == "L3":
                fetch.append(replace(window, src_mem="L3", dst_mem="L2", dst=b))
                window = cg.Dma(src_mem="L2", dst_mem="L1", src=b, dst=d, length=window.nbytes)
                b += _al(window.nbytes)
            loads.append(window)
            d += _al(window.nbytes)
        return loads, fetch

    def _placed_stores(self, lay, n: int, ho0: int, hh: int, wo0: int, ww: int, k0: int,
                       kk: int, src: int) -> list:
        """An output tile written through a view: one 3-D copy of its pixels (``kk`` channels
        each) to rows ``o + s * m``, columns ``o' + s' * m'`` and the slice's channels of the
        HWC tensor."""
        ly, t = lay.layer, lay.tout
        oy, ox, sy, sx = _phase(ly)
        if (sy, sx) == (1, 1) and t.name not in self.slices:
            return super()._placed_stores(lay, n, ho0, hh, wo0, ww, k0, kk, src)
        home, choff = self._home(t)
        pix, tp = home.c * t.cbits // 8, kk * t.cbits // 8
        dst = home.offset + ((n * home.h + oy + sy * ho0) * home.w + ox + sx * wo0) * pix + \
            choff + k0 * t.cbits // 8
        return [cg.Dma(src_mem="L1", dst_mem="L2", src=src, dst=dst, length=tp, rows=ww,
                       planes=hh, src_row_stride=tp, src_plane_stride=ww * tp,
                       dst_row_stride=sx * pix, dst_plane_stride=sy * home.w * pix)]
