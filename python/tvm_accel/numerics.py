"""Fixed-point requantize recipes: solver, Relax emitter and error report.

A recipe is a :class:`tvm_accel.layers.Requant` (``((acc >> pre) * m[c] + round) >> shift``,
plus the zero point and the clip) approximating ``round(acc * scale[c]) + zero_point``.
Hardware differs in how wide the multiplier may be, how wide the lanes that hold every
intermediate are, and whether a pre-shift exists; :class:`RecipeLimits` captures that and
:func:`solve_requant` / :func:`solve_add` pick the best integers under those limits. A target's
``requant_recipe`` is normally a one-line call with its own limits (see
``tvm_vta_cp.numerics``); ``target=None`` in canonicalize uses :data:`CPU_LIMITS` (int64 lanes,
31-bit multipliers). How "best" is measured and the power-of-two (fix-point) case:
docs/architecture.md section 4.2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm_accel.errors import AccelError
from tvm_accel.layers import DTYPE_RANGE, Requant


class RecipeError(AccelError, ValueError):
    """No recipe satisfies the limits (scale out of range for the hardware); canonicalize
    leaves the layer float, on the CPU, with this message as the reason."""


@dataclass(frozen=True)
class RecipeLimits:
    """Hardware limits of a requantize unit."""

    #: multipliers lie in [1, multiplier_max] (0 only for a zero scale)
    multiplier_max: int = (1 << 31) - 1
    #: every intermediate must fit a signed integer of this many bits
    intermediate_bits: int = 64
    #: largest shift (after the multiply); shifts are >= 0
    max_shift: int = 62
    #: largest pre-shift (before the multiply); 0 = the hardware has no pre-shift
    max_pre_shift: int = 31
    #: the hardware requantizes by shifting only (fix-point): exact power-of-two recipes or
    #: RecipeError (see the module docstring)
    power_of_two: bool = False
    #: with ``power_of_two``: the hardware shifts each output channel by its own amount
    per_channel_shift: bool = False
    #: what to call the hardware in error messages
    hardware: str = "hardware"

    @property
    def lane_max(self) -> int:
        return (1 << (self.intermediate_bits - 1)) - 1


#: default ``max_requant_error`` of the requantize guard (tvm_accel.canonicalize.guard), in
#: output LSBs: healthy recipes measure <= 1.2 (MARSELLUS's 16-bit kappa on VGG-16), VTA <= 0.5
#: (its cost-aware recipe's budget), the DPU 0; a recipe beyond 2 LSB is a broken layer
DEFAULT_MAX_REQUANT_ERROR = 2.0


#: the generic CPU recipe (target=None): int64 intermediates, 31-bit multipliers
CPU_LIMITS = RecipeLimits()


def _as_channels(scale, acc_bound) -> tuple[np.ndarray, list[int]]:
    s = np.atleast_1d(np.asarray(scale, dtype=np.float64)).ravel()
    b = np.broadcast_to(np.atleast_1d(np.asarray(acc_bound)), s.shape)
    if np.any(~np.isfinite(s)) or np.any(s < 0):
        raise RecipeError(f"scales must be finite and >= 0 (got min {s.min()}, max {s.max()})")
    bounds = [int(np.ceil(float(x))) for x in b]
    if any(x < 0 for x in bounds):
        raise RecipeError("accumulator bounds must be >= 0")
    return s, bounds


def _multipliers(scale: np.ndarray, total_shift: int) -> list[int]:
    m = np.rint(scale * 2.0 ** total_shift)
    return [0 if sc == 0 else max(1, int(x)) for sc, x in zip(scale, m, strict=True)]


def _fits(mults: list[int], bounds: list[int], pre_shift: int, shift: int, round_adds,
          zero_point: int, limits: RecipeLimits) -> bool:
    """Exact overflow check of the whole chain for every channel and ``|acc| <= bound``."""
    hi = limits.lane_max
    lo = -hi - 1
    for m, b, r in zip(mults, bounds, round_adds, strict=True):
        if m > limits.multiplier_max or b > hi:  # the accumulator itself must fit the lane
            return False
        a_hi = b >> pre_shift                                 # floor(b / 2^p)
        a_lo = -((b + (1 << pre_shift) - 1) >> pre_shift)     # floor(-b / 2^p)
        p_hi, p_lo = a_hi * m, a_lo * m
        if p_hi > hi or p_lo < lo or p_hi + r > hi or p_lo + r < lo:
            return False
        t_hi, t_lo = ((p_hi + r) >> shift) + zero_point, ((p_lo + r) >> shift) + zero_point
        if t_hi > hi or t_lo < lo:
            return False
    return True


def _round_add(shift: int) -> int:
    return (1 << (shift - 1)) if shift > 0 else 0


def _error_terms(scale: np.ndarray, bounds, mults, pre_shift: int, shift: int, zero_point: int,
                 qmin: int, qmax: int) -> tuple[float, float]:
    eff = np.asarray(mults, dtype=np.float64) / 2.0 ** (pre_shift + shift)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(scale == 0, 0.0, np.abs(eff - scale) / np.where(scale == 0, 1, scale))
    reach = max(qmax - zero_point, zero_point - qmin) + 1
    span = np.minimum(np.asarray(bounds, dtype=np.float64) * scale, reach)
    lsb = span * rel + eff * ((1 << pre_shift) - 1)
    return float(lsb.max(initial=0.0)), float(rel.max(initial=0.0))


#: relative tolerance of "this scale is a power of two"
POW2_RTOL = 1e-6


def power_of_two_exponent(x: float, rtol: float = POW2_RTOL) -> int | None:
    """``k`` if ``x`` is ``2^k`` (within ``rtol``), else None (also for 0, negative, inf)."""
    x = float(x)
    if not np.isfinite(x) or x <= 0:
        return None
    k = int(np.round(np.log2(x)))
    return k if abs(x / 2.0 ** k - 1.0) <= rtol else None


def _not_pow2(x: float, limits: RecipeLimits) -> RecipeError:
    return RecipeError(f"scale ratio {x:.4g} is not a power of two (the {limits.hardware} "
                       "requantizes by shifting); quantize with power-of-two scales")


def _solve_pow2(s: np.ndarray, bounds: list[int], zero_point: int, qmin: int, qmax: int,
                limits: RecipeLimits) -> Requant:
    exps: list[int | None] = []
    for x in s:
        if x == 0:
            exps.append(None)
            continue
        e = power_of_two_exponent(x)
        if e is None:
            raise _not_pow2(x, limits)
        exps.append(e)
    known = [e for e in exps if e is not None]
    if not known:
        known = [0]
    if len(set(known)) > 1 and not limits.per_channel_shift:
        raise RecipeError(
            f"per-channel scale ratios 2^{min(known)}..2^{max(known)} need per-channel shifts "
            f"(the {limits.hardware} shifts a whole layer by one amount); quantize weights per "
            "tensor")
    shift = max(0, -min(known))
    if shift > limits.max_shift:
        raise RecipeError(f"scale ratio 2^{min(known)} needs a right shift of {shift}, more "
                          f"than the {limits.hardware}'s {limits.max_shift}")
    mults = [0 if e is None else 1 << (shift + e) for e in exps]
    r = _round_add(shift)
    if max(mults) > limits.multiplier_max or not _fits(mults, bounds, 0, shift, [r] * len(mults),
                                                       zero_point, limits):
        raise RecipeError(f"scale ratio 2^{max(known)} with accumulators up to {max(bounds)} "
                          f"overflows the {limits.hardware}'s {limits.intermediate_bits}-bit "
                          "lanes")
    return Requant(pre_shift=0, multiplier=np.asarray(mults, dtype=np.int64),
                   round_add=np.full(len(mults), r, dtype=np.int64), shift=shift,
                   zero_point=int(zero_point), qmin=int(qmin), qmax=int(qmax), scale=s.copy())


def solve_requant(scale, acc_bound, zero_point: int, qmin: int, qmax: int,
                  limits: RecipeLimits = CPU_LIMITS) -> Requant:
    """Best :class:`Requant` for per-channel ``scale`` and ``|acc| <= acc_bound`` under ``limits``.

    ``round_add`` is ``2^(shift-1)`` for every channel (round half up; 0 when ``shift`` is 0).
    Raises :class:`RecipeError` if no (pre_shift, shift) satisfies the limits, e.g. a scale
    larger than ``multiplier_max`` or an accumulator bound wider than the lanes. With
    ``limits.power_of_two`` the recipe is the exact shift of the module docstring, or
    :class:`RecipeError` when a scale is not a power of two.
    """
    s, bounds = _as_channels(scale, acc_bound)
    if limits.power_of_two:
        return _solve_pow2(s, bounds, zero_point, qmin, qmax, limits)
    best = None
    for p in range(limits.max_pre_shift + 1):
        if p and all((b >> (p - 1)) == 0 for b in bounds):
            break  # further pre-shifting only discards information
        # largest feasible shift for this pre-shift (constraints are monotone in shift)
        lo_s, hi_s = -1, limits.max_shift
        while lo_s < hi_s:
            mid = (lo_s + hi_s + 1) // 2
            if _fits(_multipliers(s, p + mid), bounds, p, mid, [_round_add(mid)] * len(bounds),
                     zero_point, limits):
                lo_s = mid
            else:
                hi_s = mid - 1
        if lo_s < 0:
            continue
        mults = _multipliers(s, p + lo_s)
        lsb, rel = _error_terms(s, bounds, mults, p, lo_s, zero_point, qmin, qmax)
        key = (lsb, rel, p)
        if best is None or key < best[0]:
            best = (key, p, lo_s, mults)
    if best is None:
        raise RecipeError(
            f"no requantize recipe fits: scale up to {s.max():.3g} with accumulators up to "
            f"{max(bounds)} exceed a {limits.multiplier_max}-max multiplier on "
            f"{limits.intermediate_bits}-bit lanes")
    _, p, sh, mults = best
    r = _round_add(sh)
    return Requant(pre_shift=p, multiplier=np.asarray(mults, dtype=np.int64),
                   round_add=np.full(len(mults), r, dtype=np.int64), shift=sh,
                   zero_point=int(zero_point), qmin=int(qmin), qmax=int(qmax), scale=s.copy())


def solve_add(scale_a: float, scale_b: float, zero_point: int, qmin: int, qmax: int,
              limits: RecipeLimits = CPU_LIMITS,
              operand_bound: int = 255) -> tuple[int, int, Requant]:
    """Residual add ``round((a - za) * scale_a + (b - zb) * scale_b) + zero_point``.

    Scales are already divided by the output scale. Returns ``(ma, mb, requant)`` with
    ``requant`` of the add form (pre_shift 0, multiplier 1, round_add ``2^(shift-1)``) applied to
    ``(a - za) * ma + (b - zb) * mb``; ``|a - za|, |b - zb| <= operand_bound`` (255 for 8 bits).
    The shift minimising the worst operand error ``operand_bound * |m / 2^shift - scale|`` is
    chosen among those where ``ma, mb <= multiplier_max`` and nothing overflows the lanes.
    """
    sa, sb = float(scale_a), float(scale_b)
    if not (np.isfinite(sa) and np.isfinite(sb)) or sa < 0 or sb < 0:
        raise RecipeError(f"add scales must be finite and >= 0 (got {sa}, {sb})")
    if limits.power_of_two:
        return _solve_add_pow2(sa, sb, zero_point, qmin, qmax, limits, operand_bound)
    best = None
    for sh in range(limits.max_shift + 1):
        ma, mb = _multipliers(np.array([sa, sb]), sh)
        r = _round_add(sh)
        top = operand_bound * (ma + mb) + r
        if (max(ma, mb) > limits.multiplier_max or top > limits.lane_max
                or (top >> sh) + abs(zero_point) > limits.lane_max):
            continue
        err = operand_bound * max(abs(ma / 2.0 ** sh - sa), abs(mb / 2.0 ** sh - sb))
        if best is None or err <= best[0]:
            best = (err, sh, ma, mb)
    if best is None:
        raise RecipeError(f"no add recipe fits: scales {sa:.3g}, {sb:.3g} need multipliers "
                          f"above {limits.multiplier_max}")
    _, sh, ma, mb = best
    rq = Requant(pre_shift=0, multiplier=np.ones(1, dtype=np.int64),
                 round_add=np.full(1, _round_add(sh), dtype=np.int64),
                 shift=sh, zero_point=int(zero_point), qmin=int(qmin), qmax=int(qmax),
                 scale=np.full(1, 2.0 ** -sh))
    return int(ma), int(mb), rq


def _solve_add_pow2(sa: float, sb: float, zero_point: int, qmin: int, qmax: int,
                    limits: RecipeLimits, operand_bound: int) -> tuple[int, int, Requant]:
    ea, eb = power_of_two_exponent(sa), power_of_two_exponent(sb)
    if ea is None:
        raise _not_pow2(sa, limits)
    if eb is None:
        raise _not_pow2(sb, limits)
    sh = max(0, -ea, -eb)
    ma, mb = 1 << (sh + ea), 1 << (sh + eb)
    r = _round_add(sh)
    top = operand_bound * (ma + mb) + r
    if sh > limits.max_shift or max(ma, mb) > limits.multiplier_max or top > limits.lane_max or (
            (top >> sh) + abs(zero_point) > limits.lane_max):
        raise RecipeError(f"add scales 2^{ea}, 2^{eb} need shifts beyond the "
                          f"{limits.hardware}'s limits")
    rq = Requant(pre_shift=0, multiplier=np.ones(1, dtype=np.int64),
                 round_add=np.full(1, r, dtype=np.int64), shift=sh, zero_point=int(zero_point),
                 qmin=int(qmin), qmax=int(qmax), scale=np.full(1, 2.0 ** -sh))
    return ma, mb, rq


@dataclass(frozen=True)
class ApproximationError:
    """How far a recipe is from its float scales."""

    #: largest relative error of the integer scale (``multiplier / 2^(pre_shift+shift)``)
    max_rel_error: float
    #: worst-case deviation from ``acc * scale`` before the final rounding, in output LSBs
    #: (scale error over the unsaturated output range plus the pre-shift's floor, plus a round
    #: add's distance from ``2^(shift-1)``)
    max_lsb_error: float


def recipe_error(rq: Requant, acc_bound=None) -> ApproximationError:
    """Approximation error of a requantize recipe against ``rq.scale``.

    ``acc_bound`` (per channel) limits the scale-error term to reachable accumulators; without
    it only the output range bounds it."""
    s = np.broadcast_to(np.asarray(rq.scale, dtype=np.float64),
                        np.asarray(rq.multiplier).shape).ravel()
    bounds = ([np.inf] * s.size if acc_bound is None
              else np.broadcast_to(np.asarray(acc_bound, dtype=np.float64), s.shape))
    lsb, rel = _error_terms(s, bounds, [int(m) for m in np.ravel(rq.multiplier)], rq.pre_shift,
                            rq.shift, rq.zero_point, rq.qmin, rq.qmax)
    # a round add other than 2^(shift-1) moves the rounding point by its offset (in LSBs)
    ra = np.ravel(np.asarray(rq.round_add, dtype=np.int64))
    if ra.size:
        lsb += float(np.abs(ra - _round_add(rq.shift)).max()) / 2.0 ** rq.shift
    return ApproximationError(max_rel_error=rel, max_lsb_error=lsb)


def add_error(scale_a: float, scale_b: float, ma: int, mb: int, rq: Requant,
              operand_bound: int = 255) -> ApproximationError:
    """Approximation error of an add recipe: relative error of ``ma / 2^shift`` vs ``scale_a``
    and ``mb / 2^shift`` vs ``scale_b``; LSB error over the full operand range."""
    d = 2.0 ** (rq.pre_shift + rq.shift)
    rel, lsb = 0.0, 0.0
    for s, m in ((scale_a, ma), (scale_b, mb)):
        e = abs(m / d - s)
        rel = max(rel, e / s if s else 0.0)
        lsb += operand_bound * e
    return ApproximationError(max_rel_error=rel, max_lsb_error=lsb)


def check_limits(rq: Requant, acc_bound, limits: RecipeLimits) -> list[str]:
    """Violations of ``limits`` by ``rq`` for ``|acc| <= acc_bound`` (empty list = fits)."""
    problems = []
    mults = [int(m) for m in np.ravel(rq.multiplier)]
    bounds = [int(np.ceil(float(b))) for b in
              np.broadcast_to(np.asarray(acc_bound), (len(mults),))]
    if not 0 <= rq.pre_shift <= limits.max_pre_shift:
        problems.append(f"pre_shift {rq.pre_shift} outside 0..{limits.max_pre_shift}")
    if not 0 <= rq.shift <= limits.max_shift:
        problems.append(f"shift {rq.shift} outside 0..{limits.max_shift}")
    if any(not 0 <= m <= limits.multiplier_max for m in mults):
        problems.append(f"multiplier outside 0..{limits.multiplier_max}")
    ra = [int(r) for r in np.broadcast_to(np.ravel(rq.round_add), (len(mults),))]
    if not _fits(mults, bounds, rq.pre_shift, rq.shift, ra, rq.zero_point, limits):
        problems.append(f"an intermediate exceeds {limits.intermediate_bits} bits")
    if limits.power_of_two:
        nz = [m for m in mults if m]
        if any(m & (m - 1) for m in nz):
            problems.append("a multiplier is not a power of two (the hardware only shifts)")
        if any(r != _round_add(rq.shift) for r in ra):
            problems.append("round_add is not 2^(shift-1)")
        if not limits.per_channel_shift and (len(set(nz)) > 1 or (
                nz and nz[0] != 1 and rq.shift != 0)):
            problems.append("channels need different shifts (one shift per layer)")
    return problems


# --- bounds ----------------------------------------------------------------------------------
def input_reach(dtype: str, zero_point: int) -> int:
    """``max(|qmax - zp|, |zp - qmin|)``: largest ``|x - zp|`` of a quantized input."""
    lo, hi = DTYPE_RANGE[dtype]
    return max(abs(hi - zero_point), abs(zero_point - lo))


def conv_acc_bound(weight: np.ndarray, bias: np.ndarray, in_dtype: str,
                   in_zero_point: int) -> np.ndarray:
    """Per output channel: ``sum_k |w_ck| * input_reach + |B_c|`` (``weight`` has its zero point
    removed; axis 0 is the output channel, e.g. OIHW)."""
    w = np.abs(weight.astype(np.int64)).reshape(weight.shape[0], -1).sum(axis=1)
    return w * input_reach(in_dtype, in_zero_point) + np.abs(bias.astype(np.int64))


# --- Relax emission --------------------------------------------------------------------------
def _const(value, dtype: str, shape=None):
    from tvm import relax

    arr = np.asarray(value, dtype=dtype)
    if shape is not None:
        arr = arr.reshape(shape)
    return relax.const(arr, dtype)


def _channel_shape(ndim: int, n: int, channel_axis: int) -> tuple[int, ...]:
    shape = [1] * ndim
    shape[channel_axis] = n
    return tuple(shape)


def emit_requant(bb, acc, rq: Requant, out_dtype: str, channel_axis: int = 1,
                 name: str = "requant", out_name: str | None = None):
    """Emit the canonical requantize chain of ``rq`` on the int32 ``acc`` into ``bb``.

    Writes (every op kept, even identities, so the pattern is fixed)::

        t = astype(acc, int64); t = right_shift(t, pre_shift); t = multiply(t, multiplier)
        t = add(t, round_add); t = right_shift(t, shift); t = add(t, zero_point)
        t = maximum(t, qmin); t = minimum(t, qmax); y = astype(t, out_dtype)

    ``multiplier`` and ``round_add`` constants are shaped to broadcast along ``channel_axis``
    (``(1, K, 1, 1)`` for conv, ``(1, K)`` for dense); the others are int64 scalars. Returns the
    var bound to ``y`` (named ``out_name`` or ``name``).
    """
    from tvm import relax

    R = relax.op
    ndim = len(acc.ty.shape)
    k = int(np.asarray(rq.multiplier).size)
    cshape = _channel_shape(ndim, k, channel_axis)
    ra = np.broadcast_to(np.asarray(rq.round_add, dtype=np.int64), (k,))
    t = bb.emit(R.astype(acc, "int64"), name_hint=f"{name}_i64")
    t = bb.emit(R.right_shift(t, _const(rq.pre_shift, "int64")), name_hint=f"{name}_pre")
    t = bb.emit(R.multiply(t, _const(rq.multiplier, "int64", cshape)), name_hint=f"{name}_mul")
    t = bb.emit(R.add(t, _const(ra, "int64", cshape)), name_hint=f"{name}_rnd")
    t = bb.emit(R.right_shift(t, _const(rq.shift, "int64")), name_hint=f"{name}_shr")
    t = bb.emit(R.add(t, _const(rq.zero_point, "int64")), name_hint=f"{name}_zp")
    t = bb.emit(R.maximum(t, _const(rq.qmin, "int64")), name_hint=f"{name}_max")
    t = bb.emit(R.minimum(t, _const(rq.qmax, "int64")), name_hint=f"{name}_min")
    return bb.emit(R.astype(t, out_dtype), name_hint=out_name or name)


def emit_add(bb, a, b, za: int, zb: int, ma: int, mb: int, rq: Requant, out_dtype: str,
             name: str = "add", out_name: str | None = None, acc_name: str | None = None):
    """Emit the canonical residual add: ``(a - za) * ma + (b - zb) * mb`` in int64, then the add
    requantize (``+ round_add``, ``>> shift``, ``+ zero_point``, clip, cast); all scalars.
    ``acc_name`` names the ``add(ta, tb)`` value (the layer's accumulator)."""
    from tvm import relax

    R = relax.op
    ra = int(np.ravel(rq.round_add)[0])
    ta = bb.emit(R.astype(a, "int64"), name_hint=f"{name}_a64")
    ta = bb.emit(R.subtract(ta, _const(za, "int64")), name_hint=f"{name}_ac")
    ta = bb.emit(R.multiply(ta, _const(ma, "int64")), name_hint=f"{name}_am")
    tb = bb.emit(R.astype(b, "int64"), name_hint=f"{name}_b64")
    tb = bb.emit(R.subtract(tb, _const(zb, "int64")), name_hint=f"{name}_bc")
    tb = bb.emit(R.multiply(tb, _const(mb, "int64")), name_hint=f"{name}_bm")
    t = bb.emit(R.add(ta, tb), name_hint=acc_name or f"{name}_sum")
    t = bb.emit(R.add(t, _const(ra, "int64")), name_hint=f"{name}_rnd")
    t = bb.emit(R.right_shift(t, _const(rq.shift, "int64")), name_hint=f"{name}_shr")
    t = bb.emit(R.add(t, _const(rq.zero_point, "int64")), name_hint=f"{name}_zp")
    t = bb.emit(R.maximum(t, _const(rq.qmin, "int64")), name_hint=f"{name}_max")
    t = bb.emit(R.minimum(t, _const(rq.qmax, "int64")), name_hint=f"{name}_min")
    return bb.emit(R.astype(t, out_dtype), name_hint=out_name or name)


def apply_add(a: np.ndarray, b: np.ndarray, za: int, zb: int, ma: int, mb: int,
              rq: Requant) -> np.ndarray:
    """numpy reference of :func:`emit_add` (int64, before the final cast)."""
    t = (a.astype(np.int64) - za) * ma + (b.astype(np.int64) - zb) * mb
    return rq.apply(t)
