"""Emitter base: DDR placement of a function's tensors, the tile grid, LOADs/SAVEs and the PARAM
image shared by the per-layer and fused-group emitters."""

from __future__ import annotations

import dataclasses

import numpy as np

from tvm_accel.errors import MappingError
from tvm_accel.layers import (
    LayerGraph,
    PoolLayer,
    layer_shape_text,
)
from tvm_dpu import codegen as cg
from tvm_dpu.hw_config import REGION_NAMES, DPUConfig
from tvm_dpu.program import TensorPlacement
from tvm_dpu.strategy.dependencies import schedule
from tvm_dpu.strategy.space_to_depth import space_to_depth
from tvm_dpu.strategy.tiling import _cdiv


def _pool_maker(layer: PoolLayer):
    """``make(pads, **geometry) -> cg.Pool`` for a pool layer (MAXPOOL pads with -128; AVGPOOL
    needs zero points 0, one 16-bit multiplier and a 0..31 shift)."""
    kh, kw = layer.kernel
    if layer.kind == "max":
        if layer.requant is not None:
            raise MappingError(f"layer {layer.name}: a rescaling max pool is not supported")
        extra = dict(op=cg.MISC_MAXPOOL, pad_value=-128, shift=0, mult=1)
        lo, hi = -128, 127
    else:
        rq = layer.requant
        m = int(np.asarray(rq.multiplier).reshape(-1)[0])
        if (layer.input_zero_point or rq.zero_point or rq.pre_shift
                or len(set(np.asarray(rq.multiplier).reshape(-1).tolist())) != 1
                or not 1 <= m < 1 << 16 or not 0 <= rq.shift <= 31):
            raise MappingError(f"layer {layer.name}: average pool recipe does not fit "
                               "AVGPOOL (zero points 0, 16-bit mult, shift 0..31)")
        extra = dict(op=cg.MISC_AVGPOOL, pad_value=0, shift=int(rq.shift), mult=m)
        lo, hi = int(rq.qmin), int(rq.qmax)

    def make(pads, **kw_):
        return cg.Pool(**kw_, kernel_h=kh, kernel_w=kw, stride_h=layer.strides[0],
                       stride_w=layer.strides[1], pad_top=pads[0], pad_bottom=pads[1],
                       pad_left=pads[2], pad_right=pads[3], clip_lo=lo, clip_hi=hi, **extra)
    return make


def _relocate(insn, fm_off: int, pm_off: int) -> None:
    """Move an instruction's FM addresses by ``fm_off`` and PM addresses by ``pm_off``."""
    if isinstance(insn, cg.Load):
        insn.dst_addr += pm_off if insn.to_pm else fm_off
    elif isinstance(insn, cg.Save):
        insn.src_addr += fm_off
    else:
        insn.in_addr += fm_off
        insn.out_addr += fm_off
        if isinstance(insn, cg.Conv):
            insn.param_addr += pm_off
        elif isinstance(insn, cg.ELEMENTWISE):
            insn.b_addr += fm_off


class Emitter:
    """Plans the streams of one function: tensor placements, PARAM image, region use."""

    def __init__(self, graph: LayerGraph, cfg: DPUConfig, on_chip: set[str] = frozenset(),
                 views: dict[str, tuple[str, int]] | None = None):
        """``on_chip``: tensors a fused group keeps in FM (no DDR placement); ``views``: tensor ->
        (concat output, first channel) for concat inputs written in place by their producers."""
        views = views or {}
        self.own = graph  # the layers' own tensors, before any space-to-depth view
        graph, aliases = space_to_depth(graph)
        self.g, self.cfg = graph, cfg
        self.P = cfg.NUM_PE
        self.params = bytearray()
        self._pm_seq = 0
        self.tensors: dict[str, TensorPlacement] = {}
        self.region_use = {"INPUT": 0, "OUTPUT": 0, "SWAP": 0}
        for name, t in graph.tensors.items():
            if t.dtype != "int8":
                raise MappingError(f"tensor {name}: dtype {t.dtype} is not supported on the DPU "
                                   "(int8 only)")
            if len(t.shape) not in (2, 4):
                raise MappingError(f"tensor {name}: shape {t.shape} is neither NCHW nor NC")
            if name in on_chip or name in views or name in aliases:
                continue
            region = ("INPUT" if name in graph.inputs else
                      "OUTPUT" if name in graph.outputs else "SWAP")
            n_alloc = _cdiv(int(t.shape[0]), self.P) * self.P
            off = self.region_use[region]
            p = TensorPlacement(name, tuple(int(s) for s in t.shape), t.dtype, region, off,
                                n_alloc)
            self.region_use[region] = off + _cdiv(p.nbytes, 64) * 64
            self.tensors[name] = p
        for name, (whole, ch0) in views.items():
            w = self.tensors[whole]
            self.tensors[name] = TensorPlacement(name, tuple(int(x) for x in
                                                            graph.tensors[name].shape),
                                                 "int8", w.region, w.offset + ch0, w.n_alloc,
                                                 pix_stride=w.hwc[2])
        for name, base in aliases.items():  # W space-to-depth: the same bytes, reshaped
            b = self.tensors.get(base)
            if b is None or b.pix_stride:
                raise MappingError(f"tensor {base}: a space-to-depth view needs it whole in "
                                   "DDR")
            self.tensors[name] = dataclasses.replace(
                b, name=name, shape=tuple(int(x) for x in graph.tensors[name].shape))

    def shape_text(self, layer, note: str = "", first=None, last=None) -> str:
        """The layer's shape column in the core's one format
        (:func:`~tvm_accel.layers.layer_shape_text`) from the model's tensor shapes: ``layer``
        gives the window (None: none); a fused group passes its ``first`` layer, whose inputs
        it reads, and its ``last``, whose output it writes."""
        src, dst = first or layer, last or layer
        ins = getattr(src, "inputs", None) or [src.input]

        def shape(name: str):  # a tensor the W split made (``x@s2d2``): its own shape
            own = self.own.tensors.get(name)
            return own.shape if own is not None else self.tensors[name].shape

        return layer_shape_text(layer, [shape(n) for n in ins], shape(dst.output), note)

    def _schedule(self, *args, **kw) -> list:
        """:func:`~tvm_dpu.strategy.dependencies.schedule`, remembering the dependency list of the
        last stream."""
        insns = schedule(*args, **kw)
        self.last_items, self.last_sides = insns.items, None
        return insns

    def _grid(self, t: TensorPlacement, rows: tuple[int, int], cols: tuple[int, int], th: int,
              tw: int):
        """The tiles of a stream: ``(buf, g, y0, nh, x0, nw)`` over the PE groups of ``t``, rows
        ``rows = (start, count)`` in bands of ``th`` and columns likewise by ``tw``; consecutive
        tiles alternate between the two halves of the FM memories (ping-pong buffers)."""
        half = self.cfg.fm_memory_bytes // 2
        (ys, yn), (xs, xn) = rows, cols
        i = 0
        for g in range(t.n_alloc // self.P):
            for y0 in range(ys, ys + yn, th):
                for x0 in range(xs, xs + xn, tw):
                    yield (i % 2) * half, g, y0, min(th, ys + yn - y0), x0, min(tw, xs + xn - x0)
                    i += 1

    def _param(self, data: bytes) -> int:
        off = len(self.params)
        self.params += data
        self.params += bytes((-len(self.params)) % 64)
        return off

    @staticmethod
    def _region(p: TensorPlacement) -> int:
        return REGION_NAMES.index(p.region)

    def _load(self, t: TensorPlacement, mem: int, addr: int, g: int, r0: int, rows: int, c0: int,
              cols: int, ch0: int, chans: int) -> cg.Load:
        w, c = t.hwc[1], t.pstride
        return cg.Load(fm_mem=mem, dst_addr=addr, region=self._region(t),
                       ddr_offset=t.offset + g * self.P * t.img_stride + (r0 * w + c0) * c + ch0,
                       rows=rows, cols=cols, chans=chans, ddr_pix_stride=c, ddr_row_stride=w * c,
                       fm_pix_stride=chans, fm_row_stride=cols * chans, img_stride=t.img_stride)

    def _save(self, t: TensorPlacement, addr: int, g: int, r0: int, rows: int, c0: int, cols: int,
              ch0: int, chans: int, fm_mem: int = 1) -> cg.Save:
        w, c = t.hwc[1], t.pstride
        return cg.Save(fm_mem=fm_mem, src_addr=addr, region=self._region(t),
                       ddr_offset=t.offset + g * self.P * t.img_stride + (r0 * w + c0) * c + ch0,
                       rows=rows, cols=cols, chans=chans, fm_pix_stride=chans,
                       fm_row_stride=cols * chans, ddr_pix_stride=c, ddr_row_stride=w * c,
                       img_stride=t.img_stride)

    def _scratch(self, name: str, shape: tuple[int, int, int, int]) -> TensorPlacement:
        """A SWAP tensor the program uses internally (e.g. a zero-inserted deconv input)."""
        n_alloc = _cdiv(int(shape[0]), self.P) * self.P
        p = TensorPlacement(name, tuple(shape), "int8", "SWAP", self.region_use["SWAP"], n_alloc)
        self.region_use["SWAP"] += _cdiv(p.nbytes, 64) * 64
        self.tensors[name] = p
        return p

    def _in_shape(self, name: str) -> tuple[int, int, int, int]:
        t = self.tensors[name]
        return (t.shape[0], t.hwc[2], t.hwc[0], t.hwc[1])
