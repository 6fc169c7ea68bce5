"""Conv geometry of the static template: output size, tile extents in the buffers, the input
channel blocks a grouped conv's output block reads, and the phases of a transpose conv."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tvm_accel.errors import MappingError
from tvm_accel.layers import ConvLayer, DeconvLayer, SubConv, deconv_output_shape, deconv_subconvs
from tvm_vta_cp.codegen import MAX_FIELD16
from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.layout import cdiv, dims4


def tile_options(n: int) -> list[int]:
    """Tile sizes that split ``n`` into k nearly equal pieces, for every k (ascending)."""
    return sorted({cdiv(n, k) for k in range(1, n + 1)})


def segs(n: int, t: int) -> list[tuple[int, int]]:
    """``(start, size)`` of the tiles of size ``t`` (the last one smaller) covering ``n``."""
    return [(i, min(t, n - i)) for i in range(0, n, t)]


def _gemm_uops(extents: list[int]) -> int:
    """Micro-ops of a GEMM kernel: the two largest extents are hardware loops."""
    e = sorted((x for x in extents if x > 1), reverse=True)
    return math.prod(e[2:])


@dataclass
class ConvGeom:
    """A conv (or a transpose conv phase) in blocks: see ``docs/vta.md``, Static template."""

    N: int
    C: int
    H: int
    W: int
    K: int
    KH: int
    KW: int
    sh: int
    sw: int
    pad: tuple[int, int, int, int]
    Ho: int
    Wo: int
    NB: int
    CB: int
    KB: int
    dense: bool
    dh: int = 1
    dw: int = 1
    groups: int = 1
    blk: int = 16
    #: first computed output row / column of the conv (a window of a transpose conv's phase)
    oh0: int = 0
    ow0: int = 0
    #: DRAM row / column step between stored output pixels (a transpose conv's interleave)
    osh: int = 1
    osw: int = 1
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def KK(self) -> int:
        return self.KH * self.KW

    @property
    def grouped(self) -> bool:
        return self.groups > 1

    @property
    def rstep(self) -> int:
        """DRAM row step of an input tile: a 1-row kernel with a vertical stride loads only the
        rows it reads (stride x row pitch), otherwise every row of the stencil window."""
        return self.sh if self.KH == 1 and self.sh > 1 else 1

    def in_rows(self, th: int) -> int:
        """Input rows of an output tile of ``th`` rows (dilated stencil window)."""
        return th if self.rstep > 1 else (th - 1) * self.sh + (self.KH - 1) * self.dh + 1

    def in_cols(self, tw: int) -> int:
        """Input columns of an output tile of ``tw`` columns (dilated stencil window)."""
        return (tw - 1) * self.sw + (self.KW - 1) * self.dw + 1

    def ci_range(self, j: int) -> tuple[int, int]:
        """Input-channel blocks ``[lo, hi)`` that output-channel block ``j`` reads: the input
        channels of the groups its output channels belong to (all blocks without groups)."""
        if not self.grouped:
            return 0, self.CB
        kg, cg = self.K // self.groups, self.C // self.groups
        k0, k1 = j * self.blk, min((j + 1) * self.blk, self.K) - 1
        return (k0 // kg) * cg // self.blk, cdiv((k1 // kg + 1) * cg, self.blk)

    def chunks(self, co0: int, nco: int, tci: int) -> list[tuple[int, int]]:
        """Input-channel blocks ``(c0, n)`` an output-channel tile loads per chunk: the chunks
        ``segs(CB, tci)`` clipped to the blocks its groups read; chunks outside are skipped."""
        if not self.grouped:
            return segs(self.CB, tci)
        lo, hi = self.ci_range(co0)[0], self.ci_range(co0 + nco - 1)[1]
        out = []
        for s, t in segs(self.CB, tci):
            a, b = max(s, lo), min(s + t, hi)
            if a < b:
                out.append((a, b - a))
        return out

    def pairs(self, co0: int, nco: int, c0: int, n: int) -> list[tuple[int, int]]:
        """(co block offset in the tile, ci block) pairs of a chunk whose weights are not all
        zero, co-block major."""
        out = []
        for j in range(nco):
            lo, hi = self.ci_range(co0 + j)
            out += [(j, c) for c in range(max(lo, c0), min(hi, c0 + n))]
        return out

    def chunk_stats(self, tco: int, tci: int) -> tuple[int, int, float, float, float]:
        """Of a grouped tiling: (max INP blocks of a chunk, max weight blocks of a chunk,
        average chunks per co tile, average INP blocks and weight blocks per chunk)."""
        key = (tco, tci)
        hit = self._memo.get(key)
        if hit is None:
            tiles = [[(n, len(self.pairs(co0, nco, c0, n))) for c0, n in self.chunks(co0, nco, tci)]
                     for co0, nco in segs(self.KB, tco)]
            flat = [c for t in tiles for c in t]
            hit = (max(n for n, _ in flat), max(p for _, p in flat), len(flat) / len(tiles),
                   sum(n for n, _ in flat) / len(flat), sum(p for _, p in flat) / len(flat))
            self._memo[key] = hit
        return hit

    def tile_blocks(self, tco: int, tci: int) -> tuple[int, int]:
        """Largest (INP blocks, WGT blocks of KH x KW entries) a chunk of a tiling loads."""
        if not self.grouped:
            return tci, tco * tci
        ib, wb, _, _, _ = self.chunk_stats(tco, tci)
        return ib, wb

    def gemm_uops(self, tb: int, tco: int, tci: int, th: int, tw: int) -> int:
        """Micro-ops of the largest GEMM kernel of a tiling (grouped: the chunk's (co, ci)
        pairs are enumerated, the two largest of b, kh, kw, oh, ow are the hardware loops)."""
        if not self.grouped:
            return _gemm_uops([tb, tco, tci, self.KH, self.KW, th, tw])
        return self.tile_blocks(tco, tci)[1] * _gemm_uops([tb, self.KH, self.KW, th, tw])


def conv_geom(layer: ConvLayer, in_shape: tuple[int, ...], cfg: VTAConfig,
              sub: SubConv | None = None, strides: tuple[int, int] = (1, 1)) -> ConvGeom:
    """Geometry of a conv/dense layer; with ``sub`` (a phase of a transpose conv with
    ``strides``) only the phase's output window is computed and stored interleaved."""
    N, C, H, W = dims4(tuple(in_shape))
    w = np.asarray(layer.weight)
    if w.ndim != 4:
        raise MappingError(f"layer {layer.name}: weight must be OIHW, got shape {w.shape}")
    K, Cw, KH, KW = (int(s) for s in w.shape)
    groups = int(layer.groups)
    if groups < 1 or C % groups or K % groups or Cw * groups != C:
        raise MappingError(f"layer {layer.name}: weight {tuple(w.shape)} with {groups} groups "
                           f"does not read the {C} input channels")
    sh, sw = (int(s) for s in layer.strides)
    dh, dw = (int(d) for d in layer.dilation)
    pad = tuple(int(p) for p in layer.padding)
    if sh < 1 or sw < 1:
        raise MappingError(f"layer {layer.name}: strides must be >= 1, got {(sh, sw)}")
    if dh < 1 or dw < 1:
        raise MappingError(f"layer {layer.name}: dilation must be >= 1, got {(dh, dw)}")
    if min(pad) < 0:
        raise MappingError(f"layer {layer.name}: negative padding {pad}")
    Ho = (H + pad[0] + pad[2] - (KH - 1) * dh - 1) // sh + 1
    Wo = (W + pad[1] + pad[3] - (KW - 1) * dw - 1) // sw + 1
    if Ho < 1 or Wo < 1:
        raise MappingError(f"layer {layer.name}: kernel {KH}x{KW} (dilation {dh}x{dw}) larger "
                           "than the padded input")
    g = ConvGeom(N, C, H, W, K, KH, KW, sh, sw, pad, Ho, Wo, cdiv(N, cfg.batch),
                  cdiv(C, cfg.block_in), cdiv(K, cfg.block_out), bool(layer.is_dense),
                  dh, dw, groups, cfg.block_out)
    if sub is not None:
        (qh, qw), (nh, nw) = sub.crop, sub.count
        if min(qh, qw) < 0 or nh < 1 or nw < 1 or qh + nh > Ho or qw + nw > Wo:
            raise MappingError(f"layer {layer.name}: phase window rows {qh}+{nh}, cols "
                               f"{qw}+{nw} outside its {Ho}x{Wo} output")
        g.oh0, g.ow0, g.Ho, g.Wo = qh, qw, nh, nw
        g.osh, g.osw = (int(s) for s in strides)
    return g


def deconv_phases(layer: DeconvLayer, in_shape: tuple[int, ...]) -> list[SubConv]:
    """The stride-1 sub-convolutions (phases) of a transpose conv; MappingError when the
    decomposition or the interleaving STORE does not apply."""
    if tuple(int(d) for d in layer.dilation) != (1, 1):
        raise MappingError(f"layer {layer.name}: dilated transpose conv (dilation "
                           f"{tuple(layer.dilation)}) has no sub-kernel decomposition on VTA")
    if not all(1 <= int(s) <= MAX_FIELD16 for s in layer.strides):
        raise MappingError(f"layer {layer.name}: transpose conv strides {tuple(layer.strides)} "
                           f"must be 1..{MAX_FIELD16} (the STORE's x_stride field)")
    shape = dims4(tuple(in_shape))
    try:
        subs = deconv_subconvs(layer, shape)
    except ValueError as e:
        raise MappingError(str(e)) from None
    if not subs:
        raise MappingError(f"layer {layer.name}: transpose conv has an empty output "
                           f"{deconv_output_shape(layer, shape)}")
    return subs


def phase_pad(sc: SubConv, in_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Padding (top, left, bottom, right) the output window of a phase really reads."""
    _, _, H, W = dims4(tuple(in_shape))
    (kh, kw), (pt, pl, _, _) = sc.conv.kernel, sc.conv.padding
    (qh, qw), (nh, nw) = sc.crop, sc.count
    return (max(0, pt - qh), max(0, pl - qw), max(0, qh + nh - 1 - pt + kh - H),
            max(0, qw + nw - 1 - pl + kw - W))
