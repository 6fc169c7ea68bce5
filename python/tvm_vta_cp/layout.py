"""Host <-> device tensor layouts of the VTA target.

Activations live in DRAM blocked as ``NCHWnc`` with a stencil halo, weights as ``OIHWoi``;
uint8 values are stored as int8 ``value - 128``. The strategy, the codegen, the runtime, the
layout rewrites and the tests all use these helpers, so the rule lives in one place (see
``docs/vta.md``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from tvm_vta_cp.hw_config import VTAConfig


class Placed(Protocol):
    """What the packing needs to know of a tensor placement."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    halo: tuple[int, int, int, int]
    fill: int
    nbytes: int


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dims4(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """``(N, C, H, W)`` of an NCHW shape; an NC (dense) shape is ``(N, C, 1, 1)``."""
    if len(shape) == 4:
        return tuple(int(s) for s in shape)  # type: ignore[return-value]
    if len(shape) == 2:
        return int(shape[0]), int(shape[1]), 1, 1
    raise ValueError(f"expected an NCHW or NC shape, got {shape}")


def stored_offset(dtype: str) -> int:
    """Stored int8 = logical value + offset."""
    return -128 if dtype == "uint8" else 0


def packed_shape(p: Placed, cfg: VTAConfig) -> tuple[int, int, int, int, int, int]:
    """Shape of the DRAM form: ``(ceil(N/BATCH), ceil(C/BLOCK), H + halo_t + halo_b,
    W + halo_l + halo_r, BATCH, BLOCK)``."""
    N, C, H, W = dims4(p.shape)
    ht, hl, hb, hr = p.halo
    return (cdiv(N, cfg.batch), cdiv(C, cfg.block_out), H + ht + hb, W + hl + hr, cfg.batch,
            cfg.block_out)


def pack_tensor(x: np.ndarray, p: Placed, cfg: VTAConfig) -> np.ndarray:
    """Logical array -> packed int8 bytes (uint8 array of ``p.nbytes``) incl. the halo fill."""
    x = np.asarray(x)
    if tuple(x.shape) != tuple(p.shape):
        raise ValueError(f"tensor {p.name}: expected shape {tuple(p.shape)}, got {x.shape}")
    N, C, H, W = dims4(p.shape)
    NB, CB, Hp, Wp, B, BLK = packed_shape(p, cfg)
    ht, hl, _, _ = p.halo
    if x.dtype == np.dtype(p.dtype):  # the usual case: no range check, no wide copy
        xs = (x ^ np.uint8(0x80)).view(np.int8) if p.dtype == "uint8" else x
    else:
        lo, hi = (0, 255) if p.dtype == "uint8" else (-128, 127)
        if x.size and (x.min() < lo or x.max() > hi):
            raise ValueError(f"tensor {p.name}: values outside the {p.dtype} range")
        xs = (x.astype(np.int16) + stored_offset(p.dtype)).astype(np.int8)
    xs = xs.reshape(N, C, H, W)
    full = np.full((NB * B, CB * BLK, H, W), p.fill, dtype=np.int8)
    full[:N, :C] = xs
    packed = np.full((NB, CB, Hp, Wp, B, BLK), p.fill, dtype=np.int8)
    packed[:, :, ht:ht + H, hl:hl + W] = full.reshape(NB, B, CB, BLK, H, W).transpose(
        0, 2, 4, 5, 1, 3)
    return packed.reshape(-1).view(np.uint8)


def unpack_tensor(buf: np.ndarray, p: Placed, cfg: VTAConfig) -> np.ndarray:
    """Packed bytes -> logical array of ``p.dtype`` (halo, padded lanes dropped)."""
    N, C, H, W = dims4(p.shape)
    NB, CB, Hp, Wp, B, BLK = packed_shape(p, cfg)
    ht, hl, _, _ = p.halo
    arr = np.asarray(buf, dtype=np.uint8)[: p.nbytes].view(np.int8).reshape(NB, CB, Hp, Wp, B,
                                                                            BLK)
    inner = arr[:, :, ht:ht + H, hl:hl + W].transpose(0, 4, 1, 5, 2, 3).reshape(
        NB * B, CB * BLK, H, W)[:N, :C]
    out = (inner.astype(np.int16) - stored_offset(p.dtype)).astype(p.dtype)
    return out.reshape(p.shape)


def pack_weight(weight: np.ndarray, kb: int, cb: int, blk: int) -> bytes:
    """OIHW int8 weight -> ``OIHWoi`` blocks ``(kb, cb, KH, KW, BLOCK_OUT, BLOCK_IN)`` with the
    channels that do not fill a block zero-padded."""
    k, c, kh, kw = weight.shape
    w = np.zeros((kb * blk, cb * blk, kh, kw), dtype=np.int8)
    w[:k, :c] = np.asarray(weight).astype(np.int8)
    wp = w.reshape(kb, blk, cb, blk, kh, kw).transpose(0, 2, 4, 5, 1, 3)
    return np.ascontiguousarray(wp).tobytes()
