"""MARSELLUS requantize recipes: the canonical :class:`~tvm_accel.layers.Requant` written so
that it *is* the RBE / cluster NormQuant.

NormQuant (paper Sec. II-B, ``codegen`` docstring) computes per output channel
``y = clamp(floor((acc * kappa + lambda) / 2^shift))`` in int64, ``kappa`` u16, ``lambda`` i32,
``shift`` 0..31, no rounding term. The canonical recipe is
``((acc * m + R) >> s) + Z`` with ``pre_shift 0``; since ``Z * 2^s`` is a multiple of ``2^s``
both are equal with::

    kappa  = m                               (1..65535)
    lambda = R + Z * 2^s + kappa * C          R = 2^(s-1) (round half up, folded in lambda)

where ``C`` is what the engine does not add itself: the bias, minus the input zero point (and
the offset of signed activations stored unsigned for the RBE) times the weight sums. ``lambda``
must fit 32 signed bits, which bounds the shift: the solver takes the largest ``shift <= 31``
with ``kappa <= 65535`` and ``acc_bound[c] * kappa[c] + R + (|Z| + 128) * 2^s < 2^31`` for every
channel. ``|C[c]| <= acc_bound[c]`` always holds (the accumulator bound counts every weight
times the input reach, which is at least the input zero point plus the unsigned offset), and the
128 reserves the output offset, so every folded lambda of the layer fits. Precision is maximal
under these limits: the largest feasible shift gives the most significant bits of ``kappa``. The
residual add on the cluster has the same form with two 16-bit multipliers (``kappa_a``,
``kappa_b``) and a 32-bit ``lambda``.
"""

from __future__ import annotations

import numpy as np

from tvm_accel.layers import Requant
from tvm_accel.numerics import ApproximationError, RecipeError, recipe_error

KAPPA_MAX = (1 << 16) - 1
MAX_SHIFT = 31
LAMBDA_MAX = (1 << 31) - 1
#: headroom for a signed activation stored with the unsigned RBE offset 2^(bits-1)
OFFSET_RESERVE = 128


def _round_add(shift: int) -> int:
    return (1 << (shift - 1)) if shift > 0 else 0


def requant_recipe(scale: np.ndarray, acc_bound: np.ndarray, zero_point: int, qmin: int,
                   qmax: int) -> Requant:
    """NormQuant recipe for ``round(acc * scale[c]) + zero_point``: per-channel 16-bit kappa,
    one shift, rounding and zero point for lambda (RecipeError if no shift fits)."""
    s = np.atleast_1d(np.asarray(scale, np.float64)).ravel()
    b = np.broadcast_to(np.atleast_1d(np.asarray(acc_bound, np.float64)), s.shape)
    if np.any(~np.isfinite(s)) or np.any(s < 0):
        raise RecipeError("NormQuant scales must be finite and >= 0")
    bounds = [int(np.ceil(float(x))) for x in b]
    for sh in range(MAX_SHIFT, -1, -1):
        m = np.rint(s * 2.0 ** sh)
        kap = [0 if sc == 0 else max(1, int(x)) for sc, x in zip(s, m, strict=True)]
        if max(kap, default=0) > KAPPA_MAX:
            continue
        fixed = _round_add(sh) + (abs(int(zero_point)) + OFFSET_RESERVE) * (1 << sh)
        if max((k * bd for k, bd in zip(kap, bounds, strict=True)), default=0) + fixed \
                > LAMBDA_MAX:
            continue
        return Requant(pre_shift=0, multiplier=np.asarray(kap, np.int64),
                       round_add=np.full(len(kap), _round_add(sh), np.int64), shift=sh,
                       zero_point=int(zero_point), qmin=int(qmin), qmax=int(qmax), scale=s.copy())
    bound = max(bounds, default=0)
    raise RecipeError(f"no NormQuant recipe fits: scale up to {s.max():.3g} with accumulators up "
                      f"to {bound} needs kappa above 16 bits or lambda above 32 bits")


def add_recipe(scale_a: float, scale_b: float, zero_point: int, qmin: int,
               qmax: int) -> tuple[int, int, Requant]:
    """Cluster ADD recipe ``(kappa_a, kappa_b, requant)``: the shift with the smallest operand
    error whose kappas fit 16 bits and whose folded lambda (zero points of both operands up to
    255 x kappa, rounding, output zero point) fits 32 signed bits."""
    sa, sb = float(scale_a), float(scale_b)
    if not (np.isfinite(sa) and np.isfinite(sb)) or sa < 0 or sb < 0:
        raise RecipeError(f"add scales must be finite and >= 0 (got {sa}, {sb})")
    best = None
    for sh in range(MAX_SHIFT + 1):
        ma, mb = (0 if x == 0 else max(1, int(np.rint(x * 2.0 ** sh))) for x in (sa, sb))
        lam = 255 * (ma + mb) + _round_add(sh) + (abs(int(zero_point)) + 1) * (1 << sh)
        if max(ma, mb) > KAPPA_MAX or lam > LAMBDA_MAX:
            continue
        err = 255 * max(abs(ma / 2.0 ** sh - sa), abs(mb / 2.0 ** sh - sb))
        if best is None or err <= best[0]:
            best = (err, sh, ma, mb)
    if best is None:
        raise RecipeError(f"no cluster ADD recipe fits: scales {sa:.3g}, {sb:.3g}")
    _, sh, ma, mb = best
    rq = Requant(pre_shift=0, multiplier=np.ones(1, np.int64),
                 round_add=np.full(1, _round_add(sh), np.int64), shift=sh,
                 zero_point=int(zero_point), qmin=int(qmin), qmax=int(qmax),
                 scale=np.full(1, 2.0 ** -sh))
    return ma, mb, rq


def normquant_params(rq: Requant, folded: np.ndarray, out_offset: int = 0
                     ) -> tuple[np.ndarray, np.ndarray, int]:
    """``(kappa, lambda, shift)`` of a recipe; ``folded[c]`` is the per-channel constant the engine
    does not accumulate (bias minus zero-point corrections), ``out_offset`` is added to the
    output (unsigned storage of a signed tensor). ValueError if a lambda leaves 32 bits."""
    if rq.pre_shift != 0:
        raise ValueError(f"NormQuant has no pre-shift (recipe has {rq.pre_shift})")
    k = np.asarray(folded, np.int64).size
    kappa = np.broadcast_to(np.asarray(rq.multiplier, np.int64), (k,)).copy()
    ra = np.broadcast_to(np.asarray(rq.round_add, np.int64), (k,))
    lam = ra + ((int(rq.zero_point) + out_offset) << rq.shift) + kappa * np.asarray(folded,
                                                                                     np.int64)
    if kappa.min(initial=0) < 0 or kappa.max(initial=0) > KAPPA_MAX or not 0 <= rq.shift <= 31:
        raise ValueError("recipe does not fit NormQuant (kappa 16 bits, shift 0..31)")
    if lam.size and (lam.min() < -(1 << 31) or lam.max() > LAMBDA_MAX):
        raise ValueError("NormQuant lambda (bias and zero points folded) leaves 32 signed bits")
    return kappa, lam, int(rq.shift)


def approximation_error(rq: Requant, acc_bound=None) -> ApproximationError:
    """How far the NormQuant integers are from the float scale (same report as other targets)."""
    return recipe_error(rq, acc_bound)


def avgpool_recipe(scale: np.ndarray, acc_bound: np.ndarray, zero_point: int, qmin: int,
                   qmax: int) -> Requant:
    """AVGPOOL divides on the cluster with one 16-bit kappa: the NormQuant recipe of the
    (per-tensor) window-divided scale."""
    return requant_recipe(scale, acc_bound, zero_point, qmin, qmax)
