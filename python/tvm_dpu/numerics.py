"""DPU requantize recipe: power-of-two (fix-point) scales only.

The DPU's CONV engine and MISC ELTADD requantize by an arithmetic right shift with round half
up (``(acc + 2^(shift-1)) >> shift``, shift 0..31, scalar per instruction) and a clip; there is
no multiplier and no pre-shift. The recipe is therefore exact or does not exist: the core solver
with ``RecipeLimits(power_of_two=True)`` returns ``pre_shift 0, multiplier 1, round_add
2^(shift-1)`` for ``scale == 2^-shift`` and raises :class:`tvm_accel.numerics.RecipeError` for a
non-power-of-two ratio, so canonicalize keeps that layer float, on the CPU, with the reason.
Per-channel exponents are not supported (one ``shift`` field per CONV), so per-channel scales
must share one exponent. A left shift (``scale == 2^k``, multiplier ``2^k``) is a valid recipe
of the shared form, but CONV has no multiplier: the pattern check ``requant_is_shift`` keeps
such a layer on the CPU. The residual add gets ``ma = 2^ea``, ``mb = 2^eb`` (ELTADD's
``shift_a``/``shift_b``) and a common right shift.
"""

from __future__ import annotations

import numpy as np

from tvm_accel.layers import Requant
from tvm_accel.numerics import RecipeLimits, solve_add, solve_requant

#: DPU limits: shifts 0..31 (5-bit field), no multiplier (power of two), int32 accumulators
DPU_LIMITS = RecipeLimits(multiplier_max=1 << 30, intermediate_bits=64, max_shift=31,
                          max_pre_shift=0, power_of_two=True, hardware="DPU")


def requant_recipe(scale: np.ndarray, acc_bound: np.ndarray, zero_point: int, qmin: int,
                   qmax: int) -> Requant:
    """Exact shift recipe for ``round(acc * scale) + zero_point`` (RecipeError if scale is not a
    power of two)."""
    return solve_requant(scale, acc_bound, zero_point, qmin, qmax, DPU_LIMITS)


def add_recipe(scale_a: float, scale_b: float, zero_point: int, qmin: int,
               qmax: int) -> tuple[int, int, Requant]:
    """``(2^ea, 2^eb, shift recipe)`` for the residual add (RecipeError otherwise)."""
    return solve_add(scale_a, scale_b, zero_point, qmin, qmax, DPU_LIMITS, operand_bound=255)


#: AVGPOOL: ``(sum * mult + 2^(shift-1)) >> shift`` with a 16-bit ``mult``, shift 0..31, no
#: pre-shift, 64-bit intermediates; any window (1/9 is approximated like a multiplier)
AVGPOOL_LIMITS = RecipeLimits(multiplier_max=(1 << 16) - 1, intermediate_bits=64, max_shift=31,
                              max_pre_shift=0, hardware="DPU AVGPOOL")


def avgpool_recipe(scale: np.ndarray, acc_bound: np.ndarray, zero_point: int, qmin: int,
                   qmax: int) -> Requant:
    """Recipe of an average pool (the window divisor is part of ``scale``) on AVGPOOL."""
    return solve_requant(scale, acc_bound, zero_point, qmin, qmax, AVGPOOL_LIMITS)


#: MISC pool fields: 4-bit kernel, 3-bit stride
POOL_MAX_WINDOW, POOL_MAX_STRIDE = 15, 7
#: at most this many pools for one global average pool
MAX_POOL_STEPS = 3


def _axis_chains(n: int, steps: int) -> list[tuple[int, ...]]:
    """Factorizations ``n = k_1 * ... * k_steps``: every step but the last a stride = window
    pool (``k <= POOL_MAX_STRIDE``), the last a window ``<= POOL_MAX_WINDOW``."""
    if steps == 1:
        return [(n,)] if n <= POOL_MAX_WINDOW else []
    return [(k, *rest) for k in range(1, POOL_MAX_STRIDE + 1) if n % k == 0
            for rest in _axis_chains(n // k, steps - 1)]


def global_pool_steps(h: int, w: int, dtype: str,
                      zero_points: tuple[int, int]) -> list[tuple[int, int]] | None:
    """A global average pool over more than the 15 x 15 AVGPOOL window, in steps: average
    pools with stride = window (at most 7, the stride field) down to a map of at most 15 x 15,
    then the global pool (``AccelTarget.global_pool_steps``). Fewest steps first, then the most
    power-of-two windows (their 1/(kh*kw) is a shift: exact), then the largest first window
    (the smallest intermediate map). None when one window holds the map, when AVGPOOL cannot
    run the steps (not int8 with zero points 0) or when no split exists (a prime side > 15)."""
    if (h <= POOL_MAX_WINDOW and w <= POOL_MAX_WINDOW) or dtype != "int8" or any(zero_points):
        return None
    for n in range(2, MAX_POOL_STEPS + 1):
        splits = [list(zip(a, b, strict=True)) for a in _axis_chains(h, n)
                  for b in _axis_chains(w, n)]
        splits = [s for s in splits if all(kh * kw > 1 for kh, kw in s)]
        if splits:
            def rank(s):
                inexact = sum((kh * kw) & (kh * kw - 1) != 0 for kh, kw in s)
                return inexact, [-kh * kw for kh, kw in s]
            return min(splits, key=rank)
    return None


#: slope of the nonlinear module's LeakyReLU: 26/256 = 0.1015625 (the DPUCZDX8G's fixed slope;
#: Vitis AI's quantizer rounds a model's 0.1 to it)
LEAKY_SLOPE_NUM, LEAKY_SLOPE_SHIFT = 26, 8
LEAKY_SLOPE = LEAKY_SLOPE_NUM / (1 << LEAKY_SLOPE_SHIFT)


def leaky_relu(c: np.ndarray) -> np.ndarray:
    """The nonlinear module's LeakyReLU on the CONV's int8 result ``c``: ``c`` when ``c >= 0``,
    else ``(26 * c + 128) >> 8`` (round half up); the output keeps the input's scale."""
    c = np.asarray(c, dtype=np.int64)
    rnd = 1 << (LEAKY_SLOPE_SHIFT - 1)
    return np.where(c >= 0, c, (LEAKY_SLOPE_NUM * c + rnd) >> LEAKY_SLOPE_SHIFT)


def leaky_mismatch(lut: np.ndarray, lut_lo: int, qmin: int, qmax: int) -> str | None:
    """The first code where a conv's fused table is not what the CONV computes with ``leaky``
    set (None: none, the table is the DPU's LeakyReLU). The CONV clips its result to int8 and
    the module maps it, so the table of ``clip(v, qmin, qmax)`` must equal :func:`leaky_relu`
    of ``v`` for every int8 ``v``, in every row (256 codes: an exhaustive check)."""
    codes = np.arange(-128, 128)
    dpu = leaky_relu(codes)
    for row in np.asarray(lut, dtype=np.int64).reshape(-1, 256):
        ref = row[np.clip(codes, qmin, qmax) - lut_lo]
        bad = np.flatnonzero(ref != dpu)
        if bad.size:
            return (f"code {int(codes[bad[0]])} -> {int(ref[bad[0]])} in the model's table, "
                    f"{int(dpu[bad[0]])} on the DPU")
    return None
