"""Static VTA strategy: TVM's ``conv2d_packed`` / ``dense_packed`` templates for a layer graph.

The GEMM intrinsic ``acc[b][o] += sum_k inp[b][k] * wgt[o][k]`` (``BATCH x BLOCK_OUT x BLOCK_IN``)
is mapped statically: batch -> x, output channel -> y, input channel -> z (the paper's Fig. 5
reference embedding). Every activation lives in DRAM packed as ``NCHWnc``::

    (ceil(N/BATCH), ceil(C/BLOCK), H + halo_t + halo_b, W + halo_l + halo_r, BATCH, BLOCK)  int8

weights as ``OIHWoi`` (``(ceil(K/BLOCK), ceil(C/BLOCK), KH, KW, BLOCK, BLOCK)``); channels and
batch that do not divide the block are zero-padded (padded weight lanes are 0, so whatever sits in
padded activation lanes is harmless; padded output lanes are computed and discarded).

Tiling (per layer, knobs ``tile_b/tile_co/tile_h/tile_w`` in blocks/rows/cols and ``tile_ci`` in
blocks): an output tile ``[b][co][oh][ow]`` is accumulated in ACC over ``ceil(CB/tile_ci)`` input
channel chunks; each chunk loads the input tile (with its stencil halo) into INP and the weight
tile ``[co][ci][kh][kw]`` into WGT, then ONE GEMM instruction covers the chunk: the two largest of
the seven loop dimensions (b, co, ci, kh, kw, oh, ow) become ``iter_out``/``iter_in`` and the rest
is enumerated in a micro-op kernel (content-addressed; all kernels of a layer are brought in by
one LOAD UOP at the start of its stream, or loaded on first use if they do not fit together).
After the last chunk the requantize tail runs as whole-tile ALU instructions and the tile is stored
(STORE truncates ACC to int8). Loads and stores are merged into as few 2-D DMAs as the layout
allows (whole planes, whole-height channel stacks); a 1-row kernel with a vertical stride loads
only the rows it reads (DRAM row pitch x stride). Tile sizes and the tile order are chosen by a
small cost model of the simulator's timing rules (``default_knobs``); edge tiles are smaller.

Dilation ``(dh, dw)``: an output tile of ``th x tw`` reads ``(th-1)*sh + (KH-1)*dh + 1`` input
rows and ``(tw-1)*sw + (KW-1)*dw + 1`` columns, and the micro-ops step the INP index by ``dh``
rows / ``dw`` columns per kernel tap; nothing else changes.

Groups (grouped and depthwise convs, weight ``(K, C/g, KH, KW)``): computed as the dense conv
with the block-diagonal weight, except that output-channel block ``j`` only multiplies the
input-channel blocks its groups read (``_ConvGeom.ci_range``): all-zero weight blocks are never
stored, loaded or multiplied (depthwise: one input block per output block). The weight image
holds, per ``j``, its blocks ``[ci_range(j)][KH][KW][BLOCK_OUT][BLOCK_IN]``, back to back.
``tile_ci`` keeps its meaning (the chunks are ``tile_ci``-block input-channel ranges), but an
output-channel tile loads only the part of each chunk its groups read and skips the other
chunks; a chunk's (co, ci) block pairs are an explicit micro-op table (the two largest of b,
kh, kw, oh, ow stay the hardware loops), and the buffer checks count the largest chunk a tile
really loads. The zero-point fold ``bias - zx' * sum w`` sums each channel's own group weights.

Transpose conv (:class:`~tvm_accel.layers.DeconvLayer`, dilation 1, any groups): the ``SH * SW``
stride-1 sub-convolutions of ``deconv_subconvs`` (phases), planned one after the other in one
stream by this conv template, each over its output window only (``_ConvGeom.oh0/ow0``; no
intermediate tensor). The phases' STOREs interleave into the output (``_TG.scatter``). A STORE
is a 2-D DMA: ``y`` rows of ``x`` contiguous entries, with DRAM row pitch ``x_stride``. Phase rows
``SH`` apart are therefore one STORE per channel block (pitch ``SH * Wp``). Columns ``SW > 1``
apart have no column stride, so each phase row becomes one STORE with one entry per DMA row
(``x = 1``, pitch ``SW``), and a one-column tile is one STORE down its rows. The cost is one DMA
latency per stored row instead of per tile (the tiling cost model counts it). Between phases
(``_Emitter.new_phase``) the first load into either half waits for the newest GEMM. A compute
no-op waits for the last STORE, because the next phase places its tiles and requantize vectors
differently in ACC. Knobs are per phase (``{"<layer>_sub<rh><rw>": {...}}``).

Virtual threads (``oc_nthread`` or ``h_nthread`` = 2): INP, WGT and ACC are split in two halves;
tiles alternate between the halves along the flattened tile order (co innermost for
``oc_nthread``, h innermost for ``h_nthread``), and the two threads' instructions are interleaved
per chunk (load A, load B, gemm A, gemm B, ...) so one thread's DMA overlaps the other's GEMMs.
Tokens: each load group pushes L2G and its GEMM pops it (RAW); a load into a half pops G2L pushed
by the last GEMM that read that half (WAR); the last ALU of a tile pushes G2S and its first STORE
pops it (RAW); the first ACC write of a tile pops S2G pushed by the last STORE of the previous
tile on that half (WAR). Only linked pairs push, so every queue is empty at FINISH; a final
compute no-op pops the last STORE's S2G token before FINISH. A WAR pop is left out when a
later GEMM (STORE) was already waited for: the queues run in order, so the older one is done
(interleaved grouped tiles may have different numbers of chunks). Loads of data already
resident in a half (same weight tile, same input tile) are skipped.

Numerics (bit-exact with ``layers.reference_execute``): uint8 tensors are stored as value-128.
The GEMM computes ``g = sum x' * w`` over the stored int8 ``x'``; the input zero point is folded
into the bias (``bias - zx' * sum w``), padding reads ``zx'`` from a DRAM halo pre-filled by the
runtime (or LOAD zero padding when ``zx' == 0`` and the pad is <= 15). The requantize recipe runs
on the ALU in int32 with foldings that are exact by interval analysis of the worst-case
accumulator: with ``pre_shift == 0`` the bias and zero point ride on the round add
(``MUL m; ADD bias*m + r + zp<<s; SHR s``), identity ops are dropped, and the clip is skipped
where the interval proves it. Per-channel operands (or constants wider than the signed 16-bit
immediate) are ACC-resident vectors loaded per output-channel tile. The residual add loads both
operands with ``ACC_8BIT`` and runs ``MUL ma; MUL mb; ADD a+b`` plus the same tail.

Limits: an int32 MUL/ADD wrap is never relied on (a folding is used only when the interval of
every intermediate fits int32); VTA's ALU costs 2 cycles per ACC entry and op and shares the
compute module with the GEMM, so layers with few MACs per output (1x1 convs on few channels) are
ALU-bound under this template.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tvm_accel import errors
from tvm_accel.knobs import Knob, KnobSpace
from tvm_accel.layers import (
    AddLayer,
    ConvLayer,
    DeconvLayer,
    LayerGraph,
    SubConv,
    deconv_output_shape,
    deconv_subconvs,
)
from tvm_vta_cp.codegen import (
    ALU_ADD,
    ALU_MAX,
    ALU_MIN,
    ALU_MUL,
    ALU_SHR,
    ISA,
    LOOP_ITER_BITS,
    MAX_DRAM_BYTES,
    MEM_ACC,
    MEM_ACC_8BIT,
    MEM_INP,
    MEM_OUT,
    MEM_UOP,
    MEM_WGT,
    OP_LOAD,
    OP_STORE,
    AluInsn,
    FinishInsn,
    GemmInsn,
    MemInsn,
    queue_of,
)
from tvm_vta_cp.hw_config import VTAConfig

__all__ = [
    "LayerProgram", "MappingError", "TensorPlacement", "VTAProgram", "default_knobs",
    "knob_space", "pack_tensor", "plan", "unpack_tensor",
]

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
MAX_FIELD16 = (1 << 16) - 1
MAX_ITER = (1 << LOOP_ITER_BITS) - 1
MAX_LOAD_PAD = 15


class MappingError(errors.MappingError):
    """A layer the static VTA strategy cannot map (the message names the layer)."""


# --- program data structures ------------------------------------------------------------------
@dataclass
class TensorPlacement:
    """Where an activation lives in DRAM, packed ``(ceil(N/BATCH), ceil(C/BLOCK), H + halo_t +
    halo_b, W + halo_l + halo_r, BATCH, BLOCK)`` int8; uint8 tensors are stored as value-128.

    A ``blocked`` function input or output crosses the call in that DRAM form (int8, halo and
    padded lanes included): a host function around the call writes (reads) the blocked layout in
    the same pass as its layout rewrite, so the runtime only copies the bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    halo: tuple[int, int, int, int]
    fill: int
    nbytes: int
    blocked: bool = False

    def io_shape(self, cfg: VTAConfig) -> tuple[int, ...]:
        """Shape of the array that crosses the call for this tensor."""
        return tuple(packed_shape(self, cfg)) if self.blocked else tuple(self.shape)

    @property
    def io_dtype(self) -> str:
        return "int8" if self.blocked else self.dtype


@dataclass
class LayerProgram:
    name: str
    op: str
    insns: bytes
    n_insns: int
    macs: int
    padded_macs: int
    shape: str
    knobs: dict = field(default_factory=dict)


@dataclass
class VTAProgram:
    dram_size: int
    const_image: list[tuple[int, bytes]]
    tensors: dict[str, TensorPlacement]
    inputs: list[str]
    outputs: list[str]
    layers: list[LayerProgram]


# --- small helpers ------------------------------------------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tile_options(n: int) -> list[int]:
    """Tile sizes that split ``n`` into k nearly equal pieces, for every k (ascending)."""
    return sorted({_cdiv(n, k) for k in range(1, n + 1)})


def _segs(n: int, t: int) -> list[tuple[int, int]]:
    return [(i, min(t, n - i)) for i in range(0, n, t)]


def _dims4(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    if len(shape) == 4:
        return tuple(int(s) for s in shape)  # type: ignore[return-value]
    if len(shape) == 2:
        return int(shape[0]), int(shape[1]), 1, 1
    raise ValueError(f"expected an NCHW or NC shape, got {shape}")


def _stored_offset(dtype: str) -> int:
    """Stored int8 = logical value + offset."""
    return -128 if dtype == "uint8" else 0


# --- numerics: the requantize tail on the ALU --------------------------------------------------
@dataclass
class _AluOp:
    opcode: int
    values: np.ndarray  # per output channel (int64); SHR uses a uniform value

    @property
    def uniform(self) -> bool:
        return bool(np.all(self.values == self.values[0]))

    @property
    def is_imm(self) -> bool:
        return self.uniform and -(1 << 15) <= int(self.values[0]) < (1 << 15)


def _interval(op: int, v: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    if op == ALU_ADD:
        return lo + v, hi + v
    if op == ALU_SHR:
        return lo >> v, hi >> v
    if op == ALU_MUL:
        a, b = lo * v, hi * v
        return np.minimum(a, b), np.maximum(a, b)
    if op == ALU_MAX:
        return np.maximum(lo, v), np.maximum(hi, v)
    if op == ALU_MIN:
        return np.minimum(lo, v), np.minimum(hi, v)
    raise AssertionError(op)


def _requant_tail(g_lo, g_hi, bias, rq, out_dtype: str, k: int, where: str) -> list[_AluOp]:
    """ALU ops turning the GEMM sum ``g`` (``g_lo <= g <= g_hi`` per channel) into the stored
    output: ``requant(g + bias)`` minus the storage offset, clipped; exact in int32."""
    off = _stored_offset(out_dtype)
    zp, qmin, qmax = int(rq.zero_point) + off, int(rq.qmin) + off, int(rq.qmax) + off
    pre, s = int(rq.pre_shift), int(rq.shift)
    if pre < 0 or s < 0:
        raise MappingError(f"{where}: requantize shifts must be >= 0 (pre_shift {pre}, "
                           f"shift {s})")
    m = np.broadcast_to(np.asarray(rq.multiplier, dtype=np.int64).reshape(-1), (k,)).copy()
    r = np.broadcast_to(np.asarray(rq.round_add, dtype=np.int64).reshape(-1), (k,)).copy()
    bias = np.asarray(bias, dtype=np.int64)
    full = lambda v: np.full(k, v, dtype=np.int64)  # noqa: E731

    def build(fold_bias: bool, fold_zp: bool) -> list[_AluOp]:
        ops = []
        if fold_bias:  # pre == 0: (g + bias) * m + r == g * m + (bias * m + r)
            if np.any(m != 1):
                ops.append(_AluOp(ALU_MUL, m))
            c = bias * m + r
        else:
            if np.any(bias != 0):
                ops.append(_AluOp(ALU_ADD, bias))
            if pre:
                ops.append(_AluOp(ALU_SHR, full(min(pre, 31))))
            if np.any(m != 1):
                ops.append(_AluOp(ALU_MUL, m))
            c = r
        if fold_zp:  # (t + c) >> s + zp == (t + c + zp * 2^s) >> s
            c = c + (zp << s)
        if np.any(c != 0):
            ops.append(_AluOp(ALU_ADD, c))
        if s:
            ops.append(_AluOp(ALU_SHR, full(min(s, 31))))
        if not fold_zp and zp:
            ops.append(_AluOp(ALU_ADD, full(zp)))
        return ops

    def fits(ops) -> tuple[bool, np.ndarray, np.ndarray]:
        lo, hi = np.asarray(g_lo, dtype=np.int64), np.asarray(g_hi, dtype=np.int64)
        ok = True
        for op in ops:
            if np.any(op.values < INT32_MIN) or np.any(op.values > INT32_MAX):
                ok = False
            lo, hi = _interval(op.opcode, op.values, lo, hi)
            if lo.min() < INT32_MIN or hi.max() > INT32_MAX:
                ok = False
        return ok, lo, hi

    candidates = []
    zp_folds = (True, False) if s <= 30 and abs(zp) < (1 << 16) else (False,)
    if pre == 0:
        candidates += [build(True, f) for f in zp_folds]
    candidates += [build(False, f) for f in zp_folds]
    chosen = None
    for ops in candidates:
        ok, lo, hi = fits(ops)
        if ok:
            chosen = (ops, lo, hi)
            break
    if chosen is None:
        # Worst-case inputs would overflow int32 somewhere; the recipe producer guarantees the
        # layer's real accumulator bound fits, so use the plain recipe order (as the reference).
        ops = candidates[-1]
        _, lo, hi = fits(ops)
        chosen = (ops, lo, hi)
    ops, lo, hi = chosen
    if lo.min() < qmin:
        ops.append(_AluOp(ALU_MAX, full(qmin)))
    if hi.max() > qmax:
        ops.append(_AluOp(ALU_MIN, full(qmax)))
    for op in ops:
        if np.any(op.values < INT32_MIN) or np.any(op.values > INT32_MAX):
            raise MappingError(f"{where}: requantize constant {op.values.min()}..{op.values.max()}"
                               f" of the ALU op does not fit int32")
    return ops


# --- geometry ---------------------------------------------------------------------------------
@dataclass
class _ConvGeom:
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
        return (k0 // kg) * cg // self.blk, _cdiv((k1 // kg + 1) * cg, self.blk)

    def chunks(self, co0: int, nco: int, tci: int) -> list[tuple[int, int]]:
        """Input-channel blocks ``(c0, n)`` an output-channel tile loads per chunk: the chunks
        ``_segs(CB, tci)`` clipped to the blocks its groups read; chunks outside are skipped."""
        if not self.grouped:
            return _segs(self.CB, tci)
        lo, hi = self.ci_range(co0)[0], self.ci_range(co0 + nco - 1)[1]
        out = []
        for s, t in _segs(self.CB, tci):
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
                     for co0, nco in _segs(self.KB, tco)]
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


def _conv_geom(layer: ConvLayer, in_shape, cfg: VTAConfig, sub: SubConv | None = None,
               strides: tuple[int, int] = (1, 1)) -> _ConvGeom:
    """Geometry of a conv/dense layer; with ``sub`` (a phase of a transpose conv with
    ``strides``) only the phase's output window is computed and stored interleaved."""
    N, C, H, W = _dims4(tuple(in_shape))
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
    g = _ConvGeom(N, C, H, W, K, KH, KW, sh, sw, pad, Ho, Wo, _cdiv(N, cfg.batch),
                  _cdiv(C, cfg.block_in), _cdiv(K, cfg.block_out), bool(layer.is_dense),
                  dh, dw, groups, cfg.block_out)
    if sub is not None:
        (qh, qw), (nh, nw) = sub.crop, sub.count
        if min(qh, qw) < 0 or nh < 1 or nw < 1 or qh + nh > Ho or qw + nw > Wo:
            raise MappingError(f"layer {layer.name}: phase window rows {qh}+{nh}, cols "
                               f"{qw}+{nw} outside its {Ho}x{Wo} output")
        g.oh0, g.ow0, g.Ho, g.Wo = qh, qw, nh, nw
        g.osh, g.osw = (int(s) for s in strides)
    return g


def _deconv_phases(layer: DeconvLayer, in_shape) -> list[SubConv]:
    """The stride-1 sub-convolutions (phases) of a transpose conv; MappingError when the
    decomposition or the interleaving STORE does not apply."""
    if tuple(int(d) for d in layer.dilation) != (1, 1):
        raise MappingError(f"layer {layer.name}: dilated transpose conv (dilation "
                           f"{tuple(layer.dilation)}) has no sub-kernel decomposition on VTA")
    if not all(1 <= int(s) <= MAX_FIELD16 for s in layer.strides):
        raise MappingError(f"layer {layer.name}: transpose conv strides {tuple(layer.strides)} "
                           f"must be 1..{MAX_FIELD16} (the STORE's x_stride field)")
    shape = _dims4(tuple(in_shape))
    try:
        subs = deconv_subconvs(layer, shape)
    except ValueError as e:
        raise MappingError(str(e)) from None
    if not subs:
        raise MappingError(f"layer {layer.name}: transpose conv has an empty output "
                           f"{deconv_output_shape(layer, shape)}")
    return subs


def _phase_pad(sc: SubConv, in_shape) -> tuple[int, int, int, int]:
    """Padding (top, left, bottom, right) the output window of a phase really reads."""
    _, _, H, W = _dims4(tuple(in_shape))
    (kh, kw), (pt, pl, _, _) = sc.conv.kernel, sc.conv.padding
    (qh, qw), (nh, nw) = sc.crop, sc.count
    return (max(0, pt - qh), max(0, pl - qw), max(0, qh + nh - 1 - pt + kh - H),
            max(0, qw + nw - 1 - pl + kw - W))


def _conv_numerics(layer: ConvLayer, in_dtype: str, out_dtype: str, cfg: VTAConfig):
    """(zx', folded bias, ALU tail ops) of a conv/dense layer; raises MappingError."""
    where = f"layer {layer.name}"
    w = np.asarray(layer.weight)
    if w.size and (w.min() < -128 or w.max() > 127):
        raise MappingError(f"{where}: weight values {int(w.min())}..{int(w.max())} do not fit "
                           "int8 (VTA multiplies int8 x int8)")
    K = w.shape[0]
    zxp = int(layer.input_zero_point) + _stored_offset(in_dtype)
    if not -128 <= zxp <= 127:
        raise MappingError(f"{where}: input zero point {layer.input_zero_point} is outside the "
                           f"{in_dtype} range")
    wf = w.reshape(K, -1)
    ssum = wf.sum(axis=1, dtype=np.int64)
    pos = np.maximum(wf, 0).sum(axis=1, dtype=np.int64)
    neg = ssum - pos
    bias = np.broadcast_to(np.asarray(layer.bias, dtype=np.int64).reshape(-1), (K,))
    bias_eff = bias - zxp * ssum
    # interval of g = sum x' * w over stored int8 inputs x' in [-128, 127]
    g_lo = -128 * pos + 127 * neg
    g_hi = 127 * pos - 128 * neg
    ops = _requant_tail(g_lo, g_hi, bias_eff, layer.requant, out_dtype, K, where)
    return zxp, ops


def _add_numerics(layer: AddLayer, dtypes: tuple[str, str], out_dtype: str, k: int):
    where = f"layer {layer.name}"
    za = int(layer.a_zero_point) + _stored_offset(dtypes[0])
    zb = int(layer.b_zero_point) + _stored_offset(dtypes[1])
    ma, mb = int(layer.a_multiplier), int(layer.b_multiplier)
    for nm, v in (("a_multiplier", ma), ("b_multiplier", mb)):
        if not -(1 << 15) <= v < (1 << 15):
            raise MappingError(f"{where}: {nm} {v} does not fit the ALU's signed 16-bit "
                               "immediate")
    lo = min(-128 * ma, 127 * ma) + min(-128 * mb, 127 * mb)
    hi = max(-128 * ma, 127 * ma) + max(-128 * mb, 127 * mb)
    bias = np.full(k, -za * ma - zb * mb, dtype=np.int64)
    ops = _requant_tail(np.full(k, lo, np.int64), np.full(k, hi, np.int64), bias, layer.requant,
                        out_dtype, k, where)
    return ma, mb, ops


# --- knob spaces ------------------------------------------------------------------------------
def _n_vec(ops: list[_AluOp]) -> int:
    return sum(1 for op in ops if not op.is_imm)


def _threads(kn: dict) -> tuple[int, str]:
    oc, hn = int(kn.get("oc_nthread", 1)), int(kn.get("h_nthread", 1))
    if oc == 2:
        return 2, "co"
    if hn == 2:
        return 2, "h"
    return 1, ""


def _conv_tile_extents(g: _ConvGeom, kn: dict):
    tb, tco, tci = kn["tile_b"], kn["tile_co"], kn["tile_ci"]
    th, tw = (1, 1) if g.dense else (kn["tile_h"], kn["tile_w"])
    return tb, tco, tci, th, tw


def _gemm_uops(extents: list[int]) -> int:
    e = sorted((x for x in extents if x > 1), reverse=True)
    return math.prod(e[2:])


def _check_conv(g: _ConvGeom, cfg: VTAConfig, nvec: int, kn: dict) -> None:
    """Raise ValueError naming the knob when a tiling does not fit the SRAM buffers."""
    if kn.get("oc_nthread", 1) == 2 and kn.get("h_nthread", 1) == 2:
        raise ValueError("h_nthread: oc_nthread and h_nthread cannot both be 2 (VTA interleaves "
                         "two virtual threads)")
    nthr, _ = _threads(kn)
    tb, tco, tci, th, tw = _conv_tile_extents(g, kn)
    R, Cc = g.in_rows(th), g.in_cols(tw)
    ib, wb = g.tile_blocks(tco, tci)
    inp = tb * ib * R * Cc
    if inp > cfg.inp_depth // nthr:
        knob = "tile_ci" if g.dense else "tile_h"
        raise ValueError(f"{knob}: the input tile (tile_b {tb} x {ib} channel blocks x {R} rows "
                         f"x {Cc} cols = {inp} entries) exceeds the {cfg.inp_depth // nthr} INP "
                         f"entries available per thread")
    wgt = wb * g.KK
    if wgt > cfg.wgt_depth // nthr:
        raise ValueError(f"tile_co: the weight tile ({wb} blocks (tile_co {tco}, tile_ci "
                         f"{tci}) x {g.KH}x{g.KW} = {wgt} entries) exceeds the "
                         f"{cfg.wgt_depth // nthr} WGT entries available per thread")
    acc = tb * tco * th * tw + nvec * tco
    if acc > cfg.acc_depth // nthr:
        knob = "tile_co" if g.dense else "tile_w"
        raise ValueError(f"{knob}: the output tile ({tb * tco * th * tw} entries) plus "
                         f"{nvec * tco} requantize vector entries exceeds the "
                         f"{cfg.acc_depth // nthr} ACC entries available per thread")
    nu = g.gemm_uops(tb, tco, tci, th, tw)
    if nu > cfg.uop_depth // 4:
        raise ValueError(f"tile_ci: the GEMM micro-op kernel would need {nu} micro-ops (limit "
                         f"{cfg.uop_depth // 4}); use a smaller tile_ci or tile_co")


def _check_add(shape, cfg: VTAConfig, nvec: int, kn: dict) -> None:
    tb, tc, th, tw = kn["tile_b"], kn["tile_co"], kn["tile_h"], kn["tile_w"]
    n = tb * tc * th * tw
    if 2 * n + nvec * tc > cfg.acc_depth:
        raise ValueError(f"tile_w: the add tile (2 operands x {n} entries + {nvec * tc} vector "
                         f"entries) exceeds the {cfg.acc_depth} ACC entries")


def _guess_dtype(zero_point: int, hi: int = 0) -> str:
    return "uint8" if zero_point > 127 or hi > 127 else "int8"


def _layer_ctx(layer, in_shape, cfg, dtypes=None):
    """Geometry and ALU tail of a layer for knob handling. Without ``dtypes`` the tensor types
    are inferred from the zero points (uint8 when a zero point or qmax exceeds 127)."""
    dout = _guess_dtype(int(layer.requant.zero_point), int(layer.requant.qmax))
    if isinstance(layer, ConvLayer):
        g = _conv_geom(layer, in_shape, cfg)
        din, dout = dtypes or (_guess_dtype(int(layer.input_zero_point)), dout)
        _, ops = _conv_numerics(layer, din, dout, cfg)
        return g, ops
    k = _dims4(tuple(in_shape))[1]
    da, db, dout = dtypes or (_guess_dtype(int(layer.a_zero_point)),
                              _guess_dtype(int(layer.b_zero_point)), dout)
    _, _, ops = _add_numerics(layer, (da, db), dout, k)
    return None, ops


def knob_space(layer, in_shape, cfg: VTAConfig, dtypes: tuple[str, ...] | None = None,
               _ctx=None) -> KnobSpace:
    """Declared knobs of a layer: conv ``tile_b, tile_h, tile_w, tile_ci, tile_co, oc_nthread,
    h_nthread``; dense ``tile_b, tile_ci, tile_co, oc_nthread``; add ``tile_b, tile_co, tile_h,
    tile_w``. ``tile_b``/``tile_ci``/``tile_co`` count blocks (BATCH / BLOCK), ``tile_h``/``tile_w``
    output rows/columns. Options are every near-equal split of the dimension. ``dtypes``
    (conv: ``(in, out)``, add: ``(a, b, out)``) refines the ACC budget of requantize vectors;
    by default they are inferred from the zero points."""
    g, ops = _ctx or _layer_ctx(layer, in_shape, cfg, dtypes)
    nvec = _n_vec(ops)
    if isinstance(layer, ConvLayer):
        d = _default_conv(g, cfg, nvec, len(ops))
        knobs = [Knob("tile_b", tuple(_tile_options(g.NB)), d["tile_b"])]
        if not g.dense:
            knobs += [Knob("tile_h", tuple(_tile_options(g.Ho)), d["tile_h"]),
                      Knob("tile_w", tuple(_tile_options(g.Wo)), d["tile_w"])]
        knobs += [Knob("tile_ci", tuple(_tile_options(g.CB)), d["tile_ci"]),
                  Knob("tile_co", tuple(_tile_options(g.KB)), d["tile_co"]),
                  Knob("oc_nthread", (1, 2), d["oc_nthread"])]
        if not g.dense:
            knobs.append(Knob("h_nthread", (1, 2), d["h_nthread"]))
        return KnobSpace(knobs, check=lambda kn: _check_conv(g, cfg, nvec, kn),
                         name=f"vta.{'dense' if g.dense else 'conv2d'}:{layer.name}")
    N, C, H, W = _dims4(tuple(in_shape))
    NB, CB = _cdiv(N, cfg.batch), _cdiv(C, cfg.block_out)
    d = _default_add((NB, CB, H, W), cfg, nvec, len(ops))
    knobs = [Knob("tile_b", tuple(_tile_options(NB)), d["tile_b"]),
             Knob("tile_co", tuple(_tile_options(CB)), d["tile_co"]),
             Knob("tile_h", tuple(_tile_options(H)), d["tile_h"]),
             Knob("tile_w", tuple(_tile_options(W)), d["tile_w"])]
    return KnobSpace(knobs, check=lambda kn: _check_add((NB, CB, H, W), cfg, nvec, kn),
                     name=f"vta.add:{layer.name}")


def default_knobs(layer, in_shape, cfg: VTAConfig,
                  dtypes: tuple[str, ...] | None = None) -> dict:
    """Heuristic default (cost-model search over tile sizes that fit the buffers)."""
    return knob_space(layer, in_shape, cfg, dtypes).default()


# --- cost model for the defaults ----------------------------------------------------------------
def _conv_cost(g: _ConvGeom, cfg: VTAConfig, nops: int, nvec: int, tb, tco, tci, th, tw,
               nthr: int, order: str) -> float:
    """Rough cycle estimate of a tiling (same cost rules as the simulator's timing model)."""
    lat, bpc, pl = cfg.DRAM_LATENCY_CYCLES, cfg.DRAM_BYTES_PER_CYCLE, cfg.PIPELINE_LATENCY_CYCLES
    nB, nCO, nCI = _cdiv(g.NB, tb), _cdiv(g.KB, tco), _cdiv(g.CB, tci)
    nH, nW = _cdiv(g.Ho, th), _cdiv(g.Wo, tw)
    # average tile extents
    atb, atco, atci = g.NB / nB, g.KB / nCO, g.CB / nCI
    ath, atw = g.Ho / nH, g.Wo / nW
    tiles = nB * nCO * nH * nW
    n = atb * atco * ath * atw
    R = ath if g.rstep > 1 else (ath - 1) * g.sh + g.in_rows(1)
    Cc = (atw - 1) * g.sw + g.in_cols(1)
    full_plane = R >= g.H + g.pad[0] + g.pad[2] and Cc >= g.W + g.pad[1] + g.pad[3]
    full_h = R >= g.H + g.pad[0] + g.pad[2]
    if g.grouped:  # chunks clipped to the groups' input blocks, only non-zero weight blocks
        _, _, nCI, atci, apairs = g.chunk_stats(tco, tci)
    n_inp_insn = 1 if full_plane and max(g.pad) == 0 else (atb if full_h else atb * atci)
    inp_cost = n_inp_insn * lat + atb * atci * R * Cc * cfg.inp_entry_bytes / bpc
    if g.grouped:
        wgt_cost = lat + apairs * g.KK * cfg.wgt_entry_bytes / bpc
        gemm = atb * apairs * ath * atw * g.KK * cfg.GEMM_CYCLES_PER_UOP + pl
    else:
        wgt_cost = lat + atco * atci * g.KK * cfg.wgt_entry_bytes / bpc
        gemm = atb * atco * atci * ath * atw * g.KK * cfg.GEMM_CYCLES_PER_UOP + pl
    alu = nops * (n * cfg.ALU_CYCLES_PER_UOP + pl) + n + pl  # + reset
    if nvec:
        alu += lat + nvec * atco * cfg.acc_entry_bytes / bpc
    out_full = ath >= g.Ho
    n_st = atb if out_full else atb * atco
    if g.osw > 1 and atw > 1:  # interleaved columns: one STORE per row (see _TG.scatter)
        n_st = atb * atco * ath
    elif g.osh > 1 or g.osw > 1:
        n_st = atb * atco
    store = n_st * lat + n * cfg.out_entry_bytes / bpc
    # how often inputs / weights are (re)loaded per (tile, chunk)
    if nCI > 1:
        w_frac, i_frac = 1.0, 1.0
    elif g.grouped:  # each co tile reads its own input blocks
        w_frac, i_frac = min(1.0, nCO * nthr / tiles), 1.0
    elif order == "co_inner":
        w_frac = 1.0 if nCO > nthr else min(1.0, nthr / tiles)
        i_frac = min(1.0, nthr / max(nCO, 1)) if nCO > 1 else 1.0
    else:
        w_frac = min(1.0, nCO * nthr / tiles)
        i_frac = 1.0
    load = nCI * (inp_cost * i_frac + wgt_cost * w_frac)
    comp = nCI * gemm + alu
    if nthr == 2:
        per = max(comp, load, store)
        total = tiles * per + load + store
    else:
        total = tiles * (comp + max(load, store + alu * 0.0)) + store
    return total + tiles * nCI * 2.0  # a little per-instruction overhead favours big tiles


def _largest_fit(opts: list[int], pred) -> int | None:
    """Largest option satisfying a predicate that is monotone (true up to some option)."""
    lo, hi = 0, len(opts)  # pred true for opts[:lo], unknown in [lo, hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(opts[mid]):
            lo = mid + 1
        else:
            hi = mid
    return opts[lo - 1] if lo else None


def _default_conv(g: _ConvGeom, cfg: VTAConfig, nvec: int, nops: int) -> dict:
    b_opts, co_opts, ci_opts = _tile_options(g.NB), _tile_options(g.KB), _tile_options(g.CB)
    h_opts = [1] if g.dense else _tile_options(g.Ho)
    w_opts = [1] if g.dense else _tile_options(g.Wo)
    best = None
    for nthr in (2, 1):
        inp_d, wgt_d, acc_d = cfg.inp_depth // nthr, cfg.wgt_depth // nthr, cfg.acc_depth // nthr
        for tb in b_opts:
            for tci in ci_opts[::-1]:
                if not g.grouped and tb * tci * g.KK > inp_d:
                    continue
                for tco in co_opts:
                    ib, wb = g.tile_blocks(tco, tci)
                    if (tb * ib * g.KK > inp_d or wb * g.KK > wgt_d
                            or tb * tco + nvec * tco > acc_d):
                        continue
                    for tw in w_opts[::-1]:
                        Cc = g.in_cols(tw)
                        if (tb * ib * g.in_rows(1) * Cc > inp_d
                                or tb * tco * tw + nvec * tco > acc_d):
                            continue

                        def fits(th, tb=tb, tci=tci, tco=tco, tw=tw, Cc=Cc, ib=ib, inp_d=inp_d,
                                 acc_d=acc_d):
                            R = g.in_rows(th)
                            return (tb * ib * R * Cc <= inp_d
                                    and tb * tco * th * tw + nvec * tco <= acc_d
                                    and g.gemm_uops(tb, tco, tci, th, tw) <= cfg.uop_depth // 4)

                        th = _largest_fit(h_opts, fits)
                        if th is None:
                            continue
                        tiles = (_cdiv(g.NB, tb) * _cdiv(g.KB, tco) * _cdiv(g.Ho, th)
                                 * _cdiv(g.Wo, tw))
                        if nthr == 2 and tiles < 2:
                            continue
                        if nthr == 2:
                            axes = []
                            if _cdiv(g.KB, tco) >= 2:
                                axes.append(("co", "co_inner"))
                            if not g.dense:
                                axes.append(("h", "h_inner"))
                            if not axes:
                                axes.append(("co", "co_inner"))
                        else:
                            axes = [("", "co_outer"), ("", "co_inner")]
                        for axis, order in axes:
                            c = _conv_cost(g, cfg, nops, nvec, tb, tco, tci, th, tw, nthr, order)
                            if best is None or c < best[0] - 1e-9:
                                best = (c, tb, tco, tci, th, tw, nthr, axis)
    if best is None:
        raise MappingError("no tiling fits the VTA buffers (kernel too large for the INP/WGT "
                           "buffer even with 1x1 tiles)")
    _, tb, tco, tci, th, tw, nthr, axis = best
    d = {"tile_b": tb, "tile_h": th, "tile_w": tw, "tile_ci": tci, "tile_co": tco,
         "oc_nthread": 2 if axis == "co" and nthr == 2 else 1,
         "h_nthread": 2 if axis == "h" and nthr == 2 else 1}
    if g.dense:
        del d["tile_h"], d["tile_w"], d["h_nthread"]
    return d


def _default_add(dims, cfg: VTAConfig, nvec: int, nops: int) -> dict:
    NB, CB, H, W = dims
    lat, bpc = cfg.DRAM_LATENCY_CYCLES, cfg.DRAM_BYTES_PER_CYCLE
    half = cfg.acc_depth // 2
    best = None
    for tw in _tile_options(W)[::-1]:
        for th in _tile_options(H)[::-1]:
            if 2 * th * tw > half:
                continue
            for tc in _tile_options(CB)[::-1]:
                tb_ok = [tb for tb in _tile_options(NB)
                         if 2 * tb * tc * th * tw + nvec * tc <= half]
                if not tb_ok:
                    continue
                tb = tb_ok[-1]
                n = tb * tc * th * tw
                tiles = _cdiv(NB, tb) * _cdiv(CB, tc) * _cdiv(H, th) * _cdiv(W, tw)
                n_ld = 1 if (th == H and tw == W) else (tb if th == H else tb * tc)
                cost = tiles * (2 * (n_ld * lat + n * cfg.out_entry_bytes / bpc)
                                + (nops + 3) * (2 * n + 4) + 8)
                if best is None or cost < best[0]:
                    best = (cost, tb, tc, th, tw)
                break  # larger tc first: the first fitting one is the best for this (th, tw)
    if best is None:
        raise MappingError("the add layer does not fit the ACC buffer")
    _, tb, tc, th, tw = best
    return {"tile_b": tb, "tile_co": tc, "tile_h": th, "tile_w": tw}


# --- DRAM -------------------------------------------------------------------------------------
class _Dram:
    def __init__(self, align: int):
        self.align = align
        self.size = 0
        self.const_image: list[tuple[int, bytes]] = []
        self._dedupe: dict[bytes, int] = {}

    def alloc(self, nbytes: int) -> int:
        off = _cdiv(self.size, self.align) * self.align
        self.size = off + nbytes
        return off

    def const(self, data: bytes) -> int:
        off = self._dedupe.get(data)
        if off is None:
            off = self.alloc(len(data))
            self.const_image.append((off, data))
            self._dedupe[data] = off
        return off


class _TG:
    """Packed DRAM geometry of a placement (indices in entries of BATCH x BLOCK bytes)."""

    def __init__(self, p: TensorPlacement, cfg: VTAConfig):
        N, C, H, W = _dims4(p.shape)
        self.H, self.W = H, W
        self.NB, self.CB = _cdiv(N, cfg.batch), _cdiv(C, cfg.block_out)
        self.ht, self.hl, self.hb, self.hr = p.halo
        self.Hp, self.Wp = H + self.ht + self.hb, W + self.hl + self.hr
        self.base = p.offset // cfg.inp_entry_bytes

    def entry(self, b, c, r, x) -> int:
        return self.base + ((b * self.CB + c) * self.Hp + r) * self.Wp + x

    def region(self, b0, tb, c0, tc, r0, nr, x0, nx):
        """2-D transfers ``(sram_offset, dram_entry, y, x, stride)`` covering the dense block
        ``[tb][tc][nr][nx]`` starting at DRAM row ``r0``, column ``x0`` (halo coordinates)."""
        Hp, Wp, CB = self.Hp, self.Wp, self.CB
        plane = Hp * Wp
        if r0 == 0 and nr == Hp and x0 == 0 and nx == Wp:
            if (tc == CB or tb == 1) and tb * tc * plane <= MAX_FIELD16:
                x = tb * tc * plane
                return [(0, self.entry(b0, c0, 0, 0), 1, x, x)]
            if tc * plane <= MAX_FIELD16 and CB * plane <= MAX_FIELD16:
                return [(0, self.entry(b0, c0, 0, 0), tb, tc * plane, CB * plane)]
        if r0 == 0 and nr == Hp:
            if tc == CB and tb * tc * Hp <= MAX_FIELD16:
                return [(0, self.entry(b0, c0, 0, x0), tb * tc * Hp, nx, Wp)]
            if tc * Hp <= MAX_FIELD16:
                return [(b * tc * nr * nx, self.entry(b0 + b, c0, 0, x0), tc * Hp, nx, Wp)
                        for b in range(tb)]
        return [((b * tc + c) * nr * nx, self.entry(b0 + b, c0 + c, r0, x0), nr, nx, Wp)
                for b in range(tb) for c in range(tc)]

    def scatter(self, b0, tb, c0, tc, r0, nr, x0, nx, sy, sx):
        """STOREs ``(sram_offset, dram_entry, y, x, stride)`` of the dense block
        ``[tb][tc][nr][nx]`` to DRAM rows ``r0 + i * sy`` and columns ``x0 + j * sx``.

        A STORE copies ``y`` rows of ``x`` consecutive entries, row ``i`` to ``dram_entry +
        i * stride``: rows spaced ``sy`` are one STORE per channel block (stride ``sy * Wp``);
        columns spaced ``sx > 1`` are one STORE per row, taking each entry as a row of one
        (``x = 1``, stride ``sx``), or per channel block when the tile is one column wide."""
        if sy == sx == 1:
            return self.region(b0, tb, c0, tc, r0, nr, x0, nx)
        out, Wp = [], self.Wp
        for b in range(tb):
            for c in range(tc):
                so = (b * tc + c) * nr * nx
                if (sx == 1 or nx == 1) and sy * Wp <= MAX_FIELD16:
                    out.append((so, self.entry(b0 + b, c0 + c, r0, x0), nr, nx, sy * Wp))
                    continue
                for i in range(nr):
                    de = self.entry(b0 + b, c0 + c, r0 + i * sy, x0)
                    out.append((so + i * nx, de, 1, nx, nx) if sx == 1 or nx == 1
                               else (so + i * nx, de, nx, 1, sx))
        return out


# --- instruction emitter with token bookkeeping --------------------------------------------------
class _UopOverflow(Exception):
    """The layer's micro-op kernels do not all fit the UOP buffer at once."""


def _emit_layer(cfg: VTAConfig, isa: ISA, dram: _Dram, name: str, body) -> bytes:
    """Run ``body(emitter)``; with one bulk UOP load if every kernel fits, else on demand."""
    try:
        em = _Emitter(cfg, isa, dram, name, bulk_uops=True)
        body(em)
    except _UopOverflow:
        em = _Emitter(cfg, isa, dram, name, bulk_uops=False)
        body(em)
    return em.finish()


class _Emitter:
    """Builds one layer's instruction stream: uop kernels, token links, FINISH."""

    def __init__(self, cfg: VTAConfig, isa: ISA, dram: _Dram, name: str, bulk_uops: bool = True):
        self.cfg, self.isa, self.dram, self.name = cfg, isa, dram, name
        # bulk: every kernel gets its own UOP range and one LOAD UOP at the start of the stream
        # brings them all in; otherwise kernels are loaded on first use (evicting all when full)
        self.bulk_uops = bulk_uops
        self._uop_image: list[bytes] = []
        self.insns: list = []
        self._count = [0, 0, 0]
        self._seq: dict[int, int] = {}
        self._links: dict[str, list[tuple[int, int]]] = {"L2G": [], "G2L": [], "G2S": [],
                                                         "S2G": []}
        self.last_reader: dict[int, object] = {}  # INP/WGT half -> last GEMM reading it
        self.last_store: dict[int, object] = {}   # ACC half -> last STORE of its latest tile
        self.pending_load: dict[int, object] = {}  # half -> load group awaiting its GEMM
        self.pending_g2s = None
        self.final_store = None
        self._g2l_done = -1  # queue position of the newest GEMM / STORE a token was popped for
        self._s2g_done = -1
        self._uop_res: dict[bytes, int] = {}
        self._uop_top = 0
        self._kernel_memo: dict[tuple, tuple] = {}
        A, Ib = isa.A, isa.I
        self._uop_shift = (A, A + Ib)

    # -- basics
    def emit(self, insn):
        q = queue_of(insn)
        self._seq[id(insn)] = self._count[q]
        self._count[q] += 1
        self.insns.append(insn)
        return insn

    def _link(self, queue: str, push_insn, pop_insn):
        self._links[queue].append((self._seq[id(push_insn)], self._seq[id(pop_insn)]))

    # -- token protocol
    def load_group(self, half: int, insns: list) -> bool:
        """Emit INP/WGT loads into a half; returns False if there is nothing to load."""
        if not insns:
            return False
        for i in insns:
            self.emit(i)
        reader = self.last_reader.pop(half, None)
        if reader is not None and self._seq[id(reader)] > self._g2l_done:
            # WAR: wait until the last GEMM reading this half is done (an older one is done
            # already when an earlier load waited for a later GEMM: both queues run in order)
            self._g2l_done = self._seq[id(reader)]
            reader.deps.push_prev = True
            insns[0].deps.pop_next = True
            self._link("G2L", reader, insns[0])
        insns[-1].deps.push_next = True
        self.pending_load[half] = insns[-1]
        return True

    def gemm_reads(self, half: int, gemm, popped: bool):
        """Register ``gemm`` as the consumer of the half's pending load (RAW) and its reader."""
        if popped:
            ld = self.pending_load.pop(half)
            gemm.deps.pop_prev = True
            self._link("L2G", ld, gemm)
        self.last_reader[half] = gemm

    def acc_acquire(self, half: int, first_write):
        st = self.last_store.pop(half, None)
        if st is not None and self._seq[id(st)] > self._s2g_done:
            # WAR on ACC: wait for the previous tile's STORE of this half (unless a later STORE
            # was waited for already)
            self._s2g_done = self._seq[id(st)]
            st.deps.push_prev = True
            first_write.deps.pop_next = True
            self._link("S2G", st, first_write)

    def compute_done(self, last_compute):
        last_compute.deps.push_next = True
        self.pending_g2s = last_compute

    def store_group(self, half: int, insns: list):
        for i in insns:
            self.emit(i)
        insns[0].deps.pop_prev = True
        self._link("G2S", self.pending_g2s, insns[0])
        self.pending_g2s = None
        self.last_store[half] = insns[-1]
        self.final_store = insns[-1]

    def new_phase(self):
        """Start a sub-program that lays out INP/WGT/ACC differently (the phases of a
        transpose conv): its first load into either half waits for the newest GEMM of the
        previous one (the queues run in order, so that covers all older GEMMs), and a compute
        no-op waits for its last STORE before any ACC write (requantize vectors included)."""
        if self.last_reader:
            newest = max(self.last_reader.values(), key=lambda i: self._seq[id(i)])
            self.last_reader.update({0: newest, 1: newest})
        st = self.final_store
        if st is not None and self._seq[id(st)] > self._s2g_done:
            nop = self.emit(MemInsn(OP_LOAD, MEM_UOP, 0, 0, 0, 0, 0))
            self._s2g_done = self._seq[id(st)]
            st.deps.push_prev = True
            nop.deps.pop_next = True
            self._link("S2G", st, nop)
        self.last_store.clear()
        self.final_store = None

    def finish(self) -> bytes:
        if self.final_store is not None:
            nop = MemInsn(OP_LOAD, MEM_UOP, 0, 0, 0, 0, 0)
            self.emit(nop)
            self.final_store.deps.push_prev = True
            nop.deps.pop_next = True
            self._link("S2G", self.final_store, nop)
        self.emit(FinishInsn())
        if self.bulk_uops and self._uop_image:
            words = b"".join(self._uop_image)
            n = len(words) // 4
            ld = MemInsn(OP_LOAD, MEM_UOP, 0, self.dram.const(words) // 4, 1, n, n)
            self.insns.insert(0, ld)  # compute-queue order of everything else is unchanged
        for q, pairs in self._links.items():
            for (a0, b0), (a1, b1) in zip(pairs, pairs[1:], strict=False):
                if not (a1 > a0 and b1 > b0):
                    raise AssertionError(f"{self.name}: {q} token links are not FIFO-ordered")
        return self.isa.encode_stream(self.insns)

    # -- micro-op kernels
    def _kernel(self, dims: tuple, bases: tuple, table: tuple = ()) -> tuple:
        """(uop words, iter_out, iter_in, factors) for loop dims ``(extent, dst, src, wgt)``;
        ``table`` lists explicit ``(dst, src, wgt)`` offsets enumerated as one more (outermost,
        non-linear) micro-op dimension, e.g. the non-zero weight blocks of a grouped conv."""
        key = (dims, bases, table)
        hit = self._kernel_memo.get(key)
        if hit is not None:
            return hit
        ds = sorted((d for d in dims if d[0] > 1), key=lambda d: -d[0])
        loops = ds[:2]
        rest = sorted(ds[2:], key=lambda d: -d[1])
        t = np.asarray(table or ((0, 0, 0),), dtype=np.int64).reshape(-1, 3)
        dst, src, wgt = (bases[i] + t[:, i] for i in range(3))
        for e, a, b, c in rest:
            ar = np.arange(e, dtype=np.int64)
            dst = (dst[:, None] + ar[None, :] * a).ravel()
            src = (src[:, None] + ar[None, :] * b).ravel()
            wgt = (wgt[:, None] + ar[None, :] * c).ravel()
        sa, sb = self._uop_shift
        words = (dst | (src << sa) | (wgt << sb)).astype("<u4").tobytes()
        while len(loops) < 2:
            loops.append((1, 0, 0, 0))
        outer, inner = loops[1], loops[0]  # the largest extent innermost
        if outer[0] > MAX_ITER or inner[0] > MAX_ITER:
            raise MappingError(f"layer {self.name}: a loop of {max(outer[0], inner[0])} "
                               "iterations exceeds the 14-bit iteration field")
        res = (words, outer, inner)
        self._kernel_memo[key] = res
        return res

    def _uops(self, words: bytes) -> tuple[int, int]:
        n = len(words) // 4
        base = self._uop_res.get(words)
        if base is None:
            if n > self.cfg.uop_depth:
                raise MappingError(f"layer {self.name}: a micro-op kernel of {n} uops exceeds the "
                                   f"UOP buffer ({self.cfg.uop_depth})")
            if self._uop_top + n > self.cfg.uop_depth:
                if self.bulk_uops:
                    raise _UopOverflow
                self._uop_res.clear()  # evict everything (compute runs in order)
                self._uop_top = 0
            base = self._uop_top
            self._uop_top += n
            self._uop_res[words] = base
            if self.bulk_uops:
                self._uop_image.append(words)
            else:
                self.emit(MemInsn(OP_LOAD, MEM_UOP, base, self.dram.const(words) // 4, 1, n, n))
        return base, base + n

    def gemm(self, dims: tuple, bases: tuple, reset: bool = False,
             table: tuple = ()) -> GemmInsn:
        words, outer, inner = self._kernel(dims, bases, table)
        bgn, end = self._uops(words)
        insn = GemmInsn(reset, bgn, end, outer[0], inner[0], outer[1], inner[1], outer[2],
                        inner[2], outer[3], inner[3])
        return self.emit(insn)

    def alu(self, opcode: int, dims: tuple, bases: tuple, imm: int | None) -> AluInsn:
        words, outer, inner = self._kernel(dims, (bases[0], bases[1], 0))
        bgn, end = self._uops(words)
        insn = AluInsn(opcode, bgn, end, outer[0], inner[0], outer[1], inner[1], outer[2],
                       inner[2], use_imm=imm is not None, imm=0 if imm is None else int(imm))
        return self.emit(insn)


# --- per-layer compilation ----------------------------------------------------------------------
def _vector_image(ops: list[_AluOp], k: int, cfg: VTAConfig) -> tuple[bytes, list[int | None]]:
    """ACC image ``[nvec][KB][BATCH][BLOCK]`` int32 of the non-immediate operands and, per op,
    its vector index (None for immediates)."""
    KB, B, BLK = _cdiv(k, cfg.block_out), cfg.batch, cfg.block_out
    vecs, index = [], []
    for op in ops:
        if op.is_imm:
            index.append(None)
            continue
        v = np.zeros(KB * BLK, dtype=np.int64)
        v[:k] = op.values
        img = np.broadcast_to(v.reshape(KB, 1, BLK), (KB, B, BLK))
        index.append(len(vecs))
        vecs.append(img.astype("<i4"))
    data = np.stack(vecs).tobytes() if vecs else b""
    return data, index


def _emit_tail(em: _Emitter, ops, vidx, n: int, tb: int, tco: int, S: int, abase: int,
               vbase: int):
    """Whole-tile ALU instructions of the requantize tail; returns the last one (or None)."""
    last = None
    for op, vi in zip(ops, vidx, strict=True):
        if vi is None:
            last = em.alu(op.opcode, ((n, 1, 0, 0),), (abase, 0), int(op.values[0]))
        else:
            dims = ((tb, tco * S, 0, 0), (tco, S, 1, 0), (S, 1, 0, 0))
            last = em.alu(op.opcode, dims, (abase, vbase + vi * tco), None)
    return last


def _grouped_weight_image(weight: np.ndarray, g: _ConvGeom) -> tuple[bytes, list[int]]:
    """OIHWoi blocks of a grouped conv's block-diagonal dense weight, keeping per output-channel
    block ``j`` only the input-channel blocks ``g.ci_range(j)`` (the others are all zero):
    ``[j][ci][KH][KW][BLOCK_OUT][BLOCK_IN]``, blocks of consecutive ``j`` back to back. Returns
    the bytes and the first WGT entry of each ``j``."""
    BLK, kg, cg = g.blk, g.K // g.groups, g.C // g.groups
    w = np.asarray(weight).astype(np.int8)
    parts, offsets, off = [], [], 0
    for j in range(g.KB):
        lo, hi = g.ci_range(j)
        slab = np.zeros((BLK, (hi - lo) * BLK, g.KH, g.KW), dtype=np.int8)
        for kl in range(min(BLK, g.K - j * BLK)):
            k = j * BLK + kl
            c0 = (k // kg) * cg - lo * BLK
            slab[kl, c0:c0 + cg] = w[k]
        parts.append(slab.reshape(BLK, hi - lo, BLK, g.KH, g.KW).transpose(1, 3, 4, 0, 2))
        offsets.append(off)
        off += (hi - lo) * g.KK
    return np.ascontiguousarray(np.concatenate(parts)).tobytes(), offsets


def _grouped_wgt_runs(g: _ConvGeom, woff: list[int], co0: int, nco: int, ci0: int,
                      nci: int) -> list[tuple[int, int, int]]:
    """WGT loads ``(sram offset, dram offset, entries)`` of a grouped conv's chunk: the blocks of
    :meth:`_ConvGeom.pairs` in order, runs adjacent in DRAM merged into one transfer."""
    runs: list[list[int]] = []
    sram = 0
    for j in range(co0, co0 + nco):
        lo, hi = g.ci_range(j)
        a, b = max(lo, ci0), min(hi, ci0 + nci)
        if a >= b:
            continue
        de, x = woff[j] + (a - lo) * g.KK, (b - a) * g.KK
        if runs and runs[-1][1] + runs[-1][2] == de and runs[-1][2] + x <= MAX_FIELD16:
            runs[-1][2] += x
        else:
            runs.append([sram, de, x])
        sram += x
    return [(so, de, x) for so, de, x in runs]


def _conv_macs(g: _ConvGeom, cfg: VTAConfig) -> tuple[int, int]:
    """(MACs, MACs incl. the padded lanes and zero weight blocks VTA multiplies) of a conv."""
    macs = g.N * g.K * (g.C // g.groups) * g.Ho * g.Wo * g.KK
    nblocks = sum(hi - lo for lo, hi in map(g.ci_range, range(g.KB)))  # (co, ci) blocks
    return macs, g.NB * cfg.batch * cfg.block_out * nblocks * cfg.block_out * g.Ho * g.Wo * g.KK


def _tile_order(order: str, b_s, co_s, h_s, w_s):
    if order == "h_inner":
        return [(b, co, h, w) for co in co_s for b in b_s for w in w_s for h in h_s]
    if order == "co_inner":
        return [(b, co, h, w) for b in b_s for h in h_s for w in w_s for co in co_s]
    return [(b, co, h, w) for co in co_s for b in b_s for h in h_s for w in w_s]


class _Plan:
    def __init__(self, graph: LayerGraph, cfg: VTAConfig):
        self.graph, self.cfg = graph, cfg
        self.isa = ISA(cfg)
        align = max(cfg.inp_entry_bytes, cfg.wgt_entry_bytes, cfg.acc_entry_bytes, 64)
        self.dram = _Dram(align)
        self.placements: dict[str, TensorPlacement] = {}
        self._zero_off: int | None = None

    def zero_region(self) -> int:
        """DRAM entry index (INP entries) of a zero block as large as the INP buffer."""
        if self._zero_off is None:
            nbytes = self.cfg.inp_depth * self.cfg.inp_entry_bytes
            self._zero_off = self.dram.const(bytes(nbytes))
        return self._zero_off // self.cfg.inp_entry_bytes

    # -- conv / dense
    def conv(self, layer: ConvLayer, user_knobs: dict | None, use_halo: bool) -> LayerProgram:
        g, kn, body = self._conv_body(layer, user_knobs, use_halo)
        insns = _emit_layer(self.cfg, self.isa, self.dram, layer.name, body)
        macs, padded = _conv_macs(g, self.cfg)
        if g.dense:
            shape = f"{g.N}x{g.C} -> {g.N}x{g.K}"
        else:
            shape = (f"{g.N}x{g.C}x{g.H}x{g.W} -> {g.N}x{g.K}x{g.Ho}x{g.Wo} k{g.KH}x{g.KW} "
                     f"s{g.sh}" + (f"x{g.sw}" if g.sw != g.sh else ""))
            if any(g.pad):
                shape += " p" + (str(g.pad[0]) if len(set(g.pad)) == 1
                                 else ",".join(map(str, g.pad)))
            if (g.dh, g.dw) != (1, 1):
                shape += f" d{g.dh}" + (f"x{g.dw}" if g.dw != g.dh else "")
            if g.grouped:
                shape += f" g{g.groups}"
        return LayerProgram(layer.name, "dense" if g.dense else "conv2d", insns,
                            len(insns) // 16, macs, padded, shape, dict(kn))

    def _conv_body(self, layer: ConvLayer, user_knobs: dict | None, use_halo: bool,
                   output: str | None = None, sub: SubConv | None = None,
                   strides: tuple[int, int] = (1, 1)):
        """``(geometry, knobs, body)`` of a conv: ``body(emitter)`` emits its tiles. With
        ``sub`` (a phase of a transpose conv with ``strides`` writing tensor ``output``) only
        the phase's window is computed, its pixels stored to every ``strides``-th row/column
        of ``output`` from the phase's offset."""
        cfg, name = self.cfg, layer.name
        pin, pout = self.placements[layer.input], self.placements[output or layer.output]
        g = _conv_geom(layer, pin.shape, cfg, sub, strides)
        orow, ocol = sub.offset if sub is not None else (0, 0)
        zxp, ops = _conv_numerics(layer, pin.dtype, pout.dtype, cfg)
        space = knob_space(layer, pin.shape, cfg, _ctx=(g, ops))
        kn = _validate_knobs(space, user_knobs, name)
        nthr, axis = _threads(kn)
        tb, tco, tci, th, tw = _conv_tile_extents(g, kn)
        BLK, KK = cfg.block_out, g.KK
        # constants: OIHWoi weights (grouped: only the non-zero blocks), requantize vectors
        if g.grouped:
            wdata, woff = _grouped_weight_image(np.asarray(layer.weight), g)
        else:
            w = np.zeros((g.KB * BLK, g.CB * BLK, g.KH, g.KW), dtype=np.int8)
            w[: g.K, : g.C] = np.asarray(layer.weight).astype(np.int8)
            wp = w.reshape(g.KB, BLK, g.CB, BLK, g.KH, g.KW).transpose(0, 2, 4, 5, 1, 3)
            wdata, woff = np.ascontiguousarray(wp).tobytes(), []
        wbase_dram = self.dram.const(wdata) // cfg.wgt_entry_bytes
        vdata, vidx = _vector_image(ops, g.K, cfg)
        nvec = _n_vec(ops)
        vbase_dram = self.dram.const(vdata) // cfg.acc_entry_bytes if nvec else 0
        tin, tout = _TG(pin, cfg), _TG(pout, cfg)
        inp_h, wgt_h, acc_h = cfg.inp_depth // nthr, cfg.wgt_depth // nthr, cfg.acc_depth // nthr
        nmax = tb * tco * th * tw
        b_s, co_s = _segs(g.NB, tb), _segs(g.KB, tco)
        h_s, w_s = _segs(g.Ho, th), _segs(g.Wo, tw)
        # input-channel chunks (ci0, nci) of each output-channel tile
        co_chunks = {co: g.chunks(co[0], co[1], tci) for co in co_s}
        if axis == "co":
            order = "co_inner"
        elif axis == "h":
            order = "h_inner"
        else:
            c_out = _conv_cost(g, cfg, len(ops), nvec, tb, tco, tci, th, tw, 1, "co_outer")
            c_in = _conv_cost(g, cfg, len(ops), nvec, tb, tco, tci, th, tw, 1, "co_inner")
            order = "co_inner" if c_in < c_out else "co_outer"
        tiles = _tile_order(order, b_s, co_s, h_s, w_s)
        def body(em: _Emitter):
            inp_key: dict[int, tuple] = {}
            wgt_key: dict[int, tuple] = {}
            vec_key: dict[int, tuple] = {}
            pt, pl = g.pad[0], g.pad[1]

            def loads(t, chunk, half):
                (b0, nb), (co0, nco), (h0, nh), (w0, nw) = t
                ci0, nci = chunk
                out = []
                ikey = (b0, nb, ci0, nci, h0, nh, w0, nw)
                if inp_key.get(half) != ikey:
                    inp_key[half] = ikey
                    R, Cc = g.in_rows(nh), g.in_cols(nw)
                    out += self._inp_loads(tin, b0, nb, ci0, nci, (g.oh0 + h0) * g.sh - pt, R,
                                           g.rstep, (g.ow0 + w0) * g.sw - pl, Cc, use_halo,
                                           half * inp_h)
                wkey = (co0, nco, ci0, nci)
                if wgt_key.get(half) != wkey:
                    wgt_key[half] = wkey
                    if g.grouped:
                        out += [MemInsn(OP_LOAD, MEM_WGT, half * wgt_h + so, wbase_dram + de, 1,
                                        x, x)
                                for so, de, x in _grouped_wgt_runs(g, woff, co0, nco, ci0, nci)]
                    elif nci == g.CB:
                        x = nco * g.CB * KK
                        out.append(MemInsn(OP_LOAD, MEM_WGT, half * wgt_h, wbase_dram
                                           + co0 * g.CB * KK, 1, x, x))
                    else:
                        out.append(MemInsn(OP_LOAD, MEM_WGT, half * wgt_h, wbase_dram
                                           + (co0 * g.CB + ci0) * KK, nco, nci * KK, g.CB * KK))
                return out

            for gi in range(0, len(tiles), nthr):
                group = [(tiles[gi + j], j) for j in range(nthr) if gi + j < len(tiles)]
                for ci_i in range(max(len(co_chunks[t[1]]) for t, _ in group)):
                    active = [(t, half) for t, half in group if ci_i < len(co_chunks[t[1]])]
                    popped = {half: em.load_group(half, loads(t, co_chunks[t[1]][ci_i], half))
                              for t, half in active}
                    for t, half in active:
                        (b0, nb), (co0, nco), (h0, nh), (w0, nw) = t
                        ci0, nci = co_chunks[t[1]][ci_i]
                        abase = half * acc_h
                        vbase = abase + nmax
                        S, n = nh * nw, nb * nco * nh * nw
                        if ci_i == 0:
                            if nvec and vec_key.get(half) != (co0, nco):
                                vec_key[half] = (co0, nco)
                                em.emit(MemInsn(OP_LOAD, MEM_ACC, vbase, vbase_dram + co0,
                                                nvec, nco, g.KB))
                            reset = em.gemm(((n, 1, 0, 0),), (abase, 0, 0), reset=True)
                            em.acc_acquire(half, reset)
                        R, Cc = g.in_rows(nh), g.in_cols(nw)
                        stencil = ((g.KH, 0, g.dh * Cc, g.KW), (g.KW, 0, g.dw, 1),
                                   (nh, nw, g.sh // g.rstep * Cc, 0), (nw, 1, g.sw, 0))
                        bases = (abase, half * inp_h, half * wgt_h)
                        if g.grouped:  # only the (co, ci) blocks with non-zero weights
                            table = tuple((j * S, (c - ci0) * R * Cc, p * KK) for p, (j, c)
                                          in enumerate(g.pairs(co0, nco, ci0, nci)))
                            gm = em.gemm(((nb, nco * S, nci * R * Cc, 0), *stencil), bases,
                                         table=table)
                        else:
                            dims = ((nb, nco * S, nci * R * Cc, 0), (nco, S, 0, nci * KK),
                                    (nci, 0, R * Cc, KK), *stencil)
                            gm = em.gemm(dims, bases)
                        em.gemm_reads(half, gm, popped[half])
                        if ci_i == len(co_chunks[t[1]]) - 1:
                            last = _emit_tail(em, ops, vidx, n, nb, nco, S, abase, vbase) or gm
                            em.compute_done(last)
                            sts = [MemInsn(OP_STORE, MEM_OUT, abase + so, de, y, x, st)
                                   for so, de, y, x, st in tout.scatter(
                                       b0, nb, co0, nco, tout.ht + orow + h0 * g.osh, nh,
                                       tout.hl + ocol + w0 * g.osw, nw, g.osh, g.osw)]
                            em.store_group(half, sts)

        return g, kn, body

    # -- transpose conv
    def deconv(self, layer: DeconvLayer, user_knobs: dict | None,
               use_halo: bool) -> LayerProgram:
        """A transpose conv as its ``deconv_subconvs`` phases, one after the other in one
        stream: each phase is the static conv template on its output window, its STOREs
        interleave it into the output (:meth:`_TG.scatter`). ``user_knobs`` maps phase names
        (``<layer>_sub<rh><rw>``) to the conv knobs of that phase."""
        cfg, pin = self.cfg, self.placements[layer.input]
        user_knobs = user_knobs or {}
        subs = _deconv_phases(layer, pin.shape)
        unknown = sorted(set(user_knobs) - {sc.conv.name for sc in subs})
        if unknown:
            raise ValueError(f"layer {layer.name}: knobs are per phase "
                             f"({', '.join(sc.conv.name for sc in subs)}), not {unknown[0]!r}")
        strides = tuple(int(s) for s in layer.strides)
        parts = [self._conv_body(sc.conv, user_knobs.get(sc.conv.name), use_halo, layer.output,
                                 sc, strides) for sc in subs]

        def body(em: _Emitter):
            for i, (_, _, phase) in enumerate(parts):
                if i:
                    em.new_phase()
                phase(em)

        insns = _emit_layer(cfg, self.isa, self.dram, layer.name, body)
        macs, padded = (sum(v) for v in zip(*(_conv_macs(g, cfg) for g, _, _ in parts),
                                            strict=True))
        (n, c, h, w), (kh, kw) = _dims4(tuple(pin.shape)), layer.kernel
        _, k, ho, wo = deconv_output_shape(layer, (n, c, h, w))
        shape = (f"{n}x{c}x{h}x{w} -> {n}x{k}x{ho}x{wo} k{kh}x{kw} s{strides[0]}"
                 + (f"x{strides[1]}" if strides[1] != strides[0] else ""))
        if any(layer.padding):
            pad = tuple(int(p) for p in layer.padding)
            shape += " p" + (str(pad[0]) if len(set(pad)) == 1 else ",".join(map(str, pad)))
        if any(layer.output_padding):
            shape += " op" + ",".join(str(int(p)) for p in layer.output_padding)
        if layer.groups > 1:
            shape += f" g{layer.groups}"
        shape += f" ({len(subs)} phases)"
        return LayerProgram(layer.name, "conv2d_transpose", insns, len(insns) // 16, int(macs),
                            int(padded), shape,
                            {sc.conv.name: dict(kn) for sc, (_, kn, _) in zip(subs, parts,
                                                                               strict=True)})

    def _inp_loads(self, tg: _TG, b0, tb, c0, tc, rs, R, rstep, cs, Cc, use_halo, sbase):
        """LOAD INP instructions filling the dense block ``[tb][tc][R][Cc]`` with image rows
        ``rs + i * rstep`` (i < R) and cols ``cs..cs+Cc-1``; rows/cols outside the image are
        read from the halo (``use_halo``) or zero-padded by the LOAD."""
        def mk(so, de, y, x, st, p=(0, 0, 0, 0)):
            return MemInsn(OP_LOAD, MEM_INP, sbase + so, de, y, x, st, *p)

        plane = R * Cc
        if use_halo:
            if rstep == 1:
                return [mk(*t) for t in tg.region(b0, tb, c0, tc, tg.ht + rs, R, tg.hl + cs, Cc)]
            return [mk((b * tc + c) * plane, tg.entry(b0 + b, c0 + c, tg.ht + rs, tg.hl + cs), R,
                       Cc, rstep * tg.Wp) for b in range(tb) for c in range(tc)]
        # rows i with 0 <= rs + i * rstep < H are data, the others padding
        y0 = _cdiv(-rs, rstep) if rs < 0 else 0
        i_hi = min(R - 1, (tg.H - 1 - rs) // rstep) if tg.H - 1 - rs >= 0 else -1
        ny = i_hi - y0 + 1
        y1 = R - y0 - max(ny, 0)
        x0, x1 = max(0, -cs), max(0, cs + Cc - tg.W)
        nx = Cc - x0 - x1
        if ny <= 0 or nx <= 0:  # the whole tile is padding: copy zeros
            n = tb * tc * plane
            return [mk(0, self.zero_region(), 1, n, n)]
        r0, c0d = tg.ht + rs + y0 * rstep, tg.hl + cs + x0
        if rstep == 1:
            if y0 == y1 == x0 == x1 == 0:
                return [mk(*t) for t in tg.region(b0, tb, c0, tc, r0, R, c0d, Cc)]
            if y0 == y1 == 0 and r0 == 0 and ny == tg.Hp and tc * tg.Hp <= MAX_FIELD16:
                return [mk(b * tc * plane, tg.entry(b0 + b, c0, 0, c0d), tc * tg.Hp, nx, tg.Wp,
                           (0, 0, x0, x1)) for b in range(tb)]
        return [mk((b * tc + c) * plane, tg.entry(b0 + b, c0 + c, r0, c0d), ny, nx,
                   rstep * tg.Wp, (y0, y1, x0, x1)) for b in range(tb) for c in range(tc)]

    # -- residual add
    def add(self, layer: AddLayer, user_knobs: dict | None) -> LayerProgram:
        cfg, name = self.cfg, layer.name
        pa, pb_ = (self.placements[n] for n in layer.inputs)
        pout = self.placements[layer.output]
        if tuple(pa.shape) != tuple(pout.shape) or tuple(pb_.shape) != tuple(pout.shape):
            raise MappingError(f"layer {name}: add operands {pa.shape} and {pb_.shape} must "
                               f"both have the output shape {pout.shape}")
        N, C, H, W = _dims4(pout.shape)
        ma, mb, ops = _add_numerics(layer, (pa.dtype, pb_.dtype), pout.dtype, C)
        space = knob_space(layer, pout.shape, cfg, _ctx=(None, ops))
        kn = _validate_knobs(space, user_knobs, name)
        tb, tc, th, tw = kn["tile_b"], kn["tile_co"], kn["tile_h"], kn["tile_w"]
        vdata, vidx = _vector_image(ops, C, cfg)
        nvec = _n_vec(ops)
        NB, CB = _cdiv(N, cfg.batch), _cdiv(C, cfg.block_out)
        vbase_dram = self.dram.const(vdata) // cfg.acc_entry_bytes if nvec else 0
        ta, tbg, tout = _TG(pa, cfg), _TG(pb_, cfg), _TG(pout, cfg)
        nmax = tb * tc * th * tw
        nthr = 2 if 2 * (2 * nmax + nvec * tc) <= cfg.acc_depth else 1
        acc_h = cfg.acc_depth // nthr
        tiles = [(b, c, h, w) for b in _segs(NB, tb) for c in _segs(CB, tc)
                 for h in _segs(H, th) for w in _segs(W, tw)]
        def body(em: _Emitter):
            vec_key: dict[int, tuple] = {}
            for i, ((b0, nb), (c0, nc), (h0, nh), (w0, nw)) in enumerate(tiles):
                half = i % nthr
                abase = half * acc_h
                bbase, vbase = abase + nmax, abase + 2 * nmax
                n, S = nb * nc * nh * nw, nh * nw
                if nvec and vec_key.get(half) != (c0, nc):
                    vec_key[half] = (c0, nc)
                    em.emit(MemInsn(OP_LOAD, MEM_ACC, vbase, vbase_dram + c0, nvec, nc, CB))
                first = None
                for tg, base in ((ta, abase), (tbg, bbase)):
                    for so, de, y, x, st in tg.region(b0, nb, c0, nc, tg.ht + h0, nh,
                                                      tg.hl + w0, nw):
                        ld = em.emit(MemInsn(OP_LOAD, MEM_ACC_8BIT, base + so, de, y, x, st))
                        first = first or ld
                em.acc_acquire(half, first)
                if ma != 1:
                    em.alu(ALU_MUL, ((n, 1, 0, 0),), (abase, 0), ma)
                if mb != 1:
                    em.alu(ALU_MUL, ((n, 1, 0, 0),), (bbase, 0), mb)
                last = em.alu(ALU_ADD, ((n, 1, 1, 0),), (abase, bbase), None)
                last = _emit_tail(em, ops, vidx, n, nb, nc, S, abase, vbase) or last
                em.compute_done(last)
                sts = [MemInsn(OP_STORE, MEM_OUT, abase + so, de, y, x, st)
                       for so, de, y, x, st in tout.region(b0, nb, c0, nc, tout.ht + h0, nh,
                                                            tout.hl + w0, nw)]
                em.store_group(half, sts)

        insns = _emit_layer(cfg, self.isa, self.dram, name, body)
        shape = "x".join(map(str, pout.shape))
        return LayerProgram(name, "add", insns, len(insns) // 16, 0, 0,
                            f"{shape} + {shape} -> {shape}", dict(kn))


def _validate_knobs(space: KnobSpace, user: dict | None, layer: str) -> dict:
    """Complete a partial knob dict with the defaults and validate it. Setting one virtual-thread
    knob to 2 switches the other (left unset) to 1."""
    if not user:
        return space.default()
    user = dict(user)
    for a, b in (("oc_nthread", "h_nthread"), ("h_nthread", "oc_nthread")):
        if user.get(a) == 2 and b in space and b not in user:
            user[b] = 1
    try:
        return space.validate(user)
    except ValueError as e:
        raise ValueError(f"layer {layer}: {e}") from None


# --- planning a graph ---------------------------------------------------------------------------
def plan(graph: LayerGraph, cfg: VTAConfig, knobs: dict[str, dict] | None = None) -> VTAProgram:
    """Compile a layer graph into per-layer VTA instruction streams and a DRAM memory map.

    ``knobs`` maps layer names to (partial) knob dicts overriding the defaults; names of layers
    not in the graph are ignored (tuning records may cover several functions)."""
    cfg.validate("VTA config")
    if cfg.log_acc_depth > cfg.log_inp_depth:
        raise MappingError("VTA config: ACC deeper than INP is not supported (ALU source "
                           "indices are INP-width fields)")
    knobs = knobs or {}
    tensors = graph.tensors
    for tname, t in tensors.items():
        if t.dtype not in ("int8", "uint8"):
            raise MappingError(f"tensor {tname}: dtype {t.dtype} is not supported on VTA "
                               "(int8/uint8 only)")
        if len(t.shape) not in (2, 4):
            raise MappingError(f"tensor {tname}: shape {t.shape} is neither NCHW nor NC")
    # halos: a conv whose padding reads zx' != 0 (or pads more than a LOAD can) reads a DRAM halo
    halo: dict[str, list[int]] = {n: [0, 0, 0, 0] for n in tensors}
    fill: dict[str, int | None] = dict.fromkeys(tensors)
    use_halo: dict[str, bool] = {}
    for layer in graph.layers:
        if isinstance(layer, ConvLayer | DeconvLayer):
            if layer.input not in tensors or layer.output not in tensors:
                raise MappingError(f"layer {layer.name}: unknown input/output tensor")
            if isinstance(layer, DeconvLayer):  # the padding its phases' windows read
                shape = tuple(tensors[layer.input].shape)
                pad = tuple(max(p) for p in zip(*(_phase_pad(sc, shape) for sc in
                                                  _deconv_phases(layer, shape)), strict=True))
            else:
                pad = tuple(int(p) for p in layer.padding)
                if layer.is_dense and any(pad):
                    raise MappingError(f"layer {layer.name}: a dense layer cannot have padding")
            zxp = int(layer.input_zero_point) + _stored_offset(tensors[layer.input].dtype)
            need = any(pad) and (zxp != 0 or max(pad) > MAX_LOAD_PAD)
            use_halo[layer.name] = bool(need)
            if need:
                t = layer.input
                if fill[t] is not None and fill[t] != zxp:
                    raise MappingError(f"layer {layer.name}: tensor {t} needs a halo filled with "
                                       f"{zxp} but another consumer needs {fill[t]}")
                fill[t] = zxp
                halo[t] = [max(a, b) for a, b in zip(halo[t], pad, strict=True)]
        elif isinstance(layer, AddLayer):
            for t in (*layer.inputs, layer.output):
                if t not in tensors:
                    raise MappingError(f"layer {layer.name}: unknown tensor {t}")
        else:
            raise MappingError(f"layer {getattr(layer, 'name', layer)}: unsupported layer type "
                               f"{type(layer).__name__}")
    p = _Plan(graph, cfg)
    B, BLK = cfg.batch, cfg.block_out
    for tname, t in tensors.items():
        N, C, H, W = _dims4(tuple(t.shape))
        ht, hl, hb, hr = halo[tname]
        if len(t.shape) == 2 and any(halo[tname]):
            raise MappingError(f"tensor {tname}: a 2-D (dense) tensor cannot carry a halo")
        nbytes = _cdiv(N, B) * _cdiv(C, BLK) * (H + ht + hb) * (W + hl + hr) * B * BLK
        off = p.dram.alloc(nbytes)
        p.placements[tname] = TensorPlacement(tname, tuple(int(s) for s in t.shape), t.dtype, off,
                                              (ht, hl, hb, hr), int(fill[tname] or 0), nbytes)
    _check_dram(p.dram.size, "its activations")
    layers = []
    for layer in graph.layers:
        user = knobs.get(layer.name)
        if isinstance(layer, ConvLayer):
            layers.append(p.conv(layer, user, use_halo[layer.name]))
        elif isinstance(layer, DeconvLayer):
            layers.append(p.deconv(layer, user, use_halo[layer.name]))
        else:
            layers.append(p.add(layer, user))
    size = _cdiv(p.dram.size, p.dram.align) * p.dram.align
    _check_dram(size, "its activations, weights and micro-ops")
    return VTAProgram(dram_size=max(size, p.dram.align), const_image=p.dram.const_image,
                      tensors=p.placements, inputs=list(graph.inputs),
                      outputs=list(graph.outputs), layers=layers)


def _check_dram(nbytes: int, what: str) -> None:
    """VTA addresses 4 GiB of DRAM (32-bit physical addresses): a program needing more cannot
    run, so it is refused at compile time (the layers fall back to the CPU)."""
    if nbytes > MAX_DRAM_BYTES:
        raise MappingError(f"the function needs {nbytes:,} bytes of DRAM for {what}; VTA "
                           f"addresses {MAX_DRAM_BYTES:,}")


# --- packing ------------------------------------------------------------------------------------
def packed_shape(p: TensorPlacement, cfg: VTAConfig):
    N, C, H, W = _dims4(p.shape)
    ht, hl, hb, hr = p.halo
    return (_cdiv(N, cfg.batch), _cdiv(C, cfg.block_out), H + ht + hb, W + hl + hr, cfg.batch,
            cfg.block_out)


def pack_tensor(x: np.ndarray, p: TensorPlacement, cfg: VTAConfig) -> np.ndarray:
    """Logical array -> packed int8 bytes (uint8 array of ``p.nbytes``) incl. the halo fill."""
    x = np.asarray(x)
    if tuple(x.shape) != tuple(p.shape):
        raise ValueError(f"tensor {p.name}: expected shape {tuple(p.shape)}, got {x.shape}")
    N, C, H, W = _dims4(p.shape)
    NB, CB, Hp, Wp, B, BLK = packed_shape(p, cfg)
    ht, hl, _, _ = p.halo
    if x.dtype == np.dtype(p.dtype):  # the usual case: no range check, no wide copy
        xs = (x ^ np.uint8(0x80)).view(np.int8) if p.dtype == "uint8" else x
    else:
        lo, hi = (0, 255) if p.dtype == "uint8" else (-128, 127)
        if x.size and (x.min() < lo or x.max() > hi):
            raise ValueError(f"tensor {p.name}: values outside the {p.dtype} range")
        xs = (x.astype(np.int16) + _stored_offset(p.dtype)).astype(np.int8)
    xs = xs.reshape(N, C, H, W)
    full = np.full((NB * B, CB * BLK, H, W), p.fill, dtype=np.int8)
    full[:N, :C] = xs
    packed = np.full((NB, CB, Hp, Wp, B, BLK), p.fill, dtype=np.int8)
    packed[:, :, ht:ht + H, hl:hl + W] = full.reshape(NB, B, CB, BLK, H, W).transpose(
        0, 2, 4, 5, 1, 3)
    return packed.reshape(-1).view(np.uint8)


def unpack_tensor(buf: np.ndarray, p: TensorPlacement, cfg: VTAConfig) -> np.ndarray:
    """Packed bytes -> logical array of ``p.dtype`` (halo, padded lanes dropped)."""
    N, C, H, W = _dims4(p.shape)
    NB, CB, Hp, Wp, B, BLK = packed_shape(p, cfg)
    ht, hl, _, _ = p.halo
    arr = np.asarray(buf, dtype=np.uint8)[: p.nbytes].view(np.int8).reshape(NB, CB, Hp, Wp, B,
                                                                            BLK)
    inner = arr[:, :, ht:ht + H, hl:hl + W].transpose(0, 4, 1, 5, 2, 3).reshape(
        NB * B, CB * BLK, H, W)[:N, :C]
    out = (inner.astype(np.int16) - _stored_offset(p.dtype)).astype(p.dtype)
    return out.reshape(p.shape)
