"""Activations VTA's ALU can compose exactly: a LeakyReLU table as ``MUL``/``ADD``/``MAX``/``SHR``.

VTA's ALU has MIN, MAX, ADD, SHR and MUL on int32 lanes and no lookup, so a table
(``docs/architecture.md`` 4.4: Sigmoid, SiLU, Tanh, HardSwish, ...) cannot run there. A
LeakyReLU table is two lines joined at the input zero point; on the stored int8 codes ``x'``

    y' = clip(max(x' * m_pos + c_pos, x' * m_neg + c_neg) >> shift, -128, 127)

is one candidate form (``floor`` is monotone, so the shift after the ``MAX`` equals the max of
the two shifted lines). :func:`fit_leaky` searches it and keeps it only when it reproduces the
canonical table on all 256 codes (:meth:`LeakyAlu.apply`, int32 checked), so the ALU program is
bit-exact by exhaustion, never by argument. A table it cannot reproduce (a non-convex one, a
table per channel, a rounding the two lines miss) stays a table, on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tvm_vta_cp.layout import stored_offset

__all__ = ["LeakyAlu", "fit_leaky"]

_BIG = 1 << 60
_I32 = (-(1 << 31), (1 << 31) - 1)
#: signed 16-bit immediate of ``MUL``
_M_RANGE = (-(1 << 15), (1 << 15) - 1)
_MAX_SHIFT = 22
CODES = np.arange(-128, 128, dtype=np.int64)


@dataclass(frozen=True)
class LeakyAlu:
    """``y' = clip(max(x' * m_pos + c_pos, x' * m_neg + c_neg) >> shift)`` on stored codes."""

    m_pos: int
    c_pos: int
    m_neg: int
    c_neg: int
    shift: int

    def lines(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, dtype=np.int64)
        return x * self.m_pos + self.c_pos, x * self.m_neg + self.c_neg

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The ALU program on stored codes ``x'`` (int64 model; :meth:`fits_int32` says the
        int32 lanes never wrap)."""
        a, b = self.lines(x)
        return np.clip(np.maximum(a, b) >> self.shift, -128, 127)

    def fits_int32(self) -> bool:
        a, b = self.lines(CODES)
        both = np.concatenate([a, b, CODES * self.m_pos, CODES * self.m_neg])
        return bool(both.min() >= _I32[0] and both.max() <= _I32[1])


_PAIR_I, _PAIR_J = np.nonzero(CODES[:, None] > CODES[None, :])
_PAIR_D = CODES[_PAIR_I] - CODES[_PAIR_J]


def _fit_line(lo: np.ndarray, hi: np.ndarray) -> tuple[int, int] | None:
    """Integers ``(m, c)`` with ``lo <= x' * m + c <= hi`` on every code, or None. Eliminating
    ``c`` (Fourier-Motzkin) leaves one bound on ``m`` per pair of codes ``x_i > x_j``:
    ``(lo_i - hi_j) / d <= m <= (hi_i - lo_j) / d``, ``d = x_i - x_j``; exact for integers."""
    i, j, d = _PAIR_I, _PAIR_J, _PAIR_D
    m_lo = int((-((hi[j] - lo[i]) // d)).max())  # ceil((lo_i - hi_j) / d)
    m_hi = int(((hi[i] - lo[j]) // d).min())
    if m_lo > m_hi:
        return None
    m = int(np.clip(0, m_lo, m_hi))  # the smallest multiplier: the narrowest int32 range
    c_lo, c_hi = int((lo - CODES * m).max()), int((hi - CODES * m).min())
    return m, int(np.clip(0, c_lo, c_hi))


def _fit_at_shift(y: np.ndarray, s: int) -> LeakyAlu | None:
    """Two lines at shift ``s``: the steeper covers the codes from ``k`` up, the other those
    below; both stay at or under the table elsewhere (so the MAX picks the covering one)."""
    lo = np.where(y > -128, y << s, -_BIG)
    hi = np.where(y < 127, ((y + 1) << s) - 1, _BIG)

    def line(cover: np.ndarray):
        return _fit_line(np.where(cover, lo, -_BIG), hi)

    a, b = -128, 128  # smallest k whose suffix one line reproduces (monotone in k)
    while a < b:
        k = (a + b) // 2
        if line(CODES >= k) is not None:
            b = k
        else:
            a = k + 1
    pos, neg = line(CODES >= a), line(CODES < a)
    if pos is None or neg is None:
        return None
    return LeakyAlu(pos[0], pos[1], neg[0], neg[1], s)


@lru_cache(maxsize=256)
def _fit(table: bytes, in_dtype: str, out_dtype: str) -> LeakyAlu | None:
    y = np.frombuffer(table, dtype=out_dtype).astype(np.int64) + stored_offset(out_dtype)
    # a form at shift s is one at s + 1 (2m, 2c): feasibility grows with s, so the smallest
    # feasible shift (smallest multipliers) is found by bisection
    if _fit_at_shift(y, _MAX_SHIFT) is None:
        return None
    a, b = 0, _MAX_SHIFT
    while a < b:
        s = (a + b) // 2
        if _fit_at_shift(y, s) is not None:
            b = s
        else:
            a = s + 1
    f = _fit_at_shift(y, a)
    ok = (f is not None and _M_RANGE[0] <= min(f.m_pos, f.m_neg)
          and max(f.m_pos, f.m_neg) <= _M_RANGE[1] and f.fits_int32())
    return f if ok and np.array_equal(f.apply(CODES), y) else None


def fit_leaky(table: np.ndarray, in_dtype: str, out_dtype: str) -> LeakyAlu | None:
    """The ALU form of a one-row 256-entry table of an ``in_dtype`` input (entries in
    ``out_dtype``), checked on every code; None when no such form reproduces it."""
    t = np.asarray(table).reshape(-1)
    if t.size != 256 or in_dtype not in ("int8", "uint8") or out_dtype not in ("int8",
                                                                               "uint8"):
        return None
    # the stored code x' = x + offset reads table entry x - lo = x' + 128 for both dtypes
    return _fit(np.ascontiguousarray(t.astype(out_dtype)).tobytes(), in_dtype, out_dtype)
