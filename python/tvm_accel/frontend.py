"""ONNX import: a checked ONNX model (float or QDQ) -> Relax IRModule with bound constants.

``load_onnx`` is the first stage of the flow (docs/architecture.md section 2):

1. load and validate the model with ``onnx.checker`` (a bad file is a one-line
   :class:`~tvm_accel.errors.ModelError` naming the file);
2. require static input shapes (or take them from ``shapes``);
3. ``from_onnx`` with every initializer inlined as a constant;
4. ``FoldConstant``, except that the integer data of ``dequantize(const)`` (quantized weights and
   biases) is kept: FoldConstant would otherwise turn it into a float constant and canonicalize
   could no longer see the integers and their scales.

Layer names. ``from_onnx`` drops ONNX node names (Relax vars come out as ``lv``, ``lv1``... and
no spans are set). We import with a small subclass of the frontend's graph importer that binds
the value each ONNX node produces to a var named after the node (sanitized to an identifier,
e.g. ``layer1.0.conv1`` -> ``layer1_0_conv1``); the module attribute ``"onnx_node_names"`` maps
sanitized names back to the original ones. For a Conv with bias the named var is the
``add(conv2d, bias)`` the node produces. If the importer ever changes so that the hook fails,
``load_onnx`` falls back to plain ``from_onnx`` and ``info["naming"]`` says ``"positional"``
(canonicalize then names layers ``conv2d_0``, ``dense_1``, ...).
"""

from __future__ import annotations

import re
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import tvm
from tvm import relax

from tvm_accel.errors import AccelError, ModelError

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16",
                11: "float64", 9: "bool"}


@dataclass
class ModelInfo:
    """What ``load_onnx`` learned about the model (for reports and the CLI)."""

    name: str
    inputs: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, dtype)
    outputs: list[str]
    opset: int
    op_counts: dict[str, int]
    #: Relax var name -> ONNX node name, for names the sanitizer changed
    node_names: dict[str, str] = field(default_factory=dict)
    #: "onnx" (vars carry node names) or "positional" (fallback, see module docstring)
    naming: str = "onnx"
    #: quantized model (holds QuantizeLinear/DequantizeLinear)
    is_qdq: bool = False
    #: sub-byte ranges found in the model (:func:`tvm_accel.precision.widen_subbyte_qdq`):
    #: QuantizeLinear node name -> (qmin, qmax); weight DequantizeLinear node name -> bits
    activation_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    weight_bits: dict[str, int] = field(default_factory=dict)


def sanitize_name(name: str) -> str:
    """ONNX node name -> identifier usable as a Relax var name (``a.b/c`` -> ``a_b_c``)."""
    s = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return f"_{s}" if not s or s[0].isdigit() else s


def _read_model(path_or_model) -> tuple[onnx.ModelProto, str]:
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model, path_or_model.graph.name or "<model>"
    if isinstance(path_or_model, (bytes, bytearray)):
        where = "<bytes>"
        try:
            return onnx.load_from_string(bytes(path_or_model)), where
        except Exception as e:
            raise ModelError(f"{where}: not an ONNX model ({type(e).__name__}); pass the bytes "
                             "of an .onnx file") from None
    where = str(path_or_model)
    p = Path(where)
    if not p.exists():
        raise ModelError(f"{where}: no such file; give the path of an .onnx model")
    if p.is_dir():
        raise ModelError(f"{where}: is a directory; give the path of an .onnx model")
    try:
        return onnx.load(where), where
    except Exception as e:
        raise ModelError(f"{where}: not an ONNX model ({type(e).__name__}); export the network "
                         "to ONNX (e.g. torch.onnx.export) and pass the .onnx file") from None


def _check(model: onnx.ModelProto, where: str) -> None:
    if not model.graph.node:
        raise ModelError(f"{where}: not an ONNX model (the graph has no nodes); pass an .onnx "
                         "file exported from a framework")
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"{where}: invalid ONNX model: {msg}; re-export it or fix it with "
                         "onnx.checker") from None


def _static_inputs(model: onnx.ModelProto, where: str, shapes: dict | None):
    """Input name -> (static shape, dtype): the model's, or ``shapes`` (which must name model
    inputs and agree with every dimension the model fixes)."""
    inits = {t.name for t in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in inits]
    shapes = dict(shapes or {})
    unknown = sorted(set(shapes) - {vi.name for vi in graph_inputs})
    if unknown:
        raise ModelError(f"{where}: shape given for unknown input(s) {', '.join(unknown)}; the "
                         f"model's inputs are {', '.join(vi.name for vi in graph_inputs)}")
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for vi in graph_inputs:
        tt = vi.type.tensor_type
        dtype = _ONNX_DTYPES.get(tt.elem_type, f"onnx_type_{tt.elem_type}")
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in tt.shape.dim] if tt.HasField("shape") else None
        shown = "[" + ", ".join(str(d) for d in dims) + "]" if dims is not None else "unknown"
        if vi.name in shapes:
            shape = tuple(int(d) for d in shapes[vi.name])
            if dims is not None and (len(shape) != len(dims) or any(
                    isinstance(d, int) and d > 0 and d != g
                    for d, g in zip(dims, shape, strict=True))):
                raise ModelError(f"{where}: input '{vi.name}' is {shown} in the model; the given "
                                 f"shape {list(shape)} does not match it")
        else:
            if dims is None or any(not isinstance(d, int) or d <= 0 for d in dims):
                example = ",".join(str(d) if isinstance(d, int) and d > 0 else "1"
                                   for d in dims) if dims else "1,3,224,224"
                raise ModelError(
                    f"{where}: input '{vi.name}' has a dynamic shape {shown}; give a static "
                    f"shape: tvmc --input-shapes \"{vi.name}:[{example}]\" (Python: "
                    f"shapes={{'{vi.name}': [{example.replace(',', ', ')}]}})")
            shape = tuple(d for d in dims if isinstance(d, int))  # all are, checked above
        out[vi.name] = (shape, dtype)
    return out


#: module attribute: the model's named nodes in graph order, ``[name, op_type, kind]`` with
#: kind ``op``, ``const`` (a Constant, or a Q/DQ of a constant: folded into its consumer's
#: weights) or ``qdq`` (of an activation); the compile report lists the nodes from it
ONNX_NODES_ATTR = "tvm_accel_onnx_nodes"

_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def name_unnamed_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, with each node that has no name named after its first output tensor (with a
    numeric suffix if another node has that name), so that every operator has a layer name in
    the reports, knobs and precision configs; a copy only when some node is unnamed."""
    if all(n.name for n in model.graph.node):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    taken = {n.name for n in model.graph.node if n.name}
    for i, n in enumerate(model.graph.node):
        if n.name:
            continue
        base = next((o for o in n.output if o), f"{n.op_type}_{i}")
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        n.name = name
    return model


def onnx_node_list(model: onnx.ModelProto) -> list[list[str]]:
    """``[name, op_type, kind]`` per named node (see :data:`ONNX_NODES_ATTR`)."""
    const = {i.name for i in model.graph.initializer}
    out = []
    for n in model.graph.node:
        kind = "op"
        if n.op_type == "Constant":
            kind = "const"
        elif n.op_type in _QDQ_OPS:
            kind = "const" if n.input and n.input[0] in const else "qdq"
        if kind == "const":
            const.update(n.output)
        if n.name:
            out.append([n.name, n.op_type, kind])
    return out


def _clip(inputs, attrs, opset):
    """ONNX Clip with constant bounds -> ``relax.op.clip`` (the stock converter emits two TE
    PrimFuncs, which canonicalize could not read the bounds from). None = use the stock one."""
    x = inputs[0]
    if opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
    else:
        bounds = []
        for e in list(inputs[1:3]) + [None] * (3 - len(inputs)):
            if e is None:
                bounds.append(None)
            elif isinstance(e, tvm.ir.GenericConst) and e.value.numpy().size == 1:
                bounds.append(float(e.value.numpy().ravel()[0]))
            else:
                return None
        lo, hi = bounds
    if not isinstance(getattr(x, "ty", None), relax.TensorType) or str(x.ty.dtype) != "float32":
        return None
    big = float(np.finfo(np.float32).max)
    lo = -big if lo is None or np.isnan(lo) else max(float(lo), -big)
    hi = big if hi is None or np.isnan(hi) else min(float(hi), big)
    return relax.op.clip(x, lo, hi)


def _named_importer_class():
    """Subclass of the frontend importer that binds each node's value to a var named after
    the node (see module docstring). Returns None if the frontend layout is not as expected."""
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    base = getattr(fe, "ONNXGraphImporter", None)
    if base is None or not hasattr(base, "_convert_operator"):
        return None

    class _NamedImporter(base):
        def _convert_operator(self, op_name, inputs, attrs, opset):
            sym = _clip(inputs, attrs, opset) if op_name == "Clip" else None
            if sym is not None:
                sym = self.bb.normalize(sym)
            else:
                sym = super()._convert_operator(op_name, inputs, attrs, opset)
            name = (attrs.get("tvm_custom") or {}).get("name", "")
            if name and op_name == "BatchNormalization" and isinstance(sym, relax.Tuple):
                # (y, running mean, running var): the node's value is y
                y = self.bb.emit(sym.fields[0], name_hint=sanitize_name(name))
                return relax.Tuple([y, *sym.fields[1:]])
            if (name and isinstance(sym, relax.Call)
                    and isinstance(getattr(sym, "ty", None), relax.TensorType)):
                sym = self.bb.emit(sym, name_hint=sanitize_name(name))
            return sym

    return _NamedImporter


def _from_onnx(model: onnx.ModelProto, shape_dict: dict) -> tuple[tvm.IRModule, str]:
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    cls = _named_importer_class()
    if cls is not None:
        orig = fe.ONNXGraphImporter
        fe.ONNXGraphImporter = cls
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return from_onnx(model, shape_dict=shape_dict), "onnx"
        except tvm.error.OpNotImplemented:
            raise
        except Exception:  # the hook broke something in this TVM version: import without it
            pass
        finally:
            fe.ONNXGraphImporter = orig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_onnx(model, shape_dict=shape_dict), "positional"


def fold_constants_keep_qweights(mod: tvm.IRModule, func: str = "main") -> tvm.IRModule:
    """``FoldConstant`` that leaves ``dequantize(constant, ...)`` (and what consumes it) alone.

    The integer data of each such dequantize is swapped for a temporary function parameter, the
    module is folded, and the parameters are bound back to the same constants.
    """
    f = mod[func]
    hidden: dict[str, tvm.runtime.Tensor] = {}
    new_params: list[relax.Var] = []

    @relax.expr_functor.mutator
    class _Hide(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.dequantize"
                    and isinstance(call.args[0], tvm.ir.GenericConst)):
                v = relax.Var(f"__tvm_accel_qconst_{len(hidden)}", call.args[0].ty)
                hidden[v.name] = call.args[0].value
                new_params.append(v)
                return relax.Call(call.op, [v, *call.args[1:]], call.attrs, call.ty_args)
            return call

    body = _Hide().visit_expr(f.body)
    if not hidden:
        return relax.transform.FoldConstant()(mod)
    g = relax.Function(list(f.params) + new_params, body, f.ret_ty, f.is_pure, f.attrs)
    mod = tvm.IRModule({**{gv: fn for gv, fn in mod.functions_items() if gv.name_hint != func}},
                       attrs=mod.attrs)
    mod[func] = g
    mod = relax.transform.FoldConstant()(mod)
    mod = relax.transform.BindParams(func, hidden)(mod)
    return mod


def load_onnx(path_or_model, shapes: dict | None = None) -> tuple[tvm.IRModule, ModelInfo]:
    """Import an ONNX model (path, bytes or ``ModelProto``) into a Relax module.

    ``shapes`` overrides input shapes (needed when the model has dynamic dimensions). Returns
    ``(mod, info)``; ``mod["main"]`` takes the model inputs in graph order and has all weights
    as constants. Raises :class:`ModelError` with a one-line message for every user error.
    """
    from tvm_accel.precision import QRANGE_ATTR, WBITS_ATTR, widen_subbyte_qdq

    model, where = _read_model(path_or_model)
    _check(model, where)
    model = name_unnamed_nodes(model)
    op_counts: dict[str, int] = {}
    for n in model.graph.node:
        op_counts[n.op_type] = op_counts.get(n.op_type, 0) + 1
    try:
        model, sub = widen_subbyte_qdq(model)
    except Exception as e:
        raise ModelError(f"{where}: cannot read the sub-byte Q/DQ ranges: {e}") from None
    inputs = _static_inputs(model, where, shapes)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    try:
        mod, naming = _from_onnx(model, {k: list(s) for k, (s, _) in inputs.items()})
    except tvm.error.OpNotImplemented as e:
        raise ModelError(f"{where}: {str(e).strip().splitlines()[-1]}; replace these operators "
                         "or export with another opset") from None
    except Exception as e:
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ModelError(f"{where}: the ONNX importer failed: {msg}") from None
    names: dict[str, str] = {}
    if naming == "onnx":
        for n in model.graph.node:  # only names the sanitizer changed; others are verbatim
            if n.name and sanitize_name(n.name) != n.name:
                names.setdefault(sanitize_name(n.name), n.name)
    mod = fold_constants_keep_qweights(mod)
    mod = mod.with_attr("onnx_node_names", names)
    if naming == "onnx":
        mod = mod.with_attr(ONNX_NODES_ATTR, onnx_node_list(model))
    if sub.activations:
        mod = mod.with_attr(QRANGE_ATTR, {sanitize_name(k): [int(lo), int(hi)]
                                          for k, (lo, hi) in sub.activations.items()})
    if sub.weights:
        mod = mod.with_attr(WBITS_ATTR, {sanitize_name(k): int(b) for k, b in sub.weights.items()})
    info = ModelInfo(
        name=model.graph.name or Path(where).stem,
        inputs=inputs,
        outputs=[o.name for o in model.graph.output],
        opset=opset,
        op_counts=op_counts,
        node_names=names,
        naming=naming,
        is_qdq=op_counts.get("QuantizeLinear", 0) + op_counts.get("DequantizeLinear", 0) > 0,
        activation_ranges=dict(sub.activations),
        weight_bits=dict(sub.weights),
    )
    return mod, info


def random_inputs(info: ModelInfo, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal float inputs (integers for integer inputs) matching ``info``."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in info.inputs.items():
        if dtype.startswith("float"):
            out[name] = rng.standard_normal(shape).astype(dtype)
        else:
            out[name] = rng.integers(0, 10, shape).astype(dtype)
    return out


def read_npz(path: str, where: str, what: str,
             error: type[AccelError] = AccelError) -> dict[str, np.ndarray]:
    """Arrays of a ``.npz`` of model inputs by name (``tvmc run --inputs``, ``tvmc quantize
    --calibration``), read eagerly with pickle off so a bad member fails here. Errors are
    ``error`` one-liners starting with ``where`` and saying what could not be read (``what``):
    a plain ``.npy``, a file that is not a ``.npz``, object or damaged members."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise error(f"{where}: cannot read {what}: {e.strerror or e}") from None
    if head == b"\x93NUMPY":
        raise error(f"{where}: is a single .npy array; give a .npz with one array per model "
                    "input, e.g. np.savez('inputs.npz', <input name>=array)")
    if head[:2] != b"PK":
        raise error(f"{where}: not a .npz file; write it with np.savez('inputs.npz', "
                    "<input name>=array)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise error(f"{where}: cannot read {what}: {e} (save plain numeric arrays with "
                    "np.savez)") from None
