"""Phase convolutions: a transpose conv or a dilated conv as ordinary dense convolutions over
phases of its input / output (``docs/marsellus.md``, Transpose and dilated convolutions).

A :class:`PhaseConv` is a stride-1 conv that reads its input through a strided view (the
sub-image of rows ``p, p + d, p + 2d, ...``: a dilated conv's input phase) and writes its
output through one (rows ``o, o + s, ...`` of the full output: a transpose conv's output phase,
or a dilated conv's). The DMA engines make both views: DMA_IN gathers the view's pixels into a
dense L1 tile (a 3-D copy, one pixel per row, one view row per plane), DMA_OUT scatters the
output tile's pixels to their places (the transpose of that copy), so the RBE and the cores
run their ordinary jobs on dense tiles and the phases of one layer together write every output
pixel once, with no intermediate tensor and no host copy.

:func:`expand_phases` replaces the layers the strategy decomposes (``deconv``, ``dilated``)
by their phase convs before the stages run; :func:`merge_phases` gathers their programs back
into one layer program named after the original layer (its profile row and placement).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import tvm_marsellus.codegen as cg
from tvm_accel.errors import MappingError
from tvm_accel.layers import ConvLayer, DeconvLayer, LayerGraph
from tvm_marsellus.program import LayerProgram, MarsProgram
from tvm_marsellus.strategy.layers import Geometry, TensorInfo


@dataclass
class PhaseConv(ConvLayer):
    """One phase of a decomposed layer ``parent``: a dense conv (``strides`` 1) on the input
    view ``x[:, :, in_phase[0]::in_step[0], in_phase[1]::in_step[1]]`` whose output row ``m``
    (column likewise) is row ``out_phase[0] + m * out_step[0]`` of ``output``, for
    ``out_count`` rows. Its padding is relative to the input view; a negative top / left
    padding starts the window inside it (the phase crops the view's first rows)."""

    parent: str = ""
    in_phase: tuple[int, int] = (0, 0)
    in_step: tuple[int, int] = (1, 1)
    out_phase: tuple[int, int] = (0, 0)
    out_step: tuple[int, int] = (1, 1)
    out_count: tuple[int, int] = (0, 0)
    #: kernel taps that are not zero padding (an RBE embedding's zero taps are not counted
    #: as MACs); None: all of them
    useful_taps: int | None = None

    def view_size(self, h: int, w: int) -> tuple[int, int]:
        """Rows and columns of the input view of an ``h x w`` input."""
        return (len(range(self.in_phase[0], h, self.in_step[0])),
                len(range(self.in_phase[1], w, self.in_step[1])))

    def geometry(self, tin: TensorInfo, tout: TensorInfo) -> Geometry:
        """The layer geometry the stages tile: the input view, the output phase."""
        (h, w), (ho, wo), (kh, kw) = self.view_size(tin.h, tin.w), self.out_count, self.kernel
        return Geometry(h, w, tin.c, ho, wo, tout.c, kh, kw, *self.strides, self.padding)

    @property
    def gathers(self) -> bool:
        return tuple(self.in_step) != (1, 1)

    @property
    def scatters(self) -> bool:
        return tuple(self.out_step) != (1, 1)


def phase_padding(count: int, taps: int, top: int, size: int) -> tuple[int, int]:
    """(before, after) padding of a stride-1 axis of ``taps`` taps whose ``count`` outputs
    start ``top`` rows before an input of ``size``: after = what the last window needs."""
    return top, max(0, count - 1 + taps - top - size)


def expand_phases(graph: LayerGraph, knobs: dict | None) -> tuple[LayerGraph, dict | None,
                                                                   dict[str, object]]:
    """``graph`` with every transpose conv and dilated conv replaced by its phase convs (or,
    for a dilated conv whose pruned kernel is dense, one ordinary conv), the knobs of such a
    layer given to each of its phases, and the replaced layers by name. MappingError (the
    layer runs on the CPU) when a layer has no phase form."""
    from tvm_marsellus.strategy.deconv import deconv_phases
    from tvm_marsellus.strategy.dilated import dilated_phases

    layers, parents, user = [], {}, dict(knobs or {})
    for ly in graph.layers:
        if isinstance(ly, DeconvLayer):
            subs = deconv_phases(ly, graph)
        elif isinstance(ly, ConvLayer) and tuple(ly.dilation) != (1, 1):
            subs = dilated_phases(ly, graph)
        else:
            layers.append(ly)
            continue
        parents[ly.name] = ly
        own = user.pop(ly.name, None)
        if own is not None:  # the layer's knobs hold for each of its phases
            user.update({s.name: dict(own) for s in subs})
        layers += subs
    if not parents:
        return graph, knobs, parents
    return LayerGraph(graph.tensors, layers, graph.inputs, graph.outputs), user, parents


def merge_phases(prog: MarsProgram, parents: dict[str, object]) -> MarsProgram:
    """The phase programs of each decomposed layer as one layer program (its commands in phase
    order: every phase's stream is balanced, so the sequence is too)."""
    if not parents:
        return prog
    out: list[LayerProgram] = []
    merged: dict[str, LayerProgram] = {}
    for lp in prog.layers:
        parent = lp.meta.get("phase_of")
        if parent is None:
            out.append(lp)
            continue
        m = merged.get(parent)
        if m is None:
            ly = parents[parent]
            m = LayerProgram(parent, ly.op_name, lp.engine, [], 0,
                             {"shape": lp.meta.get("parent_shape", ""), "phases": {}, "tiles": 0,
                              "cost": 0.0})
            merged[parent] = m
            out.append(m)
        if m.engine != lp.engine:
            m.engine = "mixed"
        m.commands += lp.commands
        m.macs += lp.macs
        m.meta["tiles"] += lp.meta.get("tiles", 0)
        m.meta["cost"] = round(m.meta["cost"] + lp.meta.get("cost", 0.0), 1)
        m.meta["phases"][lp.name] = {k: v for k, v in lp.meta.items()
                                     if k in ("tile_h", "tile_k", "tile_w", "tile_c", "shape")}
        m.meta["phases"][lp.name]["engine"] = lp.engine
    return replace(prog, layers=out)


class Phases:
    """Planner stage mixin: the strided views of phase convs (gathering loads, scattering
    stores), their output tensors kept in HWC, and weights shared by phases stored once."""

    def _layouts(self) -> None:
        """A tensor written through a scattering view stays in bit-packed HWC: the scatter
        copies whole pixels, which a bit-plane tensor written by sub-word tiles does not have
        (our choice, see docs/marsellus.md)."""
        super()._layouts()
        for ly in self.g.layers:
            if isinstance(ly, PhaseConv) and ly.scatters:
                self.t[ly.output].layout = "hwc"

    def _layer(self, ly) -> LayerProgram:
        lp = super()._layer(ly)
        if isinstance(ly, PhaseConv):
            t = self.t[ly.output]
            lp.meta["phase_of"] = ly.parent
            if ly.useful_taps is not None:
                geo = self.layers[ly.name].geo
                lp.macs = t.n * geo.ho * geo.wo * geo.k * ly.useful_taps * (
                    geo.c if ly.groups == 1 else 1)
            lp.meta["parent_shape"] = f"{list(self.t[ly.input].placement().shape)} -> " \
                                      f"{[t.n, t.h, t.w, t.c]}"
            for what, tn in (("input", ly.input) if ly.gathers else (None, None),
                             ("output", ly.output) if ly.scatters else (None, None)):
                if what and self.t[tn].layout == "hwc" and (self.t[tn].c * self.t[tn].cbits) % 8:
                    raise MappingError(f"layer {ly.parent}: a pixel of its {what} {tn} is not "
                                       "whole bytes (the phase views copy whole pixels)")
            if ly.gathers and self.layers[ly.name].chunked:
                raise MappingError(f"layer {ly.parent}: its phases would need Kin tiling, "
                                   "which the gathering input view does not have")
        return lp

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
        off = self._shared_blobs.get(bytes(data))
        if off is not None and bytes(self.image[off:off + len(data)]) == bytes(data):
            return off
        off = super()._blob(data)
        self._shared_blobs[bytes(data)] = off
        return off

    def _loads(self, lay, n: int, ho0: int, hh: int, wo0: int, ww: int, dst: int,
               bounce: int, c0: int = 0, cc: int = 0) -> tuple[list, list]:
        """A gathering phase: one 3-D copy of the tile's window of the input view (a pixel
        per row, a view row per plane) into a dense L1 tile; an L3 input goes to the bounce
        slot that way first."""
        ly = lay.layer
        if not (isinstance(ly, PhaseConv) and ly.gathers):
            return super()._loads(lay, n, ho0, hh, wo0, ww, dst, bounce, c0, cc)
        g, t = lay.geo, lay.tin
        lo, hi, _, _ = g.in_rows(ho0, hh)
        clo, chi, _, _ = g.in_cols(wo0, ww)
        pix = int(t.pix_bytes())
        (py, px), (dy, dx) = ly.in_phase, ly.in_step
        src = t.offset + ((n * t.h + py + dy * lo) * t.w + px + dx * clo) * pix
        cols = chi - clo
        window = cg.Dma(src_mem="L2", dst_mem="L1", src=src, dst=dst, length=pix, rows=cols,
                        planes=hi - lo, src_row_stride=dx * pix, src_plane_stride=dy * t.w * pix,
                        dst_row_stride=pix, dst_plane_stride=pix * cols)
        if t.mem != "L3":
            return [window], []
        fetch = replace(window, src_mem="L3", dst_mem="L2", dst=bounce)
        return [cg.Dma(src_mem="L2", dst_mem="L1", src=bounce, dst=dst,
                       length=window.nbytes)], [fetch]

    def _placed_stores(self, lay, n: int, ho0: int, hh: int, wo0: int, ww: int, k0: int,
                       kk: int, src: int) -> list:
        """A scattering phase: one 3-D copy of the output tile's pixels (``kk`` channels each)
        to rows ``o + s * m`` and columns ``o' + s' * m'`` of the HWC output."""
        ly = lay.layer
        if not (isinstance(ly, PhaseConv) and ly.scatters):
            return super()._placed_stores(lay, n, ho0, hh, wo0, ww, k0, kk, src)
        t = lay.tout
        pix, tp = t.c * t.cbits // 8, kk * t.cbits // 8
        (oy, ox), (sy, sx) = ly.out_phase, ly.out_step
        y0, x0 = oy + sy * ho0, ox + sx * wo0
        dst = t.offset + ((n * t.h + y0) * t.w + x0) * pix + k0 * t.cbits // 8
        return [cg.Dma(src_mem="L1", dst_mem="L2", src=src, dst=dst, length=tp, rows=ww,
                       planes=hh, src_row_stride=tp, src_plane_stride=ww * tp,
                       dst_row_stride=sx * pix, dst_plane_stride=sy * t.w * pix)]

