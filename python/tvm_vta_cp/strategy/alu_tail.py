"""The requantize tail on VTA's ALU: the GEMM sum -> stored int8 output as int32 ALU ops.

Each op is exact in int32 by interval analysis of the worst-case accumulator, so foldings
(bias and zero point riding on the round add, dropped identity ops, skipped clips) never change
a bit against ``layers.reference_execute``; ``docs/vta.md`` (Numerics) gives the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_accel.errors import MappingError
from tvm_accel.layers import AddLayer, ConvLayer, Requant
from tvm_vta_cp.codegen import (
    ALU_ADD,
    ALU_MAX,
    ALU_MIN,
    ALU_MUL,
    ALU_SHR,
    MEM_ACC,
    OP_LOAD,
    MemInsn,
)
from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.layout import cdiv, stored_offset

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


@dataclass
class AluOp:
    """One whole-tile ALU instruction of the tail and its operand per output channel."""

    opcode: int
    values: np.ndarray  # per output channel (int64); SHR uses a uniform value
    #: a leading ADD done by the GEMM instead (bias lanes, :func:`bias_lanes`), not the ALU
    on_gemm: bool = False

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


@dataclass
class _Recipe:
    """A requantize recipe in stored-int8 terms, per output channel."""

    m: np.ndarray      # multiplier
    r: np.ndarray      # round add
    bias: np.ndarray
    pre: int           # shift before the multiply
    s: int             # shift after the round add
    zp: int            # output zero point (stored)

    def simplified(self) -> _Recipe:
        """The same function with fewer ops, by exact shift identities: a uniform multiplier
        ``2^k`` (``k <= s``, round add a multiple of ``2^k``) becomes ``s - k``
        (``(t * 2^k + r) >> s == (t + r / 2^k) >> (s - k)``), then with multiplier 1 the
        pre-shift joins the shift (``((x >> p) + r) >> s == (x + r * 2^p) >> (p + s)``)."""
        m, r, pre, s = self.m, self.r, self.pre, self.s
        k = int(m[0]).bit_length() - 1 if len(m) and m[0] > 0 else -1
        if k > 0 and np.all(m == m[0]) and int(m[0]) == 1 << k and k <= s and np.all(
                r % (1 << k) == 0):
            m, r, s = np.ones_like(m), r >> k, s - k
        if pre and np.all(m == 1) and pre + s <= 31:
            r, s, pre = r << pre, s + pre, 0
        return _Recipe(m=m, r=r, bias=self.bias, pre=pre, s=s, zp=self.zp)

    def full(self, v: int) -> np.ndarray:
        return np.full(len(self.m), v, dtype=np.int64)

    def ops(self, fold_bias: bool, fold_zp: bool) -> list[AluOp]:
        """The ALU ops of the recipe with (or without) the bias / zero point folded into the
        round add."""
        m, s, zp = self.m, self.s, self.zp
        ops = []
        if fold_bias:  # pre == 0: (g + bias) * m + r == g * m + (bias * m + r)
            if np.any(m != 1):
                ops.append(AluOp(ALU_MUL, m))
            c = self.bias * m + self.r
        else:
            if np.any(self.bias != 0):
                ops.append(AluOp(ALU_ADD, self.bias))
            if self.pre:
                ops.append(AluOp(ALU_SHR, self.full(min(self.pre, 31))))
            if np.any(m != 1):
                ops.append(AluOp(ALU_MUL, m))
            c = self.r
        if fold_zp:  # (t + c) >> s + zp == (t + c + zp * 2^s) >> s
            c = c + (zp << s)
        if np.any(c != 0):
            ops.append(AluOp(ALU_ADD, c))
        if s:
            ops.append(AluOp(ALU_SHR, self.full(min(s, 31))))
        if not fold_zp and zp:
            ops.append(AluOp(ALU_ADD, self.full(zp)))
        return ops

    def premul_ops(self) -> list[AluOp] | None:
        """When ``r + zp * 2^s == c * m`` in every channel, the whole constant goes before the
        multiply: ``((g + bias + c * 2^pre) >> pre) * m >> s`` equals the recipe exactly
        (``(x >> p) + c == (x + c * 2^p) >> p``); its leading ADD can ride on the GEMM."""
        m = self.m
        if not len(m) or np.any(m <= 0) or self.s > 31 or abs(self.zp) >= (1 << 16):
            return None
        total = self.r + (self.zp << self.s)
        if np.any(total % m != 0):
            return None
        ops = []
        b = self.bias + ((total // m) << self.pre)
        if np.any(b != 0):
            ops.append(AluOp(ALU_ADD, b))
        if self.pre:
            ops.append(AluOp(ALU_SHR, self.full(min(self.pre, 31))))
        if np.any(m != 1):
            ops.append(AluOp(ALU_MUL, m))
        if self.s:
            ops.append(AluOp(ALU_SHR, self.full(self.s)))
        return ops

    def candidates(self) -> list[list[AluOp]]:
        """Foldings to try, the cheapest first; the last is the plain recipe order."""
        zp_folds = (True, False) if self.s <= 30 and abs(self.zp) < (1 << 16) else (False,)
        premul = self.premul_ops()
        out = [] if premul is None else [premul]
        if self.pre == 0:
            out += [self.ops(True, f) for f in zp_folds]
        return out + [self.ops(False, f) for f in zp_folds]


def _outside_int32(values: np.ndarray) -> bool:
    return bool(np.any(values < INT32_MIN) or np.any(values > INT32_MAX))


def _fits(ops: list[AluOp], g_lo, g_hi) -> tuple[bool, np.ndarray, np.ndarray]:
    """Whether every operand and intermediate of ``ops`` stays in int32 for ``g`` in
    ``[g_lo, g_hi]``, and the interval of the result."""
    lo, hi = np.asarray(g_lo, dtype=np.int64), np.asarray(g_hi, dtype=np.int64)
    ok = True
    for op in ops:
        if _outside_int32(op.values):
            ok = False
        lo, hi = _interval(op.opcode, op.values, lo, hi)
        if lo.min() < INT32_MIN or hi.max() > INT32_MAX:
            ok = False
    return ok, lo, hi


def _first_exact(candidates: list[list[AluOp]], g_lo, g_hi):
    """``(ops, lo, hi)`` of the first candidate exact in int32. When none is, worst-case inputs
    would overflow somewhere; the recipe producer guarantees the layer's real accumulator bound
    fits, so the plain recipe order (as the reference) is used."""
    for ops in candidates:
        ok, lo, hi = _fits(ops, g_lo, g_hi)
        if ok:
            return ops, lo, hi
    ops = candidates[-1]
    _, lo, hi = _fits(ops, g_lo, g_hi)
    return ops, lo, hi


def requant_tail(g_lo: np.ndarray, g_hi: np.ndarray, bias: np.ndarray, rq: Requant,
                 out_dtype: str, k: int, where: str) -> list[AluOp]:
    """ALU ops turning the GEMM sum ``g`` (``g_lo <= g <= g_hi`` per channel) into the stored
    output: ``requant(g + bias)`` minus the storage offset, clipped; exact in int32."""
    off = stored_offset(out_dtype)
    zp, qmin, qmax = int(rq.zero_point) + off, int(rq.qmin) + off, int(rq.qmax) + off
    pre, s = int(rq.pre_shift), int(rq.shift)
    if pre < 0 or s < 0:
        raise MappingError(f"{where}: requantize shifts must be >= 0 (pre_shift {pre}, "
                           f"shift {s})")
    recipe = _Recipe(
        m=np.broadcast_to(np.asarray(rq.multiplier, dtype=np.int64).reshape(-1), (k,)).copy(),
        r=np.broadcast_to(np.asarray(rq.round_add, dtype=np.int64).reshape(-1), (k,)).copy(),
        bias=np.asarray(bias, dtype=np.int64), pre=pre, s=s, zp=zp)
    ops, lo, hi = _first_exact(recipe.simplified().candidates() + recipe.candidates(), g_lo,
                               g_hi)
    if lo.min() < qmin:
        ops.append(AluOp(ALU_MAX, recipe.full(qmin)))
    if hi.max() > qmax:
        ops.append(AluOp(ALU_MIN, recipe.full(qmax)))
    for op in ops:
        if _outside_int32(op.values):
            raise MappingError(f"{where}: requantize constant {op.values.min()}..{op.values.max()}"
                               f" of the ALU op does not fit int32")
    return ops


def bias_lanes(values: np.ndarray, block_in: int) -> np.ndarray | None:
    """int8 weights ``(K, block_in)`` with ``sum_j x_j * w[k, j] == values[k]`` for the
    constant input lanes ``x = (1, -128, ..., -128)`` (:func:`bias_input`), or None when a value
    is out of their reach (``|v|`` up to about ``16384 * (block_in - 1)``): a per-channel
    constant added by one GEMM micro-op per output entry (1 cycle) instead of an ALU ADD (2)."""
    v = np.asarray(values, dtype=np.int64)
    if block_in < 2:
        return None
    w0 = v % 128                 # lane 0 (input 1): the low part, 0..127
    need = -((v - w0) // 128)    # the other lanes (input -128) sum to this
    n = block_in - 1
    if np.any(need < -128 * n) or np.any(need > 127 * n):
        return None
    base, rem = need // n, need % n
    w = np.empty((len(v), block_in), dtype=np.int64)
    w[:, 0] = w0
    w[:, 1:] = base[:, None] + (np.arange(n)[None, :] < rem[:, None])
    return w.astype(np.int8)


def bias_input(cfg: VTAConfig) -> bytes:
    """The INP entry of the bias lanes: every batch row ``(1, -128, ..., -128)``."""
    x = np.full((cfg.batch, cfg.block_in), -128, dtype=np.int8)
    x[:, 0] = 1
    return x.tobytes()


def gemm_bias(ops: list[AluOp]) -> AluOp | None:
    """The tail's op done by the GEMM's bias lanes, if any."""
    return next((op for op in ops if op.on_gemm), None)


def alu_ops(ops: list[AluOp]) -> list[AluOp]:
    """The tail's ops the ALU runs."""
    return [op for op in ops if not op.on_gemm]


def conv_numerics(layer: ConvLayer, in_dtype: str, out_dtype: str,
                  cfg: VTAConfig) -> tuple[int, list[AluOp]]:
    """(zx', folded bias, ALU tail ops) of a conv/dense layer; raises MappingError."""
    where = f"layer {layer.name}"
    w = np.asarray(layer.weight)
    if w.size and (w.min() < -128 or w.max() > 127):
        raise MappingError(f"{where}: weight values {int(w.min())}..{int(w.max())} do not fit "
                           "int8 (VTA multiplies int8 x int8)")
    K = w.shape[0]
    zxp = int(layer.input_zero_point) + stored_offset(in_dtype)
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
    ops = requant_tail(g_lo, g_hi, bias_eff, layer.requant, out_dtype, K, where)
    if ops and ops[0].opcode == ALU_ADD and bias_lanes(ops[0].values, cfg.block_in) is not None:
        ops[0] = AluOp(ALU_ADD, ops[0].values, on_gemm=True)
    return zxp, ops


def add_numerics(layer: AddLayer, dtypes: tuple[str, str], out_dtype: str,
                 k: int) -> tuple[int, int, list[AluOp]]:
    where = f"layer {layer.name}"
    za = int(layer.a_zero_point) + stored_offset(dtypes[0])
    zb = int(layer.b_zero_point) + stored_offset(dtypes[1])
    ma, mb = int(layer.a_multiplier), int(layer.b_multiplier)
    for nm, v in (("a_multiplier", ma), ("b_multiplier", mb)):
        if not -(1 << 15) <= v < (1 << 15):
            raise MappingError(f"{where}: {nm} {v} does not fit the ALU's signed 16-bit "
                               "immediate")
    lo = min(-128 * ma, 127 * ma) + min(-128 * mb, 127 * mb)
    hi = max(-128 * ma, 127 * ma) + max(-128 * mb, 127 * mb)
    bias = np.full(k, -za * ma - zb * mb, dtype=np.int64)
    ops = requant_tail(np.full(k, lo, np.int64), np.full(k, hi, np.int64), bias, layer.requant,
                        out_dtype, k, where)
    return ma, mb, ops


def n_vec(ops: list[AluOp]) -> int:
    """ACC-resident operand vectors of a tail (ALU ops whose operand is not an immediate)."""
    return sum(1 for op in ops if not op.is_imm and not op.on_gemm)


def vector_image(ops: list[AluOp], k: int, cfg: VTAConfig) -> tuple[bytes, list[int | None]]:
    """ACC image ``[nvec][KB][BATCH][BLOCK]`` int32 of the non-immediate operands and, per op,
    its vector index (None for immediates)."""
    KB, B, BLK = cdiv(k, cfg.block_out), cfg.batch, cfg.block_out
    vecs, index = [], []
    for op in ops:
        if op.is_imm or op.on_gemm:
            index.append(None)
            continue
        v = np.zeros(KB * BLK, dtype=np.int64)
        v[:k] = op.values
        img = np.broadcast_to(v.reshape(KB, 1, BLK), (KB, B, BLK))
        index.append(len(vecs))
        vecs.append(img.astype("<i4"))
    data = np.stack(vecs).tobytes() if vecs else b""
    return data, index


class VectorLoads:
    """The tail's per-channel constant vectors (:func:`vector_image`) in ACC, per half of the
    double buffer: a tile LOADs them only when it needs others than the half holds (another
    channel range or image, or an edge tile that moved their region)."""

    def __init__(self, nvec: int, blocks: int):
        self.nvec, self.blocks = nvec, blocks
        self._held: dict[int, tuple[int, int, int]] = {}

    def load(self, em, half: int, vbase: int, dram: int, nc: int) -> None:
        """Make ``nc`` channel blocks of vectors from DRAM entry ``dram`` sit at ACC ``vbase``."""
        if self.nvec and self._held.get(half) != (vbase, dram, nc):
            self._held[half] = (vbase, dram, nc)
            em.emit(MemInsn(OP_LOAD, MEM_ACC, vbase, dram, self.nvec, nc, self.blocks))
