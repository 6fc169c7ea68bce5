"""MARSELLUS requantize recipes: the canonical :class:`~tvm_accel.layers.Requant` written so
that it *is* the RBE / cluster NormQuant.

NormQuant (paper Sec. II-B, docs/marsellus.md Command ISA) computes per output channel
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
residual add is written so that the RBE can run it as a 1x1 BinConv over both operands stacked
along the input channels (weights ``wa`` on the first operand's channels and ``wb`` on the
second's, two scaled identity blocks)::

    ma = wa * kappa,  mb = wb * kappa       wa, wb unsigned W-bit (W = 2..8), kappa 16 bits
    y  = floor(((wa * xa + wb * xb) * kappa + lambda) / 2^shift)
    lambda = R + (Z + offset_out) * 2^s - kappa * (wa * (za + offset_a) + wb * (zb + offset_b))

(``xa``, ``xb`` the stored unsigned operands), which equals the canonical add
``(((a - za) * ma + (b - zb) * mb + R) >> s) + Z`` exactly; ``ma, mb`` also fit the cluster
ADD's two 16-bit multipliers, so either engine runs the one recipe. The scale ratio limited to
W-bit weights costs precision (worst case ~0.01-0.2 output LSB over 8-bit operands, against
~0.003 with free 16-bit multipliers), reported by ``--dump-offloads`` as for every recipe.
"""

from __future__ import annotations

import math

import numpy as np

from tvm_accel.layers import Requant
from tvm_accel.numerics import ApproximationError, RecipeError, recipe_error

KAPPA_MAX = (1 << 16) - 1
MAX_SHIFT = 31
LAMBDA_MAX = (1 << 31) - 1
#: headroom for a signed activation stored with the unsigned RBE offset 2^(bits-1)
OFFSET_RESERVE = 128
#: widest weight of an ADD on the RBE (the RBE's W) and the worst-case error, in output LSBs
#: over 8-bit operands, below which a narrower W is preferred (it costs less RBE energy)
ADD_MAX_WEIGHT_BITS = 8
ADD_LSB_TOLERANCE = 0.125
#: above this worst-case error the ADD takes the cluster-only recipe when it is more precise
ADD_RBE_MAX_LSB = 0.5


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
    """Residual ADD recipe ``(ma, mb, requant)`` that both engines run as it is: the RBE as a 1x1
    BinConv over the operands stacked along input channels (:func:`add_factors`), the cluster
    ADD with ``kappa_a = ma``, ``kappa_b = mb``.

    ``ma = wa * kappa`` and ``mb = wb * kappa`` with unsigned weights ``wa, wb < 2^W`` (W = 2..8)
    and one 16-bit NormQuant kappa; ``ma, mb`` fit the cluster's 16-bit fields and the folded
    lambda (zero points of both operands up to 255 x m, rounding, output zero point and offset)
    fits 32 signed bits. Among these the recipe takes the narrowest W whose worst-case error
    over 8-bit operands (``ADD_LSB_TOLERANCE``) is within tolerance, else the most precise one:
    the RBE's dynamic energy grows with W. A scale ratio so far from 1 that W-bit weights miss
    it by more than ``ADD_RBE_MAX_LSB`` gets the free 16-bit multipliers of the cluster ADD
    (the layer then stays on the cluster). RecipeError if no shift fits."""
    sa, sb = float(scale_a), float(scale_b)
    if not (np.isfinite(sa) and np.isfinite(sb)) or sa < 0 or sb < 0:
        raise RecipeError(f"add scales must be finite and >= 0 (got {sa}, {sb})")
    best = _add_search(sa, sb, int(zero_point))
    good = [w for w in sorted(best) if best[w][0] <= ADD_LSB_TOLERANCE]
    w = good[0] if good else min(best, key=lambda x: (best[x][0], x), default=None)
    cluster = _cluster_add(sa, sb, int(zero_point))
    if cluster is None:
        raise RecipeError(f"no ADD recipe fits: scales {sa:.3g}, {sb:.3g} need multipliers "
                          "above 16 bits")
    if w is None or (best[w][0] > ADD_RBE_MAX_LSB and cluster[0] < best[w][0]):
        _, sh, ma, mb = cluster  # scale ratio beyond W-bit weights: cluster ADD only
    else:
        _, sh, ma, mb = best[w]
    rq = Requant(pre_shift=0, multiplier=np.ones(1, np.int64),
                 round_add=np.full(1, _round_add(sh), np.int64), shift=sh,
                 zero_point=int(zero_point), qmin=int(qmin), qmax=int(qmax),
                 scale=np.full(1, 2.0 ** -sh))
    return ma, mb, rq


def _cluster_add(sa: float, sb: float, zero_point: int) -> tuple[float, int, int, int] | None:
    """``(error, shift, ma, mb)`` of the most precise ADD with free 16-bit multipliers (the
    cluster ADD alone), or None."""
    best = None
    for sh in range(MAX_SHIFT + 1):
        ma, mb = (0 if x == 0 else max(1, int(np.rint(x * 2.0 ** sh))) for x in (sa, sb))
        lam = 255 * (ma + mb) + _round_add(sh) + (abs(zero_point) + OFFSET_RESERVE) * (1 << sh)
        if max(ma, mb) > KAPPA_MAX or lam > LAMBDA_MAX:
            continue
        err = 255 * (abs(ma / 2.0 ** sh - sa) + abs(mb / 2.0 ** sh - sb))
        if best is None or err <= best[0]:
            best = (err, sh, ma, mb)
    return best


def _add_search(sa: float, sb: float, zero_point: int) -> dict[int, tuple[float, int, int, int]]:
    """Most precise ``(error, shift, ma, mb)`` per weight width W (2..8) of :func:`add_recipe`.

    Candidates: for every weight ``wa`` (``wb``) the two weights ``wb`` (``wa``) nearest the
    scale ratio (the best rational approximations are among them) and a zero weight, and for
    every shift the kappas next to the two breakpoints of the convex error
    ``|wa k - A| + |wb k - B|``."""
    top = (1 << ADD_MAX_WEIGHT_BITS) - 1
    w = np.arange(1, top + 1, dtype=np.float64)
    cand = [np.zeros((1, 2)), np.stack([w * 0, w], axis=1), np.stack([w, w * 0], axis=1)]
    if sa > 0 and sb > 0:  # a scale far below the other may still round to a zero weight
        cand += [np.stack([w, f(w * sb / sa)], axis=1) for f in (np.floor, np.ceil)]
        cand += [np.stack([f(w * sa / sb), w], axis=1) for f in (np.floor, np.ceil)]
    pairs = np.concatenate(cand)
    pairs = pairs[(pairs >= 0).all(axis=1) & (pairs <= top).all(axis=1)]
    wa, wb = pairs[:, 0], pairs[:, 1]
    big = np.maximum(wa, wb)
    wbits = np.maximum(2, np.ceil(np.log2(big + 1))).astype(np.int64)
    best: dict[int, tuple[float, int, int, int]] = {}
    for sh in range(MAX_SHIFT + 1):
        a, b = sa * 2.0 ** sh, sb * 2.0 ** sh
        with np.errstate(divide="ignore", invalid="ignore"):
            bases = [np.where(wa > 0, a / np.maximum(wa, 1), np.nan),
                     np.where(wb > 0, b / np.maximum(wb, 1), np.nan)]
        k = np.stack([f(x) for x in bases for f in (np.floor, np.ceil)])
        k = np.nan_to_num(k, nan=1.0)
        ma, mb = wa * k, wb * k
        lam = 255 * (ma + mb) + _round_add(sh) + (abs(zero_point) + OFFSET_RESERVE) * 2.0 ** sh
        ok = (k >= 1) & (ma <= KAPPA_MAX) & (mb <= KAPPA_MAX) & (lam <= LAMBDA_MAX)
        err = np.where(ok, 255 * (np.abs(ma / 2.0 ** sh - sa) + np.abs(mb / 2.0 ** sh - sb)),
                       np.inf)
        i = np.argmin(err, axis=0)
        e = err[i, np.arange(err.shape[1])]
        for bits in range(2, ADD_MAX_WEIGHT_BITS + 1):
            m = np.where(wbits <= bits, e, np.inf)
            j = int(np.argmin(m))
            if np.isfinite(m[j]) and (bits not in best or m[j] < best[bits][0] - 1e-12):
                best[bits] = (float(m[j]), sh, int(ma[i[j], j]), int(mb[i[j], j]))
    return best


def add_factors(ma: int, mb: int) -> tuple[int, int, int, int]:
    """``(wa, wb, kappa, W)`` of an ADD recipe on the RBE: the smallest unsigned weights with
    ``ma = wa * kappa``, ``mb = wb * kappa`` (kappa = gcd) and their width W (at least 2)."""
    ma, mb = int(ma), int(mb)
    if ma < 0 or mb < 0:
        raise ValueError(f"add multipliers must be >= 0 (got {ma}, {mb})")
    g = math.gcd(ma, mb) or 1
    wa, wb = ma // g, mb // g
    return wa, wb, g, max(2, max(wa, wb).bit_length())


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
