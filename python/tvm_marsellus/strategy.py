"""MARSELLUS strategy: a :class:`~tvm_accel.layers.LayerGraph` to a
:class:`~tvm_marsellus.codegen.MarsProgram` (engine choice, DORY-style tiling, command
generation with double buffering).

Engines. A conv layer goes to the RBE when it is a 3x3 or 1x1 convolution with stride 1 or 2,
groups 1, 2..8-bit W/I/O and padding smaller than the kernel, unless the cores are estimated at
least twice as fast (a 3-channel stem) and, under the default ``objective: energy``, also
cheaper in estimated energy over the conv and its neighbours (a stem feeding RBE layers is
not: on the RBE it needs no marshaling; knob ``engine``); otherwise (other kernels, depthwise,
dense) it runs on the 16-core cluster (XpulpNN CONV / DWCONV / FC kernels), as do MAXPOOL and
AVGPOOL.

Windows beyond the RBE. The cluster kernels are software on the cores: their kernel, stride and
padding fields are 8-bit (``codegen``: low nibbles in word 10, high nibbles in word 14), so a
kernel such as DeepBench's 20x5 is one ``CL.CONV`` (im2col + MatMul at the cores' MAC rate,
``hw_config``), not a sum of sub-kernels. Padding not smaller than the kernel (DeepBench's 1x1
stride-2 convs with padding 3) runs there too: an output tile whose window lies in the padding
only loads one input row / column that no tap reads (:func:`_window`), and its outputs are
NormQuant of the padding taps, i.e. the bias-only value once the zero points are folded into
lambda, as in the reference. The RBE's job format keeps 4-bit padding below kernel + stride, so
such layers stay on the cores.

Anything else never reaches the strategy (the pattern table keeps it on the host).

Residual adds on the RBE. The ADD recipe (``numerics.add_recipe``) is ``ma = wa * kappa``,
``mb = wb * kappa`` with W-bit unsigned ``wa, wb``, so an add is a 1x1 BinConv: for each
32-channel tile j one RBE job reads 64 input channels, tile j of operand ``a`` then tile j of
``b`` (weights ``w[k, k] = wa``, ``w[k, 32 + k] = wb``, one 32 x 64 block shared by all jobs;
NormQuant kappa, and lambda with both zero points and storage offsets folded in). DMA_IN puts
both operand tiles into one L1 input buffer with 3-D strided copies, the pair ``[a_j, b_j]`` side
by side in every pixel, and job j reads it through its pixel stride (the RBE job format is
unchanged: bit-plane words of 32 channels, Kin tiles). An add of at most 16 channels (whole bytes)
is *packed*: both operands share one word (``a`` in channels ``0..C-1``, ``b`` in ``C..2C-1``, byte
copies per bit plane), so its job reduces over 2C channels, not 64. It runs there when the recipe's
weights fit W <= 8, both operands have one precision and both are in the RBE layout, unless the knob
``engine`` says ``cluster`` or the estimated energy (at the compile-time operating point) of the add
and of the layers whose layouts follow its engine (its operands' producers and readers, its output's
readers) is lower with the cluster ADD: the RBE add takes longer than ``CL.ADD``
(the RBE streams 3x3 output patches) but spares the marshaling on both sides. The global knob
``objective`` says what that choice minimises: ``energy`` (default, as above) or ``latency``
(the same layers' estimated cycles). It steers the conv engine rule the same way (above; the
cores take an RBE conv only when much faster, see ``CLUSTER_WINS``, and under ``energy`` only
when that also saves energy); the tiles are time-based under both (the pipelined time).

Layouts and marshaling. Tensors live in L2 in one of two layouts: ``rbe`` (the RBE bit-plane
layout, I/O bits = the tensor's ``bits``; a signed tensor is stored unsigned with the offset
``2^(bits-1)``, since the RBE reads unsigned activations) when it is produced by an RBE layer (or
by a cluster CONV / DWCONV / ADD, which then marshals its output tile once, ``CL.HWC2RBE``
after the kernel; global knob ``cluster_marshals_out``) and read only by RBE layers, else
``hwc`` (bit-packed HWC at the cluster width 2, 4 or 8 that holds
``bits``, true values). Where the layout changes the cluster marshals inside the tile loop:
HWC -> bit planes (``CL.ADD`` adding the offset for signed tensors, then ``CL.HWC2RBE``) before an
RBE job and bit planes -> HWC (``CL.RBE2HWC``) after it. The offset, the input zero point, the
bias and the output zero point all fold into NormQuant's ``lambda`` (``numerics``). A signed
``hwc`` tensor whose producer and consumers all fold an offset (everything but max pool) and
whose clip is the full range is stored *biased* (unsigned, offset ``2^(bits-1)``) too, which
saves the ``CL.ADD`` step before an RBE job.

Tiling (DORY, paper Sec. II / pulp-rbe notes). L2 holds the tensors of the function and the
weights (or, when they do not fit, L3 does: see L3 below); L1 (TCDM) holds the tiles of one
layer. A tile is ``tile_h`` output rows x ``tile_w`` output columns x ``tile_k`` output channels,
its reduction over ``tile_c`` input channels at a time (all of them unless Kin tiling, below).
Input halos (rows and columns) follow from kernel, stride and padding. Every L1 buffer is
doubled (input, weights, output, marshaling temporaries) so DMA_IN of tile i+1 and DMA_OUT of
tile i-1 overlap the compute of tile i. The tile is chosen by **exact enumeration** of all
``(tile_h, tile_k)`` pairs (at most ``H_out x`` a few channel candidates per layer, so CP-SAT
buys nothing here) at the full width, or, when no full-width tile fits L1 (W tiling), at the
widest ``tile_w`` (the width split in 2..64 near-equal parts) that has one: constraint = the
double-buffered footprint fits L1; objective = the pipelined time ``steps x max(DMA in, compute,
DMA out, I/O DMA) + fill/drain`` with the RBE compute taken from the simulator's own cycle model
(:func:`~tvm_marsellus.simulator.rbe_job_phases`) and the cluster kernels' from the simulator's
formulas, which rewards what the RBE likes (output rows in multiples of the 3x3 patch, channels
in multiples of 32) and fewer, larger DMA transfers. Output tiles of 8 or 16 channels are
options too (a job filling part of the BinConv columns, stored into part of each bit-plane
word): they keep wide 3x3 layers on the RBE, whose 32-channel weight tiles over 512 input
channels do not fit L1 twice. A tile narrower than the tensor is loaded and stored with strided
(row / plane) DMA copies. All are knobs (``tile_h``, ``tile_w``, ``tile_k``, ``tile_c``,
``engine``) with these defaults (:func:`knob_space`).

Kin tiling (input-channel chunks). When no tile with all input channels fits L1 at any width
(e.g. a 5x5 conv over 512 / 832 channels: the weights of 8 output channels alone exceed half
of L1), the reduction of an output tile is split over ``ceil(C / tile_c)`` chunks of
``tile_c`` channels (``KIN_SPLITS`` near-equal splits, whole 8-channel groups; for each, the
widest feasible width and the exact ``(tile_h, tile_k)`` enumeration; the cheapest wins).
**The partial sums accumulate on the cluster**, in 32-bit in L1: chunk 0 runs ``CL.CONV`` /
``CL.FC`` with ``psum_out`` (int32 accumulators written to an L1 buffer, no NormQuant), middle
chunks with ``psum_in`` and ``psum_out``, the last with ``psum_in`` and NormQuant into the
output tile, so the result equals the one-pass accumulator (int32 wrap-around included) and is
bit-exact. This is what the real hardware allows: the RBE does stream input channels in
32-channel groups and keeps 32-bit accumulators, but only *inside a job* (paper Sec. II-B:
"after the accumulation is complete, i.e. all reduction dimensions ... have been fully
computed", NormQuant; the ``rbe`` uloop iterates the Kin tiles within the job): its Accums are
latches with no stream-in, and NormQuant saturates every output to O <= 8 bits
(``rbe_normquant.sv``), so no partial sum can leave one job and enter the next. (Its successor
NE16 added exactly that, a 32-bit output mode and partial-sum stream-in.) A layer needing Kin
tiling therefore runs on the cluster, and ``tile_c`` with ``engine: rbe`` is refused with that
reason. Each step loads one chunk of the input window (a 3-D strided DMA of the pixels'
channels) and of the weights (stored chunk after chunk in L2, the last chunk followed by the
NormQuant records) into the double buffers; the partial-sum buffer has one copy (the chunks of
a tile run in order on the cores); the output buffer, its store and L3 drain go per output
tile.

Synchronisation (semaphores; balanced per layer so every layer is also a valid stream alone):
0 input-buffer free (2 credits), 1 input full, 2 output-buffer free (2 credits), 3 output full,
4 layer done (last DMA_OUT -> next layer's DMA_IN), 5 cluster -> RBE, 6 RBE -> cluster, 7 layer
done for the I/O DMA, 8 weight group staged, 9 / 10 input bounce slot free (2 credits) / full,
11 / 12 output bounce slot free (2 credits) / full, 13 weight slot free, 14 input full for a
step that starts on the RBE (1 is for steps starting on the cluster: one semaphore per engine,
so an RBE job of the next layer never takes the token of a layer still running on the cores;
each engine takes its tokens in order). The L1 weight slot is freed with the input credit by
the command that reads the weights last.

L3 (three-level tiling, as DORY does). When the weights plus the activations do not fit L2, the
weight image moves to L3 and the I/O DMA copies each weight group (the ``tile_k`` output
channels of a layer) into one of two L2 slots (one when two do not fit) before DMA_IN brings
it to L1. When the activations still do not fit, tensors move to L3 too, the largest first
(inputs, outputs and intermediates alike: a static allocation for the whole function), until
L2 holds the weight slots, the bounce slots and the remaining tensors; placements that keep the
fewest tensors in L3 win, then double-buffered weight slots. A tile of an L3 input is fetched
by the I/O DMA into one of two L2 bounce slots and copied from there to L1 by DMA_IN; a tile of
an L3 output goes from L1 to an output bounce slot and from there to L3 (strided rows when the
tile holds some output channels). The I/O DMA runs its commands in order, so input tile i + 2
is fetched right after output tile i is drained: fetches run two tiles ahead of the compute
and overlap it. The tile cost includes the I/O DMA: once a placement puts weights or tensors
in L3, the tiles are chosen again with, per step, the L3 fetch of the input window, the drain
of the output tile and the staging of the weight group (one engine, so their sum) as a fourth
pipeline stage, and the memory map is redone (the first choice is kept if the new tiles would
no longer fit L2). L3 bandwidth and latency are the config's ``L3_BYTES_PER_CYCLE`` /
``L3_LATENCY_CYCLES``; a function that does not fit L2 and L3 is a mapping error (the layers
fall back to the CPU).

Precision: RBE W/I/O come from ``ConvLayer.weight_bits`` and the tensors' ``bits``; cluster
kernels run at 2, 4 or 8 bits, other widths rounded up to the next one (values fit the wider
container). A cluster layer's output clamp is its container's range, so the layer's clip must
be that range (a 3-bit result must come from the RBE, which clamps at any O).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tvm_accel import errors
from tvm_accel.knobs import Knob, KnobSpace
from tvm_accel.layers import AddLayer, ConvLayer, LayerGraph, PoolLayer
from tvm_marsellus import codegen as cg
from tvm_marsellus.energy import NOMINAL, OperatingPoint, energy_coefficients
from tvm_marsellus.hw_config import RBE_CHANNELS, MarsellusConfig
from tvm_marsellus.numerics import add_factors, normquant_params

FREE_IN, FULL_IN, FREE_OUT, FULL_OUT, DONE, CL2RBE, RBE2CL, DONE_IO, STAGED = range(9)
#: L3: L2 bounce slot of an input tile free / filled by the I/O DMA, of an output tile free /
#: filled by DMA_OUT, of a weight group free (STAGED: filled)
IO_IN_FREE, IO_IN_FULL, IO_OUT_FREE, IO_OUT_FULL, STAGE_FREE = range(9, 14)
#: "input full" for a step whose first compute command is an RBE job (FULL_IN: the cluster)
FULL_IN_RBE = 14
ALIGN = 8
#: output-channel tiles below one 32-channel bit-plane word (byte-aligned: 8 channels a byte)
SUBWORD_TILES = (8, 16)
#: Kin tiling: the input channels are split in this many near-equal chunks (whole 8-channel
#: groups), the widest feasible tile of each scored by the cost model
KIN_SPLITS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: why a split reduction (Kin tiling) never runs on the RBE (module docstring)
RBE_NO_KIN = ("the RBE cannot split the input channels (tile_c): its 32-bit accumulators live "
              "inside a job and NormQuant always saturates them to O <= 8 bits, so no partial "
              "sum leaves or enters a job; Kin tiling runs on the cluster")
#: the cores take an RBE-capable conv only when their estimated time is below this share of
#: the RBE's (the RBE is the engine the design is built around; similar power, Sec. III)
CLUSTER_WINS = 0.5
#: values of the global knob ``objective``: what the engine choice of a residual add minimises
OBJECTIVES = ("energy", "latency")


class MappingError(errors.MappingError):
    """A layer graph (or a user knob) the MARSELLUS strategy cannot map, with the reason."""


def cluster_bits(bits: int) -> int:
    """Cluster container width (2, 4 or 8) holding ``bits``-bit values."""
    return 2 if bits <= 2 else 4 if bits <= 4 else 8


def _al(n: int, a: int = ALIGN) -> int:
    return -(-int(n) // a) * a


def _rng(bits: int, signed: bool) -> tuple[int, int]:
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


@dataclass
class TensorInfo:
    """A tensor as the strategy stores it: NHWC geometry, precision and L2 layout."""

    name: str
    n: int
    h: int
    w: int
    c: int
    bits: int
    signed: bool
    layout: str = "hwc"
    offset: int = 0
    dense: bool = False
    #: a signed ``hwc`` tensor stored unsigned with the offset 2^(bits-1) (module docstring)
    biased: bool = False
    mem: str = "L2"  # "L3" when L2 cannot hold it (module docstring, L3)

    @property
    def cbits(self) -> int:
        return cluster_bits(self.bits)

    @property
    def offset_value(self) -> int:
        """Unsigned storage offset (2^(bits-1) of a signed ``rbe`` or biased tensor, else 0)."""
        return (1 << (self.bits - 1)) if self.signed and (
            self.layout == "rbe" or self.biased) else 0

    @property
    def stored_signed(self) -> bool:
        """The stored values are two's complement (signed and not offset)."""
        return self.signed and not self.offset_value

    def pix_bytes(self) -> float:
        if self.layout == "rbe":
            return -(-self.c // RBE_CHANNELS) * self.bits * 4
        return self.c * self.cbits / 8

    @property
    def nbytes(self) -> int:
        return int(np.ceil(self.n * self.h * self.w * self.pix_bytes()))

    def placement(self) -> cg.TensorPlacement:
        shape = ((self.n, self.c) if self.dense else (self.n, self.h, self.w, self.c))
        if self.layout == "rbe":
            shape = (self.n * self.h, self.w, self.c)
        return cg.TensorPlacement(self.name, shape, self.mem, self.offset, self.layout,
                                  self.bits if self.layout == "rbe" else self.cbits,
                                  self.stored_signed)


@dataclass
class Geometry:
    """Spatial geometry of a layer: input (H, W, C), output (Ho, Wo, K), window and padding."""

    h: int
    w: int
    c: int
    ho: int
    wo: int
    k: int
    kh: int
    kw: int
    sh: int
    sw: int
    pads: tuple[int, int, int, int]  # top, left, bottom, right

    def in_rows(self, ho0: int, th: int) -> tuple[int, int, int, int]:
        """Loaded input rows ``[lo, hi)`` and the tile's (top, bottom) padding."""
        return _window(ho0 * self.sh - self.pads[0], (th - 1) * self.sh + self.kh, self.h)

    def in_cols(self, wo0: int, tw: int) -> tuple[int, int, int, int]:
        """Loaded input columns ``[lo, hi)`` and the tile's (left, right) padding."""
        return _window(wo0 * self.sw - self.pads[1], (tw - 1) * self.sw + self.kw, self.w)


def _window(r0: int, extent: int, size: int) -> tuple[int, int, int, int]:
    """The input range ``[lo, hi)`` a tile loads for its window ``[r0, r0 + extent)`` over an
    axis of ``size``, and the (before, after) padding of the kernel command. A window lying in
    the padding only (padding not smaller than the kernel) still loads one element, which no
    tap reads: before a tensor the padding puts every tap at a negative index; after it the
    padding before is the whole extent, so every tap again falls before the loaded element.
    Those outputs are NormQuant of the padding taps alone (the bias-only value)."""
    r1 = r0 + extent
    lo, hi = max(r0, 0), min(r1, size)
    if hi > lo:
        return lo, hi, lo - r0, r1 - hi
    if r1 <= 0:
        return 0, 1, -r0, 0
    return size - 1, size, extent, 0


@dataclass
class _Plan:
    """How one layer runs: engine, tile, buffer sizes."""

    engine: str
    tile_h: int
    tile_k: int
    cost: float = 0.0
    extra: dict = field(default_factory=dict)


# --- engine eligibility ---------------------------------------------------------------------
def rbe_reasons(layer: ConvLayer, tin: TensorInfo, tout: TensorInfo,
                cfg: MarsellusConfig) -> list[str]:
    """Why a conv layer cannot run on the RBE (empty = it can)."""
    r = []
    kh, kw = layer.kernel
    if layer.is_dense or layer.groups != 1:
        r.append("dense / grouped layers run on the cluster")
    if (kh, kw) not in ((3, 3), (1, 1)):
        r.append(f"kernel {kh}x{kw} is not 3x3 or 1x1")
    if layer.strides[0] != layer.strides[1] or layer.strides[0] not in (1, 2):
        r.append(f"stride {layer.strides} is not 1 or 2")
    if max(layer.padding) > 15:
        r.append("padding above 15")
    pt, pl, pb, pr = layer.padding
    if max(pt, pb) >= kh or max(pl, pr) >= kw:
        r.append(f"padding {layer.padding} not smaller than the kernel (outputs that read "
                 "padding only run on the cluster)")
    lo, hi = cfg.RBE_MIN_BITS, cfg.RBE_MAX_BITS
    for what, b in (("W", layer.weight_bits), ("I", tin.bits), ("O", tout.bits)):
        if not lo <= b <= hi:
            r.append(f"{what} = {b} bits outside {lo}..{hi}")
    return r


def add_rbe_reasons(layer: AddLayer, ta: TensorInfo, tb: TensorInfo, tout: TensorInfo,
                    cfg: MarsellusConfig) -> list[str]:
    """Why a residual add cannot run on the RBE as a 1x1 BinConv over its operands stacked
    along the input channels (empty = it can, once both operands are in the RBE layout)."""
    r = []
    if ta.bits != tb.bits:
        r.append(f"operands of {ta.bits} and {tb.bits} bits (one input precision per RBE job)")
    lo, hi = cfg.RBE_MIN_BITS, cfg.RBE_MAX_BITS
    for what, b in (("I", ta.bits), ("O", tout.bits)):
        if not lo <= b <= hi:
            r.append(f"{what} = {b} bits outside {lo}..{hi}")
    wa, wb, kappa, wbits = add_factors(layer.a_multiplier, layer.b_multiplier)
    if wbits > hi or kappa > 0xFFFF:
        r.append(f"multipliers {layer.a_multiplier}, {layer.b_multiplier} need {wbits}-bit "
                 "weights (the recipe fell back to the cluster ADD's 16-bit multipliers)")
    if ta.dense or tb.dense:
        r.append("operands are not 4-D")
    return r


def _clip_mode(layer, tout: TensorInfo, cbits: int | None = None) -> tuple[bool, bool]:
    """``(relu, full)`` of the output clip at ``cbits`` (default the tensor's bits); MappingError
    when NormQuant cannot clamp to ``[qmin, qmax]``."""
    rq = layer.requant
    bits = cbits or tout.bits
    lo, hi = _rng(bits, tout.signed)
    if rq is None:
        return False, True
    if rq.qmax == hi and rq.qmin == lo:
        return False, True
    if tout.signed and rq.qmax == hi and rq.qmin == 0:
        return True, False
    raise MappingError(f"layer {layer.name}: clip [{rq.qmin}, {rq.qmax}] is not the {bits}-bit "
                       f"{'signed' if tout.signed else 'unsigned'} range (NormQuant clamps to "
                       "the O-bit range, optionally ReLU)")


# --- knobs and the tile solver -------------------------------------------------------------
def _k_options(k: int, engine: str, kind: str, rbe_out: bool = False) -> list[int]:
    """Output-channel tile sizes: multiples of 8 on the cores; on the RBE or into a bit-plane
    tensor whole 32-channel words plus the sub-word tiles 8 and 16 (a job with fewer output
    channels leaves BinConv columns idle, but its weights take less L1: a 3x3 layer over 512
    channels needs them, 32 output channels of its weights alone exceed half of L1)."""
    if kind in ("dw", "pool", "add"):
        return [k]
    if engine == "rbe" or rbe_out:
        return sorted({m for m in SUBWORD_TILES if m < k and k % 8 == 0}
                      | {min(k, m) for m in range(RBE_CHANNELS, k + RBE_CHANNELS, RBE_CHANNELS)})
    return sorted({min(k, m) for m in range(8, k + 8, 8)} | {k})


class _Layer:
    """Per-layer geometry + the buffer model used by the solver and the emitter."""

    def __init__(self, layer, kind: str, engine: str, geo: Geometry, tins: list[TensorInfo],
                 tout: TensorInfo, cfg: MarsellusConfig):
        self.layer, self.kind, self.engine, self.geo = layer, kind, engine, geo
        self.tins, self.tout, self.cfg = tins, tout, cfg
        self.tin = tins[0]
        self.tw = geo.wo  # output columns per tile (W tiling; the full width by default)
        self.tc = geo.c  # input channels per L1 chunk (Kin tiling; all of them by default)
        self.w_l3 = False  # the weights are staged from L3 (the planner's second pass)

    @property
    def w_bits(self) -> int:
        """Weight precision W (an add on the RBE: the width of its two identity blocks)."""
        if self.kind == "add":
            return add_factors(self.layer.a_multiplier, self.layer.b_multiplier)[3]
        return self.layer.weight_bits

    @property
    def k_in(self) -> int:
        """Input channels of an RBE job (an add: a 32-channel tile of each operand, or both
        operands' channels in one word when :attr:`packed`)."""
        if self.kind != "add":
            return self.geo.c
        return 2 * self.geo.c if self.packed else 2 * RBE_CHANNELS

    @property
    def chunked(self) -> bool:
        """The reduction is split over several L1 input-channel chunks (Kin tiling)."""
        return self.tc < self.geo.c

    def k_options(self) -> list[int]:
        """Output channels per tile to try (whole 32-channel tiles for a bit-plane output)."""
        return _k_options(self.geo.k, self.engine, self.kind, self.tout.layout == "rbe")

    @property
    def marshals_out(self) -> bool:
        """A cluster layer writing the RBE layout: ``CL.HWC2RBE`` after its kernel."""
        return self.engine != "rbe" and self.tout.layout == "rbe"

    @property
    def stacked(self) -> bool:
        """An add on the RBE: its operands interleave per pixel in one Kin-stacked L1 tile."""
        return self.kind == "add" and self.engine == "rbe"

    @property
    def packed(self) -> bool:
        """A stacked add of at most 16 channels (whole bytes): both operands share one
        32-channel bit-plane word per pixel (``a`` in channels ``0..C-1``, ``b`` in
        ``C..2C-1``), so the job reduces over 2C input channels, not 64 (half the BinConv
        work of a 16-channel add)."""
        c = self.geo.c
        return self.stacked and 2 * c <= RBE_CHANNELS and c % 8 == 0

    @property
    def n_chunks(self) -> int:
        return -(-self.geo.c // self.tc)

    def c_options(self) -> list[int]:
        """Input channels per chunk to try, all of them first: the channels split in 2..64
        near-equal chunks of whole 8-channel groups, for CONV / FC on the cluster only (the RBE
        cannot carry a partial sum from one job to the next: module docstring)."""
        c = self.geo.c
        if self.kind not in ("conv", "fc") or self.engine == "rbe":
            return [c]
        return sorted({c} | {v for v in (_al(-(-c // n), 8) for n in KIN_SPLITS) if v < c},
                      reverse=True)

    def pix_in(self, t: TensorInfo) -> float:
        """L1 bytes of one input pixel of a tile (one chunk of its channels)."""
        return self.tc * t.cbits / 8 if self.chunked else t.pix_bytes()

    # byte sizes of the L1 buffers of one tile (one copy; everything but psum is doubled)
    def in_bytes(self, th: int) -> int:
        if self.packed:  # one word per bit plane holds both operands
            return _al(th * self.tw * self.tin.bits * 4)
        rows = self.rows_in(th) if self.kind != "add" else th
        return sum(_al(rows * self.cols_in() * self.pix_in(t)) for t in self.tins)

    def cols_in(self) -> int:
        """Largest number of input columns a tile of ``tw`` output columns loads."""
        g = self.geo
        return self.tw if self.kind == "add" else min((self.tw - 1) * g.sw + g.kw, g.w)

    def w_options(self) -> list[int]:
        """Tile widths to try when the full width does not fit L1: the width split in 2..64
        near-equal parts."""
        wo = self.geo.wo
        return sorted({-(-wo // n) for n in range(1, min(wo, 64) + 1)}, reverse=True)

    def rows_in(self, th: int) -> int:
        """Largest number of input rows any tile of ``th`` output rows loads."""
        g = self.geo
        return min((th - 1) * g.sh + g.kh, g.h)

    def buffers(self, th: int, kt: int) -> dict[str, int]:
        g, t = self.geo, self.tin
        b = {"in": self.in_bytes(th)}
        out_rbe = self.engine == "rbe"
        if out_rbe:
            wk = min(kt, RBE_CHANNELS) if self.kind == "add" else kt  # one block, every job
            b["w"] = _al(cg.weight_bytes(wk, self.k_in, g.kh, self.w_bits)) + _al(6 * wk)
            rows, cols = self.rows_in(th), self.cols_in()
            if t.layout == "hwc" and self.kind != "add":
                if t.stored_signed:
                    b["t1"] = _al(rows * cols * g.c * t.cbits / 8)
                b["t2"] = _al(cg.activation_bytes(rows, cols, g.c, t.bits))
            b["out"] = _al(cg.activation_bytes(th, self.tw, kt, self.tout.bits)) \
                if self.tout.layout == "rbe" else _al(th * self.tw * kt * self.tout.cbits / 8)
            if self.tout.layout == "hwc":
                b["t3"] = _al(cg.activation_bytes(th, self.tw, kt, self.tout.bits))
        else:
            wb = cluster_bits(getattr(self.layer, "weight_bits", 8))
            if self.kind in ("conv", "fc"):
                b["w"] = _al(kt * g.kh * g.kw * self.tc * wb / 8) + _al(6 * kt)
            elif self.kind == "dw":
                b["w"] = _al(kt * g.kh * g.kw * wb / 8) + _al(6 * kt)
            b["out"] = _al(th * self.tw * kt * self.tout.cbits / 8)
            if self.marshals_out:  # the kernel's HWC tile, then its bit planes
                b["t4"] = b["out"]
                b["out"] = _al(cg.activation_bytes(th, self.tw, kt, self.tout.bits))
            if self.chunked:  # int32 partial sums of the output tile, one copy
                b["psum"] = _al(th * self.tw * kt * 4)
        return b

    def l1_bytes(self, th: int, kt: int) -> int:
        """L1 footprint: two copies of every buffer, one of the partial sums (the chunks of
        an output tile run in order on the cores, the next tile's first chunk after them)."""
        b = self.buffers(th, kt)
        return 2 * sum(b.values()) - b.get("psum", 0)

    def fits(self, th: int, kt: int) -> bool:
        return self.l1_bytes(th, kt) <= self.cfg.L1_BYTES

    def byte_ok(self, th: int, kt: int) -> bool:
        """Tile boundaries fall on whole bytes of the packed L2 tensors."""
        g = self.geo
        if th < g.ho:
            for t in self.tins:
                if t.layout == "hwc" and (g.w * t.c * t.cbits) % 8:
                    return False
            if self.tout.layout == "hwc" and (g.wo * g.k * self.tout.cbits) % 8:
                return False
        if kt < g.k and self.tout.layout == "hwc" and (kt * self.tout.cbits) % 8:
            return False
        if self.tw < g.wo or self.chunked:  # column boundaries: whole bytes per pixel
            if any(t.layout == "hwc" and (t.c * t.cbits) % 8 for t in self.tins):
                return False
            if self.tout.layout == "hwc" and (g.k * self.tout.cbits) % 8:
                return False
        if self.chunked:  # chunk boundaries: whole bytes of the input pixels and weight rows
            wb = cluster_bits(self.layer.weight_bits)
            if (self.tc * self.tin.cbits) % 8 or (self.tc * wb) % 8 or (g.c * wb) % 8:
                return False
        return True

    def compute_cycles(self, th: int, kt: int) -> float:
        g, cfg = self.geo, self.cfg
        if self.engine == "rbe":
            from tvm_marsellus.simulator import rbe_job_phases

            lo, hi, pt, pb = g.in_rows(0, th)
            clo, chi, pl, pr = g.in_cols(0, self.tw)
            if self.kind == "add":  # one job per 32-channel tile
                kts = [min(RBE_CHANNELS, kt - k0) for k0 in range(0, kt, RBE_CHANNELS)]
                lo, hi, pt, pb, clo, chi, pl, pr = 0, th, 0, 0, 0, self.tw, 0, 0
            else:
                kts = [kt]
            c = 0.0
            for k in kts:
                job = cg.RbeJob(h_in=hi - lo, w_in=chi - clo, h_out=th, w_out=self.tw,
                                k_in=self.k_in, k_out=k, in_bits=self.tin.bits,
                                w_bits=self.w_bits, out_bits=self.tout.bits, kernel=g.kh,
                                stride=g.sh, pad_top=pt, pad_bottom=pb, pad_left=pl,
                                pad_right=pr)
                c += sum(rbe_job_phases(cfg, job).values())
            # the cores marshal on separate commands: with one side in HWC they overlap the
            # RBE jobs of the neighbouring tiles; with both, the cores' in-order stream puts
            # the output marshaling of tile i before the input marshaling of tile i + 1, which
            # then waits for the job of tile i
            cl = self.cluster_cycles(th, kt)
            both = self.tout.layout == "hwc" and self.tin.layout == "hwc" and self.kind != "add"
            return c + cl if both else max(c, cl)
        out = 0.0
        if self.marshals_out:
            out = cfg.CL_KERNEL_OVERHEAD_CYCLES + th * self.tw * kt * self.tout.bits / \
                cfg.CL_MARSHAL_BITS_PER_CYCLE / self.n_chunks
        if self.kind == "add":  # CL.ADD: elements at the element-wise rate
            return out + cfg.CL_KERNEL_OVERHEAD_CYCLES + th * self.tw * kt / \
                cfg.CL_ELTWISE_ELEMS_PER_CYCLE
        # the simulator's CL.* model: taps at the pool rate; MatMul at the wider of the input
        # and weight containers, im2col for windows, NormQuant of the last chunk and partial-sum
        # traffic on the cores
        outs = th * self.tw * kt
        if self.kind == "pool":
            return out + cfg.CL_KERNEL_OVERHEAD_CYCLES + outs * g.kh * g.kw / \
                cfg.CL_POOL_TAPS_PER_CYCLE
        macs = outs * g.kh * g.kw * (self.tc if self.kind in ("conv", "fc") else 1)
        if self.kind == "dw":
            work = macs / cfg.CL_DW_MACS_PER_CYCLE
        else:
            rate = cfg.cluster_macs_per_cycle(max(self.tin.cbits,
                                                  cluster_bits(self.layer.weight_bits)))
            work = macs / (rate * (cfg.CL_FC_EFFICIENCY if self.kind == "fc" else 1.0))
            if self.kind == "conv" and (g.kh * g.kw > 1 or g.sh > 1 or g.sw > 1):
                work += th * self.tw * g.kh * g.kw * self.tc * self.tin.cbits / 8 / \
                    cfg.CL_IM2COL_BYTES_PER_CYCLE
        nq = outs * cfg.CL_NQ_CYCLES_PER_OUTPUT / cfg.CLUSTER_CORES / self.n_chunks
        psum = 2 * outs / cfg.CLUSTER_CORES if self.chunked else 0
        return out + cfg.CL_KERNEL_OVERHEAD_CYCLES + work + nq + psum

    def cost(self, th: int, kt: int) -> float:
        """Estimated cycles of the layer: ``steps x`` the slowest engine per step (DMA_IN,
        compute, DMA_OUT, the I/O DMA for L3 tensors and staged weights) plus fill / drain.
        A step is one output tile, or one input-channel chunk of it under Kin tiling."""
        g, cfg = self.geo, self.cfg
        n_h, n_k, n_w = -(-g.ho // th), -(-g.k // kt), -(-g.wo // self.tw)
        bufs = self.buffers(th, kt)
        strided = self.tw < g.wo
        bursts = self.rows_in(th) * (self.cols_in() if self.chunked else 1) \
            if strided or self.chunked else 0
        if self.stacked:  # a burst per 32-channel tile (packed: bit plane), pixel and operand
            bursts = len(self.tins) * th * self.tw * (
                self.tin.bits if self.packed else -(-g.k // RBE_CHANNELS))
        dma_in = cfg.DMA_LATENCY_CYCLES + bufs["in"] / cfg.DMA_BYTES_PER_CYCLE + \
            bursts * cfg.DMA_ROW_OVERHEAD_CYCLES
        out_rows = th * self.tw if kt < g.k else th if strided else 0
        dma_out = cfg.DMA_LATENCY_CYCLES + bufs["out"] / cfg.DMA_BYTES_PER_CYCLE + \
            out_rows * cfg.DMA_ROW_OVERHEAD_CYCLES
        w_step = bufs.get("w", 0) / cfg.DMA_BYTES_PER_CYCLE + cfg.DMA_LATENCY_CYCLES
        nch = self.n_chunks
        if self.chunked:  # every step loads its chunk of the weights
            dma_in += w_step
        comp = self.compute_cycles(th, kt)
        n = n_h * n_w * n_k * self.tin.n
        steps = n * nch
        # the I/O DMA (L3 <-> L2) runs the fetches, drains and weight staging of every step
        l3 = cfg.L3_BYTES_PER_CYCLE
        io = 0.0
        if any(t.mem == "L3" for t in self.tins):  # fetched contiguous to the bounce slot
            io_bursts = self.rows_in(th) if strided and not self.chunked else (
                bursts if self.chunked else 0)
            io += cfg.L3_LATENCY_CYCLES + bufs["in"] / l3 + io_bursts * \
                cfg.DMA_ROW_OVERHEAD_CYCLES
        if self.tout.mem == "L3":
            io += (cfg.L3_LATENCY_CYCLES + bufs["out"] / l3
                   + out_rows * cfg.DMA_ROW_OVERHEAD_CYCLES) / nch
        if self.w_l3 and "w" in bufs:
            group = bufs["w"] * nch  # a whole weight group is staged, all chunks
            io += n_k * (cfg.L3_LATENCY_CYCLES + group / l3) / steps
        w_load = 0 if self.chunked else n_k * w_step
        return steps * max(dma_in, comp, dma_out / nch, io) + dma_in + dma_out + w_load

    def steps(self, th: int, kt: int) -> int:
        """Steps of the layer (output tiles, times the input-channel chunks)."""
        g = self.geo
        return -(-g.ho // th) * -(-g.k // kt) * -(-g.wo // self.tw) * self.tin.n * \
            self.n_chunks

    def cluster_cycles(self, th: int, kt: int) -> float:
        """Cluster busy cycles of one step: the kernel, or the marshaling around an RBE job."""
        if self.engine != "rbe":
            return self.compute_cycles(th, kt)
        g, cfg = self.geo, self.cfg
        c = 0.0
        if self.tin.layout == "hwc" and self.kind != "add":
            bits_in = self.rows_in(th) * self.cols_in() * g.c * self.tin.bits
            c += cfg.CL_KERNEL_OVERHEAD_CYCLES + bits_in / cfg.CL_MARSHAL_BITS_PER_CYCLE
        if self.tout.layout == "hwc":
            c += cfg.CL_KERNEL_OVERHEAD_CYCLES + th * self.tw * kt * self.tout.bits / \
                cfg.CL_MARSHAL_BITS_PER_CYCLE
        return c

    def energy(self, th: int, kt: int, coef: dict[str, float]) -> float:
        """Estimated energy (pJ, :func:`~tvm_marsellus.energy.energy_coefficients`) of the
        layer: static power over its estimated time, the cores' busy cycles, the RBE's
        operations (2 x MACs, and 2 x MACs x W x I 1-bit ones)."""
        g = self.geo
        e = coef["static"] * self.cost(th, kt) + \
            coef["cluster"] * self.steps(th, kt) * self.cluster_cycles(th, kt)
        if self.engine == "rbe":
            macs = self.tin.n * g.ho * g.wo * g.k * self.k_in * g.kh * g.kw
            e += 2 * macs * (coef["rbe_op"] + self.w_bits * self.tin.bits * coef["rbe_binop"])
        return e

    def group_bytes(self, kt: int) -> int:
        """L2 bytes of the weight group of ``kt`` output channels (all input channels) and
        their NormQuant records: what one L2 staging slot holds when the weights live in L3."""
        g = self.geo
        if self.kind in ("add", "pool"):
            return 0
        if self.engine == "rbe":
            return cg.weight_bytes(kt, g.c, g.kh, self.w_bits) + 6 * kt
        taps = g.kh * g.kw * (g.c if self.kind != "dw" else 1)
        return _al(kt * taps * cluster_bits(self.layer.weight_bits) / 8) + 6 * kt

    def candidates(self) -> list[tuple[int, int]]:
        """Feasible ``(tile_h, tile_k)``: whole bytes, double-buffered in L1, and a weight group
        of at most a quarter of L2 (so two staging slots and the bounce slots fit beside the
        tensors when the weights move to L3) where some ``tile_k`` allows it."""
        g = self.geo
        ths = range(1, g.ho + 1)
        kts = self.k_options()
        kts = [kt for kt in kts if self.group_bytes(kt) <= self.cfg.L2_BYTES // 4] or kts[:1]
        return [(th, kt) for kt in kts for th in ths
                if self.byte_ok(th, kt) and self.fits(th, kt)]

    def solve(self) -> tuple[int, int, float]:
        """Exact enumeration: the feasible (tile_h, tile_k) of least estimated time at the
        current tile width."""
        best = None
        for th, kt in self.candidates():
            c = self.cost(th, kt)
            if best is None or c < best[2] - 1e-9:
                best = (th, kt, c)
        if best is None:
            raise MappingError(f"layer {self.layer.name}: no tile fits L1 "
                               f"({self.cfg.L1_BYTES} bytes) with double buffering")
        return best

    def solve_width(self) -> tuple[int, int, float]:
        """:meth:`solve` with all input channels at the full width, else at the widest tile
        width (W tiling) that has a feasible tile: fewer column tiles, less halo reloaded; when
        no full-width tile holds all input channels, also every input-channel split (Kin
        tiling) at its widest feasible width, the cheapest of all winning. Leaves ``tw`` and
        ``tc`` set."""
        g = self.geo
        kmin = min(self.k_options())
        best = None
        for tc in self.c_options():
            self.tc = tc
            self.tw = min(self.w_options())
            if not self.fits(1, kmin):  # the smallest tile does not fit: fewer channels
                continue
            for tw in self.w_options():
                self.tw = tw
                try:
                    r = self.solve()
                except MappingError:
                    continue
                if best is None or r[2] < best[2][2] - 1e-9:
                    best = (tc, tw, r)
                break
            if best is not None and best[:2] == (g.c, g.wo):
                break  # all channels at the full width: no reason to split
        if best is None:
            self.tw, self.tc = g.wo, g.c
            return self.solve()  # raises with the full-width reason
        self.tc, self.tw = best[0], best[1]
        return best[2]


def knob_space(lay: _Layer, rbe_ok: bool) -> KnobSpace:
    """Knobs of a layer: ``tile_h``, ``tile_k``, ``tile_w``, ``tile_c`` (defaults from the
    solver) and, for convs the RBE can run, ``engine``."""
    th, kt, _ = lay.solve_width()
    g, tw, tc = lay.geo, lay.tw, lay.tc

    def check(cfg: dict) -> None:
        saved = lay.tw, lay.tc
        lay.tw, lay.tc = cfg.get("tile_w", tw), cfg.get("tile_c", tc)
        try:
            what = (f"tile_h {cfg['tile_h']} x tile_k {cfg['tile_k']} x tile_w {lay.tw} x "
                    f"tile_c {lay.tc}")
            if not lay.byte_ok(cfg["tile_h"], cfg["tile_k"]):
                raise ValueError(f"{what} split a byte of a sub-byte tensor")
            if not lay.fits(cfg["tile_h"], cfg["tile_k"]):
                raise ValueError(f"{what} does not fit L1 double-buffered")
        finally:
            lay.tw, lay.tc = saved

    knobs = [Knob("tile_h", tuple(range(1, g.ho + 1)), th),
             Knob("tile_k", tuple(lay.k_options()), kt),
             Knob("tile_w", tuple(lay.w_options()), tw),
             Knob("tile_c", tuple(lay.c_options()), tc)]
    if rbe_ok:
        knobs.append(Knob("engine", ("rbe", "cluster"), lay.engine))
    return KnobSpace(knobs, check, name=lay.layer.name)


# --- the planner ------------------------------------------------------------------------------
def _tensor_infos(graph: LayerGraph) -> dict[str, TensorInfo]:
    out = {}
    for name, t in graph.tensors.items():
        s = tuple(int(x) for x in t.shape)
        if len(s) == 2:
            ti = TensorInfo(name, s[0], 1, 1, s[1], int(t.bits), t.dtype == "int8", dense=True)
        elif len(s) == 4:
            ti = TensorInfo(name, s[0], s[2], s[3], s[1], int(t.bits), t.dtype == "int8")
        else:
            raise MappingError(f"tensor {name}: shape {s} is neither NCHW nor NC")
        out[name] = ti
    return out


def _geometry(layer, tin: TensorInfo, tout: TensorInfo) -> Geometry:
    if isinstance(layer, ConvLayer):
        kh, kw = layer.kernel
        pt, pl, pb, pr = layer.padding
        return Geometry(tin.h, tin.w, tin.c, tout.h, tout.w, tout.c, kh, kw, *layer.strides,
                        (pt, pl, pb, pr))
    if isinstance(layer, PoolLayer):
        pt, pl, pb, pr = layer.padding
        return Geometry(tin.h, tin.w, tin.c, tout.h, tout.w, tout.c, *layer.kernel,
                        *layer.strides, (pt, pl, pb, pr))
    return Geometry(tin.h, tin.w, tin.c, tout.h, tout.w, tout.c, 1, 1, 1, 1, (0, 0, 0, 0))


class Planner:
    """Builds the program of one layer graph (see the module docstring)."""

    def __init__(self, graph: LayerGraph, cfg: MarsellusConfig, knobs: dict | None = None,
                 op: OperatingPoint | None = None):
        self.g, self.cfg, self.user = graph, cfg, dict(knobs or {})
        self.objective = self.user.get("objective", "energy")
        if self.objective not in OBJECTIVES:  # a user error, not a layer that cannot map
            raise errors.ConfigError(f"knob objective: {self.objective!r} is not one of "
                                     f"{', '.join(OBJECTIVES)}")
        self.coef = energy_coefficients(op or NOMINAL)
        self.add_reasons: dict[str, list[str]] = {}
        self.consumers: dict[str, list] = {}
        self.t = _tensor_infos(graph)
        self.image = bytearray()
        self.engines: dict[str, str] = {}
        self.layers: dict[str, _Layer] = {}
        self.kinds: dict[str, str] = {}
        self.wrange: dict[str, tuple[int, int]] = {}
        self.l3 = False
        self.bounce_in = self.bounce_out = (0, 0)  # L2 bounce slots of L3 tensors' tiles
        self.stage: tuple[int, ...] = ()  # L2 slots of weight groups staged from L3
        self.l3_costs = False  # the tile costs include the L3 transfers of the placement

    # L2 image (weights / NormQuant) bump allocation
    def _blob(self, data: bytes) -> int:
        off = _al(len(self.image))
        self.image += bytes(off - len(self.image)) + bytes(data)
        return off

    def _kind(self, layer) -> str:
        if isinstance(layer, ConvLayer):
            if layer.is_dense:
                return "fc"
            if layer.groups == 1:
                return "conv"
            if layer.is_depthwise and layer.weight.shape[0] == layer.groups:
                return "dw"
            raise MappingError(f"layer {layer.name}: grouped conv other than depthwise")
        if isinstance(layer, AddLayer):
            return "add"
        if isinstance(layer, PoolLayer):
            return "pool"
        raise MappingError(f"layer {layer.name}: {type(layer).__name__} has no MARSELLUS kernel")

    def _cluster_much_faster(self, ly: ConvLayer) -> bool:
        """Default engine rule: the RBE unless the cores' estimated time is below
        ``CLUSTER_WINS`` x the RBE's (e.g. a stem conv with 3 input channels, which fills 3 of
        the RBE's 32 BinConv channels). The RBE estimate includes HWC marshaling on both sides,
        which a conv inside an RBE chain does not pay: the rule is conservative for the cores
        only where that marshaling dominates (small outputs of host tensors)."""
        tin, tout = self.t[ly.input], self.t[ly.output]
        try:
            _clip_mode(ly, tout, tout.cbits)
        except MappingError:
            return False
        geo = _geometry(ly, tin, tout)
        cost = {}
        for eng in ("rbe", "cluster"):
            try:
                cost[eng] = _Layer(ly, "conv", eng, geo, [tin], tout,
                                   self.cfg).solve_width()[2]
            except MappingError:
                cost[eng] = float("inf")
        return cost["cluster"] < CLUSTER_WINS * cost["rbe"]

    def _choose(self) -> None:
        """Engines, then layouts. A conv the RBE can run but whose cores are much faster
        (:meth:`_cluster_much_faster`) goes back to the RBE under ``objective: energy`` when
        that costs less estimated energy over it and its neighbours (:meth:`_near_cost`: e.g.
        a stem feeding RBE layers, which then need no marshaling)."""
        faster: list = []
        consumers: dict[str, list] = {}
        for ly in self.g.layers:
            ins = ly.inputs if isinstance(ly, AddLayer) else (ly.input,)
            for n in ins:
                consumers.setdefault(n, []).append(ly)
        for ly in self.g.layers:
            kind = self._kind(ly)
            self.kinds[ly.name] = kind
            eng = "cluster"
            user = self.user.get(ly.name, {})
            if kind == "conv":
                reasons = rbe_reasons(ly, self.t[ly.input], self.t[ly.output], self.cfg)
                tc = user.get("tile_c")
                if isinstance(tc, int) and tc < self.t[ly.input].c:  # Kin tiling asked for
                    reasons.append(RBE_NO_KIN)
                want = user.get("engine")
                if want is None:
                    want = "cluster" if reasons or self._cluster_much_faster(ly) else "rbe"
                    if want == "cluster" and not reasons:
                        faster.append(ly)
                if want == "rbe" and reasons:
                    if "engine" in user:
                        raise MappingError(f"layer {ly.name}: engine rbe: {reasons[0]}")
                else:
                    eng = want
            self.engines[ly.name] = eng
        self.consumers = consumers
        self._choose_adds()
        if self.objective == "energy":
            moved = [ly for ly in faster
                     if self._near_cost(ly, "rbe") < self._near_cost(ly, "cluster")]
            for ly in moved:
                self.engines[ly.name] = "rbe"
            if moved:
                self._choose_adds()
        io = set(self.g.inputs) | set(self.g.outputs)
        # biased HWC: a signed tensor between kernels that all fold an offset (not max pool,
        # whose clamp cannot subtract it) is stored unsigned, so the RBE reads it without the
        # CL.ADD marshaling step
        for ly in self.g.layers:
            t = self.t[ly.output]
            if t.layout != "hwc" or not t.signed or ly.output in io or not consumers.get(
                    ly.output):
                continue
            if self.kinds[ly.name] == "pool" and ly.kind == "max":
                continue
            if any(self.kinds[c.name] == "pool" and c.kind == "max" for c in consumers[ly.output]):
                continue
            lo, hi = _rng(t.bits, True)
            if (ly.requant.qmin, ly.requant.qmax) != (lo, hi):
                continue
            if self.engines[ly.name] != "rbe" and t.bits != t.cbits:
                continue
            if self.user.get("biased_hwc", True):
                t.biased = True

    def _layouts(self) -> None:
        """Tensor layouts from the engines: ``rbe`` when produced by the RBE, read only by the
        RBE, not a function input or output, and clipped to its full range; else ``hwc``."""
        io = set(self.g.inputs) | set(self.g.outputs)
        for t in self.t.values():
            t.layout = "hwc"
        for ly in self.g.layers:
            out, cons = ly.output, self.consumers.get(ly.output)
            if ((self.engines[ly.name] == "rbe" or self._cluster_marshals(ly)) and out not in io
                    and cons and all(self.engines[c.name] == "rbe" for c in cons)):
                rq = ly.requant
                lo, hi = _rng(self.t[out].bits, self.t[out].signed)
                if rq.qmin == lo and rq.qmax == hi:
                    self.t[out].layout = "rbe"

    def _cluster_marshals(self, ly) -> bool:
        """A cluster conv, depthwise conv or ADD whose output only RBE layers read writes it in
        the RBE layout (``CL.HWC2RBE`` on its output tile): marshaled once, where the readers
        would each marshal it again, with their halos. Its container must be the tensor's width
        (a cluster kernel clamps to its container) and inside the RBE's precisions."""
        t = self.t[ly.output]
        return (self.engines[ly.name] == "cluster" and self.kinds[ly.name] in ("conv", "dw", "add")
                and not t.dense and t.bits == t.cbits
                and self.cfg.RBE_MIN_BITS <= t.bits <= self.cfg.RBE_MAX_BITS
                and self.user.get("cluster_marshals_out", True))

    def _choose_adds(self) -> None:
        """Engines of the residual adds, then the layouts. An add runs on the RBE (a 1x1
        BinConv over its operands stacked along Kin, ``numerics.add_recipe``) when the recipe
        allows it and both operands end up in the RBE layout (they are produced by the RBE and
        read only by it), unless the knob ``engine`` says otherwise or the cost model finds the
        cluster ADD cheaper under the global knob ``objective`` (estimated energy by default,
        or estimated time with ``latency``): the add with the layer(s) producing its operands,
        those reading them and those reading its output, whose layouts (and marshaling) change
        with the add's engine (:meth:`_near_cost`)."""
        adds = [ly for ly in self.g.layers if self.kinds[ly.name] == "add"]
        for ly in adds:
            a, b = (self.t[n] for n in ly.inputs)
            r = add_rbe_reasons(ly, a, b, self.t[ly.output], self.cfg)
            want = self.user.get(ly.name, {}).get("engine")
            if want == "rbe" and r:
                raise MappingError(f"layer {ly.name}: engine rbe: {r[0]}")
            self.add_reasons[ly.name] = r
            self.engines[ly.name] = "rbe" if not r and want != "cluster" else "cluster"
        self._settle_adds(adds)
        for ly in adds:
            if self.engines[ly.name] != "rbe" or "engine" in self.user.get(ly.name, {}):
                continue
            if self._near_cost(ly, "cluster") < self._near_cost(ly, "rbe"):
                self.engines[ly.name] = "cluster"
                self._settle_adds(adds)
        self._layouts()

    def _settle_adds(self, adds: list) -> None:
        """Move to the cluster every RBE add with an operand that is not in the RBE layout
        (until none is left: an add's output may be another add's operand)."""
        while True:
            self._layouts()
            bad = [ly for ly in adds if self.engines[ly.name] == "rbe"
                   and any(self.t[n].layout != "rbe" for n in ly.inputs)]
            if not bad:
                return
            for ly in bad:
                n = next(n for n in ly.inputs if self.t[n].layout != "rbe")
                why = (f"operand {n} is not in the RBE layout (a function input or output, made "
                       "by the cluster, or also read by the cluster)")
                if self.user.get(ly.name, {}).get("engine") == "rbe":
                    raise MappingError(f"layer {ly.name}: engine rbe: {why}")
                self.add_reasons[ly.name].append(why)
                self.engines[ly.name] = "cluster"

    def _near_cost(self, layer, eng: str) -> float:
        """Estimated energy (pJ) of a layer and of the layers whose layouts depend on its
        engine (its inputs' producers and readers, its output's readers), with the layer on
        ``eng`` (each at its own best tile); their estimated cycles under ``objective:
        latency``."""
        saved = self.engines[layer.name]
        self.engines[layer.name] = eng
        self._layouts()
        names = set(layer.inputs if isinstance(layer, AddLayer) else (layer.input,)) | {
            layer.output}
        near = [ly for ly in self.g.layers if ly.output in names or any(
            n in names for n in (ly.inputs if isinstance(ly, AddLayer) else (ly.input,)))]
        total = 0.0
        for ly in near:
            ins = ly.inputs if isinstance(ly, AddLayer) else (ly.input,)
            tins = [self.t[n] for n in ins]
            lay = _Layer(ly, self.kinds[ly.name], self.engines[ly.name],
                         _geometry(ly, tins[0], self.t[ly.output]), tins, self.t[ly.output],
                         self.cfg)
            try:
                th, kt, cycles = lay.solve_width()
                total += cycles if self.objective == "latency" else lay.energy(th, kt,
                                                                               self.coef)
            except MappingError:
                total = float("inf")
                break
        self.engines[layer.name] = saved
        self._layouts()
        return total

    def plan(self) -> cg.MarsProgram:
        self._choose()
        progs = [self._layer(ly) for ly in self.g.layers]
        l2_bytes, l3_bytes = self._place()
        if self.l3:  # choose the tiles again with the I/O DMA transfers of this placement
            first = (progs, l2_bytes, l3_bytes, dict(self.layers), bytes(self.image),
                     dict(self.wrange), {n: (t.mem, t.offset) for n, t in self.t.items()},
                     (self.bounce_in, self.bounce_out, self.stage))
            self.l3_costs = True
            self.image, self.wrange = bytearray(), {}
            try:
                progs = [self._layer(ly) for ly in self.g.layers]
                l2_bytes, l3_bytes = self._place()
            except MappingError:  # the new tiles need more L2: keep the first choice
                progs, l2_bytes, l3_bytes, self.layers, img, self.wrange, mem, slots = first
                self.image = bytearray(img)
                for n, (m, off) in mem.items():
                    self.t[n].mem, self.t[n].offset = m, off
                self.bounce_in, self.bounce_out, self.stage = slots
                self.l3 = True
        for lp, ly in zip(progs, self.g.layers, strict=True):
            lp.commands = self._emit(ly, lp)
        img = bytes(self.image)
        return cg.MarsProgram(
            layers=progs, tensors={n: t.placement() for n, t in self.t.items()},
            inputs=list(self.g.inputs), outputs=list(self.g.outputs),
            l2_image=b"" if self.l3 else img, l3_image=img if self.l3 else b"",
            l2_bytes=l2_bytes, l3_bytes=l3_bytes)

    def _bounce(self, in_l3: set[str]) -> tuple[int, int]:
        """Bytes of one L2 bounce slot for the input / output tiles of the layers reading /
        writing an L3 tensor (the largest such tile; two slots each)."""
        bi = bo = 0
        for lay in self.layers.values():
            bufs = lay.buffers(lay.plan.tile_h, lay.plan.tile_k)
            if any(t.name in in_l3 for t in lay.tins):
                bi = max(bi, bufs["in"])
            if lay.tout.name in in_l3:
                bo = max(bo, bufs["out"])
        return bi, bo

    def _spill(self, base: int) -> tuple[set[str], int]:
        """Tensors moved to L3, the largest first, until L2 (``base`` bytes of weights or
        weight slots first) fits, and the L2 bytes then needed."""
        in_l3: set[str] = set()
        while True:
            bi, bo = self._bounce(in_l3)
            need = base + 2 * (bi + bo) + sum(_al(t.nbytes) for t in self.t.values()
                                              if t.name not in in_l3)
            rest = [t for t in self.t.values() if t.name not in in_l3]
            if need <= self.cfg.L2_BYTES or not rest or not self.cfg.L3_BYTES:
                return in_l3, need
            in_l3.add(max(rest, key=lambda t: (t.nbytes, t.name)).name)

    def _place(self) -> tuple[int, int]:
        """The memory map (module docstring, L3): L2 holds the weight image, or with weights in
        L3 one or two slots for a layer's weight group, then the bounce slots and the tensors;
        weights move to L3 first, then tensors, the largest first, until L2 fits (the fewest
        tensors in L3, then double-buffered weight slots). Returns the L2 and L3 bytes used."""
        cfg = self.cfg
        for t in self.t.values():
            t.mem = "L2"
        act = sum(_al(t.nbytes) for t in self.t.values())
        self.l3 = _al(len(self.image)) + act > cfg.L2_BYTES
        group = _al(max((size for lay in self.layers.values() for _, size in lay.wsrc),
                        default=0))
        layouts = []
        for slots in ((2, 1) if self.l3 else (0,)):
            base = slots * group if self.l3 else _al(len(self.image))
            in_l3, need = self._spill(base)
            layouts.append((len(in_l3), -slots, need, base, slots, in_l3))
        fit = [lo for lo in layouts if lo[2] <= cfg.L2_BYTES]
        if not fit:
            _, _, need, _, _, in_l3 = min(layouts, key=lambda lo: lo[2])
            raise MappingError(
                f"function needs {need} bytes of L2 (weights staged from L3: {self.l3}, "
                f"{len(in_l3)} tensor(s) in L3), the config has {cfg.L2_BYTES}"
                + ("" if cfg.L3_BYTES else " and no L3"))
        _, _, _, base, slots, in_l3 = min(fit, key=lambda lo: lo[:2])
        self.stage = tuple(i * group for i in range(slots))
        bi, bo = self._bounce(in_l3)
        self.bounce_in = (base, base + bi)
        self.bounce_out = (base + 2 * bi, base + 2 * bi + bo)
        off, off3 = base + 2 * (bi + bo), _al(len(self.image)) if self.l3 else 0
        for t in self.t.values():
            if t.name in in_l3:
                t.mem, t.offset = "L3", off3
                off3 = _al(off3 + t.nbytes)
            else:
                t.offset = off
                off = _al(off + t.nbytes)
        if off3 > cfg.L3_BYTES:
            raise MappingError(f"function needs {off3} bytes of L3 (weights and "
                               f"{len(in_l3)} tensor(s)) beside L2, the config has "
                               + (f"{cfg.L3_BYTES}" if cfg.L3_BYTES else "no L3"))
        return off, off3

    # --- per layer: plan + weights ---------------------------------------------------------
    def _layer(self, ly) -> cg.LayerProgram:
        kind, eng = self.kinds[ly.name], self.engines[ly.name]
        ins = ly.inputs if isinstance(ly, AddLayer) else (ly.input,)
        tins = [self.t[n] for n in ins]
        tout = self.t[ly.output]
        geo = _geometry(ly, tins[0], tout)
        lay = _Layer(ly, kind, eng, geo, tins, tout, self.cfg)
        lay.w_l3 = self.l3_costs and self.l3
        self.layers[ly.name] = lay
        rbe_ok = (kind == "conv" and not rbe_reasons(ly, tins[0], tout, self.cfg)) or (
            kind == "add" and not self.add_reasons.get(ly.name))
        space = knob_space(lay, rbe_ok)
        user = {k: v for k, v in self.user.get(ly.name, {}).items()}
        try:
            kn = space.validate(user)
        except ValueError as e:
            raise MappingError(f"layer {ly.name}: {e}") from None
        th, kt = kn["tile_h"], kn["tile_k"]
        lay.tw, lay.tc = kn["tile_w"], kn["tile_c"]
        macs = 0
        if isinstance(ly, ConvLayer):
            macs = tout.n * geo.ho * geo.wo * geo.k * geo.kh * geo.kw * (
                geo.c if kind in ("conv", "fc") else 1)
        meta = {"tile_h": th, "tile_k": kt, "tile_w": lay.tw, "tile_c": lay.tc,
                "shape": f"{list(tins[0].placement().shape)}",
                "cost": round(lay.cost(th, kt), 1)}
        lp = cg.LayerProgram(name=ly.name, op=ly.op_name, engine=eng, commands=[], macs=macs,
                             meta=meta)
        lay.plan = _Plan(eng, th, kt)
        start = _al(len(self.image))
        if isinstance(ly, ConvLayer):
            groups = [self._weights(lay, k0, min(kt, geo.k - k0)) for k0 in range(0, geo.k, kt)]
        else:
            groups = [self._add_weights(lay)] if lay.stacked else []
        lay.wsrc = [(off, size) for off, size, _ in groups]
        lay.wparts = [parts for _, _, parts in groups]
        if lay.wsrc:
            self.wrange[ly.name] = (start, len(self.image))
        return lp

    def _weights(self, lay: _Layer, k0: int, kt: int) -> tuple[int, int, list]:
        """Pack the weights + NormQuant of output channels [k0, k0+kt) into the L2 image;
        returns (L2 offset, byte size, parts). The NormQuant records follow the weights at an
        aligned offset. Under Kin tiling the weights are stored chunk after chunk, each
        ``(kt, kh, kw, chunk)`` contiguous and aligned, and ``parts`` lists their (offset in
        the group, bytes) then the NormQuant offset; else it is empty."""
        ly, g = lay.layer, lay.geo
        w = ly.weight[k0:k0 + kt].astype(np.int64)
        sumw = w.reshape(w.shape[0], -1).sum(axis=1)
        # the RBE reads signed activations with the unsigned offset 2^(I-1) (module docstring)
        in_off = lay.tin.offset_value or (
            (1 << (lay.tin.bits - 1)) if lay.engine == "rbe" and lay.tin.signed else 0)
        folded = ly.bias.astype(np.int64).reshape(-1)[k0:k0 + kt] - (
            ly.input_zero_point + in_off) * sumw
        out_off = lay.tout.offset_value
        rq = ly.requant
        sub = _sub_requant(rq, k0, kt)
        try:
            kappa, lam, _ = normquant_params(sub, folded, out_off)
        except ValueError as e:
            raise MappingError(f"layer {ly.name}: {e}") from None
        if lay.engine == "rbe":
            wb = cg.pack_weights(w, ly.weight_bits).tobytes()
        else:
            wbits = cluster_bits(ly.weight_bits)
            if lay.kind == "dw":
                wb = cg.pack_hwc(w.reshape(kt, g.kh, g.kw), wbits).tobytes()
            elif lay.chunked:
                data, parts = b"", []
                for c0 in range(0, g.c, lay.tc):
                    chunk = cg.pack_hwc(w[:, c0:c0 + lay.tc].transpose(0, 2, 3, 1),
                                        wbits).tobytes()
                    parts.append((len(data), len(chunk)))
                    data += chunk + bytes(_al(len(chunk)) - len(chunk))
                parts.append(len(data))
                data += cg.pack_normquant(kappa, lam).tobytes()
                return self._blob(data), len(data), parts
            else:
                wb = cg.pack_hwc(w.transpose(0, 2, 3, 1), wbits).tobytes()
        nq = cg.pack_normquant(kappa, lam).tobytes()
        data = wb + bytes(_al(len(wb)) - len(wb)) + nq
        return self._blob(data), len(data), []

    def _add_weights(self, lay: _Layer) -> tuple[int, int, list]:
        """Weights + NormQuant of an add on the RBE (``numerics.add_recipe``) in the L2 image: the
        1x1 BinConv of one 32-channel output tile from its Kin-stacked operand tiles (``a`` in input
        channels 0..31, ``b`` in 32..63; packed: ``0..C-1`` and ``C..2C-1``) with unsigned weights
        ``w[k, k] = wa``, ``w[k, 32 + k] = wb`` (packed: ``w[k, C + k]``), shared by the jobs of
        every tile (a partial last tile uses the first rows); kappa per channel, and lambda with the
        rounding, the zero points of both operands and their unsigned storage offsets, the output
        zero point and offset folded in."""
        ly, (a, b), tout = lay.layer, lay.tins, lay.tout
        wa, wb, kappa, wbits = add_factors(ly.a_multiplier, ly.b_multiplier)
        c = min(lay.geo.c, RBE_CHANNELS)
        w = np.zeros((c, lay.k_in, 1, 1), np.int64)
        w[np.arange(c), np.arange(c)] = wa
        w[np.arange(c), (c if lay.packed else RBE_CHANNELS) + np.arange(c)] = wb
        rq = ly.requant
        lam = int(np.ravel(rq.round_add)[0]) + ((rq.zero_point + tout.offset_value) << rq.shift) \
            - kappa * (wa * (ly.a_zero_point + a.offset_value)
                       + wb * (ly.b_zero_point + b.offset_value))
        if not -(1 << 31) <= lam < 1 << 31 or not 0 <= rq.shift <= 31:
            raise MappingError(f"layer {ly.name}: add recipe does not fit NormQuant (lambda "
                               f"{lam}, shift {rq.shift})")
        wbytes = cg.pack_weights(w, wbits, signed=False).tobytes()
        nq = cg.pack_normquant(np.full(c, kappa), np.full(c, lam)).tobytes()
        data = wbytes + bytes(_al(len(wbytes)) - len(wbytes)) + nq
        return self._blob(data), len(data), []

    # --- command emission ------------------------------------------------------------------
    def _emit(self, ly, lp: cg.LayerProgram) -> list:
        """Commands of one layer. A step is one output tile or, under Kin tiling, one input-
        channel chunk of it: every step loads its input window (and weight chunk) into one of
        the two input / weight buffers; the output buffers, stores and L3 drains go by output
        tile, after the step of its last chunk."""
        lay = self.layers[ly.name]
        g, plan = lay.geo, lay.plan
        th, kt = plan.tile_h, plan.tile_k
        bufs = lay.buffers(th, kt)
        # L1 map: two copies of every buffer but the partial sums
        l1, addr = {}, 0
        for name, size in bufs.items():
            one = _al(size, 64)
            l1[name] = (addr, addr) if name == "psum" else (addr, addr + one)
            addr += one if name == "psum" else 2 * one
        if addr > self.cfg.L1_BYTES:
            raise MappingError(f"layer {ly.name}: tile does not fit L1")
        cmds: list = [cg.Nop(engine="DMA_IN", signal=FREE_IN), cg.Nop(engine="DMA_IN",
                                                                       signal=FREE_IN),
                      cg.Nop(engine="DMA_IN", signal=FREE_OUT), cg.Nop(engine="DMA_IN",
                                                                       signal=FREE_OUT)]
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
        staged = self.l3 and ly.name in self.wrange
        if staged:  # L2 slots for weight groups, filled by the I/O DMA from L3
            cmds += [cg.Nop(engine="IODMA", signal=STAGE_FREE)] * len(self.stage)
        io_in = any(t.mem == "L3" for t in lay.tins)
        io_out = lay.tout.mem == "L3"
        if io_in:  # two L2 bounce slots for input tiles, filled by the I/O DMA
            cmds += [cg.Nop(engine="IODMA", signal=IO_IN_FREE)] * 2
        if io_out:  # two for output tiles, drained by the I/O DMA
            cmds += [cg.Nop(engine="DMA_OUT", signal=IO_OUT_FREE)] * 2
        io_loads: list[list] = []  # per step: its I/O DMA L3 -> L2 copies
        body = []
        n_w = 0  # weight loads so far (they alternate between the two L1 weight buffers)
        last_w = {}  # group -> index of its last step (frees a staged L2 slot)
        for i, step in enumerate(steps):
            last_w[step[0][0]] = i
        o = -1  # output tiles so far
        for i, (tile, j, c0, cc) in enumerate(steps):
            gi, k0, kk, n, ho0, hh, wo0, ww = tile
            first, final = j == 0, j == len(chunks) - 1
            o += first
            s = i % 2

            def buf(name, step_slot=s, out_slot=o % 2):
                return l1[name][out_slot if name in ("out", "t3") else step_slot]

            loads, wfetch = [], []
            new_group = i == 0 or steps[i - 1][0][0] != gi
            wslot = l1["w"][n_w % 2] if "w" in l1 else 0
            nq = None  # L1 NormQuant address of a chunked layer's last chunk
            if "w" in bufs and (new_group or lay.chunked):
                off, size = lay.wsrc[gi]
                src = off
                if staged:  # I/O DMA: this group's weights L3 -> an L2 slot, then to L1
                    src = self.stage[gi % len(self.stage)]
                    if new_group:
                        wfetch.append(cg.Dma(src_mem="L3", dst_mem="L2", src=off, dst=src,
                                             length=size, wait=(STAGE_FREE,), signal=(STAGED,)))
                if lay.chunked:  # this chunk's weights; the last one brings the NormQuant too
                    rel, length = lay.wparts[gi][j]
                    if final:
                        nq, length = wslot + lay.wparts[gi][-1] - rel, size - rel
                    src, size = src + rel, length
                wslot = l1["w"][n_w % 2]
                n_w += 1
                free = staged and (not lay.chunked or last_w[gi] == i)
                loads.append(cg.Dma(src_mem="L2", dst_mem="L1", src=src, dst=wslot, length=size,
                                    signal=(STAGE_FREE,) if free else ()))
            elif "w" in l1:
                wslot = l1["w"][(n_w - 1) % 2]
            acts, fetch = self._loads(lay, n, ho0, hh, wo0, ww, buf("in"), self.bounce_in[s]
                                      if io_in else 0, c0, cc)
            loads += acts
            loads[0].wait = (FREE_IN, STAGED) if wfetch else (FREE_IN,)
            if fetch:  # the bounce slot: filled before the first read, freed after the last
                fetch[0].wait, fetch[-1].signal = (IO_IN_FREE,), (IO_IN_FULL,)
                reads = [c for c in loads if c.src_mem == "L2" and self._in_bounce(c.src)]
                reads[0].wait = tuple(reads[0].wait) + (IO_IN_FULL,)
                reads[-1].signal = tuple(reads[-1].signal) + (IO_IN_FREE,)
            io_loads.append(wfetch + fetch)
            comps, free_at = self._computes(lay, n, ho0, hh, wo0, ww, k0, kk, buf, wslot,
                                            (j, len(chunks), cc, nq))
            full = FULL_IN_RBE if comps[0].engine == "RBE" else FULL_IN
            loads[-1].signal = tuple(loads[-1].signal) + (full,)
            # chain the compute commands across engines
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
            if not final:
                body.append(loads + comps)
                continue
            stores, drain = self._stores(lay, n, ho0, hh, wo0, ww, k0, kk, buf("out"),
                                         self.bounce_out[o % 2] if io_out else None)
            stores[0].wait = (FULL_OUT,) + ((IO_OUT_FREE,) if drain else ())
            last = i == len(steps) - 1
            stores[-1].signal = (FREE_OUT,) + ((DONE,) if last else ()) + (
                (DONE_IO,) if last and staged else ()) + ((IO_OUT_FULL,) if drain else ())
            if drain:
                drain[0].wait, drain[-1].signal = (IO_OUT_FULL,), (IO_OUT_FREE,)
            body.append(loads + comps + stores + drain)
        # the I/O DMA runs its commands in order: the inputs of step i + 2 are fetched after
        # the output of step i is drained, so fetches run two steps ahead of the compute
        cmds += [c for f in io_loads[:2] for c in f]
        for i, part in enumerate(body):
            cmds += part + [c for f in io_loads[i + 2:i + 3] for c in f]
        cmds += [cg.Nop(engine="DMA_IN", wait=FREE_IN), cg.Nop(engine="DMA_IN", wait=FREE_IN),
                 cg.Nop(engine="DMA_OUT", wait=FREE_OUT), cg.Nop(engine="DMA_OUT", wait=FREE_OUT),
                 cg.Nop(engine="DMA_IN", wait=DONE)]
        if io_in:
            cmds += [cg.Nop(engine="IODMA", wait=IO_IN_FREE)] * 2
        if io_out:
            cmds += [cg.Nop(engine="DMA_OUT", wait=IO_OUT_FREE)] * 2
        if staged:  # the next layer's I/O DMA may overwrite the staging area only now
            cmds += [cg.Nop(engine="IODMA", wait=STAGE_FREE)] * len(self.stage)
            cmds.append(cg.Nop(engine="IODMA", wait=DONE_IO))
        lp.meta["tiles"] = o + 1
        lp.meta["chunks"] = len(chunks)
        return cmds

    def _loads(self, lay: _Layer, n: int, ho0: int, hh: int, wo0: int, ww: int, dst: int,
               bounce: int, c0: int = 0, cc: int = 0) -> tuple[list, list]:
        """DMA_IN copies of one tile's input window into L1 (one strided copy of its rows when
        the tile is narrower than the tensor, a 3-D copy of its pixels' channels
        ``[c0, c0 + cc)`` under Kin tiling) and the I/O DMA copies that first bring the window
        of L3 tensors into the L2 bounce slot at ``bounce`` (contiguous there)."""
        g = lay.geo
        if lay.kind == "add":
            lo, hi, clo, chi = ho0, ho0 + hh, wo0, wo0 + ww
        else:
            lo, hi, _, _ = g.in_rows(ho0, hh)
            clo, chi, _, _ = g.in_cols(wo0, ww)
        out, fetch, d, b = [], [], dst, bounce
        for i, t in enumerate(lay.tins):
            row = g.w * t.pix_bytes()
            src = t.offset + int((n * g.h + lo) * row + clo * t.pix_bytes())
            if cc and cc < t.c:  # one chunk of the channels of every pixel: a 3-D copy
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
            if lay.packed:  # the operand's bytes of every bit-plane word
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
        """A packed add (:attr:`_Layer.packed`): the copy of one operand's tile (``window``, as
        in :meth:`_stacked`) rewritten as 3-D copies of its ``C / 8`` bytes of each bit-plane
        word (bytes x planes x pixels) to ``dst`` in the L1 words; with ``dst`` at byte 0 for
        the first operand and ``C / 8`` for the second, each word holds ``[a, b]``."""
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

    def _computes(self, lay: _Layer, n: int, ho0: int, hh: int, wo0: int, ww: int, k0: int,
                  kk: int, buf, wslot: int, chunk: tuple = (0, 1, 0, None)
                  ) -> tuple[list, int]:
        """Compute commands of one tile (``chunk`` = index, count, channels and L1 NormQuant
        address of its input-channel chunk under Kin tiling) and the index of the last one
        reading input/weights. A cluster layer writing the RBE layout puts its (last chunk's)
        HWC result in ``t4`` and marshals it into the output tile."""
        cmds, free_at = self._kernels(lay, n, ho0, hh, wo0, ww, k0, kk, buf, wslot, chunk)
        if lay.marshals_out and chunk[0] == chunk[1] - 1:
            t = lay.tout
            cmds[-1].out_addr = buf("t4")
            cmds.append(cg.ClusterKernel(
                kernel="HWC2RBE", in_signed=0, out_signed=0, in_bits=t.cbits, out_bits=t.bits,
                in_addr=buf("t4"), out_addr=buf("out"), h_in=hh, w_in=ww, c_in=kk, c_out=kk,
                h_out=hh, w_out=ww))
        return cmds, free_at

    def _kernels(self, lay: _Layer, n: int, ho0: int, hh: int, wo0: int, ww: int, k0: int,
                 kk: int, buf, wslot: int, chunk: tuple = (0, 1, 0, None)
                 ) -> tuple[list, int]:
        """The commands of :meth:`_computes` before a cluster layer's output marshaling."""
        ly, g, tin, tout = lay.layer, lay.geo, lay.tin, lay.tout
        if lay.stacked:
            cmds = self._rbe_add(lay, hh, ww, kk, buf, wslot)
            return cmds, -(-kk // RBE_CHANNELS) - 1
        if lay.kind == "add":
            return [self._add(lay, hh, ww, buf)], 0
        lo, hi, ptop, pbot = g.in_rows(ho0, hh)
        clo, chi, pleft, pright = g.in_cols(wo0, ww)
        rows, cols = hi - lo, chi - clo
        if lay.kind == "pool":
            return [self._pool(lay, rows, hh, cols, ww, (ptop, pleft, pbot, pright), buf)], 0
        relu, _ = _clip_mode(ly, tout, None if lay.engine == "rbe" and tout.layout == "rbe"
                             else (tout.bits if lay.engine == "rbe" else tout.cbits))
        wbytes = _al(cg.weight_bytes(kk, g.c, g.kh, ly.weight_bits)) if lay.engine == "rbe" \
            else _al(kk * g.kh * g.kw * (g.c if lay.kind != "dw" else 1)
                     * cluster_bits(ly.weight_bits) / 8)
        nq = wslot + wbytes
        shift = int(ly.requant.shift)
        if lay.engine != "rbe":
            kern = {"conv": "CONV", "dw": "DWCONV", "fc": "FC"}[lay.kind]
            j, nch, cc, nq_last = chunk
            if nch > 1:  # Kin tiling: 32-bit partial sums in L1, NormQuant after the last chunk
                c = cg.ClusterKernel(
                    kernel=kern, relu=int(relu) if j == nch - 1 else 0,
                    out_signed=int(tout.stored_signed), in_signed=int(tin.stored_signed),
                    in_bits=tin.cbits, w_bits=cluster_bits(ly.weight_bits), out_bits=tout.cbits,
                    shift=shift if j == nch - 1 else 0, in_addr=buf("in"), out_addr=buf("out"),
                    w_addr=wslot, nq_addr=nq_last if j == nch - 1 else 0, h_in=rows, w_in=cols,
                    c_in=cc, c_out=kk, h_out=hh, w_out=ww, kh=g.kh, kw=g.kw, sh=g.sh, sw=g.sw,
                    pad_top=ptop, pad_bottom=pbot, pad_left=pleft, pad_right=pright,
                    pad_value=int(ly.input_zero_point) + tin.offset_value, psum_in=int(j > 0),
                    psum_out=int(j < nch - 1), psum_addr=buf("psum"))
                return [c], 0
            c = cg.ClusterKernel(
                kernel=kern, relu=int(relu), out_signed=int(tout.stored_signed),
                in_signed=int(tin.stored_signed), in_bits=tin.cbits,
                w_bits=cluster_bits(ly.weight_bits), out_bits=tout.cbits, shift=shift,
                in_addr=buf("in"), out_addr=buf("out"), w_addr=wslot, nq_addr=nq,
                h_in=rows, w_in=cols, c_in=g.c, c_out=kk, h_out=hh, w_out=ww, kh=g.kh,
                kw=g.kw, sh=g.sh, sw=g.sw, pad_top=ptop, pad_bottom=pbot, pad_left=pleft,
                pad_right=pright, pad_value=int(ly.input_zero_point) + tin.offset_value)
            return [c], 0
        cmds = []
        x = buf("in")
        if tin.layout == "hwc":
            src = x
            if tin.stored_signed:
                cmds.append(cg.ClusterKernel(
                    kernel="ADD", in_signed=1, b_signed=1, out_signed=0, in_bits=tin.cbits,
                    out_bits=tin.cbits, in_addr=x, w_addr=x, out_addr=buf("t1"), kappa_a=1,
                    kappa_b=0, lambda_=1 << (tin.bits - 1), h_in=rows, w_in=cols, c_in=g.c,
                    c_out=g.c, h_out=rows, w_out=cols))
                src = buf("t1")
            cmds.append(cg.ClusterKernel(
                kernel="HWC2RBE", in_signed=0, out_signed=0, in_bits=tin.cbits,
                out_bits=tin.bits, in_addr=src, out_addr=buf("t2"), h_in=rows, w_in=cols,
                c_in=g.c, c_out=g.c, h_out=rows, w_out=cols))
            x = buf("t2")
        off_in = (1 << (tin.bits - 1)) if tin.signed else 0
        y = buf("out") if tout.layout == "rbe" else buf("t3")
        cmds.append(cg.RbeJob(
            x_ptr=x, w_ptr=wslot, nq_ptr=nq, y_ptr=y, h_in=rows, w_in=cols, h_out=hh,
            w_out=ww, k_in=g.c, k_out=kk, in_bits=tin.bits, w_bits=ly.weight_bits,
            out_bits=tout.bits, kernel=g.kh, stride=g.sh, relu=int(relu),
            out_signed=int(tout.stored_signed), shift=shift,
            pad_value=int(ly.input_zero_point) + off_in, pad_top=ptop, pad_bottom=pbot,
            pad_left=pleft, pad_right=pright))
        free_at = len(cmds) - 1
        if tout.layout == "hwc":
            cmds.append(_rbe2hwc(tout, y, buf("out"), hh, ww, kk))
        return cmds, free_at

    def _rbe_add(self, lay: _Layer, hh: int, ww: int, kk: int, buf, wslot: int) -> list:
        """An add on the RBE: one 1x1 job per 32-channel tile j, reading the pair ``[a tile j,
        b tile j]`` of every stacked pixel as 64 input channels (pixel stride: the stacked
        pixel) and writing tile j of the output pixels (pixel stride: the output pixel), all
        with the weights and NormQuant of :meth:`_add_weights`; then ``CL.RBE2HWC`` if the
        output is HWC."""
        ly, tout, tin = lay.layer, lay.tout, lay.tin
        relu, _ = _clip_mode(ly, tout, None if tout.layout == "rbe" else tout.bits)
        wk = min(kk, RBE_CHANNELS)
        nq = wslot + _al(cg.weight_bytes(wk, lay.k_in, 1, lay.w_bits))
        y = buf("out") if tout.layout == "rbe" else buf("t3")
        tb_in, tb_out = tin.bits * 4, tout.bits * 4
        nt = -(-kk // RBE_CHANNELS)
        cmds: list = [cg.RbeJob(
            x_ptr=buf("in") + j * 2 * tb_in, w_ptr=wslot, nq_ptr=nq, y_ptr=y + j * tb_out,
            h_in=hh, w_in=ww, h_out=hh, w_out=ww, k_in=lay.k_in,
            k_out=min(RBE_CHANNELS, kk - j * RBE_CHANNELS), in_bits=tin.bits,
            w_bits=lay.w_bits, out_bits=tout.bits, kernel=1, relu=int(relu),
            out_signed=int(tout.stored_signed), w_unsigned=1, shift=int(ly.requant.shift),
            x_pix_stride=2 * nt * tb_in if nt > 1 else 0,
            y_pix_stride=nt * tb_out if nt > 1 else 0) for j in range(nt)]
        if tout.layout == "hwc":
            cmds.append(_rbe2hwc(tout, y, buf("out"), hh, ww, kk))
        return cmds

    def _add(self, lay: _Layer, hh: int, ww: int, buf) -> cg.ClusterKernel:
        ly, g = lay.layer, lay.geo
        a, b = lay.tins
        if a.cbits != b.cbits:
            raise MappingError(f"layer {ly.name}: operands of {a.bits} and {b.bits} bits need "
                               "one cluster width")
        rq = ly.requant
        relu, _ = _clip_mode(ly, lay.tout, lay.tout.cbits)
        lam = int(np.ravel(rq.round_add)[0]) + ((rq.zero_point + lay.tout.offset_value)
                                                 << rq.shift) \
            - (ly.a_zero_point + a.offset_value) * ly.a_multiplier \
            - (ly.b_zero_point + b.offset_value) * ly.b_multiplier
        if not -(1 << 31) <= lam < 1 << 31 or max(ly.a_multiplier, ly.b_multiplier) > 0xFFFF \
                or min(ly.a_multiplier, ly.b_multiplier) < 0 or not 0 <= rq.shift <= 31:
            raise MappingError(f"layer {ly.name}: add recipe does not fit the cluster ADD")
        row_a = _al(hh * ww * a.pix_bytes())
        return cg.ClusterKernel(
            kernel="ADD", relu=int(relu), in_signed=int(a.stored_signed),
            b_signed=int(b.stored_signed), out_signed=int(lay.tout.stored_signed),
            in_bits=a.cbits, out_bits=lay.tout.cbits,
            shift=int(rq.shift), in_addr=buf("in"), w_addr=buf("in") + row_a,
            out_addr=buf("out"), kappa_a=int(ly.a_multiplier), kappa_b=int(ly.b_multiplier),
            lambda_=lam, h_in=hh, w_in=ww, c_in=g.c, c_out=g.c, h_out=hh, w_out=ww)

    def _pool(self, lay: _Layer, rows: int, hh: int, cols: int, ww: int,
              pads: tuple[int, int, int, int], buf) -> cg.ClusterKernel:
        ly, g, tin, tout = lay.layer, lay.geo, lay.tin, lay.tout
        ptop, pleft, pbot, pright = pads
        common = dict(in_signed=int(tin.stored_signed), out_signed=int(tout.stored_signed),
                      in_bits=tin.cbits, out_bits=tout.cbits, in_addr=buf("in"),
                      out_addr=buf("out"), h_in=rows, w_in=cols, c_in=g.c, c_out=g.c, h_out=hh,
                      w_out=ww, kh=g.kh, kw=g.kw, sh=g.sh, sw=g.sw, pad_top=ptop,
                      pad_bottom=pbot, pad_left=pleft, pad_right=pright)
        if ly.kind == "max":
            if ly.requant is not None:
                raise MappingError(f"layer {ly.name}: max pool that requantizes")
            lo = _rng(8, tin.stored_signed)[0]
            return cg.ClusterKernel(kernel="MAXPOOL", pad_value=lo, **common)
        rq = ly.requant
        relu, _ = _clip_mode(ly, tout, tout.cbits)
        m = np.unique(np.ravel(rq.multiplier))
        if m.size != 1 or rq.pre_shift or not 0 < int(m[0]) <= 0xFFFF:
            raise MappingError(f"layer {ly.name}: average pool recipe is not one 16-bit kappa")
        kap = int(m[0])
        izp = ly.input_zero_point + tin.offset_value
        lam = int(np.ravel(rq.round_add)[0]) + ((rq.zero_point + tout.offset_value)
                                                 << rq.shift) - kap * ly.window * izp
        if not -(1 << 31) <= lam < 1 << 31:
            raise MappingError(f"layer {ly.name}: AVGPOOL lambda leaves 32 bits")
        return cg.ClusterKernel(kernel="AVGPOOL", relu=int(relu), kappa_a=kap, lambda_=lam,
                                shift=int(rq.shift), pad_value=int(izp),
                                **common)


def _pixel_runs(window: cg.Dma, cols: int, src_pix: int, dst_pix: int, dst: int
                ) -> list[tuple[int, int, int]]:
    """``(source, pixels, destination)`` runs of contiguous source pixels in the input window
    copy ``window`` (one block, or one run per row of ``cols`` pixels), the destination
    advancing ``dst_pix`` bytes per pixel from ``dst``."""
    if window.rows == 1:  # a contiguous block of pixels
        return [(window.src, window.length // src_pix, dst)]
    return [(window.src + r * window.src_row_stride, cols, dst + r * cols * dst_pix)
            for r in range(window.rows)]


def _rbe2hwc(tout: TensorInfo, src: int, dst: int, hh: int, ww: int, kk: int
             ) -> cg.ClusterKernel:
    """Marshaling of an RBE output tile (bit planes at ``src``) to HWC at ``dst``."""
    return cg.ClusterKernel(
        kernel="RBE2HWC", in_signed=int(tout.stored_signed), out_signed=int(tout.stored_signed),
        in_bits=tout.bits, out_bits=tout.cbits, in_addr=src, out_addr=dst, h_in=hh, w_in=ww,
        c_in=kk, c_out=kk, h_out=hh, w_out=ww)


def _sub_requant(rq, k0: int, kt: int):
    from dataclasses import replace

    m = np.asarray(rq.multiplier)
    r = np.asarray(rq.round_add)
    return replace(rq, multiplier=m[k0:k0 + kt] if m.size > 1 else m,
                   round_add=r[k0:k0 + kt] if r.size > 1 else r)


def plan(graph: LayerGraph, cfg: MarsellusConfig, knobs: dict | None = None,
         op: OperatingPoint | None = None) -> cg.MarsProgram:
    """Compile a layer graph to a MARSELLUS program (``knobs``: ``{layer: {knob: value}}``, plus
    the globals ``"biased_hwc": False`` to store signed HWC tensors two's complement,
    ``"cluster_marshals_out": False`` and ``"objective"``: ``"energy"`` (default) or
    ``"latency"``, what a residual add's engine choice minimises; ``op``: the operating point
    whose energy that choice weighs, default nominal)."""
    return Planner(graph, cfg, knobs, op).plan()


def layer_knob_spaces(graph: LayerGraph, cfg: MarsellusConfig) -> dict[str, KnobSpace]:
    """The knob space of every layer (defaults = the solver's choice). An add's ``engine`` is
    left out: a tuning task measures one layer alone, with HWC inputs, where the RBE add (whose
    gain is the marshaling it spares its neighbours) cannot run; set it in ``knobs``."""
    p = Planner(graph, cfg)
    p._choose()
    out = {}
    for ly in graph.layers:
        p._layer(ly)
        lay = p.layers[ly.name]
        out[ly.name] = knob_space(lay, lay.kind == "conv" and not rbe_reasons(
            ly, lay.tin, lay.tout, cfg))
    return out
