"""VTA's requantize recipe: the integers VTA's ALU uses to turn int32 accumulators into int8.

VTA has no requantize unit; the strategy writes the recipe as a sequence of ALU instructions on
the ACC lanes (``SHR``, ``MUL``, ``ADD``, ``SHR``, ``ADD``, ``MAX``, ``MIN``) before the STORE
narrows each lane to 8 bits. The choices, and why:

- **int32 lanes.** Every ALU result lives in an int32 ACC lane and ``ADD``/``MUL`` wrap, so every
  intermediate of the chain must fit int32 for every accumulator ``|acc| <= acc_bound``. The
  solver checks this exactly (:func:`tvm_accel.numerics.check_limits`), per output channel.
- **Multiplier 1..32767.** ``MUL`` takes a signed 16-bit immediate (or a per-channel vector
  loaded into ACC, which we keep in the same range so either form works); positive scales need
  positive multipliers, so at most 15 bits of precision.
- **Scalar pre_shift (0..31).** Large accumulators (e.g. 3x3x256 convs, ``|acc|`` up to ~2^25)
  leave too little headroom for a 15-bit multiplier, so the chain may first shift the
  accumulator right (``SHR``, arithmetic). The solver trades the precision this floor discards
  against the multiplier's precision (see the module docstring of ``tvm_accel.numerics``).
- **Scalar shift (0..31)** after the multiply. Note: the public HLS core reads the shift amount
  from the low 5 bits as a *signed* value, i.e. only 0..15 would shift right there; our
  simulator follows the functional simulator (any amount), so 0..31 is used.
- **round_add = 2^(shift-1)** (0 when shift is 0): round half up, a per-channel array of equal
  values so the strategy can use an immediate ``ADD`` or a vector one.
- **Scalar zero point, qmin, qmax**: ``ADD`` imm, then ``MAX``/``MIN`` imm (a fused ReLU/Clip is a
  tighter qmin/qmax), then STORE truncates to 8 bits, which is exact after the clip.
- **Cost-aware choice.** Every tail op costs ``ALU_CYCLES_PER_UOP`` per ACC entry in the
  compute module the GEMM shares, so :func:`requant_recipe` takes the cheapest recipe (fewest
  ALU ops, :func:`tail_alu_ops`) among the most accurate one, the best one without a pre-shift
  and a shift-only one (multiplier 1), each also with its round add moved to a multiple of
  the multiplier (:func:`round_before_multiply`: the tail's whole constant is then added
  before the MUL, by the GEMM), whose worst-case error stays within
  ``max(error of the most accurate, CHEAP_RECIPE_BUDGET_LSB)``; docs/vta.md (Numerics) has
  the measurements behind the budget.
- **Residual add.** ``(a - za) * ma + (b - zb) * mb`` with ``ma, mb <= 32767`` and
  ``255 * ma + 255 * mb + round_add < 2^31``, then the same shift/zero point/clip tail (pre_shift
  0, multiplier 1).
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import replace

import numpy as np

from tvm_accel.layers import Requant
from tvm_accel.numerics import (
    RecipeError,
    RecipeLimits,
    check_limits,
    recipe_error,
    solve_add,
    solve_requant,
)

#: VTA ALU limits (int32 lanes, 16-bit signed MUL immediate, shifts 0..31)
VTA_LIMITS = RecipeLimits(multiplier_max=(1 << 15) - 1, intermediate_bits=32, max_shift=31,
                          max_pre_shift=31)

#: a recipe cheaper than the most accurate one is taken when its worst-case error (output LSBs,
#: ``recipe_error``) is at most max(the most accurate one's, this); see docs/vta.md (Numerics)
CHEAP_RECIPE_BUDGET_LSB = 0.5


def _stored_zero_point(rq: Requant) -> int:
    """The zero point as VTA stores the output (uint8 as value - 128; uint8 when qmax > 127)."""
    return int(rq.zero_point) - (128 if rq.qmax > 127 else 0)


def rounds_before_multiply(rq: Requant) -> bool:
    """Whether the round add and the stored zero point are a multiple of the multiplier in
    every channel (``round_add + zp * 2^shift == c * m``), so the whole constant of the tail
    is added before the multiply, as ``c * 2^pre_shift`` on the accumulator: one ADD that rides
    on the GEMM (``strategy.alu_tail``, bias lanes)."""
    m = np.ravel(np.asarray(rq.multiplier, dtype=np.int64))
    if m.size == 0 or np.any(m <= 0):
        return False
    total = np.ravel(np.asarray(rq.round_add, dtype=np.int64)) + (
        _stored_zero_point(rq) << rq.shift)
    return bool(np.all(total % m == 0))


def tail_alu_ops(rq: Requant) -> int:
    """ALU ops per output entry of ``rq``'s tail on VTA, clip included. Rounding before the
    multiply (:func:`rounds_before_multiply`): the bias, round add and zero point are one
    constant added to the accumulator by the GEMM (its bias lanes), so only the shifts, the
    MUL and the clip are ALU ops. Otherwise the bias and zero point ride on the round add when
    there is no pre-shift; ``strategy.alu_tail`` may drop more."""
    mul = int(bool(np.any(np.asarray(rq.multiplier) != 1)))
    shr = int(rq.shift > 0)
    if rounds_before_multiply(rq):
        return int(rq.pre_shift > 0) + mul + shr + 2
    pre = 2 if rq.pre_shift else 0  # its own SHR, and the bias needs its own ADD before it
    return pre + mul + 1 + shr + 2


def round_before_multiply(rq: Requant, acc_bound: np.ndarray) -> Requant | None:
    """``rq`` with its round add moved to the nearest value that makes
    :func:`rounds_before_multiply` hold (``c = round((2^(shift-1) + zp * 2^shift) / m)``,
    round add ``c * m - zp * 2^shift``), or None when ``rq`` rounds before the multiply
    already or the new constant breaks the int32 limits. The rounding point moves by at most
    ``m / 2^(shift+1)`` LSB (``recipe_error`` counts it)."""
    m = np.ravel(np.asarray(rq.multiplier, dtype=np.int64))
    if rounds_before_multiply(rq) or m.size == 0 or np.any(m <= 0):
        return None
    zps = _stored_zero_point(rq) << rq.shift
    target = ((1 << rq.shift) >> 1) + zps
    c = (target + m // 2) // m
    out = replace(rq, round_add=(c * m - zps).astype(np.int64))
    return None if check_limits(out, acc_bound, VTA_LIMITS) else out


def shift_only_recipe(scale: np.ndarray, acc_bound: np.ndarray, zero_point: int, qmin: int,
                      qmax: int) -> Requant | None:
    """The most accurate recipe with multiplier 1 and no pre-shift (``(acc + r) >> s``) within
    :data:`VTA_LIMITS`, or None (a zero scale, or no shift fits)."""
    s = np.atleast_1d(np.asarray(scale, dtype=np.float64)).ravel()
    if s.size == 0 or np.any(s <= 0):
        return None
    exps = -np.log2(s)
    shifts = {int(np.clip(f(e), 0, VTA_LIMITS.max_shift)) for e in exps
              for f in (np.floor, np.ceil)}
    best = None
    for sh in sorted(shifts):
        rq = Requant(pre_shift=0, multiplier=np.ones(s.size, dtype=np.int64),
                     round_add=np.full(s.size, (1 << sh) >> 1, dtype=np.int64), shift=sh,
                     zero_point=int(zero_point), qmin=int(qmin), qmax=int(qmax), scale=s.copy())
        if check_limits(rq, acc_bound, VTA_LIMITS):
            continue
        err = recipe_error(rq, acc_bound).max_lsb_error
        if best is None or err < best[0]:
            best = (err, rq)
    return None if best is None else best[1]


def requant_candidates(scale: np.ndarray, acc_bound: np.ndarray, zero_point: int, qmin: int,
                       qmax: int) -> list[Requant]:
    """The most accurate recipe first, then the cheaper forms: the best without a pre-shift
    and the shift-only one (those that exist), then each of them rounding before the multiply
    (:func:`round_before_multiply`)."""
    best = solve_requant(scale, acc_bound, zero_point, qmin, qmax, VTA_LIMITS)
    out = [best]
    if best.pre_shift:
        with suppress(RecipeError):  # no recipe without a pre-shift fits: no such candidate
            out.append(solve_requant(scale, acc_bound, zero_point, qmin, qmax,
                                     replace(VTA_LIMITS, max_pre_shift=0)))
    shift_only = shift_only_recipe(scale, acc_bound, zero_point, qmin, qmax)
    if shift_only is not None:
        out.append(shift_only)
    moved = [round_before_multiply(rq, acc_bound) for rq in out]
    return out + [rq for rq in moved if rq is not None]


def requant_recipe(scale: np.ndarray, acc_bound: np.ndarray, zero_point: int, qmin: int,
                   qmax: int, budget_lsb: float | None = None,
                   max_error: float | None = None) -> Requant:
    """Recipe approximating ``round(acc * scale[c]) + zero_point`` clipped to ``[qmin, qmax]``
    for ``|acc[c]| <= acc_bound[c]`` within :data:`VTA_LIMITS` (int32-safe by construction):
    the one with the fewest ALU ops whose worst-case error is at most ``max(error of the most
    accurate recipe, budget_lsb)`` (default :data:`CHEAP_RECIPE_BUDGET_LSB`), the most accurate
    on ties. ``max_error`` (the requantize guard's limit) caps the budget, so a cheaper recipe
    never sends a layer the most accurate one keeps on VTA to the CPU."""
    budget = CHEAP_RECIPE_BUDGET_LSB if budget_lsb is None else budget_lsb
    if max_error is not None:
        budget = min(budget, max_error)
    cands = requant_candidates(scale, acc_bound, zero_point, qmin, qmax)
    errs = [recipe_error(rq, acc_bound).max_lsb_error for rq in cands]
    limit = max(errs[0], budget)
    within = [i for i, e in enumerate(errs) if e <= limit]
    rq = cands[min(within, key=lambda i: (tail_alu_ops(cands[i]), errs[i], i))]
    problems = check_limits(rq, acc_bound, VTA_LIMITS)
    assert not problems, problems  # the solver only returns recipes that fit
    return rq


def add_recipe(scale_a: float, scale_b: float, zero_point: int, qmin: int,
               qmax: int) -> tuple[int, int, Requant]:
    """``(ma, mb, requant)`` for ``round((a - za) * scale_a + (b - zb) * scale_b) + zero_point``
    (scales already divided by the output scale), int32-safe for 8-bit operands."""
    return solve_add(scale_a, scale_b, zero_point, qmin, qmax, VTA_LIMITS, operand_bound=255)
