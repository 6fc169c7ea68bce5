"""Per-layer agreement with onnxruntime (``tvmc compare``, docs/architecture.md section 14).

The integer tensor of every layer is the output of its ``QuantizeLinear``. One copy of the QDQ
model gets every such tensor as an extra graph output (:func:`expose_layer_outputs`); the same
copy is compiled for the target and run (the offloaded layers on the simulator, the rest on the
host) and run by onnxruntime, so both return the same list of tensors and each comparison is
in the integer domain: 1 LSB = one integer step of the layer's output.

Two figures per layer: ``max_lsb`` / ``share_differ`` compare the two runs end to end (a layer
inherits the differences of the layers before it), ``local_max_lsb`` runs onnxruntime on *our*
inputs of each layer (:func:`cut_at_layer_outputs`), i.e. the layer's own disagreement.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from tvm_accel.errors import AccelError, ModelError
from tvm_accel.numerics import DEFAULT_MAX_REQUANT_ERROR

#: suffix of the graph inputs that feed our layer outputs into onnxruntime's next layers
OURS_SUFFIX = ".ours"


@dataclass
class LayerDiff:
    """One layer output (a QuantizeLinear tensor) compared with onnxruntime's."""

    layer: str            # ONNX node name of the layer (the input Q node's for the input)
    op: str
    placement: str        # the target kind, or cpu
    max_lsb: int          # largest |ours - onnxruntime| in integer steps, end to end
    share_differ: float   # fraction of the elements that differ, end to end
    elements: int
    tensor: str = ""      # the ONNX tensor compared (the QuantizeLinear output)
    #: the same with onnxruntime computing the layer from our inputs of it (None: not run)
    local_max_lsb: int | None = None
    local_share_differ: float | None = None


@dataclass
class CompareReport:
    """:func:`compare_layers`' result: one :class:`LayerDiff` per layer, worst first."""

    model: str
    target: str
    config: str = ""
    layers: list[LayerDiff] = field(default_factory=list)

    @property
    def max_lsb(self) -> int:
        """The worst layer's end-to-end difference (0 with no layer)."""
        return max((r.max_lsb for r in self.layers), default=0)

    @property
    def local_max_lsb(self) -> int:
        """The worst layer's own difference, onnxruntime fed with our inputs of each layer."""
        return max((r.local_max_lsb or 0 for r in self.layers), default=0)

    def worst(self) -> LayerDiff | None:
        return self.layers[0] if self.layers else None

    def format(self, limit: int | None = None) -> str:
        """The table (worst ``limit`` layers, all by default) and a summary line."""
        from tvm_accel.report import format_table

        rows = [(r.layer, r.op, r.placement, str(r.max_lsb), f"{100 * r.share_differ:.2f}",
                 f"{r.elements:,}", _opt(r.local_max_lsb, str),
                 _opt(r.local_share_differ, lambda s: f"{100 * s:.2f}"))
                for r in self.layers[:limit]]
        table = format_table(["layer", "op", "placement", "max LSB", "% differ", "elements",
                              "local LSB", "local %"], rows, align="lllrrrrr")
        worst = self.worst()
        where = self.target + (f" ({self.config})" if self.config else "")
        if worst is None:
            return table + f"\n{self.model} on {where}: no quantized layer to compare"
        differ = sum(1 for r in self.layers if r.max_lsb)
        if not differ:
            return table + (f"\n{self.model} on {where} vs onnxruntime: all "
                            f"{len(self.layers)} layer outputs agree bit for bit")
        shown = "" if limit is None or limit >= len(self.layers) else \
            f" (worst {limit} shown)"
        return (table + f"\n{self.model} on {where} vs onnxruntime: {len(self.layers)} layer "
                f"outputs{shown}, {differ} differ; worst {worst.max_lsb} LSB at {worst.layer};"
                f" each layer alone (onnxruntime on our inputs of it): worst "
                f"{self.local_max_lsb} LSB")


def _opt(value, fmt) -> str:
    return "-" if value is None else fmt(value)


def ort_session(model: onnx.ModelProto):
    """An onnxruntime CPU session of ``model`` without graph optimizations: the QDQ model as
    written (float ops between DequantizeLinear and QuantizeLinear, no fused integer kernels)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own exception classes: the model, not a bug here
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ModelError(f"{model.graph.name or 'model'}: onnxruntime cannot run it: "
                         f"{msg}") from None


def layer_outputs(model: onnx.ModelProto) -> list[str]:
    """The QuantizeLinear outputs of ``model`` (its integer activation tensors), model order."""
    return [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"]


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # an op shape inference does not know: types from the zero points below
        inferred = model.graph
    return {v.name: v for v in [*inferred.value_info, *inferred.output, *inferred.input]}


def expose_layer_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every QuantizeLinear output also a graph output (after the
    model's own outputs, in model order)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    infos = _value_infos(model)
    inits = {t.name: t for t in model.graph.initializer}
    have = {o.name for o in out.graph.output}
    for n in model.graph.node:
        if n.op_type != "QuantizeLinear" or n.output[0] in have:
            continue
        t = n.output[0]
        vi = infos.get(t)
        if vi is None or not vi.type.tensor_type.elem_type:
            zp = inits.get(n.input[2]) if len(n.input) > 2 else None
            vi = onnx.helper.make_tensor_value_info(
                t, zp.data_type if zp is not None else onnx.TensorProto.UINT8, None)
        out.graph.output.append(vi)
        have.add(t)
    return out


def cut_at_layer_outputs(exposed: onnx.ModelProto, ours: dict[str, np.ndarray]
                         ) -> onnx.ModelProto:
    """A copy of ``exposed`` where every node reading a layer output in ``ours`` reads the graph
    input ``<tensor>.ours`` instead: onnxruntime then computes each layer from our values of
    its inputs."""
    out = onnx.ModelProto()
    out.CopyFrom(exposed)
    used = set()
    for n in out.graph.node:
        for i, name in enumerate(n.input):
            if name in ours:
                n.input[i] = name + OURS_SUFFIX
                used.add(name)
    for name in sorted(used):
        arr = ours[name]
        out.graph.input.append(onnx.helper.make_tensor_value_info(
            name + OURS_SUFFIX, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
    return out


#: operators that only move or reshape values: an output behind them keeps its producer's step
_VIEW_OPS = ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity")


def output_lsb(model: onnx.ModelProto, ours: list[np.ndarray], theirs: list[np.ndarray]
               ) -> list[float | None]:
    """Largest difference of each graph output of the QDQ ``model`` between two runs (ours,
    onnxruntime's), in steps of the output's DequantizeLinear scale (found through view ops
    such as Flatten), rounded to 1/1000 of a step (float noise of the dequantized values); None
    for an output no DequantizeLinear produces (a float op's)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}
    out: list[float | None] = []
    for vi, a, b in zip(model.graph.output, ours, theirs, strict=True):
        n = producer.get(vi.name)
        while n is not None and n.op_type in _VIEW_OPS:
            n = producer.get(n.input[0])
        scale = inits.get(n.input[1]) if n is not None and n.op_type == "DequantizeLinear" \
            else None
        if scale is None or np.asarray(a).shape != np.asarray(b).shape:
            out.append(None)
            continue
        step = float(np.max(onnx.numpy_helper.to_array(scale)))
        d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
        out.append(round(float(d.max()) / step, 3) if d.size else 0.0)
    return out


def _diff(ours: np.ndarray, theirs: np.ndarray, tensor: str) -> tuple[int, float]:
    if ours.shape != theirs.shape:
        raise AccelError(f"{tensor}: the compiled model returns shape {list(ours.shape)}, "
                         f"onnxruntime {list(theirs.shape)} (a bug; report it)")
    d = np.abs(ours.astype(np.int64) - theirs.astype(np.int64))
    return (int(d.max()) if d.size else 0), (float(np.count_nonzero(d)) / d.size if d.size
                                             else 0.0)


def _check_inputs(inputs: dict[str, np.ndarray], info, where: str) -> dict[str, np.ndarray]:
    """``inputs`` as the model takes them: every input present with its shape, finite."""
    out = {}
    for name, (shape, dtype) in info.inputs.items():
        if name not in inputs:
            raise AccelError(f"{where}: no array named '{name}' (have: "
                             f"{', '.join(inputs) or 'none'}); give one array per model input")
        arr = np.asarray(inputs[name])
        if list(arr.shape) != list(shape):
            raise AccelError(f"{where}: input '{name}' has shape {list(arr.shape)}, the model "
                             f"expects {list(shape)}")
        if arr.dtype.kind not in "biuf" or (arr.dtype.kind == "f"
                                            and not np.isfinite(arr).all()):
            raise AccelError(f"{where}: input '{name}' is not finite real numbers")
        out[name] = arr.astype(dtype)
    return out


def _layer_of(model: onnx.ModelProto, tensor_to_q: dict[str, onnx.NodeProto],
              nodes: dict[str, Any], ops: dict[str, str]) -> dict[str, tuple[str, str, str]]:
    """Layer output tensor -> (layer name, op, placement) from the compile report's rows
    (``nodes``: ONNX name -> OffloadRecord; empty for an all-CPU build, where ``ops``, ONNX
    name -> canonical op, names the ops)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for tensor, q in tensor_to_q.items():
        src = producer.get(q.input[0])
        if src is None:  # the model input's quantize: float, on the host
            out[tensor] = (q.name or tensor, "quantize", "cpu")
            continue
        row = nodes.get(src.name)
        if row is not None and row.kind == "fused" and row.reason.startswith("fused into "):
            row = nodes.get(row.reason.removeprefix("fused into "), row)
        if row is None:
            out[tensor] = (src.name or tensor, ops.get(src.name, src.op_type.lower()), "cpu")
        else:
            out[tensor] = (row.layer, row.op, row.placement)
    return out


def compare_layers(model: Any, target: Any, inputs: dict[str, np.ndarray] | None = None, *,
                   config: Any = None, knobs: dict | None = None, precision: Any = None,
                   seed: int = 0, host: str = "llvm",
                   shapes: dict[str, list[int]] | None = None,
                   max_requant_error: float = DEFAULT_MAX_REQUANT_ERROR) -> CompareReport:
    """Compile ``model`` (a QDQ ONNX path or ModelProto) for ``target`` (a kind such as
    ``"vta"``, an :class:`~tvm_accel.target.AccelTarget`, or None for the CPU reference) with
    every layer output exposed, run it and onnxruntime on the same ``inputs`` (by input name;
    default: :func:`tvm_accel.frontend.random_inputs` with ``seed``) and compare each layer's
    integer output (``max_requant_error``: the requantize guard's limit, as in
    :func:`~tvm_accel.pipeline.compile_model`). Returns the layers worst first."""
    import tvm
    from tvm import relax

    from tvm_accel.frontend import _check, _read_model, load_onnx, random_inputs
    from tvm_accel.package import outputs_to_numpy
    from tvm_accel.pipeline import compile_model, compile_reference
    from tvm_accel.quantize import is_quantized
    from tvm_accel.target import get_target

    onnx_model, where = _read_model(os.fspath(model) if isinstance(model, os.PathLike)
                                    else model)
    _check(onnx_model, where)
    if not is_quantized(onnx_model) or not layer_outputs(onnx_model):
        raise ModelError(f"{where}: not quantized (no QuantizeLinear), so there is no integer "
                         "layer output to compare; quantize it first with 'tvmc quantize'")
    exposed = expose_layer_outputs(onnx_model)
    mod, info = load_onnx(exposed, shapes=shapes)
    feed = _check_inputs(inputs, info, "inputs") if inputs is not None \
        else random_inputs(info, seed)
    accel = get_target(target) if isinstance(target, str) else target
    report, ops = None, {}
    if accel is None:
        from tvm_accel.canonicalize import canonicalize

        ops = {r.onnx_name: r.op for r in canonicalize(mod, None, precision_config=precision)[1]}
        ex = compile_reference(mod, None, host, precision=precision)
    else:
        ex, report = compile_model(mod, accel, config, knobs, host, precision=precision,
                                   max_requant_error=max_requant_error)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    ours = outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(feed[k]) for k in info.inputs]))
    names = [o.name for o in exposed.graph.output]
    ours_by = dict(zip(names, ours, strict=True))
    theirs = dict(zip(names, ort_session(exposed).run(names, feed), strict=True))
    q_nodes = {n.output[0]: n for n in onnx_model.graph.node if n.op_type == "QuantizeLinear"}
    cut = cut_at_layer_outputs(exposed, {t: ours_by[t] for t in q_nodes})
    local_feed = {**feed, **{t + OURS_SUFFIX: ours_by[t] for t in q_nodes}}
    cut_inputs = {i.name for i in cut.graph.input}
    local = dict(zip(names, ort_session(cut).run(
        names, {k: v for k, v in local_feed.items() if k in cut_inputs}), strict=True))
    rows_by = {r.layer: r for r in report.nodes} if report is not None else {}
    owners = _layer_of(onnx_model, q_nodes, rows_by, ops)
    layers = []
    for t in q_nodes:
        layer, op, placement = owners[t]
        worst, share = _diff(ours_by[t], theirs[t], t)
        lw, ls = _diff(ours_by[t], local[t], t)
        layers.append(LayerDiff(layer, op, placement, worst, share, int(ours_by[t].size), t,
                                lw, ls))
    layers.sort(key=lambda r: (-r.max_lsb, -r.share_differ, -(r.local_max_lsb or 0)))
    return CompareReport(model=os.path.basename(where), target=accel.name if accel else "cpu",
                         config=report.config_name if report else "", layers=layers)
