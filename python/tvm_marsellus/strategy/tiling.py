"""Tiling stage: the DORY-style L1 tile of every layer (output rows x columns x channels, input
channels per chunk), chosen by exact enumeration against the pipelined cost model, and the
layer's knob space (``docs/marsellus.md``, Tiling)."""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm_marsellus.codegen as cg
from tvm_accel.errors import MappingError
from tvm_accel.knobs import Knob, KnobSpace, validate_knobs
from tvm_accel.layers import ConvLayer, layer_shape_text
from tvm_marsellus.hw_config import RBE_CHANNELS, MarsellusConfig
from tvm_marsellus.layout import activation_bytes, weight_bytes
from tvm_marsellus.numerics import add_factors
from tvm_marsellus.program import LayerProgram
from tvm_marsellus.strategy.layers import (
    Geometry,
    TensorInfo,
    _al,
    _geometry,
    cluster_bits,
    layer_reads,
    rbe_reasons,
)

#: output-channel tiles below one 32-channel bit-plane word (byte-aligned: 8 channels a byte)
SUBWORD_TILES = (8, 16)


#: Kin tiling: the input channels are split in this many near-equal chunks (whole 8-channel
#: groups), the widest feasible tile of each scored by the cost model
KIN_SPLITS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass
class _Plan:
    """How one layer runs: engine, tile, buffer sizes."""

    engine: str
    tile_h: int
    tile_k: int
    cost: float = 0.0
    extra: dict = field(default_factory=dict)


def _k_options(k: int, engine: str, kind: str, rbe_out: bool = False) -> list[int]:
    """Output-channel tile sizes: multiples of 8 on the cores; on the RBE or into a bit-plane
    tensor whole 32-channel words plus the sub-word tiles 8 and 16 (a job with fewer output
    channels leaves BinConv columns idle, but its weights take less L1: a 3x3 layer over 512
    channels needs them, 32 output channels of its weights alone exceed half of L1)."""
    if kind in ("dw", "pool", "add", "lut", "mul"):
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
        self.pair = False  # runs over column pairs (:meth:`pairable`)
        self.pair_pp = 0  # output pairs of the pair job (:meth:`pair_jobs`)

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

    def pairable(self) -> bool:
        """A 3x3 stride-1 RBE conv over at most 16 input and exactly 16 output channels, one
        column of padding each side, an even width and bit planes on both sides: it can run
        over *column pairs* (``layout.pair_columns_weights``): DMA_IN lays the odd pixel's
        16 channels into the idle upper half of the even pixel's bit-plane words, the job reads
        every second pixel (its pixel stride) as 32 input channels and computes 32 output
        channels (both pixels of a pair), and DMA_OUT writes the two halves back to their
        pixels. The RBE is unchanged (paper Sec. II-B: 32 channels per BinConv, one Kout
        channel per COMPUTE cycle): per output pixel COMPUTE and NORMQUANT stay, LOAD and
        STREAMOUT (a 5x5 / 3x3 patch of 32-channel words, Fig. 4) are shared by two pixels."""
        g, ti, to = self.geo, self.tin, self.tout
        return (self.engine == "rbe" and self.kind == "conv" and g.kh == g.kw == 3
                and g.sh == g.sw == 1 and g.pads[1] == g.pads[3] == 1 and g.w % 2 == 0
                and g.wo == g.w and g.c <= 16 and g.k == 16 and ti.layout == to.layout == "rbe"
                and getattr(self.layer, "groups", 1) == 1)

    def pair_wparts(self) -> tuple[int, int, int]:
        """Offsets in a column-pair layer's weight group of the pair job's NormQuant records
        (after its 32 x 32 weights), the plain job's weights and their NormQuant records."""
        g = self.geo
        nq = _al(weight_bytes(RBE_CHANNELS, RBE_CHANNELS, 3, self.w_bits))
        w2 = nq + _al(6 * RBE_CHANNELS)
        return nq, w2, w2 + _al(weight_bytes(g.k, g.c, 3, self.w_bits))

    def pair_jobs(self, x: int, w: int, y: int, rows: int, hh: int, ptop: int, pbot: int,
                  **common) -> list:
        """The RBE jobs of one full-width tile over column pairs (input window at ``x``, whole
        rows, the odd pixels laid into the even ones' upper lanes; weight group at ``w``; output
        at ``y``): the pair job over the first ``pair_pp`` output pairs (every second input
        pixel, 32 channels in and out, output rows of ``W / 2`` pair words) and, when the pairs
        leave a patch column mostly empty (``pair_pp < W / 2``), a plain job over the remaining
        columns, reading their own pixels' lower 16 lanes, after the pair rows."""
        g = self.geo
        pix, wbo = int(self.tin.pix_bytes()), self.tout.bits * 4
        full, pp = g.wo // 2, self.pair_pp
        rest = g.wo - 2 * pp
        nq, w2, nq2 = self.pair_wparts()
        jobs = [cg.RbeJob(x_ptr=x, w_ptr=w, nq_ptr=w + nq, y_ptr=y, h_in=rows,
                          w_in=pp + (rest > 0), h_out=hh, w_out=pp, k_in=RBE_CHANNELS,
                          k_out=RBE_CHANNELS, pad_top=ptop, pad_bottom=pbot, pad_left=1,
                          pad_right=0 if rest else 1, x_pix_stride=2 * pix,
                          x_row_stride=g.w * pix, y_pix_stride=wbo, y_row_stride=full * wbo,
                          **common)]
        if rest:
            jobs.append(cg.RbeJob(x_ptr=x + (2 * pp - 1) * pix, w_ptr=w + w2, nq_ptr=w + nq2,
                                  y_ptr=y + hh * full * wbo, h_in=rows, w_in=rest + 1,
                                  h_out=hh, w_out=rest, k_in=g.c, k_out=g.k, pad_top=ptop,
                                  pad_bottom=pbot, pad_left=0, pad_right=1,
                                  x_row_stride=g.w * pix, **common))
        return jobs

    def choose_pairs(self) -> None:
        """``pair_pp``: all ``W / 2`` pairs, or the largest multiple of 3 below (whole 3 x 3
        patches of pairs) with a plain job over the rest, whichever the cycle model finds
        faster for a 3-row tile (W = 32: 16 pairs fill 6 patch columns of 18, 15 pairs fill 5
        and the last 2 columns take one plain patch)."""
        g = self.geo
        best = None
        for pp in sorted({g.wo // 2, 3 * (g.wo // 6)} - {0}, reverse=True):
            self.pair_pp = pp
            c = self.rbe_cycles(min(3, g.ho), g.k)
            if best is None or c < best[0]:
                best = (c, pp)
        self.pair_pp = best[1]

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
        cannot carry a partial sum from one job to the next: docs/marsellus.md)."""
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
        if self.kind == "mul":  # the tile of the feature map, then the whole vector
            return _al(rows * self.cols_in() * self.pix_in(self.tin)) + _al(
                self.tins[1].pix_bytes())
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
            b["w"] = _al(weight_bytes(wk, self.k_in, g.kh, self.w_bits)) + _al(6 * wk)
            if self.pair:  # the pair job's weights, then the plain job's if it has one
                nq, _, nq2 = self.pair_wparts()
                b["w"] = nq2 + _al(6 * kt) if 2 * self.pair_pp < g.wo else nq + _al(
                    6 * RBE_CHANNELS)
            rows, cols = self.rows_in(th), self.cols_in()
            if t.layout == "hwc" and self.kind != "add":
                if t.stored_signed:
                    b["t1"] = _al(rows * cols * g.c * t.cbits / 8)
                b["t2"] = _al(activation_bytes(rows, cols, g.c, t.bits))
            b["out"] = _al(activation_bytes(th, self.tw, kt, self.tout.bits)) \
                if self.tout.layout == "rbe" else _al(th * self.tw * kt * self.tout.cbits / 8)
            if self.tout.layout == "hwc":
                b["t3"] = _al(activation_bytes(th, self.tw, kt, self.tout.bits))
            if self.pair:  # W / 2 pair words per row, then the plain job's columns
                b["out"] = _al(th * (g.wo // 2 + g.wo - 2 * self.pair_pp) * self.tout.bits * 4)
        else:
            wb = cluster_bits(getattr(self.layer, "weight_bits", 8))
            if self.kind in ("conv", "fc"):
                b["w"] = _al(kt * g.kh * g.kw * self.tc * wb / 8) + _al(6 * kt)
            elif self.kind == "dw":
                b["w"] = _al(kt * g.kh * g.kw * wb / 8) + _al(6 * kt)
            elif self.kind == "lut":  # the table: one 256-byte row, or one per channel
                b["w"] = self.group_bytes(kt)
            b["out"] = _al(th * self.tw * kt * self.tout.cbits / 8)
            if self.marshals_out:  # the kernel's HWC tile, then its bit planes
                b["t4"] = b["out"]
                b["out"] = _al(activation_bytes(th, self.tw, kt, self.tout.bits))
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

    def rbe_cycles(self, th: int, kt: int) -> int:
        """RBE job cycles of one step (the simulator's cycle model); an add runs one job per
        32-channel tile."""
        from tvm_marsellus.simulator import rbe_job_phases

        g = self.geo
        lo, hi, pt, pb = g.in_rows(0, th)
        clo, chi, pl, pr = g.in_cols(0, self.tw)
        if self.kind == "add":
            kts = [min(RBE_CHANNELS, kt - k0) for k0 in range(0, kt, RBE_CHANNELS)]
            lo, hi, pt, pb, clo, chi, pl, pr = 0, th, 0, 0, 0, self.tw, 0, 0
        else:
            kts = [kt]
        common = dict(in_bits=self.tin.bits, w_bits=self.w_bits, out_bits=self.tout.bits,
                      kernel=g.kh, stride=g.sh)
        if self.pair:
            jobs = self.pair_jobs(0, 0, 0, hi - lo, th, pt, pb, **common)
        else:
            jobs = [cg.RbeJob(h_in=hi - lo, w_in=chi - clo, h_out=th, w_out=self.tw,
                              k_in=self.k_in, k_out=k, pad_top=pt, pad_bottom=pb, pad_left=pl,
                              pad_right=pr, **common) for k in kts]
        return sum(sum(rbe_job_phases(self.cfg, job).values()) for job in jobs)

    def compute_cycles(self, th: int, kt: int) -> float:
        g, cfg = self.geo, self.cfg
        if self.engine == "rbe":
            c = self.rbe_cycles(th, kt)
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
        if self.kind in ("add", "mul"):  # CL.ADD / CL.MUL: elements at the element-wise rate
            return out + cfg.CL_KERNEL_OVERHEAD_CYCLES + th * self.tw * kt / \
                cfg.CL_ELTWISE_ELEMS_PER_CYCLE
        # the simulator's CL.* model: taps at the pool rate; MatMul at the wider of the input
        # and weight containers, im2col for windows, NormQuant of the last chunk and partial-sum
        # traffic on the cores
        outs = th * self.tw * kt
        if self.kind == "lut":
            return out + cfg.CL_KERNEL_OVERHEAD_CYCLES + outs * cfg.CL_LUT_CYCLES_PER_ELEMENT / \
                cfg.CLUSTER_CORES
        if self.kind == "pool":
            return out + cfg.CL_KERNEL_OVERHEAD_CYCLES + outs * g.kh * g.kw / \
                cfg.CL_POOL_TAPS_PER_CYCLE
        # outputs whose window lies in the padding only cost their NormQuant alone: the mean
        # step does the window share of the MatMul and im2col work
        win = 1.0 if self.kind == "fc" else g.window_fraction()
        macs = win * outs * g.kh * g.kw * (self.tc if self.kind in ("conv", "fc") else 1)
        if self.kind == "dw":
            work = macs / cfg.CL_DW_MACS_PER_CYCLE
        else:
            rate = cfg.cluster_macs_per_cycle(max(self.tin.cbits,
                                                  cluster_bits(self.layer.weight_bits)))
            work = macs / (rate * (cfg.CL_FC_EFFICIENCY if self.kind == "fc" else 1.0))
            if self.kind == "conv" and (g.kh * g.kw > 1 or g.sh > 1 or g.sw > 1):
                work += win * th * self.tw * g.kh * g.kw * self.tc * self.tin.cbits / 8 / \
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
        if self.packed:  # the first operand whole, the second a burst per bit plane and pixel
            bursts = th * self.tw * self.tin.bits + (th if strided else 0)
        elif self.stacked:  # a burst per 32-channel tile, pixel and operand
            bursts = len(self.tins) * th * self.tw * -(-g.k // RBE_CHANNELS)
        extra_in = 0.0
        out_rows = th * self.tw if kt < g.k else th if strided else 0
        if self.pair:  # the odd pixels' halves: a 2-byte burst per bit plane and pair
            pairs = self.rows_in(th) * self.cols_in() // 2
            bursts += pairs * self.tin.bits
            extra_in = cfg.DMA_LATENCY_CYCLES + pairs * self.tin.bits * 2 / \
                cfg.DMA_BYTES_PER_CYCLE
            out_rows = th * self.tw * self.tout.bits + th  # both halves, 2 bytes per burst
        dma_in = cfg.DMA_LATENCY_CYCLES + bufs["in"] / cfg.DMA_BYTES_PER_CYCLE + \
            bursts * cfg.DMA_ROW_OVERHEAD_CYCLES + extra_in
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
        layer: static power over its estimated time, the cores' busy cycles, the RBE's job cycles
        and its 1-bit products (2 x MACs x W x I)."""
        g = self.geo
        e = coef["static"] * self.cost(th, kt) + \
            coef["cluster"] * self.steps(th, kt) * self.cluster_cycles(th, kt)
        if self.engine == "rbe":
            macs = self.tin.n * g.ho * g.wo * g.k * self.k_in * g.kh * g.kw
            if self.pair:  # the jobs' products: the pair job's 32 x 32, zero taps included
                rest = g.wo - 2 * self.pair_pp
                macs = self.tin.n * g.ho * g.kh * g.kw * (
                    self.pair_pp * RBE_CHANNELS * RBE_CHANNELS + rest * g.k * g.c)
            e += coef["rbe"] * self.steps(th, kt) * self.rbe_cycles(th, kt) + \
                2 * macs * self.w_bits * self.tin.bits * coef["rbe_binop"]
        return e

    def group_bytes(self, kt: int) -> int:
        """L2 bytes of the weight group of ``kt`` output channels (all input channels) and
        their NormQuant records: what one L2 staging slot holds when the weights live in L3."""
        g = self.geo
        if self.kind in ("add", "pool", "mul"):
            return 0
        if self.kind == "lut":
            rows = self.layer.table.shape[0]
            return _al(256 * (kt if rows > 1 else 1))
        if self.engine == "rbe":
            return weight_bytes(kt, g.c, g.kh, self.w_bits) + 6 * kt
        taps = g.kh * g.kw * (g.c if self.kind != "dw" else 1)
        return _al(kt * taps * cluster_bits(self.layer.weight_bits) / 8) + 6 * kt

    def candidates(self) -> list[tuple[int, int]]:
        """Feasible ``(tile_h, tile_k)``: whole bytes, double-buffered in L1, and a weight group
        of at most a quarter of L2 (so two staging slots and the bounce slots fit beside the
        tensors when the weights move to L3) where some ``tile_k`` allows it."""
        g = self.geo
        ths = range(1, g.ho + 1)
        kts = [g.k] if self.pair else self.k_options()
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
            for tw in [g.wo] if self.pair else self.w_options():
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


def use_pairs(lay: _Layer, knobs: dict) -> bool:
    """Whether a layer runs over column pairs (``pair_pp`` chosen): the global knob
    ``pair_columns`` (default on), :meth:`_Layer.pairable` and an estimated gain."""
    return bool(knobs.get("pair_columns", True)) and lay.pairable() and _pairs_win(lay)


def _pairs_win(lay: _Layer) -> bool:
    """Whether the layer's best tile over column pairs is estimated faster than its best
    plain tile (``tw`` / ``tc`` left at the full layer)."""
    g = lay.geo
    costs = []
    for pair in (True, False):
        lay.pair = pair
        if pair:
            lay.choose_pairs()
        try:
            costs.append(lay.solve_width()[2])
        except MappingError:
            costs.append(float("inf"))
        lay.tw, lay.tc = g.wo, g.c
    lay.pair = False
    return costs[0] < costs[1]


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


class Tiling:
    """Planner stage: the tiles and knobs of every layer."""

    def tile_layers(self) -> list[LayerProgram]:
        """Tile every layer (knobs validated, weights packed into the image), in order."""
        return [self._layer(ly) for ly in self.g.layers]

    def _layer(self, ly) -> LayerProgram:
        kind, eng = self.kinds[ly.name], self.engines[ly.name]
        ins = layer_reads(ly)
        tins = [self.t[n] for n in ins]
        tout = self.t[ly.output]
        geo = _geometry(ly, tins[0], tout)
        lay = _Layer(ly, kind, eng, geo, tins, tout, self.cfg)
        lay.w_l3 = self.l3_costs and self.l3
        self.layers[ly.name] = lay
        rbe_ok = (kind == "conv" and not rbe_reasons(ly, tins[0], tout, self.cfg)) or (
            kind == "add" and not self.add_reasons.get(ly.name))
        lay.pair = use_pairs(lay, self.user)
        space = knob_space(lay, rbe_ok)
        user = {k: v for k, v in self.user.get(ly.name, {}).items()}
        kn = validate_knobs(space, user, ly.name)
        th, kt = kn["tile_h"], kn["tile_k"]
        lay.tw, lay.tc = kn["tile_w"], kn["tile_c"]
        lay.pair = lay.pair and kt == geo.k and lay.tw == geo.wo
        macs = 0
        if isinstance(ly, ConvLayer):
            macs = tout.n * geo.ho * geo.wo * geo.k * geo.kh * geo.kw * (
                geo.c if kind in ("conv", "fc") else 1)
        meta = {"tile_h": th, "tile_k": kt, "tile_w": lay.tw, "tile_c": lay.tc,
                "shape": layer_shape_text(ly, [self.g.tensors[n].shape for n in ins],
                                          self.g.tensors[ly.output].shape),
                "cost": round(lay.cost(th, kt), 1), "pair_columns": lay.pair}
        lp = LayerProgram(name=ly.name, op=ly.op_name, engine=eng, commands=[], macs=macs,
                             meta=meta)
        lay.plan = _Plan(eng, th, kt)
        start = _al(len(self.image))
        if isinstance(ly, ConvLayer):
            groups = [self._weights(lay, k0, min(kt, geo.k - k0)) for k0 in range(0, geo.k, kt)]
        elif kind == "lut":
            groups = [self._lut_table(lay)]
        else:
            groups = [self._add_weights(lay)] if lay.stacked else []
        lay.wsrc = [(off, size) for off, size, _ in groups]
        lay.wparts = [parts for _, _, parts in groups]
        if lay.wsrc:
            self.wrange[ly.name] = (start, len(self.image))
        return lp
