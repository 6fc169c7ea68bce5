"""QDQ -> explicit integer graph (docs/architecture.md sections 2 and 4).

``canonicalize(mod, target)`` rewrites every recognised ``quantize(op(dequantize(x), ...))`` of
the imported model into integer Relax ops, with requantize constants from the target's recipe.
The result compiled for llvm is the reference every accelerator must match bit for bit.

Offloadable layers get a fixed op sequence that the targets' partition patterns match
(:mod:`tvm_accel.partition` has a builder for each). ``RQ`` below is
:func:`tvm_accel.numerics.emit_requant` (``astype(int64) -> right_shift(pre) -> multiply(m) ->
add(round) -> right_shift(shift) -> add(zp) -> maximum(qmin) -> minimum(qmax) ->
astype(out)``) and ``RESCALE`` is ``astype(int32) -> subtract(zx) -> RQ``:

- conv2d (any groups; depthwise is ``groups == C``): ``astype(x, int32) - zx`` ->
  ``conv2d(.., W - zw (OIHW int32), out_dtype=int32)`` -> ``add(B (1,K,1,1) int32)`` -> ``RQ``;
- dense (Gemm / MatMul with constant weight, 2-D input): the same with ``matmul(xc, Wt (Cin,K))``
  and ``(1, K)`` constants;
- transpose conv (ConvTranspose): the conv form with
  ``conv2d_transpose(.., W - zw (IOHW int32), strides, padding, output_padding, groups,
  out_dtype=int32)``;
- residual add of two quantized tensors: :func:`tvm_accel.numerics.emit_add`;
- max pool: ``max_pool2d(x)`` on the 8-bit tensor itself (padding is the dtype minimum, so it
  never wins), then ``RESCALE`` only if the output quantization differs from the input's or a
  folded ReLU/Clip narrows the range (ONNX QDQ max pools share the input's parameters, so
  normally the single op is the whole layer);
- nearest upsample (ONNX Resize/Upsample, mode nearest, integer scales whose index mapping is
  ``i // S``, see :func:`nearest_upsample_scale`): ``image.resize2d(x)`` on the 8-bit tensor
  [+ ``RESCALE`` as for max pool]; linear/cubic modes stay float;
- average pool (no padding, or ``count_include_pad``): ``astype(x, int64) -> subtract(zx) ->
  multiply(KH*KW) -> avg_pool2d(count_include_pad=True)`` -- the int64 average of values
  pre-multiplied by the window is exactly the window sum -- then ``RQ`` with scale
  ``s_in / (s_out * KH * KW)``;
- global average pool (``mean`` over H, W): ``astype(x, int32) - zx -> sum(axis=[2, 3],
  keepdims) -> RQ`` with scale ``s_in / (s_out * H * W)``;
- concat: each input whose quantization differs from the output's (or every input, when a
  folded ReLU narrows the range) goes through ``RESCALE``; the others enter as they are; then
  ``concat``.

The core op of each form -- conv2d / matmul / conv2d_transpose / the add of the scaled
operands / max_pool2d / resize2d / avg_pool2d / sum / concat -- is named ``<layer>_acc``.

A ReLU / Clip between the op and its quantize is folded into ``qmin``/``qmax`` (exact: rounding
is monotone, so ``round(clip(v, lo, hi) / s) = clip(round(v / s), round(lo / s), round(hi / s))``).

Which recipe: conv2d, dense and conv2d_transpose use the target's ``requant_recipe``; the add
uses its ``add_recipe``; pools, concat, upsample and the CPU-only ops below use the generic
int64 recipe (:data:`tvm_accel.numerics.CPU_LIMITS`) unless the target defines
``recipe_for(op)`` (see :meth:`_Recipes.for_op`) -- a target that offloads pools or concat
(a DPU) routes them through its own, e.g. power-of-two, recipe.

CPU-only ops get an integer form of our own:

- layout ops (reshape/flatten, permute_dims, squeeze, expand_dims) run on the integer tensor
  directly (layout commutes with the monotone dequantize); a requantize follows only if the
  output scale/zero point/dtype differ from the input's;
- a standalone ReLU/Clip (or a bare ``quantize(dequantize(x))``): clip, or requantize.

Anything else stays as imported (``dequantize -> op -> quantize`` in float, on the CPU), and so do
the model's input ``quantize`` and output ``dequantize``. A pattern that is recognised but
inconsistent (bias scale != x_scale * w_scale, non-zero bias zero point, non-constant weights)
raises :class:`~tvm_accel.errors.ModelError` naming the layer.

Layer names come from the ONNX node names that :func:`tvm_accel.frontend.load_onnx` puts on the
Relax vars (module attribute ``onnx_node_names``); the canonical values are emitted with
``name_hint`` derived from the layer name: ``<name>_acc`` is the layer's core op (see above;
the partition report keys layers by it), ``<name>_biased``, ``<name>_rq_*`` the requantize
steps, and ``<name>`` the 8-bit output (for max pool, upsample and concat without a rescale
the core op is the output: ``<name>_acc``). Without ONNX names, layers are named
``conv2d_0``, ``dense_1``, ``add_2``, ...

One layer name for the user: var names must be identifiers (``layer1_0_conv1``), but every name
a user reads or writes (``--dump-offloads``, ``--profile``, knobs, precision configs, tuning
records) is the ONNX node name (``layer1.0.conv1``). The core op's call carries the layer's var
name as its span (``Span.source_name``), which survives partitioning even where the binding's
var is renamed (a one-op composite), and the module attribute :data:`LAYER_NAMES_ATTR` maps
each var name to its ONNX name where they differ.
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
from tvm_accel.canonicalize.records import (
    BIAS_SCALE_RTOL,
    TARGET_RECIPE_OPS,
    LayerRecord,
    _Recipes,
    format_report,
)
from tvm_accel.canonicalize.rewrite import _Canonicalizer

__all__ = ["BIAS_SCALE_RTOL", "LAYER_NAMES_ATTR", "TARGET_RECIPE_OPS", "LayerRecord",
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
                 precision_config=None) -> tuple[tvm.IRModule, list[LayerRecord]]:
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
    """
    recipes = _Recipes(target)
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
    new_func = _Rewriter(canon.plans, mod).visit_expr(func)
    out = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint != func_name},
                       attrs=mod.attrs)
    out[func_name] = new_func
    entries = [gv.name_hint for gv, f in out.functions_items() if isinstance(f, relax.Function)]
    out = relax.transform.DeadCodeElimination(entries)(out)
    renamed = {r.name: r.onnx_name for r in canon.report if r.integer and r.onnx_name != r.name}
    if renamed:
        out = out.with_attr(LAYER_NAMES_ATTR, renamed)
    if canon.layer_bits:
        out = out.with_attr(precision.LAYER_BITS_ATTR, {
            k: {kk: int(vv) for kk, vv in v.items() if vv is not None}
            for k, v in canon.layer_bits.items()})
    relax.analysis.well_formed(out)
    return out, canon.report
