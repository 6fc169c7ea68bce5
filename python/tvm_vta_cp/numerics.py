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
- **Residual add.** ``(a - za) * ma + (b - zb) * mb`` with ``ma, mb <= 32767`` and
  ``255 * ma + 255 * mb + round_add < 2^31``, then the same shift/zero point/clip tail (pre_shift
  0, multiplier 1).
"""

from __future__ import annotations

import numpy as np

from tvm_accel.layers import Requant
from tvm_accel.numerics import RecipeLimits, check_limits, solve_add, solve_requant

#: VTA ALU limits (int32 lanes, 16-bit signed MUL immediate, shifts 0..31)
VTA_LIMITS = RecipeLimits(multiplier_max=(1 << 15) - 1, intermediate_bits=32, max_shift=31,
                          max_pre_shift=31)


def requant_recipe(scale: np.ndarray, acc_bound: np.ndarray, zero_point: int, qmin: int,
                   qmax: int) -> Requant:
    """Recipe approximating ``round(acc * scale[c]) + zero_point`` clipped to ``[qmin, qmax]``
    for ``|acc[c]| <= acc_bound[c]`` within :data:`VTA_LIMITS` (int32-safe by construction)."""
    rq = solve_requant(scale, acc_bound, zero_point, qmin, qmax, VTA_LIMITS)
    problems = check_limits(rq, acc_bound, VTA_LIMITS)
    assert not problems, problems  # the solver only returns recipes that fit
    return rq


def add_recipe(scale_a: float, scale_b: float, zero_point: int, qmin: int,
               qmax: int) -> tuple[int, int, Requant]:
    """``(ma, mb, requant)`` for ``round((a - za) * scale_a + (b - zb) * scale_b) + zero_point``
    (scales already divided by the output scale), int32-safe for 8-bit operands."""
    return solve_add(scale_a, scale_b, zero_point, qmin, qmax, VTA_LIMITS, operand_bound=255)
