"""Host <-> device tensor layouts of MARSELLUS: the RBE bit-plane layouts of activations and
weights (paper Sec. II-B3), NormQuant parameter records and the cluster's bit-packed HWC.

One place for the packing that the compiler (weights into the L2 image), the runtime (program
inputs and outputs) and the tests share; the byte formats are specified in ``docs/marsellus.md``
(the command ISA).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from tvm_accel.errors import SimulatorError
from tvm_marsellus.hw_config import RBE_CHANNELS


def _tiles(k: int) -> int:
    return -(-k // RBE_CHANNELS)


def activation_bytes(h: int, w: int, k: int, bits: int) -> int:
    """Bytes of an (H, W, K) tensor in the bit-plane layout (H, W, K/32, bits, 32)."""
    return h * w * _tiles(k) * bits * 4


def weight_bytes(k_out: int, k_in: int, kernel: int, bits: int) -> int:
    return k_out * _tiles(k_in) * bits * kernel * kernel * 4


def _planes(v: np.ndarray, bits: int) -> np.ndarray:
    """(..., 32) values -> (..., bits, 4) bytes of the bit-plane words."""
    b = ((v[..., None, :] >> np.arange(bits, dtype=np.int64)[:, None]) & 1).astype(np.uint8)
    return np.packbits(b, axis=-1, bitorder="little")


def _unplanes(data: np.ndarray, bits: int) -> np.ndarray:
    """(..., bits, 4) bytes -> (..., 32) unsigned values."""
    b = np.unpackbits(data, axis=-1, bitorder="little").astype(np.int64)
    return (b << np.arange(bits, dtype=np.int64)[:, None]).sum(axis=-2)


def pack_activations(x: np.ndarray, bits: int) -> np.ndarray:
    """(H, W, K) integers -> uint8 bytes of the RBE layout (H, W, K/32, bits, 32).

    Each value's low ``bits`` bits are stored (unsigned values, or two's complement patterns of
    signed ones); channels are zero-padded to a multiple of 32.
    """
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"activations must be (H, W, K), got shape {x.shape}")
    h, w, k = x.shape
    t = _tiles(k)
    v = np.zeros((h, w, t * RBE_CHANNELS), np.int64)
    v[..., :k] = x.astype(np.int64) & ((1 << bits) - 1)
    return _planes(v.reshape(h, w, t, RBE_CHANNELS), bits).reshape(-1)


def unpack_activations(data, h: int, w: int, k: int, bits: int,
                       signed: bool = False) -> np.ndarray:
    """Inverse of :func:`pack_activations`: (H, W, K) int64 (sign-extended when ``signed``)."""
    t = _tiles(k)
    raw = np.frombuffer(bytes(data), np.uint8)[:activation_bytes(h, w, k, bits)]
    v = _unplanes(raw.reshape(h, w, t, bits, 4), bits).reshape(h, w, t * RBE_CHANNELS)[..., :k]
    if signed:
        v = np.where(v >> (bits - 1), v - (1 << bits), v)
    return v


def pack_weights(w: np.ndarray, bits: int, signed: bool = True) -> np.ndarray:
    """(Kout, Kin, k, k) weights (k = 3 or 1, OIHW) -> uint8 bytes of the RBE weight layout.

    3x3: (Kout, Kin/32, W, 9, 32) with tap f = 3*ky + kx; 1x1: (Kout, Kin/32, W, 32). Signed
    weights in [-2^(W-1), 2^(W-1)) are stored offset-binary (w + 2^(W-1)).
    """
    w = np.asarray(w).astype(np.int64)
    if w.ndim != 4 or w.shape[2] != w.shape[3] or w.shape[2] not in (1, 3):
        raise ValueError(f"weights must be (Kout, Kin, 3, 3) or (Kout, Kin, 1, 1), got {w.shape}")
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if w.size and (w.min() < lo or w.max() > hi):
        raise ValueError(f"weights outside {lo}..{hi} for {bits}-bit "
                         f"{'signed' if signed else 'unsigned'} weights")
    ko, ki, k, _ = w.shape
    t = _tiles(ki)
    u = w + (1 << (bits - 1)) if signed else w
    v = np.zeros((ko, t * RBE_CHANNELS, k * k), np.int64)
    v[:, :ki] = u.reshape(ko, ki, k * k)
    v = v.reshape(ko, t, RBE_CHANNELS, k * k).transpose(0, 1, 3, 2)  # (Kout, T, taps, 32)
    p = _planes(v, bits)  # (Kout, T, taps, bits, 4)
    return np.ascontiguousarray(p.transpose(0, 1, 3, 2, 4)).reshape(-1)


def unpack_weights(data, k_out: int, k_in: int, kernel: int, bits: int,
                   signed: bool = True) -> np.ndarray:
    """Inverse of :func:`pack_weights`: (Kout, Kin, k, k) int64."""
    t, taps = _tiles(k_in), kernel * kernel
    raw = np.frombuffer(bytes(data), np.uint8)[:weight_bytes(k_out, k_in, kernel, bits)]
    p = raw.reshape(k_out, t, bits, taps, 4).transpose(0, 1, 3, 2, 4)
    v = _unplanes(p, bits)  # (Kout, T, taps, 32)
    v = v.transpose(0, 1, 3, 2).reshape(k_out, t * RBE_CHANNELS, taps)[:, :k_in]
    if signed:
        v = v - (1 << (bits - 1))
    return v.reshape(k_out, k_in, kernel, kernel)


def pack_normquant(kappa, lambda_) -> np.ndarray:
    """Per-channel NormQuant records: kappa u16 then lambda i32, 6 bytes each."""
    kappa = np.asarray(kappa, np.int64).reshape(-1)
    lam = np.asarray(lambda_, np.int64).reshape(-1)
    if kappa.shape != lam.shape:
        raise ValueError("kappa and lambda need one value per channel each")
    if kappa.size and (kappa.min() < 0 or kappa.max() > 0xFFFF):
        raise ValueError("kappa must fit 16 unsigned bits")
    if lam.size and (lam.min() < -(1 << 31) or lam.max() >= 1 << 31):
        raise ValueError("lambda must fit 32 signed bits")
    rec = np.zeros(kappa.size, np.dtype([("k", "<u2"), ("l", "<i4")]))
    rec["k"], rec["l"] = kappa, lam
    return np.frombuffer(rec.tobytes(), np.uint8).copy()


def pack_hwc(x: np.ndarray, bits: int) -> np.ndarray:
    """Cluster tensor bytes: elements in C order, ``bits`` (2, 4, 8) each, little-endian packed."""
    v = (np.asarray(x).astype(np.int64).reshape(-1) & ((1 << bits) - 1)).astype(np.uint8)
    if bits == 8:
        return v
    per = 8 // bits
    v = np.concatenate([v, np.zeros((-v.size) % per, np.uint8)]).reshape(-1, per)
    return (v << (np.arange(per, dtype=np.uint8) * bits)).sum(axis=1).astype(np.uint8)


def unpack_hwc(data, shape: tuple[int, ...], bits: int, signed: bool) -> np.ndarray:
    """Inverse of :func:`pack_hwc`."""
    n = int(np.prod(shape))
    raw = np.frombuffer(bytes(data), np.uint8)
    per = 8 // bits
    v = ((raw[:, None] >> (np.arange(per) * bits)) & ((1 << bits) - 1)).reshape(-1)[:n]
    v = v.astype(np.int64)
    if signed:
        v = np.where(v >> (bits - 1), v - (1 << bits), v)
    return v.reshape(shape)


class Placement(Protocol):
    """What packing needs of a tensor's placement
    (:class:`~tvm_marsellus.program.TensorPlacement`)."""

    name: str
    shape: tuple[int, ...]
    layout: str
    bits: int
    signed: bool


def _check_range(name: str, v: np.ndarray, bits: int, signed: bool) -> None:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if v.size and (v.min() < lo or v.max() > hi):
        raise SimulatorError(f"input {name}: values outside {lo}..{hi} of its {bits}-bit "
                             f"{'signed' if signed else 'unsigned'} type")


def pack_tensor(t: Placement, value: np.ndarray) -> np.ndarray:
    """Bytes of a program input at its placement ``t``: ``value`` of the placement's shape,
    integers in its ``bits``-bit range, packed in its layout (``rbe``:
    :func:`pack_activations`, ``hwc``: :func:`pack_hwc`); :class:`SimulatorError` otherwise."""
    v = np.asarray(value)
    if tuple(v.shape) != tuple(t.shape):
        raise SimulatorError(f"input {t.name}: shape {tuple(v.shape)}, the program expects "
                             f"{tuple(t.shape)}")
    if not np.issubdtype(v.dtype, np.integer):
        raise SimulatorError(f"input {t.name}: dtype {v.dtype} is not an integer type")
    _check_range(t.name, v, t.bits, t.signed)
    return pack_activations(v, t.bits) if t.layout == "rbe" else pack_hwc(v, t.bits)


def unpack_tensor(t: Placement, data: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_tensor`: int64 values of the placement's shape from its bytes."""
    if t.layout == "rbe":
        return unpack_activations(data, *t.shape, t.bits, signed=t.signed)
    return unpack_hwc(data, t.shape, t.bits, t.signed)


#: lane of the odd pixel's channels in a column-pair word (the even pixel's start at lane 0)
PAIR_LANE = 16


def pair_columns_weights(w: np.ndarray) -> np.ndarray:
    """(K, C, 3, 3) weights of a 3x3 stride-1 conv with one column of padding each side over
    K, C <= 16 channels -> the (32, 32, 3, 3) weights of the same conv over *column pairs*:
    pixel pair q holds pixel 2q in lanes 0..15 and pixel 2q + 1 in lanes 16..31 of every
    bit-plane word, input and output alike. The even output 2q reads pixels 2q - 1 (pair q - 1,
    odd half), 2q and 2q + 1 (pair q); the odd output 2q + 1 reads 2q and 2q + 1 (pair q) and
    2q + 2 (pair q + 1, even half); every other tap is zero. The accumulators are those of the
    plain conv, so NormQuant (per channel, duplicated) gives the same outputs."""
    w = np.asarray(w).astype(np.int64)
    k, c = w.shape[:2]
    p = np.zeros((2 * PAIR_LANE, 2 * PAIR_LANE, 3, 3), np.int64)
    ev, od = slice(0, c), slice(PAIR_LANE, PAIR_LANE + c)
    p[:k, od, :, 0] = w[:, :, :, 0]
    p[:k, ev, :, 1] = w[:, :, :, 1]
    p[:k, od, :, 1] = w[:, :, :, 2]
    p[PAIR_LANE:PAIR_LANE + k, ev, :, 1] = w[:, :, :, 0]
    p[PAIR_LANE:PAIR_LANE + k, od, :, 1] = w[:, :, :, 1]
    p[PAIR_LANE:PAIR_LANE + k, ev, :, 2] = w[:, :, :, 2]
    return p
