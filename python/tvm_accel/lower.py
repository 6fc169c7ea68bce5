"""Lowering of offloaded functions: Relax ``Codegen`` function -> LayerGraph -> program blob.

Each function produced by :func:`tvm_accel.partition.partition` holds a chain of composite
functions in canonical integer form. :func:`extract_layer_graph` reads them back into the
target-independent :class:`~tvm_accel.layers.LayerGraph`; the target compiles that into a blob,
and the call site becomes ``call_dps_packed("<package>.run", [blob, *inputs])`` so the blob
travels inside the compiled module (``export_library`` keeps it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from tvm_accel.errors import AccelError
from tvm_accel.layers import AddLayer, ConvLayer, LayerGraph, Requant, Tensor
from tvm_accel.partition import OffloadPattern, const_value, layer_name, static_shape
from tvm_accel.target import AccelTarget


@dataclass
class LoweredFunction:
    """What lowering produced for one offloaded function (for reports and tests)."""

    name: str
    graph: LayerGraph
    blob: bytes
    compile_seconds: float
    layers: list[str] = field(default_factory=list)


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


def _layer_from_composite(comp: relax.Function, pat: OffloadPattern, inputs: list[str],
                          output: str):
    body = comp.body
    root = body.blocks[-1].bindings[-1].value
    var2val = relax.analysis.get_var2val(comp)
    m = pat.pattern.extract_matched_expr(root, var2val)
    if m is None:
        raise AccelError(f"composite {pat.name} does not match its own pattern")
    ann = {k: m[p] for k, p in pat.annotations.items() if p in m}
    core_name = next((b.var.name for blk in body.blocks for b in blk.bindings
                      if b.value.same_as(ann["core"])), output)
    name = layer_name(core_name)
    if "weight" in ann:
        w = const_value(ann["weight"]).astype(np.int64)
        is_dense = ann["core"].op.name == "relax.matmul"
        if is_dense:
            w = w.T.reshape(w.shape[1], w.shape[0], 1, 1)
            strides, padding = (1, 1), (0, 0, 0, 0)
        else:
            a = ann["core"].attrs
            strides = tuple(int(s) for s in a.strides)
            padding = tuple(int(p) for p in a.padding)
        k = w.shape[0]
        rq = _requant(ann, k, _scalar(ann["pre_shift"]), _vector(ann["multiplier"], k))
        return ConvLayer(name=name, input=inputs[0], output=output, weight=w,
                         bias=const_value(ann["bias"]).astype(np.int64).reshape(-1),
                         input_zero_point=_scalar(ann["input_zero_point"]), strides=strides,
                         padding=padding, requant=rq, is_dense=is_dense,
                         op_name="dense" if is_dense else "conv2d")
    rq = _requant(ann, 1, 0, np.ones(1, dtype=np.int64))
    return AddLayer(name=name, inputs=(inputs[0], inputs[1]), output=output,
                    a_zero_point=_scalar(ann["lhs_zero_point"]),
                    b_zero_point=_scalar(ann["rhs_zero_point"]),
                    a_multiplier=_scalar(ann["lhs_multiplier"]),
                    b_multiplier=_scalar(ann["rhs_multiplier"]), requant=rq)


def _tensor(name: str, expr) -> Tensor:
    shape = static_shape(expr)
    if shape is None:
        raise AccelError(f"tensor {name} has no static shape")
    return Tensor(name, shape, str(expr.ty.dtype))


def extract_layer_graph(func: relax.Function, patterns: list[OffloadPattern]) -> LayerGraph:
    """Read an offloaded ``Codegen`` function back into a :class:`LayerGraph`."""
    by_name = {p.name: p for p in patterns}
    tensors: dict[str, Tensor] = {}
    names: dict[int, str] = {}
    inputs = []
    for p in func.params:
        tensors[p.name] = _tensor(p.name, p)
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
                layer.output = out = unique(layer.name)
                names[b.var.__chandle__()] = out
                tensors[out] = _tensor(out, b.var)
                layers.append(layer)
            elif isinstance(v, relax.Var):
                names[b.var.__chandle__()] = names[v.__chandle__()]
            else:
                raise AccelError(f"unexpected binding in offloaded function: {type(v).__name__}")
    result = func.body.body
    outs = result.fields if isinstance(result, relax.Tuple) else [result]
    outputs = [names[o.__chandle__()] for o in outs]
    return LayerGraph(tensors=tensors, layers=layers, inputs=inputs, outputs=outputs)


def lower_offloads(mod: tvm.IRModule, target: AccelTarget, config, knobs: dict | None = None,
                   report: list[LoweredFunction] | None = None) -> tvm.IRModule:
    """Compile every ``Codegen`` function of ``target`` and call its blob from ``main``."""
    patterns = target.pattern_table()
    offloaded = {gv: f for gv, f in mod.functions_items()
                 if isinstance(f, relax.Function) and f.attrs
                 and f.attrs.get("Codegen") == target.name}
    blobs = {}
    for i, (gv, f) in enumerate(offloaded.items()):
        t0 = time.perf_counter()
        graph = extract_layer_graph(f, patterns)
        first = graph.layers[0].name if graph.layers else "empty"
        name = f"{target.name}_{i}_{first}"
        data = target.compile_function(graph, config, knobs, name=name)
        blobs[gv] = relax.const(np.frombuffer(data, dtype=np.uint8), "uint8")
        if report is not None:
            report.append(LoweredFunction(name, graph, data,
                                          time.perf_counter() - t0,
                                          [ly.name for ly in graph.layers]))

    @relax.expr_functor.mutator
    class _Rewrite(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.GlobalVar) and call.op in blobs:
                return relax.call_dps_packed(target.runtime_func, [blobs[call.op], *call.args],
                                             offloaded[call.op].ret_ty)
            return call

    new = tvm.IRModule(attrs=mod.attrs)
    for gv, f in mod.functions_items():
        if gv in offloaded:
            continue
        new[gv] = _Rewrite().visit_expr(f) if isinstance(f, relax.Function) else f
    return new
