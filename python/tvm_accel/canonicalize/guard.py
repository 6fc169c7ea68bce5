"""The requantize guard: recipes of weighted layers that stay faithful to the float scales.

Two things happen between the integer parameters of a conv / dense / transpose conv and its
recipe (docs/architecture.md section 4.3):

- **Constant channels.** A channel whose integer weights are all zero (a dead filter, or one so
  small that it quantized to zero) outputs ``round(B * scale) + zero_point`` whatever the
  input. Quantizers keep such a channel's bias within int32 by giving it a tiny weight scale
  (onnxruntime: ``|B| ~ 2^31``), and that one bias would set the shared shift of the whole
  layer on hardware with one shift per layer and narrow lanes (MARSELLUS's 32-bit lambda, VTA's
  int32 ALU). The channel is rewritten exactly: its scale becomes the largest healthy scale of
  the layer and its bias the integer that this recipe maps to the same constant output. Every
  target has a per-channel bias, so no hardware field changes.
- **The guard.** The recipe's worst-case deviation from ``acc * scale`` before the final
  rounding (``max_lsb_error`` of :class:`~tvm_accel.numerics.ApproximationError`, in output
  LSBs over the calibrated output range, i.e. the full integer range of the output) must stay
  within ``max_requant_error``. A layer beyond it takes the generic CPU recipe and stays on the CPU
  with the reason (:data:`CPU_LAYERS_ATTR`); ``inf`` turns the guard off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tvm_accel import numerics
from tvm_accel.layers import Requant
from tvm_accel.numerics import DEFAULT_MAX_REQUANT_ERROR

__all__ = ["CPU_LAYERS_ATTR", "DEFAULT_MAX_REQUANT_ERROR", "GuardedRecipe", "guard_add",
           "guard_weighted"]


#: module attribute: ONNX layer name -> why the guard keeps it on the CPU
CPU_LAYERS_ATTR = "accel_requant_fallback"


@dataclass
class GuardedRecipe:
    """A weighted layer's recipe after the guard: the (possibly rewritten) bias, the recipe,
    its error and accumulator bound, and what the guard did (``detail``)."""

    bias: np.ndarray
    rq: Requant
    err: numerics.ApproximationError
    bound: np.ndarray
    detail: dict[str, Any] = field(default_factory=dict)


def _apply_channel(rq: Requant, c: int, acc: int) -> int:
    """``rq`` on one accumulator of channel ``c`` (Python ints: no overflow)."""
    m = int(np.ravel(rq.multiplier)[c])
    r = int(np.broadcast_to(np.ravel(rq.round_add), np.ravel(rq.multiplier).shape)[c])
    t = (((acc >> rq.pre_shift) * m + r) >> rq.shift) + rq.zero_point
    return min(max(t, rq.qmin), rq.qmax)


def _bias_for(rq: Requant, c: int, want: int, lo: int, hi: int) -> int:
    """Smallest accumulator in ``[lo, hi]`` that ``rq`` maps to ``want`` on channel ``c`` (the
    map is monotone), else the one whose output is nearest."""
    a, b = lo, hi
    while a < b:
        mid = (a + b) // 2
        if _apply_channel(rq, c, mid) < want:
            a = mid + 1
        else:
            b = mid
    cands = [x for x in (a - 1, a) if lo <= x <= hi]
    return min(cands, key=lambda x: (abs(_apply_channel(rq, c, x) - want), x != a))


def _constant_channels(scale: np.ndarray, weight_bound: np.ndarray,
                       bias: np.ndarray) -> np.ndarray:
    """Channels whose output is a constant that would still constrain the recipe."""
    return (weight_bound == 0) & (bias != 0) & (scale > 0)


def _rewrite_constants(solver: Callable, scale: np.ndarray, weight_bound: np.ndarray,
                       bias: np.ndarray, zero_point: int, qmin: int, qmax: int):
    """Recipe with the constant channels folded (module docstring); ``None`` when there are
    none. Returns ``(scale, bias, bound, rq, constants)``."""
    const = _constant_channels(scale, weight_bound, bias)
    if not const.any():
        return None
    healthy = scale[~const & (scale > 0)]
    ref = float(healthy.max()) if healthy.size else 2.0 ** -8
    margin = int(np.ceil(1.0 / ref)) + 2  # one output LSB of room around the first guess
    new_scale, new_bias = scale.copy(), bias.copy()
    new_scale[const] = ref
    wants = {}
    for c in (int(i) for i in np.flatnonzero(const)):
        want = int(min(max(np.floor(float(bias[c]) * float(scale[c]) + 0.5) + zero_point,
                           qmin), qmax))
        wants[c] = want
        new_bias[c] = int(np.rint((want - zero_point) / ref))
    bound = weight_bound + np.abs(new_bias)
    bound[const] += margin
    rq = solver(new_scale, bound, zero_point, qmin, qmax)
    for c, want in wants.items():
        guess: int = int(new_bias[c])
        new_bias[c] = _bias_for(rq, c, want, guess - margin, guess + margin)
    return new_scale, new_bias, weight_bound + np.abs(new_bias), rq, wants


def guard_weighted(solver: Callable, cpu_solver: Callable | None, scale: np.ndarray,
                   weight_bound: np.ndarray, bias: np.ndarray, weight_scale: np.ndarray,
                   zero_point: int, qmin: int, qmax: int,
                   max_requant_error: float) -> GuardedRecipe:
    """Recipe of a weighted layer: ``scale[c]`` per output channel, ``|acc[c]| <=
    weight_bound[c] + |bias[c]|``. ``solver`` is the target's recipe, ``cpu_solver`` the generic
    one the layer falls back to (None: ``solver`` is already the CPU's, no guard)."""
    scale = np.asarray(scale, np.float64).ravel()
    weight_bound = np.asarray(weight_bound, np.int64).ravel()
    bias = np.asarray(bias, np.int64).ravel()
    detail: dict[str, Any] = {}
    folded = _rewrite_constants(solver, scale, weight_bound, bias, zero_point, qmin, qmax)
    if folded is None:
        bound = weight_bound + np.abs(bias)
        rq, new_scale, new_bias = solver(scale, bound, zero_point, qmin, qmax), scale, bias
    else:
        new_scale, new_bias, bound, rq, constants = folded
        detail["constant_channels"] = constants
    err = numerics.recipe_error(rq, bound)
    if cpu_solver is None or err.max_lsb_error <= max_requant_error:
        return GuardedRecipe(new_bias, rq, err, bound, detail)
    detail = {"cpu_reason": _reason(err, max_requant_error, new_scale, new_bias, weight_bound,
                                    weight_scale, rq)}
    bound = weight_bound + np.abs(bias)
    rq = cpu_solver(scale, bound, zero_point, qmin, qmax)
    return GuardedRecipe(bias, rq, numerics.recipe_error(rq, bound), bound, detail)


def _reason(err: numerics.ApproximationError, limit: float, scale: np.ndarray,
            bias: np.ndarray, weight_bound: np.ndarray, weight_scale: np.ndarray,
            rq: Requant) -> str:
    """``requantize error 12.4 LSB > 2 LSB limit: ...`` naming the channel that sets the
    shift (the largest accumulator) and the worst channel."""
    rel = np.abs(rq.effective_scale - scale) / np.where(scale > 0, scale, 1.0)
    worst = int(np.argmax(np.where(scale > 0, rel, 0.0)))
    widest = int(np.argmax(weight_bound + np.abs(bias)))
    ws = np.broadcast_to(np.asarray(weight_scale, np.float64).ravel(), scale.shape)
    text = (f"requantize error {err.max_lsb_error:.3g} LSB > {limit:g} LSB limit: channel "
            f"{worst} scale off by {rel[worst]:.2g} (relative)")
    if widest != worst:
        text += (f"; channel {widest} (weight scale {ws[widest]:.3g}, bias {int(bias[widest])})"
                 " needs the widest accumulator and sets the shift")
    return text + " (--max-requant-error raises the limit)"


def guard_add(solver: Callable, cpu_solver: Callable | None, scale_a: float, scale_b: float,
              zero_point: int, qmin: int, qmax: int, max_requant_error: float):
    """``(ma, mb, rq, err, detail)`` of a residual add under the guard (see
    :func:`guard_weighted`)."""
    ma, mb, rq = solver(scale_a, scale_b, zero_point, qmin, qmax)
    err = numerics.add_error(scale_a, scale_b, ma, mb, rq)
    if cpu_solver is None or err.max_lsb_error <= max_requant_error:
        return ma, mb, rq, err, {}
    reason = (f"requantize error {err.max_lsb_error:.3g} LSB > {max_requant_error:g} LSB "
              f"limit: operand scales {scale_a:.4g}, {scale_b:.4g} (--max-requant-error "
              "raises the limit)")
    ma, mb, rq = cpu_solver(scale_a, scale_b, zero_point, qmin, qmax)
    return ma, mb, rq, numerics.add_error(scale_a, scale_b, ma, mb, rq), {"cpu_reason": reason}
