"""The program's DRAM: where every activation lives (halo and fill decided per consumer), the
allocator of constants, and the 2-D DMA transfers that move a tile of a packed tensor."""

from __future__ import annotations

from tvm_accel.errors import MappingError
from tvm_accel.layers import (
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DeconvLayer,
    LayerGraph,
    LutLayer,
    MulLayer,
    PoolLayer,
    UpsampleLayer,
)
from tvm_vta_cp.codegen import ISA, MAX_DRAM_BYTES, MAX_FIELD16
from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.layout import cdiv, dims4, stored_offset
from tvm_vta_cp.program import TensorPlacement
from tvm_vta_cp.strategy.geometry import deconv_phases, phase_pad

#: the largest padding a LOAD zero-pads (its 4-bit pad fields)
MAX_LOAD_PAD = 15


class Dram:
    """Bump allocator of the DRAM image; equal constants are stored once."""

    def __init__(self, align: int):
        self.align = align
        self.size = 0
        self.const_image: list[tuple[int, bytes]] = []
        self._dedupe: dict[bytes, int] = {}

    def alloc(self, nbytes: int) -> int:
        off = cdiv(self.size, self.align) * self.align
        self.size = off + nbytes
        return off

    def const(self, data: bytes) -> int:
        off = self._dedupe.get(data)
        if off is None:
            off = self.alloc(len(data))
            self.const_image.append((off, data))
            self._dedupe[data] = off
        return off


class DramTensor:
    """Packed DRAM geometry of a placement (indices in entries of BATCH x BLOCK bytes)."""

    def __init__(self, p: TensorPlacement, cfg: VTAConfig):
        N, C, H, W = dims4(p.shape)
        self.H, self.W = H, W
        self.NB, self.CB = cdiv(N, cfg.batch), cdiv(C, cfg.block_out)
        # batch blocks lie this many channel blocks apart (more than CB for a concat slice)
        self.CBs = p.channel_blocks or self.CB
        self.ht, self.hl, self.hb, self.hr = p.halo
        self.Hp, self.Wp = H + self.ht + self.hb, W + self.hl + self.hr
        self.base = p.offset // cfg.inp_entry_bytes

    def entry(self, b: int, c: int, r: int, x: int) -> int:
        """Entry index of block (b, c), DRAM row r, column x (halo coordinates)."""
        return self.base + ((b * self.CBs + c) * self.Hp + r) * self.Wp + x

    def region(self, b0: int, tb: int, c0: int, tc: int, r0: int, nr: int, x0: int,
               nx: int) -> list[tuple[int, int, int, int, int]]:
        """2-D transfers ``(sram_offset, dram_entry, y, x, stride)`` covering the dense block
        ``[tb][tc][nr][nx]`` starting at DRAM row ``r0``, column ``x0`` (halo coordinates)."""
        Hp, Wp, CB = self.Hp, self.Wp, self.CBs
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

    def scatter(self, b0: int, tb: int, c0: int, tc: int, r0: int, nr: int, x0: int, nx: int,
                sy: int, sx: int) -> list[tuple[int, int, int, int, int]]:
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


class PlanContext:
    """What every layer schedule of a function shares: config, ISA, DRAM and placements."""

    def __init__(self, cfg: VTAConfig):
        self.cfg = cfg
        self.isa = ISA(cfg)
        align = max(cfg.inp_entry_bytes, cfg.wgt_entry_bytes, cfg.acc_entry_bytes, 64)
        self.dram = Dram(align)
        self.placements: dict[str, TensorPlacement] = {}
        self._zero_off: int | None = None

    def zero_region(self) -> int:
        """DRAM entry index (INP entries) of a zero block as large as the INP buffer."""
        if self._zero_off is None:
            nbytes = self.cfg.inp_depth * self.cfg.inp_entry_bytes
            self._zero_off = self.dram.const(bytes(nbytes))
        return self._zero_off // self.cfg.inp_entry_bytes


def check_function(graph: LayerGraph, cfg: VTAConfig) -> None:
    """Refuse a config or tensors VTA cannot hold (int8/uint8 NCHW or NC only)."""
    cfg.validate("VTA config")
    if cfg.log_acc_depth > cfg.log_inp_depth:
        raise MappingError("VTA config: ACC deeper than INP is not supported (ALU source "
                           "indices are INP-width fields)")
    for tname, t in graph.tensors.items():
        if t.dtype not in ("int8", "uint8"):
            raise MappingError(f"tensor {tname}: dtype {t.dtype} is not supported on VTA "
                               "(int8/uint8 only)")
        if len(t.shape) not in (2, 4):
            raise MappingError(f"tensor {tname}: shape {t.shape} is neither NCHW nor NC")


def _conv_padding(layer: ConvLayer | DeconvLayer, tensors: dict) -> tuple[int, ...]:
    """Padding (top, left, bottom, right) a conv reads; of a transpose conv, the padding its
    phases' windows read."""
    if layer.input not in tensors or layer.output not in tensors:
        raise MappingError(f"layer {layer.name}: unknown input/output tensor")
    if isinstance(layer, DeconvLayer):
        shape = tuple(tensors[layer.input].shape)
        return tuple(max(p) for p in zip(*(phase_pad(sc, shape) for sc in
                                           deconv_phases(layer, shape)), strict=True))
    pad = tuple(int(p) for p in layer.padding)
    if layer.is_dense and any(pad):
        raise MappingError(f"layer {layer.name}: a dense layer cannot have padding")
    return pad


def halos(graph: LayerGraph) -> tuple[dict, dict, dict[str, bool]]:
    """``(halo, fill, use_halo)``: a conv whose padding reads ``zx' != 0`` (or pads more than a
    LOAD can) reads its input's DRAM halo, filled with ``zx'``; per tensor the largest halo
    its consumers need, per layer whether it reads the halo."""
    tensors = graph.tensors
    halo: dict[str, list[int]] = {n: [0, 0, 0, 0] for n in tensors}
    fill: dict[str, int | None] = dict.fromkeys(tensors)
    use_halo: dict[str, bool] = {}
    for layer in graph.layers:
        if isinstance(layer, ConvLayer | DeconvLayer):
            pad = _conv_padding(layer, tensors)
            zxp = int(layer.input_zero_point) + stored_offset(tensors[layer.input].dtype)
            need = any(pad) and (zxp != 0 or max(pad) > MAX_LOAD_PAD)
            use_halo[layer.name] = bool(need)
            if need:
                t = layer.input
                if fill[t] is not None and fill[t] != zxp:
                    raise MappingError(f"layer {layer.name}: tensor {t} needs a halo filled with "
                                       f"{zxp} but another consumer needs {fill[t]}")
                fill[t] = zxp
                halo[t] = [max(a, b) for a, b in zip(halo[t], pad, strict=True)]
        elif isinstance(layer, AddLayer | ConcatLayer | LutLayer | MulLayer):
            ins = (layer.input,) if isinstance(layer, LutLayer) else tuple(layer.inputs)
            for t in (*ins, layer.output):
                if t not in tensors:
                    raise MappingError(f"layer {layer.name}: unknown tensor {t}")
        elif isinstance(layer, PoolLayer | UpsampleLayer):  # LOAD pads; no halo read
            for t in (layer.input, layer.output):
                if t not in tensors:
                    raise MappingError(f"layer {layer.name}: unknown tensor {t}")
        else:
            raise MappingError(f"layer {getattr(layer, 'name', layer)}: unsupported layer type "
                               f"{type(layer).__name__}")
    return halo, fill, use_halo


def place_tensors(graph: LayerGraph, cfg: VTAConfig, halo: dict, fill: dict,
                  views: dict[str, tuple[str, int]] | None = None) -> PlanContext:
    """Allocate every tensor of the function, packed with its halo, at the start of DRAM;
    ``views`` maps a tensor to ``(wider tensor, first channel block)``: it is placed as that
    slice of the wider tensor (a concat input written in place, ``strategy.concat``)."""
    ctx = PlanContext(cfg)
    B, BLK = cfg.batch, cfg.block_out
    views = views or {}
    for tname, t in graph.tensors.items():
        if tname in views:
            continue
        N, C, H, W = dims4(tuple(t.shape))
        ht, hl, hb, hr = halo[tname]
        if len(t.shape) == 2 and any(halo[tname]):
            raise MappingError(f"tensor {tname}: a 2-D (dense) tensor cannot carry a halo")
        nbytes = cdiv(N, B) * cdiv(C, BLK) * (H + ht + hb) * (W + hl + hr) * B * BLK
        off = ctx.dram.alloc(nbytes)
        ctx.placements[tname] = TensorPlacement(tname, tuple(int(s) for s in t.shape), t.dtype,
                                                off, (ht, hl, hb, hr), int(fill[tname] or 0),
                                                nbytes)
    for tname, (parent, cb0) in views.items():
        p, t = ctx.placements[parent], graph.tensors[tname]
        N, C, H, W = dims4(tuple(t.shape))
        _, CBp, Hp, Wp = (cdiv(N, B), cdiv(dims4(p.shape)[1], BLK), H + p.halo[0] + p.halo[2],
                          W + p.halo[1] + p.halo[3])
        ctx.placements[tname] = TensorPlacement(
            tname, tuple(int(s) for s in t.shape), t.dtype, p.offset + cb0 * Hp * Wp * B * BLK,
            p.halo, p.fill, cdiv(N, B) * cdiv(C, BLK) * Hp * Wp * B * BLK, channel_blocks=CBp)
    check_dram(ctx.dram.size, "its activations")
    return ctx


def check_dram(nbytes: int, what: str) -> None:
    """VTA addresses 4 GiB of DRAM (32-bit physical addresses): a program needing more cannot
    run, so it is refused at compile time (the layers fall back to the CPU)."""
    if nbytes > MAX_DRAM_BYTES:
        raise MappingError(f"the function needs {nbytes:,} bytes of DRAM for {what}; VTA "
                           f"addresses {MAX_DRAM_BYTES:,}")
