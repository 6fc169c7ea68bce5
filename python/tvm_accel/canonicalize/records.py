"""What canonicalize reports per quantized value (:class:`LayerRecord`) and where each layer's
integer parameters come from (:class:`_Recipes`: the target's recipe or the generic CPU one).
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tvm_accel import numerics
from tvm_accel.canonicalize.guard import DEFAULT_MAX_REQUANT_ERROR

#: relative tolerance of "bias scale == x_scale * w_scale" (ORT computes it in float32)
BIAS_SCALE_RTOL = 1e-4


#: ops that only move or select values (commute with a monotone dequantize)
_LAYOUT_OPS = {"relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims",
               "relax.flatten"}


_AUTO_NAME = re.compile(r"(lv|gv)\d*")


#: layer kinds that use the target's ``requant_recipe`` unless the target says otherwise
TARGET_RECIPE_OPS = frozenset({"conv2d", "dense", "conv2d_transpose"})


#: report names of float ops that have an integer layer kind
_FLOAT_OP_NAMES = {"nn.max_pool2d": "max_pool2d", "nn.avg_pool2d": "avg_pool2d",
                   "image.resize2d": "upsample"}


#: the core op of each layer kind with a weight (``_split_bias`` looks for these)
_WEIGHTED_OPS = {"relax.nn.conv2d": "conv2d", "relax.matmul": "dense",
                 "relax.nn.conv2d_transpose": "conv2d_transpose"}


# --- report ----------------------------------------------------------------------------------
@dataclass
class LayerRecord:
    """One quantized value of the model and how canonicalize handled it."""

    name: str                 # layer name (Relax var name of the integer output)
    onnx_name: str            # ONNX node name (= name when the model had none)
    op: str                   # conv2d, dense, conv2d_transpose, add, max_pool2d, avg_pool2d,
    #                           global_avg_pool2d, concat, upsample, reshape, ..., relu, clip,
    #                           requantize, or the float op
    integer: bool             # True: canonical integer ops; False: left float (CPU)
    out_dtype: str
    output_scale: float
    output_zero_point: int
    max_rel_error: float = 0.0  # integer scale vs float scale (worst channel / operand)
    max_lsb_error: float = 0.0  # worst-case deviation before the final rounding, output LSBs
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def layer(self) -> str:
        """Alias of ``name`` (the partition report keys layers by it)."""
        return self.name

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def format_report(report: list[LayerRecord]) -> str:
    """Fixed-width table of a canonicalize report (for the CLI)."""
    rows = [("layer", "op", "path", "dtype", "W/I/O", "out scale", "rel err", "LSB err",
             "notes")]
    for r in report:
        d = r.detail
        notes = []
        if d.get("activation"):
            notes.append(d["activation"])
        if "pre_shift" in d:
            notes.append(f"pre>>{d['pre_shift']} >>{d['shift']}")
        if d.get("reason"):
            notes.append(d["reason"])
        bits = d.get("bits") or {}
        wio = "/".join("-" if bits.get(k) is None else str(bits[k]) for k in "wio")
        rows.append((r.onnx_name, r.op, "int" if r.integer else "float", r.out_dtype,
                     wio if bits else "", f"{r.output_scale:.4g}", f"{r.max_rel_error:.2e}",
                     f"{r.max_lsb_error:.3f}", "; ".join(notes)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True))
                     + "  " + row[-1] for row in rows)


# --- recipes ---------------------------------------------------------------------------------
def _capped(solver: Callable, limit: float) -> Callable:
    """``solver`` with the guard's limit as ``max_error`` when it takes one (a target whose
    recipe trades accuracy for cost keeps it within the limit instead of falling back)."""
    if math.isfinite(limit) and "max_error" in inspect.signature(solver).parameters:
        return partial(solver, max_error=limit)
    return solver


class _Recipes:
    """Where integer parameters come from: the target for offloadable layers, the generic
    int64 CPU recipe for CPU-only ops (and for everything when target is None)."""

    def __init__(self, target, max_requant_error: float = DEFAULT_MAX_REQUANT_ERROR):
        self.max_requant_error = float(max_requant_error)
        self.cpu_add: Callable | None = partial(numerics.solve_add,
                                                limits=numerics.CPU_LIMITS)
        if isinstance(target, str):
            from tvm_accel.target import get_target

            target = get_target(target)
        self.target_name = getattr(target, "name", "") or ("cpu" if target is None else "custom")
        self.target = target
        self.cpu = partial(numerics.solve_requant, limits=numerics.CPU_LIMITS)
        self.requant: Callable
        if target is None:
            self.requant = self.cpu
            self.add = partial(numerics.solve_add, limits=numerics.CPU_LIMITS)
            self.cpu_add = None  # no guard: the CPU recipe is the fallback itself
        else:
            self.requant = _capped(target.requant_recipe, self.max_requant_error)
            self.add = target.add_recipe

    def for_op(self, op: str) -> Callable:
        """Requantize solver for a layer of kind ``op`` (``conv2d``, ``dense``,
        ``conv2d_transpose``, ``max_pool2d``, ``avg_pool2d``, ``global_avg_pool2d``, ``concat``,
        ``upsample``, ``requantize``, ...).

        The target's ``recipe_for`` (:class:`~tvm_accel.target.AccelTarget`) may return a
        solver with ``requant_recipe``'s signature, or None for the default: the target's
        ``requant_recipe`` for the
        multiply-accumulate layers (:data:`TARGET_RECIPE_OPS`) and the generic int64 CPU recipe
        for everything else (pools, concat, upsample, layout ops), which is what a target that
        does not offload those ops wants (VTA)."""
        if self.target is None:
            return self.cpu
        solver = self.target.recipe_for(op)
        if solver is not None:
            return solver
        return self.requant if op in TARGET_RECIPE_OPS else self.cpu
