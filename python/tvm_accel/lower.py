"""Lowering of offloaded functions: Relax ``Codegen`` function -> LayerGraph -> program blob.

Each function produced by :func:`tvm_accel.partition.partition` holds a chain of composite
functions in canonical integer form. :func:`extract_layer_graph` reads them back into the
target-independent :class:`~tvm_accel.layers.LayerGraph`; the target compiles that into a blob,
and the call site becomes ``call_dps_packed("<package>.run", [blob, *inputs])`` so the blob
travels inside the compiled module (``export_library`` keeps it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from tvm_accel.canonicalize import span_layer
from tvm_accel.canonicalize.records import _AUTO_NAME
from tvm_accel.errors import AccelError, KnobError, MappingError
from tvm_accel.frontend import sanitize_name
from tvm_accel.layers import (
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DeconvLayer,
    LayerGraph,
    LutLayer,
    MulLayer,
    PoolLayer,
    Requant,
    Tensor,
    UpsampleLayer,
)
from tvm_accel.partition import (
    LAYER_ATTR,
    OffloadPattern,
    const_value,
    dtype_of,
    layer_name,
    module_layer_bits,
    module_layer_names,
    static_shape,
)
from tvm_accel.precision import range_bits, signed_bits
from tvm_accel.target import AccelTarget
from tvm_accel.tuning.apply import apply_history


@dataclass
class LoweredFunction:
    """What lowering produced for one offloaded function (for reports and tests)."""

    name: str
    graph: LayerGraph
    blob: bytes
    compile_seconds: float
    layers: list[str] = field(default_factory=list)
    #: layer -> the tuning record's configuration it was compiled with
    tuned: dict = field(default_factory=dict)
    #: layer -> the pattern (composite) it was read from
    patterns: dict[str, str] = field(default_factory=dict)


def lowered_layers(functions: list[LoweredFunction]) -> dict[str, str]:
    """Every layer a blob holds -> its pattern: where the placement report puts layers on
    the target (:func:`tvm_accel.partition.explain`)."""
    return {layer: pat for fn in functions for layer, pat in fn.patterns.items()}


def _composite_patterns(func: relax.Function) -> list[str]:
    """The pattern of each composite call of an offloaded function, in binding order (the
    order :func:`extract_layer_graph` appends the layers)."""
    local = {b.var.__chandle__(): b.value for blk in func.body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Function)}
    return [str(local[b.value.op.__chandle__()].attrs["Composite"])
            for blk in func.body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, relax.Var)
            and b.value.op.__chandle__() in local]


def _scalar(expr) -> int:
    v = const_value(expr)
    if v.size != 1:
        raise AccelError(f"expected a scalar constant, got shape {v.shape}")
    return int(v.reshape(-1)[0])


def _vector(expr, k: int) -> np.ndarray:
    v = const_value(expr).astype(np.int64).reshape(-1)
    return np.broadcast_to(v, (k,)).copy() if v.size == 1 else v


def _requant(m: dict, k: int, pre_shift: int, multiplier: np.ndarray) -> Requant:
    rq = Requant(pre_shift=pre_shift, multiplier=multiplier, round_add=_vector(m["round_add"], k),
                 shift=_scalar(m["shift"]), zero_point=_scalar(m["zero_point"]),
                 qmin=_scalar(m["qmin"]), qmax=_scalar(m["qmax"]))
    rq.scale = rq.effective_scale
    return rq


def _param_index(comp: relax.Function, expr) -> int:
    """Position of the composite parameter ``expr`` (a matched wildcard)."""
    for i, p in enumerate(comp.params):
        if p.same_as(expr):
            return i
    raise AccelError(f"composite input {getattr(expr, 'name', expr)} is not a parameter")


def _tail_requant(ann: dict, prefix: str = "") -> Requant | None:
    """Per-tensor requant of a rescale tail (annotations ``<prefix>pre_shift`` ...), or None
    when the tail is absent."""
    if f"{prefix}multiplier" not in ann:
        return None
    sub = {k: ann[f"{prefix}{k}"] for k in ("round_add", "shift", "zero_point", "qmin", "qmax")}
    return _requant(sub, 1, _scalar(ann[f"{prefix}pre_shift"]),
                    _vector(ann[f"{prefix}multiplier"], 1))


def _ints(a) -> tuple[int, ...]:
    return tuple(int(x) for x in a)


def _pair(a) -> tuple[int, int]:
    """A two-element attribute (strides, dilation, kernel) as Python ints."""
    y, x = _ints(a)
    return y, x


def _quad(a) -> tuple[int, int, int, int]:
    """A four-element padding attribute ``(top, left, bottom, right)`` as Python ints."""
    t, lft, b, r = _ints(a)
    return t, lft, b, r


def _data_input(data: str | None, pat: OffloadPattern) -> str:
    """The tensor feeding a single-input layer (its pattern's ``data`` annotation)."""
    if data is None:
        raise AccelError(f"composite {pat.name} has no 'data' annotation")
    return data


def _layer_from_composite(comp: relax.Function, pat: OffloadPattern, inputs: list[str],
                          output: str):
    """Rebuild one layer from a composite function: dispatch on the pattern's core op (the
    annotations of :mod:`tvm_accel.partition`'s pattern builders). The layer is named by the
    function's :data:`~tvm_accel.partition.LAYER_ATTR` (the partitioner's match), else by its
    core op's span or binding."""
    body = comp.body
    root = body.blocks[-1].bindings[-1].value
    var2val = relax.analysis.get_var2val(comp)
    m = pat.pattern.extract_matched_expr(root, var2val)
    if m is None:
        raise AccelError(f"composite {pat.name} does not match its own pattern")
    ann = {k: m[p] for k, p in pat.annotations.items() if p in m}
    core = ann["core"]
    name = str(comp.attrs[LAYER_ATTR]) if LAYER_ATTR in comp.attrs else span_layer(core) or \
        layer_name(next((b.var.name for blk in body.blocks for b in blk.bindings
                         if b.value.same_as(core)), output))
    op = core.op.name
    if "weight" in ann:
        w = const_value(ann["weight"]).astype(np.int64)
        bias = const_value(ann["bias"]).astype(np.int64).reshape(-1)
        zx = _scalar(ann["input_zero_point"])
        if op == "relax.nn.conv2d_transpose":
            a = core.attrs
            g = int(a.groups)
            k = int(w.shape[1]) * g
            rq = _requant(ann, k, _scalar(ann["pre_shift"]), _vector(ann["multiplier"], k))
            return DeconvLayer(name=name, input=inputs[0], output=output, weight=w, bias=bias,
                               input_zero_point=zx, strides=_pair(a.strides),
                               padding=_quad(a.padding), output_padding=_pair(a.output_padding),
                               requant=rq, groups=g, dilation=_pair(a.dilation))
        is_dense = op == "relax.matmul"
        groups, dilation = 1, (1, 1)
        strides: tuple[int, int]
        padding: tuple[int, int, int, int]
        if is_dense:
            w = w.T.reshape(w.shape[1], w.shape[0], 1, 1)
            strides, padding = (1, 1), (0, 0, 0, 0)
        else:
            a = core.attrs
            strides = _pair(a.strides)
            padding = _quad(a.padding)
            groups = int(a.groups)
            dilation = _pair(a.dilation)
        k = w.shape[0]
        rq = _requant(ann, k, _scalar(ann["pre_shift"]), _vector(ann["multiplier"], k))
        lut, lo = None, -128
        if "table" in ann:  # a fused activation (partition.qlinear_lut_pattern)
            lut = const_value(ann["table"]).astype(np.int64).reshape(-1, 256)
            lo = -int(np.asarray(const_value(ann["offset"])).reshape(-1)[0])
        return ConvLayer(name=name, input=inputs[0], output=output, weight=w, bias=bias,
                         input_zero_point=zx, strides=strides, padding=padding, requant=rq,
                         is_dense=is_dense, op_name="dense" if is_dense else "conv2d",
                         groups=groups, dilation=dilation, lut=lut, lut_lo=lo)
    if op == "relax.multiply":
        rq = _requant(ann, 1, _scalar(ann["pre_shift"]), _vector(ann["multiplier"], 1))
        return MulLayer(name=name, inputs=(inputs[_param_index(comp, ann["lhs"])],
                                           inputs[_param_index(comp, ann["rhs"])]),
                        output=output, a_zero_point=_scalar(ann["lhs_zero_point"]),
                        b_zero_point=_scalar(ann["rhs_zero_point"]), requant=rq)
    if "lhs" in ann:
        rq = _requant(ann, 1, 0, np.ones(1, dtype=np.int64))
        return AddLayer(name=name, inputs=(inputs[0], inputs[1]), output=output,
                        a_zero_point=_scalar(ann["lhs_zero_point"]),
                        b_zero_point=_scalar(ann["rhs_zero_point"]),
                        a_multiplier=_scalar(ann["lhs_multiplier"]),
                        b_multiplier=_scalar(ann["rhs_multiplier"]), requant=rq)
    data = inputs[_param_index(comp, ann["data"])] if "data" in ann else None
    if op in ("relax.nn.max_pool2d", "relax.nn.avg_pool2d"):
        a = core.attrs
        if any(int(d) != 1 for d in a.dilation) or bool(a.ceil_mode):
            raise AccelError(f"layer {name}: dilated or ceil-mode pooling has no PoolLayer form")
        kind = "max" if op == "relax.nn.max_pool2d" else "avg"
        pool_rq = _tail_requant(ann) if kind == "max" else _requant(
            ann, 1, _scalar(ann["pre_shift"]), _vector(ann["multiplier"], 1))
        if kind == "avg" and _scalar(ann["window"]) != int(np.prod(_ints(a.pool_size))):
            raise AccelError(f"layer {name}: avg pool window constant does not match its kernel")
        return PoolLayer(name=name, input=_data_input(data, pat), output=output, kind=kind,
                         kernel=_pair(a.pool_size), strides=_pair(a.strides),
                         padding=_quad(a.padding),
                         input_zero_point=(_scalar(ann["input_zero_point"])
                                           if "input_zero_point" in ann else 0),
                         requant=pool_rq)
    if op == "relax.sum":
        shape = static_shape(ann["data"])
        if shape is None:
            raise TypeError(f"layer {name}: the summed tensor has no static shape")
        axes = [int(x) % len(shape) for x in core.attrs.axis] if core.attrs.axis is not None \
            else list(range(len(shape)))
        if len(shape) != 4 or sorted(axes) != [2, 3] or not bool(core.attrs.keepdims):
            raise AccelError(f"layer {name}: a sum that is not a global average pool")
        rq = _requant(ann, 1, _scalar(ann["pre_shift"]), _vector(ann["multiplier"], 1))
        return PoolLayer(name=name, input=_data_input(data, pat), output=output, kind="avg",
                         kernel=(shape[2], shape[3]), strides=(1, 1), padding=(0, 0, 0, 0),
                         input_zero_point=_scalar(ann["input_zero_point"]), requant=rq,
                         op_name="global_avg_pool2d")
    if op == "relax.image.resize2d":
        from tvm_accel.canonicalize import nearest_upsample_scale

        scale = nearest_upsample_scale(core.attrs, static_shape(ann["data"]),
                                       static_shape(core))
        if scale is None:
            raise AccelError(f"layer {name}: resize2d is not a nearest upsample by integers")
        return UpsampleLayer(name=name, input=_data_input(data, pat), output=output, scale=scale,
                             input_zero_point=(_scalar(ann["input_zero_point"])
                                               if "input_zero_point" in ann else 0),
                             requant=_tail_requant(ann))
    if op == "relax.concat":
        n = sum(1 for k in ann if k.startswith("input") and k[5:].isdigit())
        ins = tuple(inputs[_param_index(comp, ann[f"input{i}"])] for i in range(n))
        zps = tuple(_scalar(ann[f"in{i}_input_zero_point"]) if f"in{i}_input_zero_point" in ann
                    else 0 for i in range(n))
        rqs = tuple(_tail_requant(ann, f"in{i}_") for i in range(n))
        return ConcatLayer(name=name, inputs=ins, output=output, input_zero_points=zps,
                           requants=rqs, axis=int(core.attrs.axis))
    if op == "relax.take":
        return _lut_layer(name, ann, _data_input(data, pat), output)
    raise AccelError(f"composite {pat.name}: no layer kind for core op {op}")


def _lut_layer(name: str, ann: dict, data: str, output: str) -> LutLayer:
    """A table lookup in canonical form (``emit_lut``): the flat table as ``(K, 256)`` rows,
    the offset checked to be the canonical ``256 * k - lo``."""
    from tvm_accel.layers import DTYPE_RANGE

    dt = dtype_of(ann["data"])
    table = const_value(ann["table"])
    if dt not in DTYPE_RANGE or table.size % 256 or table.ndim != 1:
        raise AccelError(f"layer {name}: a table lookup that is not 256 entries per row of an "
                         "8-bit input")
    rows = table.reshape(-1, 256)
    offset = const_value(ann["offset"]).astype(np.int64).reshape(-1)
    want = np.arange(rows.shape[0], dtype=np.int64) * 256 - DTYPE_RANGE[dt][0]
    if offset.shape != want.shape or not np.array_equal(offset, want):
        raise AccelError(f"layer {name}: table offset is not the canonical 256 * channel - lo")
    return LutLayer(name=name, input=data, output=output, table=rows.copy())


def _tensor(name: str, expr, bits: int = 8) -> Tensor:
    shape = static_shape(expr)
    if shape is None:
        raise AccelError(f"tensor {name} has no static shape")
    return Tensor(name, shape, str(expr.ty.dtype), bits)


def _output_bits(layer, dtype: str, tensors: dict[str, Tensor]) -> int:
    """Bits of a layer's output: the clip range of its requantize; a layer without one (max
    pool, upsample, concat of equal quantizations) passes its inputs' widest range on; a table
    lookup's output is whole bytes (any entry may be any code)."""
    if isinstance(layer, LutLayer):
        return 8
    rqs = [layer.requant] if hasattr(layer, "requant") else list(getattr(layer, "requants", ()))
    ins = [layer.input] if hasattr(layer, "input") else list(layer.inputs)
    in_bits = max((tensors[i].bits for i in ins if i in tensors), default=8)
    if not rqs or any(rq is None for rq in rqs):
        width = in_bits
    else:
        width = 0
    for rq in rqs:
        if rq is not None:
            width = max(width, range_bits(int(rq.qmin), int(rq.qmax), dtype))
    return width or 8


def extract_layer_graph(func: relax.Function, patterns: list[OffloadPattern],
                        layer_bits: dict[str, dict[str, int]] | None = None,
                        input_bits: list[int] | None = None,
                        onnx_names: dict[str, str] | None = None) -> LayerGraph:
    """Read an offloaded ``Codegen`` function back into a :class:`LayerGraph`.

    Layers are named by their ONNX node (``onnx_names``: var name -> ONNX name, see
    :func:`tvm_accel.partition.module_layer_names`); tensors keep the var names.

    Precision (:mod:`tvm_accel.precision`): each output tensor's ``bits`` comes from the clip
    range of its producing requantize; function inputs take ``input_bits`` (one per parameter,
    from the recorded quantization; default 8); ``ConvLayer.weight_bits`` is the recorded
    weight width (``layer_bits[layer]["w"]``, canonicalize's record), widened if the values
    minus zero point need more, else the smallest signed width holding the values (>= 2).
    """
    layer_bits = layer_bits or {}
    onnx_names = onnx_names or {}
    by_name = {p.name: p for p in patterns}
    tensors: dict[str, Tensor] = {}
    names: dict[int, str] = {}
    inputs = []
    for i, p in enumerate(func.params):
        tensors[p.name] = _tensor(p.name, p, input_bits[i] if input_bits else 8)
        names[p.__chandle__()] = p.name
        inputs.append(p.name)
    local_funcs: dict[int, relax.Function] = {}
    layers = []
    used: set[str] = set(inputs)

    def unique(n: str) -> str:
        base, i = n, 1
        while n in used:
            n = f"{base}_{i}"
            i += 1
        used.add(n)
        return n

    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Function):
                local_funcs[b.var.__chandle__()] = v
            elif isinstance(v, relax.Call) and isinstance(v.op, relax.Var):
                comp = local_funcs.get(v.op.__chandle__())
                if comp is None or "Composite" not in comp.attrs:
                    raise AccelError(f"unexpected call in offloaded function: {v.op.name}")
                pat = by_name[str(comp.attrs["Composite"])]
                args = [names[a.__chandle__()] for a in v.args]
                layer = _layer_from_composite(comp, pat, args, "")
                if isinstance(layer, ConvLayer):
                    rec = layer_bits.get(layer.name, {}).get("w")  # still the var name
                    vb = signed_bits(layer.weight)
                    layer.weight_bits = max(int(rec), vb) if rec is not None else vb
                if LAYER_ATTR not in comp.attrs and _AUTO_NAME.fullmatch(layer.name):
                    # without the partitioner's name, a one-op composite loses its var name
                    layer.name = f"{args[0]}_{pat.name.split('.')[-1]}"
                layer.output = out = unique(layer.name)
                layer.name = onnx_names.get(out, out)  # unique, like the output tensors
                names[b.var.__chandle__()] = out
                dtype = str(b.var.ty.dtype)
                tensors[out] = _tensor(out, b.var, _output_bits(layer, dtype, tensors))
                layers.append(layer)
            elif isinstance(v, relax.Var):
                names[b.var.__chandle__()] = names[v.__chandle__()]
            else:
                raise AccelError(f"unexpected binding in offloaded function: {type(v).__name__}")
    result = func.body.body
    outs = result.fields if isinstance(result, relax.Tuple) else [result]
    outputs = [names[o.__chandle__()] for o in outs]
    return LayerGraph(tensors=tensors, layers=layers, inputs=inputs, outputs=outputs)


def _offload_input_bits(mod: tvm.IRModule, offloaded: dict, patterns, layer_bits: dict,
                        graphs: dict | None = None) -> dict:
    """Bits of each offloaded function's arguments, walking ``main`` in order: a layer output
    computed on the host has its canonicalize record (``layer_bits[name]["o"]``), the result of
    another offloaded function the bits of that function's output tensor. The layer graphs
    built on the way are left in ``graphs``. Empty when every recorded width is 8."""
    if (not any(int(v) < 8 for b in layer_bits.values() for v in b.values())
            or "main" not in [gv.name_hint for gv in mod.get_global_vars()]):
        return {}
    graphs = {} if graphs is None else graphs
    var_bits: dict = {}  # Var or (Var, tuple index) -> bits
    result: dict = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.GlobalVar) \
                    and v.op in offloaded:
                bits = [var_bits.get(a, layer_bits.get(a.name, {}).get("o", 8))
                        if isinstance(a, relax.Var) else 8 for a in v.args]
                result[v.op] = bits
                graph = graphs[v.op] = extract_layer_graph(offloaded[v.op], patterns, layer_bits,
                                                           bits, module_layer_names(mod))
                outs = [graph.tensors[o].bits for o in graph.outputs]
                var_bits[b.var] = max(outs) if outs else 8
                for j, ob in enumerate(outs):
                    var_bits[(b.var, j)] = ob
            elif isinstance(v, relax.TupleGetItem) and isinstance(v.tuple_value, relax.Var):
                key = (v.tuple_value, int(v.index))
                if key in var_bits:
                    var_bits[b.var] = var_bits[key]
            elif isinstance(v, relax.Var) and v in var_bits:
                var_bits[b.var] = var_bits[v]
    return result


class UnmappableLayers(MappingError):
    """Offloaded layers the target could not compile under the config (``reasons``: layer ->
    the target's message); :func:`tvm_accel.pipeline.offload` partitions again without them,
    so they fall back to the CPU."""

    def __init__(self, reasons: dict[str, str]):
        self.reasons = dict(reasons)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.reasons.items()))


def _unmappable_layers(target: AccelTarget, graph: LayerGraph, config, knobs: dict | None,
                       error: MappingError) -> dict[str, str]:
    """The layers of a function that failed to compile, with the reason: each layer that does
    not compile alone; when every layer does (the function as a whole does not fit), the one
    the error names, else the last, so the next partition splits the function there."""
    from tvm_accel.tuning.layer_tasks import single_layer_graph

    if len(graph.layers) == 1:
        return {graph.layers[0].name: str(error)}
    out = {}
    for layer in graph.layers:
        try:
            target.compile_function(single_layer_graph(layer, graph), config, knobs)
        except KnobError:
            raise
        except MappingError as e:
            out[layer.name] = str(e)
    if out:
        return out
    named = [ly.name for ly in graph.layers if f"{ly.name}:" in str(error)]
    return {(named or [graph.layers[-1].name])[0]: f"{error} (with the layers around it)"}


#: progress listeners: (stage, index from 1, count, name, seconds)
_progress: list[Callable[[str, int, int, str, float], None]] = []


@contextmanager
def compile_progress(callback: Callable[[str, int, int, str, float], None]) -> Iterator[None]:
    """Call ``callback`` for each step of a compile that :func:`report_progress` announces:
    each offloaded function :func:`lower_offloads` finishes (stage ``lower``) and the steps
    targets announce (e.g. VTA's per-layer embedding search). ``tvmc compile`` prints a line
    per step once a compile takes more than a few seconds."""
    _progress.append(callback)
    try:
        yield
    finally:
        _progress.remove(callback)


def report_progress(stage: str, index: int, count: int, name: str, seconds: float) -> None:
    """Announce one finished step of a compile to the :func:`compile_progress` listeners."""
    for listener in _progress:
        listener(stage, index, count, name, seconds)


def lower_offloads(mod: tvm.IRModule, target: AccelTarget, config, knobs: dict | None = None,
                   report: list[LoweredFunction] | None = None) -> tvm.IRModule:
    """Compile every ``Codegen`` function of ``target`` and call its blob from ``main``. Raises
    :class:`UnmappableLayers` naming every layer the target could not map."""
    patterns = target.pattern_table()
    offloaded = {gv: f for gv, f in mod.functions_items()
                 if isinstance(f, relax.Function) and f.attrs
                 and f.attrs.get("Codegen") == target.name}
    layer_bits = module_layer_bits(mod)
    graphs: dict = {}
    _offload_input_bits(mod, offloaded, patterns, layer_bits, graphs)
    blobs = {}
    unmapped: dict[str, str] = {}
    for i, (gv, f) in enumerate(offloaded.items()):
        t0 = time.perf_counter()
        graph = graphs[gv] if gv in graphs else extract_layer_graph(
            f, patterns, layer_bits, onnx_names=module_layer_names(mod))
        first = sanitize_name(graph.layers[0].name) if graph.layers else "empty"
        name = f"{target.name}_{i}_{first}"
        fn_knobs, tuned = apply_history(target, graph, config, knobs)
        try:
            data = target.compile_function(graph, config, fn_knobs, name=name)
        except KnobError:
            raise
        except MappingError as e:
            unmapped.update(_unmappable_layers(target, graph, config, fn_knobs, e))
            continue
        report_progress("lower", i + 1, len(offloaded), name, time.perf_counter() - t0)
        blobs[gv] = relax.const(np.frombuffer(data, dtype=np.uint8), "uint8")
        if report is not None:
            layers = [ly.name for ly in graph.layers]
            report.append(LoweredFunction(name, graph, data, time.perf_counter() - t0, layers,
                                          tuned, dict(zip(layers, _composite_patterns(f),
                                                          strict=True))))

    if unmapped:
        raise UnmappableLayers(unmapped)

    @relax.expr_functor.mutator
    class _Rewrite(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.GlobalVar) and call.op in blobs:
                ret = offloaded[call.op].ret_ty
                if isinstance(ret, relax.TupleType):  # several outputs: one DPS buffer each
                    ret = list(ret.fields)
                return relax.call_dps_packed(target.runtime_func, [blobs[call.op], *call.args],
                                             ret)
            return call

    new = tvm.IRModule(attrs=mod.attrs)
    for gv, f in mod.functions_items():
        if gv in offloaded:
            continue
        new[gv] = _Rewrite().visit_expr(f) if isinstance(f, relax.Function) else f
    return new
