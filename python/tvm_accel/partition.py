"""Pattern-table partitioning shared by every target.

A target declares :class:`OffloadPattern` entries: a Relax DPL pattern over the canonical integer
graph plus *named constraint checks*. Each check is a function of the matched sub-expressions
whose docstring is the reason shown to the user when it fails and the layer stays on the CPU.
:func:`partition` runs ``FuseOpsByPattern(annotate_codegen=False)`` + ``MergeCompositeFunctions``;
:func:`explain` lists every layer, where lowering put it and why (``--dump-offloads``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import DFPattern, is_const, is_op, is_tuple, wildcard

from tvm_accel.canonicalize.graph import span_layer
from tvm_accel.layers import layer_shape_text

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

    def as_fusion_entry(self, layer_bits: dict | None = None,
                        excluded: Mapping[str, str] | None = None
                        ) -> relax.transform.FusionPattern:
        """``FuseOpsByPattern`` entry; ``layer_bits`` (layer name -> W/I/O bits, see
        :data:`tvm_accel.precision.LAYER_BITS_ATTR`) is offered to the checks as
        ``m["precision"]``; a layer named in ``excluded`` (lowering could not map it) is not
        matched. Each composite function gets its layer's var name as :data:`LAYER_ATTR`."""
        names: dict[int, str] = {}  # core expr -> its layer's var name, for attrs()

        def check(ctx: relax.transform.PatternCheckContext) -> bool:
            if has_leaking_intermediate_variables(ctx):
                return False
            annotated = dict(ctx.annotated_expr)
            core = annotated.get("core", annotated.get("root"))
            var = ctx.value_to_bound_var.get(core) if core is not None else None
            name = layer_name(var.name) if var is not None else None
            if excluded and name in excluded:
                return False
            if layer_bits:
                annotated["precision"] = layer_bits.get(name, {}) if name else {}
            if self.failed_checks(annotated):
                return False
            if core is not None and name:
                names[core.__chandle__()] = name
            return True

        def attrs(annotated) -> dict[str, str]:
            core = annotated.get("core", annotated.get("root"))
            name = names.get(core.__chandle__()) if core is not None else None
            name = name or (span_layer(core) if core is not None else None)
            return {LAYER_ATTR: name} if name else {}

        return relax.transform.FusionPattern(self.name, self.pattern, self.annotations, check,
                                             attrs)


#: attribute of each composite function: the var name of the layer it computes. It keeps
#: structurally equal layers (two residual adds with the same quantization) apart:
#: ``FuseOpsByPattern`` shares one function between equal matches, and lowering would name
#: every call after one of them
LAYER_ATTR = "accel_layer"


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


_LINEAR_OPS = {"conv2d": "relax.nn.conv2d", "matmul": "relax.matmul", "dense": "relax.matmul",
               "conv2d_transpose": "relax.nn.conv2d_transpose"}


def qlinear_pattern(kind: str, flatten: bool = False) -> tuple[DFPattern, dict]:
    """Quantized conv2d (``kind="conv2d"``, any groups), dense (``kind="matmul"``) or transpose
    conv (``kind="conv2d_transpose"``) in canonical form. ``flatten``: a dense whose input is a
    ``reshape`` of ``data`` (a classifier head's Flatten; annotated ``flatten``), so a target
    can take the reshape as a view of its input."""
    x, zx, w, b, pre, mult = wildcard(), is_const(), is_const(), is_const(), is_const(), is_const()
    flat = is_op("relax.reshape")(x, wildcard()) if flatten else x
    xc = is_op("relax.subtract")(is_op("relax.astype")(flat), zx)
    core = is_op(_LINEAR_OPS.get(kind, "relax.matmul"))(xc, w)
    acc = is_op("relax.add")(core, b)
    t = is_op("relax.astype")(acc)
    t = is_op("relax.right_shift")(t, pre)
    t = is_op("relax.multiply")(t, mult)
    out, ann = requant_tail(t)
    ann.update({"data": x, "input_zero_point": zx, "weight": w, "bias": b, "core": core,
                "pre_shift": pre, "multiplier": mult})
    if flatten:
        ann["flatten"] = flat
    return out, ann


def qdeconv_pattern() -> tuple[DFPattern, dict]:
    """Quantized transpose convolution (ConvTranspose) in canonical form: the conv form with
    ``conv2d_transpose`` (IOHW weights)."""
    return qlinear_pattern("conv2d_transpose")


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


def rescale_pattern(v: DFPattern, prefix: str = "") -> tuple[DFPattern, dict]:
    """The rescale tail ``astype(int32) -> subtract(zx) -> astype(int64) -> right_shift(pre) ->
    multiply(m) -> requant tail`` on ``v`` (max pool, upsample and concat inputs whose
    quantization changes). Annotation names get ``prefix``."""
    zx, pre, mult = is_const(), is_const(), is_const()
    t = is_op("relax.subtract")(is_op("relax.astype")(v), zx)
    t = is_op("relax.astype")(t)
    t = is_op("relax.right_shift")(t, pre)
    t = is_op("relax.multiply")(t, mult)
    out, ann = requant_tail(t)
    ann.update({"input_zero_point": zx, "pre_shift": pre, "multiplier": mult})
    return out, {f"{prefix}{k}": p for k, p in ann.items()}


def _requant_chain(t: DFPattern) -> tuple[DFPattern, dict]:
    pre, mult = is_const(), is_const()
    t = is_op("relax.astype")(t)
    t = is_op("relax.right_shift")(t, pre)
    t = is_op("relax.multiply")(t, mult)
    out, ann = requant_tail(t)
    ann.update({"pre_shift": pre, "multiplier": mult})
    return out, ann


def qpool_pattern(kind: str, rescale: bool = False) -> tuple[DFPattern, dict]:
    """Quantized pooling in canonical form; ``kind`` is ``"max"``, ``"avg"`` or
    ``"global_avg"``.

    - ``max``: ``max_pool2d(x)``, and with ``rescale=True`` followed by :func:`rescale_pattern`
      (list the rescaled pattern before the bare one: the bare one would match its core);
    - ``avg``: ``astype -> subtract(zx) -> multiply(window) -> avg_pool2d -> requant chain``
      (annotation ``window``: the constant ``KH * KW``);
    - ``global_avg``: ``astype -> subtract(zx) -> sum -> requant chain``.

    Add :func:`pool_is_plain` to the entry's checks (the canonical form also covers ceil-mode
    max pools, which :class:`~tvm_accel.layers.PoolLayer` cannot express).
    """
    x = wildcard()
    if kind == "max":
        core = is_op("relax.nn.max_pool2d")(x)
        if not rescale:
            return core, {"data": x, "core": core, "root": core}
        out, ann = rescale_pattern(core)
    elif kind in ("avg", "global_avg"):
        zx = is_const()
        xc = is_op("relax.subtract")(is_op("relax.astype")(x), zx)
        if kind == "avg":
            n = is_const()
            core = is_op("relax.nn.avg_pool2d")(is_op("relax.multiply")(xc, n))
        else:
            core = is_op("relax.sum")(xc)
        out, ann = _requant_chain(core)
        ann["input_zero_point"] = zx
        if kind == "avg":
            ann["window"] = n
    else:
        raise ValueError(f"pool kind must be 'max', 'avg' or 'global_avg', not {kind!r}")
    ann.update({"data": x, "core": core})
    return out, ann


def qupsample_pattern(rescale: bool = False) -> tuple[DFPattern, dict]:
    """Nearest upsample in canonical form: ``image.resize2d(x, size)`` on the 8-bit tensor;
    ``rescale=True`` adds the rescale tail (list it first). Add :func:`upsample_is_nearest` to
    the entry's checks (the op alone does not say nearest / integer factors)."""
    x = wildcard()
    core = is_op("relax.image.resize2d")(x, wildcard())
    if not rescale:
        return core, {"data": x, "core": core, "root": core}
    out, ann = rescale_pattern(core)
    ann.update({"data": x, "core": core})
    return out, ann


def qconcat_pattern(n: int) -> tuple[DFPattern, dict]:
    """Concat of ``n`` quantized tensors in canonical form: ``concat((f_0, ..., f_n-1))`` where
    each ``f_i`` is the input itself or :func:`rescale_pattern` of it. Annotations: ``input<i>``
    (the 8-bit input), ``in<i>_*`` (its rescale constants, present only when it is rescaled),
    ``core``/``root`` (the concat). A target registers one entry per arity it accepts (arities
    never overlap, so their order does not matter); :func:`concat_on_channels` checks the
    axis."""
    if n < 1:
        raise ValueError("a concat has at least one input")
    fields, ann = [], {}
    for i in range(n):
        xi = wildcard()
        chain, cann = rescale_pattern(xi, f"in{i}_")
        fields.append(chain | xi)
        ann.update(cann)
        ann[f"input{i}"] = xi
    core = is_op("relax.concat")(is_tuple(fields))
    ann.update({"core": core, "root": core})
    return core, ann


def qlut_pattern() -> tuple[DFPattern, dict]:
    """Table lookup in canonical form (an activation: docs/architecture.md section 4.4):
    ``take(table, add(astype(x, int32), offset), axis=0)``. Annotations: ``data`` (the 8-bit
    input), ``offset`` (the int32 scalar ``-lo``, or ``(1, C, 1, 1)`` ``256 * c - lo`` for one
    table row per channel), ``table`` (the flattened ``K * 256`` entries, output dtype),
    ``core``/``root`` (the take)."""
    x, off, table = wildcard(), is_const(), is_const()
    core = is_op("relax.take")(table, is_op("relax.add")(is_op("relax.astype")(x), off))
    return core, {"data": x, "offset": off, "table": table, "core": core, "root": core}


def qlinear_lut_pattern(kind: str = "conv2d") -> tuple[DFPattern, dict]:
    """A conv / dense (:func:`qlinear_pattern`) whose requantized output goes through a table
    lookup (:func:`qlut_pattern`): an activation fused after the layer (DNNVM's point-wise
    fusion). The conv's annotations, plus ``offset``, ``table`` and ``lut`` (the take, the
    composite's output); ``root`` stays the conv's requantize (its dtype checks apply)."""
    conv, ann = qlinear_pattern(kind)
    off, table = is_const(), is_const()
    lut = is_op("relax.take")(table, is_op("relax.add")(is_op("relax.astype")(conv), off))
    ann.update({"offset": off, "table": table, "lut": lut})
    return lut, ann


def qmul_pattern() -> tuple[DFPattern, dict]:
    """Product of two quantized tensors in canonical form (a squeeze-excitation gate):
    ``multiply(astype(a) - za, astype(b) - zb)`` (int32, broadcasting) -> requant chain."""
    a, b, za, zb = wildcard(), wildcard(), is_const(), is_const()
    ta = is_op("relax.subtract")(is_op("relax.astype")(a), za)
    tb = is_op("relax.subtract")(is_op("relax.astype")(b), zb)
    core = is_op("relax.multiply")(ta, tb)
    out, ann = _requant_chain(core)
    ann.update({"core": core, "lhs": a, "rhs": b, "lhs_zero_point": za, "rhs_zero_point": zb})
    return out, ann


# --- form checks: what extract_layer_graph needs to rebuild a layer ----------------------------
def pool_is_plain(m: dict) -> bool:
    """pooling with ceil mode, dilation or a non-NCHW layout (no PoolLayer form)"""
    c = m["core"]
    if c.op.name == "relax.sum":
        return True
    a = c.attrs
    return (not bool(a.ceil_mode) and all(int(d) == 1 for d in a.dilation)
            and a.layout == "NCHW" and (a.out_layout or "NCHW") == "NCHW")


def upsample_is_nearest(m: dict) -> bool:
    """resize is not a nearest-neighbour upsample by integer factors"""
    from tvm_accel.canonicalize import nearest_upsample_scale

    c = m["core"]
    shape_in, shape_out = static_shape(m["data"]), static_shape(c)
    if shape_in is None or shape_out is None or len(shape_in) != 4:
        return False
    return nearest_upsample_scale(c.attrs, shape_in, shape_out) is not None


def concat_on_channels(m: dict) -> bool:
    """concat is not along the channel axis of NCHW tensors"""
    shape = static_shape(m["core"])
    return shape is not None and len(shape) == 4 and int(m["core"].attrs.axis) % 4 == 1


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


# --- sub-byte precision ---------------------------------------------------------------------------
def module_layer_bits(mod: tvm.IRModule) -> dict[str, dict[str, int]]:
    """Layer name -> ``{"w", "i", "o"}`` bits recorded by canonicalize (empty: all 8-bit)."""
    from tvm_accel.precision import LAYER_BITS_ATTR

    if mod.attrs is None or LAYER_BITS_ATTR not in mod.attrs:
        return {}
    return {str(k): {str(kk): int(vv) for kk, vv in v.items()}
            for k, v in mod.attrs[LAYER_BITS_ATTR].items()}


def module_layer_names(mod: tvm.IRModule) -> dict[str, str]:
    """Layer var name -> ONNX node name where they differ (the import's ``onnx_node_names``
    and canonicalize's :data:`~tvm_accel.canonicalize.LAYER_NAMES_ATTR`): the name users see
    and write."""
    from tvm_accel.canonicalize import LAYER_NAMES_ATTR

    out: dict[str, str] = {}
    for attr in ("onnx_node_names", LAYER_NAMES_ATTR):
        if mod.attrs is not None and attr in mod.attrs:
            out.update((str(k), str(v)) for k, v in mod.attrs[attr].items())
    return out


def subbyte_activation_bits(m: dict) -> int | None:
    """Narrowest activation width (input or output) below 8 bits of a matched layer, from
    ``m["precision"]``; None when its activations are 8-bit (or nothing was recorded)."""
    bits = m.get("precision") or {}
    low = [int(bits[k]) for k in ("i", "o") if bits.get(k) is not None and int(bits[k]) < 8]
    return min(low) if low else None


# --- running the table --------------------------------------------------------------------------
#: attribute of a host function a target added around its calls (e.g. VTA's layout rewrites):
#: it holds no offloadable layer
HOST_FUNCTION_ATTR = "accel_host_function"


def partition(mod: tvm.IRModule, patterns: list[OffloadPattern],
              excluded: Mapping[str, str] | None = None) -> tvm.IRModule:
    """Group matched layers into ``Codegen`` functions (neighbours merged), leaving the layers
    of ``excluded`` (name -> reason) on the host. Host functions (:data:`HOST_FUNCTION_ATTR`)
    come in without dataflow blocks (``MergeCompositeFunctions`` only groups dataflow blocks of
    the functions it partitions) and get them afterwards, so ``FuseOps`` fuses their ops."""
    bits = module_layer_bits(mod)
    if excluded:  # keyed by the ONNX names users see; the checks see var names
        var_of = {v: k for k, v in module_layer_names(mod).items()}
        excluded = {var_of.get(k, k): r for k, r in excluded.items()}
    entries = [p.as_fusion_entry(bits, excluded) for p in patterns]
    mod = relax.transform.FuseOpsByPattern(entries, bind_constants=True,
                                           annotate_codegen=False)(mod)
    mod = relax.transform.MergeCompositeFunctions()(mod)
    for gv, f in list(mod.functions_items()):
        if isinstance(f, relax.Function) and f.attrs is not None \
                and HOST_FUNCTION_ATTR in f.attrs:
            mod[gv] = relax.transform.ConvertToDataflow()(tvm.IRModule({gv: f}))[gv]
    return mod


@dataclass
class OffloadRecord:
    """Where one layer of the canonical graph goes, and why."""

    layer: str
    op: str
    shape: str
    placement: str
    reason: str
    #: ``layer`` (runs somewhere), ``fused`` (part of another row's layer), ``folded`` (gone
    #: at import), ``qdq`` / ``const`` (activation / constant Q/DQ; listed on request)
    kind: str = "layer"


def common_fallback(reasons: list[str]) -> list[str]:
    """The largest group of CPU-fallback ``reasons`` that differ only in their numbers (shapes,
    channel counts), in the given order; empty for no reasons."""
    import re

    groups: dict[str, list[str]] = {}
    for r in reasons:
        groups.setdefault(re.sub(r"\d[\w.+-]*", "#", r), []).append(r)
    return max(groups.values(), key=len) if groups else []


_ANCHORS = {"relax.nn.conv2d": "conv2d", "relax.matmul": "dense",
            "relax.nn.conv2d_transpose": "conv2d_transpose",
            "relax.nn.max_pool2d": "max_pool2d", "relax.nn.avg_pool2d": "avg_pool2d",
            "relax.image.resize2d": "upsample",
            "relax.sum": "sum", "relax.mean": "mean", "relax.concat": "concat",
            "relax.reshape": "reshape", "relax.quantize": "quantize",
            "relax.dequantize": "dequantize"}


def _shape_str(expr) -> str:
    s = static_shape(expr)
    return "x".join(map(str, s)) if s else "?"


_WINDOWED = {"relax.nn.conv2d", "relax.nn.conv2d_transpose", "relax.nn.max_pool2d",
             "relax.nn.avg_pool2d"}


def _layer_shape(call, out) -> str:
    """The report's shape column (:func:`~tvm_accel.layers.layer_shape_text`, the format of
    every target's profile) of the layer whose anchor op is ``call`` and whose result is
    ``out``: its data input(s) (not weights), output and window."""
    shape = static_shape(out)
    op = getattr(getattr(call, "op", None), "name", None)
    if shape is None or op is None:
        return _shape_str(out)
    args = list(call.args)
    if op == "relax.concat" and isinstance(args[0], relax.Tuple):
        data = list(args[0].fields)
    elif op in _WINDOWED or op == "relax.matmul":
        data = args[:1]
    else:  # element-wise ops and lookups: their tensor operands, not constants (tables)
        data = [a for a in args if isinstance(a, relax.Var) and static_shape(a) is not None][:2]
    if not data:
        return _shape_str(out)
    ins = [s for s in (static_shape(a) for a in data) if s is not None]
    weight = static_shape(args[1]) if len(args) > 1 else None
    if len(ins) < len(data) or (op in _WINDOWED and "pool" not in op and weight is None):
        return _shape_str(out)
    window = None
    if op in _WINDOWED:
        a = call.attrs
        kernel = (tuple(int(k) for k in a.pool_size) if "pool" in op
                  else tuple(int(k) for k in (weight or ())[2:4]))
        window = SimpleNamespace(
            kernel=kernel, strides=tuple(int(s) for s in a.strides),
            padding=tuple(int(p) for p in a.padding), dilation=tuple(int(d) for d in a.dilation),
            groups=int(getattr(a, "groups", 1)),
            output_padding=tuple(int(p) for p in getattr(a, "output_padding", ()) or ()))
    return layer_shape_text(window, ins, shape)


def layer_name(core_var_name: str) -> str:
    """Layer name from the core op's binding (the canonicalizer names it ``<layer>_acc``)."""
    return core_var_name[:-4] if core_var_name.endswith("_acc") else core_var_name


def _float_reasons(numerics) -> dict[str, Any]:
    """Relax var name -> canonicalize record of a layer left float (with its reason)."""
    out: dict[str, Any] = {}
    for rec in numerics or ():
        if getattr(rec, "integer", True):
            continue
        for v in rec.detail.get("relax_vars", ()):
            out.setdefault(v, rec)
    return out


def explain(mod: tvm.IRModule, patterns: list[OffloadPattern], target_name: str,
            partitioned: tvm.IRModule | None = None,
            numerics: list | None = None,
            excluded: Mapping[str, str] | None = None,
            lowered: Mapping[str, str] | None = None) -> list[OffloadRecord]:
    """Every layer of ``main`` in model order, with placement and reason, named by its ONNX
    node.

    ``lowered`` (layer -> the pattern of its composite, for every layer a blob holds: see
    :func:`tvm_accel.lower.lowered_layers`) is where each layer went: those layers are on the
    target, every other layer is on the CPU, so the report never contradicts the package's
    blobs. The pattern walk below only says *why* a layer stays on the CPU: the checks that
    failed (patterns in priority order, a pattern whose checks fail gives way to the next, as
    in the partitioner), the reason lowering could not map it (``excluded``), an intermediate
    value used outside the layer (``partitioned``: its core op is still in ``main``), or the
    reason canonicalize left it float (``numerics``, the
    :class:`tvm_accel.canonicalize.LayerRecord` list); other anchor ops (pooling, reshape,
    quantize, ...) are host ops. Without ``lowered`` (before lowering), a layer whose checks
    pass is reported on the target.

    Every other operator node of the ONNX model gets a row too (module attribute
    :data:`~tvm_accel.frontend.ONNX_NODES_ATTR`): a ReLU or bias add fused into a layer has the
    layer's placement, an operator left in the graph is on the CPU (a float one, e.g. a Sigmoid
    between Q/DQ nodes: "no integer form for Sigmoid: runs in float on the CPU"), a node the
    import folded away says so; Q/DQ nodes of activations and of constants (weights, biases:
    folded into their layer) are rows of kind ``qdq`` / ``const``, on the CPU when they stay
    in the graph (the model's input and output, a float operator's).
    """
    func = mod["main"]
    walk = _Walk(func, patterns, target_name, excluded, lowered,
                 _host_op_names(partitioned) if partitioned is not None else None,
                 module_layer_bits(mod), module_layer_names(mod))
    floats = _float_reasons(numerics)
    #: the operator canonicalize recorded per layer (a GlobalAveragePool is a ``sum`` then)
    layer_ops = {rec.onnx_name: rec.op for rec in numerics or ()}
    node_vars = _onnx_node_vars(mod)
    matches: dict[str, OffloadRecord] = {}  # root binding -> its layer's row
    named: set[str] = set()
    for block in func.body.blocks:
        for binding in block.bindings:
            rec = walk.row(binding) if isinstance(binding.value, relax.Call) else None
            if rec is not None and rec.layer not in named:  # one row per layer
                named.add(rec.layer)
                matches[binding.var.name] = rec
    records = []
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if binding.var.name in matches:
                records.append(matches[binding.var.name])
                continue
            op = getattr(getattr(value, "op", None), "name", None)
            if op in _ANCHORS and value.__chandle__() not in walk.covered:
                fl = floats.get(binding.var.name)
                if fl is not None:
                    records.append(OffloadRecord(fl.onnx_name, fl.op, _shape_str(binding.var),
                                                 "cpu", f"left float by canonicalize: "
                                                 f"{fl.detail.get('reason', '?')}"))
                    continue
                var_name = layer_name(binding.var.name)
                name, shape = walk.onnx.get(var_name, var_name), _layer_shape(value, binding.var)
                if op in ("relax.quantize", "relax.dequantize"):
                    records.append(OffloadRecord(name, _ANCHORS[op], shape, "cpu",
                                                 _qdq_reason(func, binding), "qdq"))
                elif _is_float(binding.var):
                    if node_vars is not None and binding.var.name not in node_vars:
                        continue  # a step of a float ONNX node (a conv before its bias add)
                    records.append(OffloadRecord(name, _ANCHORS[op], shape, "cpu",
                                                 _float_reason(_ANCHORS[op], None)))
                else:
                    kind = layer_ops.get(name, _ANCHORS[op])
                    records.append(OffloadRecord(name, kind, shape, "cpu",
                                                 f"no {target_name} pattern for {kind}"))
    for name, pat_name in (lowered or {}).items():  # a blob's layer the walk did not name
        if name not in named:
            op = walk.by_name[pat_name].op if pat_name in walk.by_name else pat_name
            records.append(OffloadRecord(name, op, "?", target_name, f"matched {pat_name}"))
    return _with_node_rows(mod, records, numerics, target_name, walk.host, walk.fused)


@dataclass
class _Walk:
    """The pattern walk of :func:`explain`: the row of the layer rooted at a binding."""

    func: relax.Function
    patterns: list[OffloadPattern]
    target_name: str
    excluded: Mapping[str, str] | None
    lowered: Mapping[str, str] | None
    host: set[str] | None
    bits: dict[str, dict[str, int]]
    onnx: dict[str, str]
    #: core ops (and views) some pattern matched: not listed again as host ops
    covered: set[int] = field(default_factory=set)
    #: ONNX name of an activation fused into a layer (``lut`` annotation) -> that layer's
    fused: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        self.var2val = relax.analysis.get_var2val(self.func)
        self.bound_name = {v.__chandle__(): k.name for k, v in self.var2val.items()}
        self.by_name = {p.name: p for p in self.patterns}

    def row(self, binding) -> OffloadRecord | None:
        """The row of the layer whose pattern matches at ``binding`` (None: no pattern)."""
        first_failure = None
        for pat in self.patterns:
            m = pat.pattern.extract_matched_expr(binding.value, self.var2val)
            if m is None:
                continue
            annotated = {k: m[p] for k, p in pat.annotations.items() if p in m}
            core = annotated.get("core", annotated.get("root"))
            if core is None:
                raise AttributeError(f"pattern {pat.name} annotates neither 'core' nor 'root'")
            self.covered.add(core.__chandle__())
            core_name = self.bound_name.get(core.__chandle__(), binding.var.name)
            var_name = layer_name(core_name)
            name = self.onnx.get(var_name, var_name)
            shape = _layer_shape(core, binding.var)
            if "lut" in annotated and (self.lowered or {}).get(name, pat.name) != pat.name:
                # a layer and its activation that were not fused: why, on the activation's row
                lut = layer_name(self.bound_name.get(annotated["lut"].__chandle__(),
                                                     binding.var.name))
                failed = pat.failed_checks(annotated)
                first_failure = first_failure or (failed and OffloadRecord(
                    self.onnx.get(lut, lut), "lut", shape, "cpu", "; ".join(failed))) or None
                continue
            if self.lowered is not None and name in self.lowered:  # a blob holds it
                used = self.by_name.get(self.lowered[name], pat)
                if "flatten" in annotated and used.name == pat.name:
                    self.covered.add(annotated["flatten"].__chandle__())
                if "lut" in annotated and used.name == pat.name:
                    lut = layer_name(self.bound_name.get(annotated["lut"].__chandle__(),
                                                         binding.var.name))
                    self.fused[self.onnx.get(lut, lut)] = name
                return OffloadRecord(name, used.op, shape, self.target_name,
                                     f"matched {used.name}")
            if self.excluded and name in self.excluded:  # whatever the checks say
                return OffloadRecord(name, pat.op, shape, "cpu", self.excluded[name])
            if self.bits:
                annotated["precision"] = self.bits.get(var_name, {})
            failed = pat.failed_checks(annotated)
            if failed:  # the partitioner tries the next pattern: so does the report
                first_failure = first_failure or OffloadRecord(name, pat.op, shape, "cpu",
                                                               "; ".join(failed))
                continue
            if "flatten" in annotated:
                self.covered.add(annotated["flatten"].__chandle__())
            return OffloadRecord(name, pat.op, shape, *self._placement(pat, name, core_name))
        return first_failure

    def _placement(self, pat: OffloadPattern, name: str, core_name: str) -> tuple[str, str]:
        """Placement and reason of a layer whose checks pass."""
        if self.excluded and name in self.excluded:
            return "cpu", self.excluded[name]
        if self.host is not None and core_name in self.host:
            return "cpu", "an intermediate value is used outside the layer"
        if self.lowered is not None:
            return "cpu", (f"matched {pat.name}, but no offloaded function holds it (the "
                           "partitioner gave its ops to other layers)")
        return self.target_name, f"matched {pat.name}"


def _with_node_rows(mod: tvm.IRModule, records: list[OffloadRecord], numerics,
                    target_name: str, host: set[str] | None,
                    fused: Mapping[str, str] | None = None) -> list[OffloadRecord]:
    """``records`` plus one row per ONNX node they do not name, all in model order (see
    :func:`explain`); ``fused``: an activation's name -> the layer it is fused into."""
    from tvm_accel.frontend import ONNX_NODES_ATTR, sanitize_name

    if mod.attrs is None or ONNX_NODES_ATTR not in mod.attrs:
        return records
    nodes = [(str(n[0]), str(n[1]), str(n[2])) for n in mod.attrs[ONNX_NODES_ATTR]]
    by_layer = {r.layer: r for r in records}
    owner: dict[str, OffloadRecord] = {}  # var name of a fused node -> its layer's row
    integer = {r.onnx_name: r for r in numerics or () if getattr(r, "integer", False)}
    for rec in numerics or ():
        row = by_layer.get(rec.onnx_name)
        if row is not None:
            for v in rec.detail.get("absorbed", ()):
                owner.setdefault(v, row)
    fused_into = {act: by_layer[lay] for act, lay in (fused or {}).items() if lay in by_layer}
    # an intermediate layer composed into another one's table (the Sigmoid of a SiLU)
    composed = {n: rec.onnx_name for rec in integer.values()
                for n in rec.detail.get("composed", ())}
    bound = {b.var.name: b.var for blk in mod["main"].body.blocks for b in blk.bindings}
    value = {b.var.name: b.value for blk in mod["main"].body.blocks for b in blk.bindings}
    floats = _float_reasons(numerics)
    order = {name: i for i, (name, _, _) in enumerate(nodes)}
    keyed, last, later = [], -1.0, []
    for r in records:  # a record without a node stays after its predecessor
        last = order.get(r.layer, last + 1e-6)
        keyed.append((last, r))
    for i, (name, op_type, kind) in enumerate(nodes):
        if name in by_layer:
            continue
        var = sanitize_name(name)
        if var not in bound and name in integer:  # canonicalize's integer op (a ReLU's max)
            var = next((v for v in reversed(bound) if v.startswith(integer[name].name + "_")),
                       var)
        op = {"QuantizeLinear": "quantize", "DequantizeLinear": "dequantize"}.get(
            op_type, op_type.lower())
        if kind == "const":
            row = OffloadRecord(name, op, "-", "-", "constant: folded into the layer using it",
                                "const")
        elif kind == "qdq":
            row = OffloadRecord(name, op, "-", "-",
                                "activation quantization: part of the integer graph", "qdq")
        elif var in owner or name in fused_into:
            lay = owner.get(var) or fused_into[name]
            row = OffloadRecord(name, op, lay.shape, lay.placement, f"fused into {lay.layer}",
                                "fused")
        elif var in bound:
            if _is_float(bound[var]):
                row = OffloadRecord(name, op, _layer_shape(value[var], bound[var]), "cpu",
                                    _float_reason(op_type, floats.get(var)))
            elif host is None or var in host:
                row = OffloadRecord(name, op, _layer_shape(value[var], bound[var]), "cpu",
                                    f"no {target_name} pattern for {op_type}")
            else:  # taken into a layer's pattern (a Flatten the DPU reads as a view)
                row = OffloadRecord(name, op, _layer_shape(value[var], bound[var]), target_name,
                                    f"inside an offloaded {target_name} function", "fused")
        elif name in composed:  # its row follows the layer's, which may come later
            later.append((i, name, op))
            continue
        else:
            row = OffloadRecord(name, op, "-", "-", "folded away at import (constant or no-op)",
                                "folded")
        keyed.append((float(i), row))
    rows = {r.layer: r for _, r in keyed}
    for i, name, op in later:
        owner_row = rows.get(composed[name])
        keyed.append((float(i), OffloadRecord(
            name, op, owner_row.shape if owner_row else "-",
            owner_row.placement if owner_row else "-",
            f"fused into {composed[name]}", "fused")))
    keyed.sort(key=lambda kr: kr[0])
    return [r for _, r in keyed]


def _onnx_node_vars(mod: tvm.IRModule) -> set[str] | None:
    """Var names of the ONNX nodes (:data:`~tvm_accel.frontend.ONNX_NODES_ATTR`); None when
    the import did not record them."""
    from tvm_accel.frontend import ONNX_NODES_ATTR, sanitize_name

    if mod.attrs is None or ONNX_NODES_ATTR not in mod.attrs:
        return None
    return {sanitize_name(str(n[0])) for n in mod.attrs[ONNX_NODES_ATTR]}


def _is_float(var: relax.Var) -> bool:
    """Whether a binding computes a float tensor (an operator left out of the integer graph)."""
    return str(getattr(var.ty, "dtype", "")).startswith(("float", "bfloat"))


def _float_reason(op_type: str, record) -> str:
    """Reason of an operator computed in float on the CPU, from canonicalize's ``record`` of
    it (None: the model has no Q/DQ around it)."""
    if record is None:
        return "not quantized in the model (no Q/DQ around it): runs in float on the CPU"
    reason = record.detail.get("reason", "?")
    if reason == "not a recognised QDQ pattern":
        return f"no integer form for {op_type}: runs in float on the CPU"
    return f"left float by canonicalize: {reason}"


def _qdq_reason(func: relax.Function, binding) -> str:
    """Reason of a quantize / dequantize left in the graph: it converts between the integer
    graph and a float tensor (the model's input or output, or a float operator's), on the
    CPU."""
    arg = binding.value.args[0]
    if binding.value.op.name == "relax.quantize":
        if any(arg.same_as(p) for p in func.params):
            return "quantizes the model input: runs on the CPU"
        return "quantizes a float operator's output: runs on the CPU"
    if _returns(func, binding.var):
        return "dequantizes the model output: runs on the CPU"
    return "dequantizes for a float operator: runs on the CPU"


def _returns(func: relax.Function, var: relax.Var) -> bool:
    """Whether ``var`` is (an alias of, or a field of the tuple of) the function's result."""
    alias = relax.analysis.get_var2val(func)
    seen: list = [func.body.body]
    while seen:
        e = seen.pop()
        if isinstance(e, relax.Var):
            if e.same_as(var):
                return True
            if e in alias and isinstance(alias[e], (relax.Var, relax.Tuple)):
                seen.append(alias[e])
        elif isinstance(e, relax.Tuple):
            seen.extend(e.fields)
    return False


def _host_op_names(mod: tvm.IRModule) -> set[str]:
    """Binding names of the operator calls left in ``main`` after partitioning (the host ops):
    a matched layer whose core binding is still among them was not offloaded."""
    names: set[str] = set()
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op):
                names.add(b.var.name)
    return names
