"""Pattern-table partitioning shared by every target.

A target declares :class:`OffloadPattern` entries: a Relax DPL pattern over the canonical integer
graph plus *named constraint checks*. Each check is a function of the matched sub-expressions
whose docstring is the reason shown to the user when it fails and the layer stays on the CPU.
:func:`partition` runs ``FuseOpsByPattern(annotate_codegen=False)`` + ``MergeCompositeFunctions``;
:func:`explain` lists every candidate layer, where it goes and why (``--dump-offloads``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

Check = Callable[[dict], bool]


def check_reason(check: Check) -> str:
    """The user-facing reason of a failed check: the first line of its docstring."""
    doc = inspect.getdoc(check) or check.__name__
    return doc.splitlines()[0].rstrip(".")


@dataclass
class OffloadPattern:
    """One row of a target's pattern table."""

    name: str
    op: str
    pattern: DFPattern
    annotations: dict[str, DFPattern]
    checks: list[Check] = field(default_factory=list)

    def failed_checks(self, annotated: dict) -> list[str]:
        failed = []
        for chk in self.checks:
            try:
                ok = bool(chk(annotated))
            except Exception as e:  # a check that cannot evaluate is a failed check, with cause
                failed.append(f"{check_reason(chk)} ({type(e).__name__}: {e})")
                continue
            if not ok:
                failed.append(check_reason(chk))
        return failed

    def as_fusion_entry(self) -> tuple:
        def check(ctx: relax.transform.PatternCheckContext) -> bool:
            if has_leaking_intermediate_variables(ctx):
                return False
            return not self.failed_checks(dict(ctx.annotated_expr))

        return (self.name, self.pattern, self.annotations, check)


# --- canonical integer-form patterns (see tvm_accel.canonicalize) ---------------------------------
def requant_tail(t: DFPattern) -> tuple[DFPattern, dict]:
    """``add(round) -> right_shift -> add(zp) -> maximum -> minimum -> astype``."""
    rnd, sh, zp, lo, hi = (is_const() for _ in range(5))
    t = is_op("relax.add")(t, rnd)
    t = is_op("relax.right_shift")(t, sh)
    t = is_op("relax.add")(t, zp)
    t = is_op("relax.maximum")(t, lo)
    t = is_op("relax.minimum")(t, hi)
    out = is_op("relax.astype")(t)
    return out, {"round_add": rnd, "shift": sh, "zero_point": zp, "qmin": lo, "qmax": hi,
                 "root": out}


def qlinear_pattern(kind: str) -> tuple[DFPattern, dict]:
    """Quantized conv2d (``kind="conv2d"``) or dense (``kind="matmul"``) in canonical form."""
    x, zx, w, b, pre, mult = wildcard(), is_const(), is_const(), is_const(), is_const(), is_const()
    xc = is_op("relax.subtract")(is_op("relax.astype")(x), zx)
    core = is_op("relax.nn.conv2d" if kind == "conv2d" else "relax.matmul")(xc, w)
    acc = is_op("relax.add")(core, b)
    t = is_op("relax.astype")(acc)
    t = is_op("relax.right_shift")(t, pre)
    t = is_op("relax.multiply")(t, mult)
    out, ann = requant_tail(t)
    ann.update({"data": x, "input_zero_point": zx, "weight": w, "bias": b, "core": core,
                "pre_shift": pre, "multiplier": mult})
    return out, ann


def qadd_pattern() -> tuple[DFPattern, dict]:
    """Quantized element-wise add in canonical form."""
    a, b, za, zb, ma, mb = wildcard(), wildcard(), is_const(), is_const(), is_const(), is_const()
    ta = is_op("relax.multiply")(is_op("relax.subtract")(is_op("relax.astype")(a), za), ma)
    tb = is_op("relax.multiply")(is_op("relax.subtract")(is_op("relax.astype")(b), zb), mb)
    core = is_op("relax.add")(ta, tb)
    out, ann = requant_tail(core)
    ann.update({"core": core, "lhs": a, "rhs": b, "lhs_zero_point": za, "rhs_zero_point": zb,
                "lhs_multiplier": ma, "rhs_multiplier": mb})
    return out, ann


def const_value(expr) -> np.ndarray:
    """numpy value of a matched constant."""
    return expr.value.numpy()


def dtype_of(expr) -> str:
    return str(expr.ty.dtype)


def static_shape(expr) -> tuple[int, ...] | None:
    shape = getattr(expr.ty, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        return None


# --- running the table --------------------------------------------------------------------------
def partition(mod: tvm.IRModule, patterns: list[OffloadPattern]) -> tvm.IRModule:
    """Group matched layers into ``Codegen`` functions (neighbours merged)."""
    entries = [p.as_fusion_entry() for p in patterns]
    mod = relax.transform.FuseOpsByPattern(entries, bind_constants=True,
                                           annotate_codegen=False)(mod)
    return relax.transform.MergeCompositeFunctions()(mod)


@dataclass
class OffloadRecord:
    """Where one layer of the canonical graph goes, and why."""

    layer: str
    op: str
    shape: str
    placement: str
    reason: str


_ANCHORS = {"relax.nn.conv2d": "conv2d", "relax.matmul": "dense",
            "relax.nn.max_pool2d": "max_pool2d", "relax.nn.avg_pool2d": "avg_pool2d",
            "relax.sum": "sum", "relax.mean": "mean", "relax.concat": "concat",
            "relax.reshape": "reshape", "relax.quantize": "quantize",
            "relax.dequantize": "dequantize"}


def _shape_str(expr) -> str:
    s = static_shape(expr)
    return "x".join(map(str, s)) if s else "?"


def layer_name(core_var_name: str) -> str:
    """Layer name from the core op's binding (the canonicalizer names it ``<layer>_acc``)."""
    return core_var_name[:-4] if core_var_name.endswith("_acc") else core_var_name


def explain(mod: tvm.IRModule, patterns: list[OffloadPattern], target_name: str,
            partitioned: tvm.IRModule | None = None) -> list[OffloadRecord]:
    """Candidate layers of ``main`` in order, with placement and reason.

    A layer matched by a pattern whose checks pass is offloaded (confirmed against the partitioned
    module when given); one whose checks fail stays on the CPU with the failed checks' reasons;
    other anchor ops (pooling, reshape, quantize, ...) are listed as host ops.
    """
    func = mod["main"]
    var2val = relax.analysis.get_var2val(func)
    bound_name = {v.__chandle__(): k.name for k, v in var2val.items()}
    offloaded = _offloaded_core_names(partitioned) if partitioned is not None else None
    matches: list[tuple[str, OffloadRecord]] = []
    covered: set[int] = set()
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not isinstance(value, relax.Call):
                continue
            for pat in patterns:
                m = pat.pattern.extract_matched_expr(value, var2val)
                if m is None:
                    continue
                annotated = {k: m[p] for k, p in pat.annotations.items() if p in m}
                core = annotated.get("core", annotated.get("root"))
                covered.add(core.__chandle__())
                core_name = bound_name.get(core.__chandle__(), binding.var.name)
                name = layer_name(core_name)
                failed = pat.failed_checks(annotated)
                shape = _shape_str(binding.var)
                if failed:
                    rec = OffloadRecord(name, pat.op, shape, "cpu", "; ".join(failed))
                elif offloaded is not None and core_name not in offloaded:
                    rec = OffloadRecord(name, pat.op, shape, "cpu",
                                        "an intermediate value is used outside the layer")
                else:
                    rec = OffloadRecord(name, pat.op, shape, target_name, f"matched {pat.name}")
                matches.append((binding.var.name, rec))
                break
    records = []
    match_by_root = dict(matches)
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if binding.var.name in match_by_root:
                records.append(match_by_root[binding.var.name])
                continue
            op = getattr(getattr(value, "op", None), "name", None)
            if op in _ANCHORS and value.__chandle__() not in covered:
                records.append(OffloadRecord(binding.var.name, _ANCHORS[op],
                                             _shape_str(binding.var), "cpu",
                                             f"no {target_name} pattern for {_ANCHORS[op]}"))
    return records


def _offloaded_core_names(mod: tvm.IRModule) -> set[str]:
    """Binding names of every conv2d/matmul/add core op inside composite functions."""
    names: set[str] = set()

    def visit_composite(f):
        for block in f.body.blocks:
            for b in block.bindings:
                names.add(b.var.name)

    def visit(e):
        if isinstance(e, relax.Function) and e.attrs and "Composite" in e.attrs:
            visit_composite(e)

    for _, f in mod.functions_items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return names
