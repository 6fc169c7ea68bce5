"""QDQ -> explicit integer graph: the CPU reference every accelerator matches bit for bit.

``canonicalize(mod, target)`` rewrites every recognised ``quantize(op(dequantize(x), ...))`` of
the imported model into integer Relax ops, with requantize constants from the target's recipe.
The canonical form of each layer kind, the recipes it takes and how layers are named are in
docs/architecture.md section 4.1. Stages: :mod:`~tvm_accel.canonicalize.graph` (the imported
graph and its QDQ structure), :mod:`~tvm_accel.canonicalize.rewrite` (each quantized op -> a
plan of integer ops), :mod:`~tvm_accel.canonicalize.records` (the report and the recipes),
:mod:`~tvm_accel.canonicalize.guard` (constant channels and the requantize guard),
:mod:`~tvm_accel.canonicalize.elementwise` (activations as table lookups, products of two
quantized tensors, BatchNormalization; section 4.4).
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_accel import precision
from tvm_accel.canonicalize.graph import (
    LAYER_NAMES_ATTR,
    _Graph,
    _NamingBuilder,
    deconv_acc_bound,
    layer_span,
    nearest_upsample_scale,
    span_layer,
)
from tvm_accel.canonicalize.guard import CPU_LAYERS_ATTR, DEFAULT_MAX_REQUANT_ERROR
from tvm_accel.canonicalize.records import (
    BIAS_SCALE_RTOL,
    TARGET_RECIPE_OPS,
    LayerRecord,
    _Recipes,
    format_report,
)
from tvm_accel.canonicalize.rewrite import _Canonicalizer

__all__ = ["BIAS_SCALE_RTOL", "CPU_LAYERS_ATTR", "DEFAULT_MAX_REQUANT_ERROR", "LAYER_NAMES_ATTR",
           "TARGET_RECIPE_OPS", "LayerRecord",
           "canonicalize", "deconv_acc_bound", "format_report", "layer_span",
           "nearest_upsample_scale", "span_layer"]


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, plans: dict, mod=None):
        super().__init__(mod)
        self.plans = plans

    def visit_var_binding_(self, binding):
        plan = self.plans.get(binding.var)
        if plan is None:
            return super().visit_var_binding_(binding)
        new = plan.emit(_NamingBuilder(self.builder_, plan.record.name), self.visit_expr)
        if not isinstance(binding.var, relax.DataflowVar) and isinstance(new, relax.DataflowVar):
            new = self.builder_.emit_output(new, name_hint=binding.var.name)
        self.set_var_remap(binding.var, new)


def canonicalize(mod: tvm.IRModule, target=None, func_name: str = "main",
                 precision_config=None,
                 max_requant_error: float = DEFAULT_MAX_REQUANT_ERROR
                 ) -> tuple[tvm.IRModule, list[LayerRecord]]:
    """Rewrite the QDQ patterns of ``mod[func_name]`` into the canonical integer graph.

    ``target``: an :class:`~tvm_accel.target.AccelTarget` (or its kind, e.g. ``"vta"``, or any
    object with its ``requant_recipe``, ``add_recipe`` and ``recipe_for``) whose recipe is
    used for conv2d, dense, conv2d_transpose and add (and whatever ``recipe_for`` claims);
    ``None`` uses the generic int64 CPU recipe. A recipe that raises
    :class:`tvm_accel.numerics.RecipeError` (scale not representable on the hardware) leaves
    that layer float, on the CPU, with the reason in its record. Returns the new module
    (weights as int32 constants, float QDQ leftovers removed by dead-code elimination) and one
    :class:`LayerRecord` per quantized value: integer layers and what stayed float.

    Sub-byte precision (:mod:`tvm_accel.precision`): ranges recorded by ``load_onnx`` and the
    optional ``precision_config`` (path, JSON text, dict or
    :class:`~tvm_accel.precision.PrecisionConfig`) become the requantize clip; each integer
    record has ``detail["bits"] = {"w", "i", "o"}`` and the result carries the module
    attribute :data:`~tvm_accel.precision.LAYER_BITS_ATTR`.

    The requantize guard (:mod:`tvm_accel.canonicalize.guard`): a conv / dense / transpose
    conv / add whose target recipe deviates by more than ``max_requant_error`` output LSBs
    takes the CPU recipe; the module attribute :data:`~tvm_accel.canonicalize.guard.
    CPU_LAYERS_ATTR` names it with the reason, and the partitioner keeps it on the CPU.
    """
    recipes = _Recipes(target, max_requant_error)
    func = mod[func_name]
    names = {}
    if mod.attrs is not None and "onnx_node_names" in mod.attrs:
        names = {str(k): str(v) for k, v in mod.attrs["onnx_node_names"].items()}
    attrs = mod.attrs if mod.attrs is not None else {}
    qranges = ({str(k): (int(v[0]), int(v[1])) for k, v in attrs[precision.QRANGE_ATTR].items()}
               if precision.QRANGE_ATTR in attrs else {})
    wbits = ({str(k): int(v) for k, v in attrs[precision.WBITS_ATTR].items()}
             if precision.WBITS_ATTR in attrs else {})
    graph = _Graph(func, names, qranges, wbits)
    config = (precision.load_precision(precision_config) if precision_config is not None
              else None)
    canon = _Canonicalizer(graph, recipes, config)
    canon.apply_config()
    canon.run()
    new_func = _Rewriter(canon.plans, mod).visit_expr(graph.func)  # narrowed by the config
    out = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint != func_name},
                       attrs=mod.attrs)
    out[func_name] = new_func
    entries = [gv.name_hint for gv, f in out.functions_items() if isinstance(f, relax.Function)]
    out = relax.transform.DeadCodeElimination(entries)(out)
    renamed = {r.name: r.onnx_name for r in canon.report if r.integer and r.onnx_name != r.name}
    if renamed:
        out = out.with_attr(LAYER_NAMES_ATTR, renamed)
    fallback = {r.onnx_name: r.detail["cpu_reason"] for r in canon.report
                if r.integer and "cpu_reason" in r.detail}
    if fallback:
        out = out.with_attr(CPU_LAYERS_ATTR, fallback)
    if canon.layer_bits:
        out = out.with_attr(precision.LAYER_BITS_ATTR, {
            k: {kk: int(vv) for kk, vv in v.items() if vv is not None}
            for k, v in canon.layer_bits.items()})
    relax.analysis.well_formed(out)
    return out, canon.report
