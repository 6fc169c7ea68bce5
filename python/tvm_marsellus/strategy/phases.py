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

:func:`tvm_marsellus.strategy.decompose.expand_phases` replaces the layers the strategy
decomposes (``deconv``, ``dilated``, and ``resize``'s nearest upsample, whose phases are
copies) by their phases before the stages run; :func:`merge_phases` gathers their programs back
into one layer program named after the original layer (its profile row and placement).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tvm_accel.layers import ConcatLayer, ConvLayer, LayerGraph, layer_shape_text
from tvm_marsellus.program import LayerProgram, MarsProgram
from tvm_marsellus.strategy.layers import Geometry, TensorInfo, layer_reads


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
    #: the same phase without the RBE embedding's zero taps, for the cores (``deconv``)
    compact: PhaseConv | None = None

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


def _reads(layer) -> tuple[str, ...]:
    """The tensors a decomposed layer reads (a concat: all its inputs)."""
    return tuple(layer.inputs) if isinstance(layer, ConcatLayer) else layer_reads(layer)


def merge_phases(prog: MarsProgram, parents: dict[str, object], graph: LayerGraph
                 ) -> MarsProgram:
    """The phase programs of each decomposed layer as one layer program (its commands in phase
    order: every phase's stream is balanced, so the sequence is too), with the layer's own
    shape (``graph``: its tensors)."""
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
                             {"shape": layer_shape_text(ly, [graph.tensors[n].shape
                                                             for n in _reads(ly)],
                                                         graph.tensors[ly.output].shape),
                              "phases": {}, "tiles": 0,
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
