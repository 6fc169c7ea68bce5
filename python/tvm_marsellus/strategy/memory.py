"""Memory stage: the weights and NormQuant records packed into the L2 image, and the static
L2 / L3 map of the function (weight slots, bounce slots, tensors; DORY's three-level tiling,
``docs/marsellus.md``, L3)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tvm_accel.errors import MappingError
from tvm_marsellus.hw_config import RBE_CHANNELS
from tvm_marsellus.layout import pack_hwc, pack_normquant, pack_weights, pair_columns_weights
from tvm_marsellus.numerics import add_factors, normquant_params
from tvm_marsellus.program import LayerProgram
from tvm_marsellus.strategy.layers import TensorInfo, _al, cluster_bits
from tvm_marsellus.strategy.tiling import _Layer


class CapacityError(MappingError):
    """The function's tensors and weights do not fit L2 / L3 (a smaller batch may:
    ``strategy.plan`` then runs it in passes)."""


class Memory:
    """Planner stage: the L2 image of the weights and the L2 / L3 memory map."""

    def place(self, progs: list[LayerProgram]) -> tuple[list[LayerProgram], int, int]:
        """The memory map of the tiled layers ``progs``; when it puts weights or tensors in L3,
        the tiles are chosen again with the I/O DMA transfers of that placement in their cost,
        and the map redone (the first choice is kept if the new tiles no longer fit L2).
        Returns the layer programs and the L2 and L3 bytes used."""
        l2_bytes, l3_bytes = self._place()
        if not self.l3:
            return progs, l2_bytes, l3_bytes
        first = (progs, l2_bytes, l3_bytes, dict(self.layers), bytes(self.image),
                 dict(self.wrange), {n: (t.mem, t.offset) for n, t in self.t.items()},
                 (self.bounce_in, self.bounce_out, self.stage))
        self.l3_costs = True
        self.image, self.wrange = bytearray(), {}
        try:
            progs = self.tile_layers()
            l2_bytes, l3_bytes = self._place()
        except MappingError:  # the new tiles need more L2: keep the first choice
            progs, l2_bytes, l3_bytes, self.layers, img, self.wrange, mem, slots = first
            self.image = bytearray(img)
            for n, (m, off) in mem.items():
                self.t[n].mem, self.t[n].offset = m, off
            self.bounce_in, self.bounce_out, self.stage = slots
            self.l3 = True
        return progs, l2_bytes, l3_bytes

    def _blob(self, data: bytes) -> int:
        off = _al(len(self.image))
        self.image += bytes(off - len(self.image)) + bytes(data)
        return off

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
        """The memory map (docs/marsellus.md, L3): L2 holds the weight image, or with weights in
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
            raise CapacityError(
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
            raise CapacityError(f"function needs {off3} bytes of L3 (weights and "
                               f"{len(in_l3)} tensor(s)) beside L2, the config has "
                               + (f"{cfg.L3_BYTES}" if cfg.L3_BYTES else "no L3"))
        return off, off3

    def _weights(self, lay: _Layer, k0: int, kt: int) -> tuple[int, int, list]:
        """Pack the weights + NormQuant of output channels [k0, k0+kt) into the L2 image;
        returns (L2 offset, byte size, parts). The NormQuant records follow the weights at an
        aligned offset. Under Kin tiling the weights are stored chunk after chunk, each
        ``(kt, kh, kw, chunk)`` contiguous and aligned, and ``parts`` lists their (offset in
        the group, bytes) then the NormQuant offset; else it is empty."""
        ly, g = lay.layer, lay.geo
        w = ly.weight[k0:k0 + kt].astype(np.int64)
        bias = ly.bias.astype(np.int64).reshape(-1)[k0:k0 + kt]
        rq = _sub_requant(ly.requant, k0, kt)
        if lay.pair:
            return self._pair_weights(lay, w, bias, rq)
        kappa, lam = self._folded(lay, w, bias, rq)
        if lay.engine == "rbe":
            wb = pack_weights(w, ly.weight_bits).tobytes()
        else:
            wbits = cluster_bits(ly.weight_bits)
            if lay.kind == "dw":
                wb = pack_hwc(w.reshape(kt, g.kh, g.kw), wbits).tobytes()
            elif lay.chunked:
                data, parts = b"", []
                for c0 in range(0, g.c, lay.tc):
                    chunk = pack_hwc(w[:, c0:c0 + lay.tc].transpose(0, 2, 3, 1),
                                        wbits).tobytes()
                    parts.append((len(data), len(chunk)))
                    data += chunk + bytes(_al(len(chunk)) - len(chunk))
                parts.append(len(data))
                data += pack_normquant(kappa, lam).tobytes()
                return self._blob(data), len(data), parts
            else:
                wb = pack_hwc(w.transpose(0, 2, 3, 1), wbits).tobytes()
        nq = pack_normquant(kappa, lam).tobytes()
        data = wb + bytes(_al(len(wb)) - len(wb)) + nq
        return self._blob(data), len(data), []

    @staticmethod
    def _folded(lay: _Layer, w: np.ndarray, bias: np.ndarray, rq) -> tuple:
        """NormQuant ``(kappa, lambda)`` of weights ``w`` (K, C, kh, kw) with the bias, the
        input zero point and the storage offsets folded into lambda."""
        ly = lay.layer
        sumw = w.reshape(w.shape[0], -1).sum(axis=1)
        # the RBE reads signed activations with the unsigned offset 2^(I-1) (docs/marsellus.md)
        in_off = lay.tin.offset_value or (
            (1 << (lay.tin.bits - 1)) if lay.engine == "rbe" and lay.tin.signed else 0)
        folded = bias - (ly.input_zero_point + in_off) * sumw
        try:
            kappa, lam, _ = normquant_params(rq, folded, lay.tout.offset_value)
        except ValueError as e:
            raise MappingError(f"layer {ly.name}: {e}") from None
        return kappa, lam

    def _pair_weights(self, lay: _Layer, w: np.ndarray, bias: np.ndarray, rq
                      ) -> tuple[int, int, list]:
        """The weight group of a column-pair layer (:meth:`_Layer.pair_jobs`): the pair
        job's 32 x 32 weights (``layout.pair_columns_weights``) and NormQuant records (each
        channel's twice), then, when it has a plain job, the layer's own weights and records,
        at the offsets of :meth:`_Layer.pair_wparts`."""
        nq, w2, nq2 = lay.pair_wparts()
        bits = lay.layer.weight_bits
        wp = pair_columns_weights(w)
        kappa, lam = self._folded(lay, wp, np.tile(bias, 2), _tile_requant(rq))
        wb = pack_weights(wp, bits).tobytes()
        data = wb + bytes(nq - len(wb)) + pack_normquant(kappa, lam).tobytes()
        if 2 * lay.pair_pp < lay.geo.wo:
            kappa, lam = self._folded(lay, w, bias, rq)
            wb = pack_weights(w, bits).tobytes()
            data += bytes(w2 - len(data)) + wb
            data += bytes(nq2 - len(data)) + pack_normquant(kappa, lam).tobytes()
        return self._blob(data), len(data), []

    def _lut_table(self, lay: _Layer) -> tuple[int, int, list]:
        """The table of a LUT layer in the L2 image (:func:`lut_rows`): one 256-byte row, or
        one per channel in channel order."""
        data = lut_rows(lay.layer.table, lay.tin, lay.tout).tobytes()
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
        wbytes = pack_weights(w, wbits, signed=False).tobytes()
        nq = pack_normquant(np.full(c, kappa), np.full(c, lam)).tobytes()
        data = wbytes + bytes(_al(len(wbytes)) - len(wbytes)) + nq
        return self._blob(data), len(data), []


def lut_rows(table: np.ndarray, tin: TensorInfo, tout: TensorInfo) -> np.ndarray:
    """The table rows as the cluster LUT reads them: indexed by the input's stored byte (two's
    complement or offset by ``tin.offset_value``) and holding the output's stored byte, so the
    kernel maps bytes to bytes whatever the storage of either side."""
    stored = np.arange(256, dtype=np.int64)
    code = stored - tin.offset_value
    if tin.stored_signed:
        code = np.where(stored >= 128, stored - 256, stored)
    lo = -128 if tin.signed else 0
    out = np.asarray(table, np.int64)[:, code - lo] + tout.offset_value
    return (out & 0xFF).astype(np.uint8)


def _sub_requant(rq, k0: int, kt: int):
    """The requantization of output channels ``[k0, k0 + kt)`` (per-channel arrays sliced)."""
    m = np.asarray(rq.multiplier)
    r = np.asarray(rq.round_add)
    return replace(rq, multiplier=m[k0:k0 + kt] if m.size > 1 else m,
                   round_add=r[k0:k0 + kt] if r.size > 1 else r)


def _tile_requant(rq):
    """A requantization over twice the channels, the per-channel arrays repeated (the column-pair
    conv's even and odd pixels)."""
    m = np.asarray(rq.multiplier)
    r = np.asarray(rq.round_add)
    return replace(rq, multiplier=np.tile(m, 2) if m.size > 1 else m,
                   round_add=np.tile(r, 2) if r.size > 1 else r)
