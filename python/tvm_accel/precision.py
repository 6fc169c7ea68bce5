"""Sub-byte (2..8 bit) mixed precision: how bit widths enter the flow and how they are recorded.

Sub-byte tensors always live in int8/uint8 *containers*; a b-bit tensor is one whose integer
values are restricted to the b-bit range (signed ``[-2^(b-1), 2^(b-1) - 1]``, unsigned
``[0, 2^b - 1]``), exactly as the PULP/RBE notes describe the W/I/O precisions of a layer.

Where bits come from (all optional; a model without them is plain 8-bit):

1. **The ONNX model** (:func:`widen_subbyte_qdq`, run by :func:`tvm_accel.frontend.load_onnx`):

   - ``QuantizeLinear``/``DequantizeLinear`` with INT4/UINT4 zero points (opset 21): the zero
     points and int4 weight initializers are widened to int8/uint8 (same values) so TVM imports
     them, and the range ``[-8, 7]`` / ``[0, 15]`` is recorded;
   - *clipped ranges*: an integer ``Clip`` between a ``QuantizeLinear`` and its
     ``DequantizeLinear``s (int8/uint8 bounds) is removed and its bounds recorded.

   Recorded in module attributes (keys = Relax var names, i.e. sanitized ONNX node names):
   :data:`QRANGE_ATTR` ``{quantize var: [qmin, qmax]}`` for activations and
   :data:`WBITS_ATTR` ``{weight dequantize var: bits}`` for weights.

2. **A precision config** (:func:`load_precision`, ``compile_model(..., precision=...)``,
   ``tvmc compile --precision-config FILE``), JSON::

       {"default": {"w": 8, "i": 8, "o": 8},            # optional, applies to every layer
        "layers": {"<onnx node name>": {"w": 4, "i": 8, "o": 4}, ...}}

   Every field is optional; ``w`` re-quantizes the layer's weights (conv, dense, transpose
   conv) to ``w`` bits (symmetric per output channel; the weight scales and the int32 bias are
   recomputed), ``o`` clips the layer's output and ``i`` clips the tensor the layer reads (at
   its producer) to that many bits. Scales of activations are *not* changed: clipping is what
   the config does, so the activations should already be calibrated for the range (the zoo's
   mixed-precision builders are). ``default`` entries apply to the weighted layers
   (conv, dense, transpose conv) only.

Canonicalize turns both into ``qmin``/``qmax`` of the requantize clip (so the canonical integer
graph -- the reference -- computes exactly the b-bit values), records ``detail["bits"] =
{"w": W, "i": I, "o": O}`` on every integer layer, and stores :data:`LAYER_BITS_ATTR`
``{layer name: {"w", "i", "o"}}`` for the partitioner (a target's check can read the bits
under the annotation ``"precision"``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from tvm_accel.errors import ConfigError

#: module attribute: quantize var name -> [qmin, qmax] of a sub-byte activation
QRANGE_ATTR = "tvm_accel_qranges"
#: module attribute: weight dequantize var name -> weight bits
WBITS_ATTR = "tvm_accel_weight_bits"
#: module attribute (canonical module): layer name -> {"w", "i", "o"} (None entries left out)
LAYER_BITS_ATTR = "tvm_accel_layer_bits"
MIN_BITS, MAX_BITS = 2, 8
_I4 = {TensorProto.INT4: (TensorProto.INT8, -8, 7), TensorProto.UINT4: (TensorProto.UINT8, 0, 15)}
_SIGNED = {"int8": True, "uint8": False}


def bits_range(bits: int, dtype: str) -> tuple[int, int]:
    """``(qmin, qmax)`` of a ``bits``-wide tensor in an int8 (signed) or uint8 container."""
    if _SIGNED.get(dtype, True):
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def range_bits(qmin: int, qmax: int, dtype: str) -> int:
    """Smallest width (2..8) whose range in ``dtype`` holds ``[qmin, qmax]``."""
    for b in range(MIN_BITS, MAX_BITS):
        lo, hi = bits_range(b, dtype)
        if lo <= qmin and qmax <= hi:
            return b
    return MAX_BITS


def signed_bits(values: np.ndarray) -> int:
    """Smallest signed width (at least 2) holding every value (weights minus zero point)."""
    v = np.asarray(values, dtype=np.int64)
    if v.size == 0:
        return MIN_BITS
    lo, hi = int(v.min()), int(v.max())
    b = MIN_BITS
    while not (-(1 << (b - 1)) <= lo and hi <= (1 << (b - 1)) - 1):
        b += 1
    return b


# --- ONNX pre-pass -------------------------------------------------------------------------------
@dataclass
class SubbyteInfo:
    """What :func:`widen_subbyte_qdq` found: ranges keyed by ONNX node name."""

    #: QuantizeLinear node name -> (qmin, qmax) of its integer output
    activations: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: weight DequantizeLinear node name -> bits
    weights: dict[str, int] = field(default_factory=dict)


def _const_scalar(model: onnx.ModelProto, name: str) -> int | None:
    for t in model.graph.initializer:
        if t.name == name:
            a = numpy_helper.to_array(t)
            return int(a.ravel()[0]) if a.size == 1 else None
    for n in model.graph.node:
        if n.op_type == "Constant" and name in n.output:
            a = numpy_helper.to_array(n.attribute[0].t)
            return int(a.ravel()[0]) if a.size == 1 else None
    return None


def widen_subbyte_qdq(model: onnx.ModelProto) -> tuple[onnx.ModelProto, SubbyteInfo]:
    """Rewrite INT4/UINT4 Q/DQ and integer Clips between Q and DQ into plain int8/uint8 QDQ that
    TVM's importer reads, recording each tensor's range (see the module docstring).

    Returns the (copied) model unchanged when it has neither; unnamed Q/DQ nodes get names.
    """
    g = model.graph
    i4 = {t.name for t in g.initializer if t.data_type in _I4}
    if not i4 and not _range_clips(model):
        return model, SubbyteInfo()
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    for i, n in enumerate(g.node):
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and not n.name:
            n.name = f"{n.op_type}_{i}"
    clips = _range_clips(model)
    info = _int4_ranges(model)
    _widen_int4(model, i4)
    for c in clips:
        _fold_clip(model, c, info)
    q_outs = {n.output[0] for n in g.node if n.op_type == "QuantizeLinear"}
    changed = i4 | {c.output[0] for c in clips} | q_outs
    keep = [v for v in g.value_info if v.name not in changed]
    del g.value_info[:]
    g.value_info.extend(keep)
    return model, info


def _range_clips(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Clips that are the only reader of a Q output: each restricts that integer tensor."""
    g = model.graph
    q_outs = {n.output[0] for n in g.node if n.op_type == "QuantizeLinear"}
    users: dict[str, int] = {}
    for n in g.node:
        for x in n.input:
            users[x] = users.get(x, 0) + 1
    return [n for n in g.node if n.op_type == "Clip" and n.input and n.input[0] in q_outs
            and users[n.input[0]] == 1 and len(n.input) > 1 and any(n.input[1:])]


def _int4_ranges(model: onnx.ModelProto) -> SubbyteInfo:
    """The ranges of INT4/UINT4 Q outputs and the bits of INT4/UINT4 weight DQs."""
    info = SubbyteInfo()
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(n.input) < 3:
            continue
        zp = inits.get(n.input[2])
        data = inits.get(n.input[0]) if n.op_type == "DequantizeLinear" else None
        kind = (zp.data_type if zp is not None and zp.data_type in _I4 else
                data.data_type if data is not None and data.data_type in _I4 else None)
        if kind is None:
            continue
        _, lo, hi = _I4[kind]
        if n.op_type == "QuantizeLinear":
            info.activations[n.name] = (lo, hi)
        elif data is not None:
            info.weights[n.name] = 4
    return info


def _widen_int4(model: onnx.ModelProto, i4: set[str]) -> None:
    """Every int4 initializer (weights, zero points), Q output type and graph input as int8."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    for name in i4:
        t = inits[name]
        wide, _, _ = _I4[t.data_type]
        a = numpy_helper.to_array(t).astype(np.int8 if wide == TensorProto.INT8 else np.uint8)
        t.CopyFrom(numpy_helper.from_array(a, name))
    for n in g.node:
        if n.op_type == "QuantizeLinear":
            for a in n.attribute:
                if a.name == "output_dtype" and a.i in _I4:
                    a.i = _I4[a.i][0]
    for v in g.input:
        if v.name in i4:
            tt = v.type.tensor_type
            tt.elem_type = _I4[tt.elem_type][0] if tt.elem_type in _I4 else tt.elem_type


def _fold_clip(model: onnx.ModelProto, c: onnx.NodeProto, info: SubbyteInfo) -> None:
    """Record clip ``c``'s bounds as its Q output's range and remove it (its readers read the
    Q output)."""
    g = model.graph
    q = next(n for n in g.node if n.op_type == "QuantizeLinear" and n.output[0] == c.input[0])
    lo = _const_scalar(model, c.input[1]) if len(c.input) > 1 and c.input[1] else None
    hi = _const_scalar(model, c.input[2]) if len(c.input) > 2 and c.input[2] else None
    old = info.activations.get(q.name, (-(1 << 31), 1 << 31))
    info.activations[q.name] = (old[0] if lo is None else max(old[0], lo),
                                old[1] if hi is None else min(old[1], hi))
    for n in g.node:
        for k, x in enumerate(n.input):
            if x == c.output[0]:
                n.input[k] = c.input[0]
    for o in g.output:
        if o.name == c.output[0]:
            o.name = c.input[0]
    g.node.remove(c)


# --- precision config ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerPrecision:
    """W/I/O bits of one layer (None: as the model says)."""

    w: int | None = None
    i: int | None = None
    o: int | None = None


@dataclass
class PrecisionConfig:
    """A parsed precision config (see the module docstring for the JSON schema)."""

    layers: dict[str, LayerPrecision] = field(default_factory=dict)
    default: LayerPrecision = LayerPrecision()
    source: str = "<precision>"

    def for_layer(self, onnx_name: str, weighted: bool) -> LayerPrecision:
        """The bits for a layer: its entry, else (weighted layers only) the default."""
        if onnx_name in self.layers:
            own, d = self.layers[onnx_name], self.default if weighted else LayerPrecision()
            return LayerPrecision(own.w if own.w is not None else d.w,
                                  own.i if own.i is not None else d.i,
                                  own.o if own.o is not None else d.o)
        return self.default if weighted else LayerPrecision()


def _entry(obj, where: str, what: str) -> LayerPrecision:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: {what} must be an object like {{\"w\": 4, \"i\": 8, "
                          f"\"o\": 4}}, got {type(obj).__name__}")
    bad = sorted(set(obj) - {"w", "i", "o"})
    if bad:
        raise ConfigError(f"{where}: {what}.{bad[0]}: unknown field; use w, i and o")
    vals = {}
    for k in ("w", "i", "o"):
        v = obj.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not MIN_BITS <= v <= MAX_BITS):
            raise ConfigError(f"{where}: {what}.{k} = {v!r}: bits must be an integer in "
                              f"{MIN_BITS}..{MAX_BITS}")
        vals[k] = v
    return LayerPrecision(**vals)


def load_precision(src) -> PrecisionConfig:
    """Parse a precision config: a path to a JSON file, a JSON string, a dict, or a
    :class:`PrecisionConfig` (returned as is). Errors are one-line :class:`ConfigError`s naming
    the file and the field."""
    if isinstance(src, PrecisionConfig):
        return src
    where = "<precision>"
    if isinstance(src, (str, Path)) and not str(src).lstrip().startswith("{"):
        where = str(src)
        p = Path(where)
        if not p.is_file():
            raise ConfigError(f"{where}: no such precision config file")
        src = p.read_text()
    if isinstance(src, str):
        try:
            src = json.loads(src)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: malformed JSON: {e.msg} (line {e.lineno}, column "
                              f"{e.colno})") from None
    if not isinstance(src, dict):
        raise ConfigError(f"{where}: a precision config is a JSON object with \"layers\" and "
                          "\"default\"")
    bad = sorted(set(src) - {"layers", "default"})
    if bad:
        raise ConfigError(f"{where}: {bad[0]}: unknown field; use \"layers\" and \"default\"")
    layers = src.get("layers", {})
    if not isinstance(layers, dict):
        raise ConfigError(f"{where}: layers must be an object mapping ONNX node names to bits")
    return PrecisionConfig(
        layers={str(k): _entry(v, where, f"layers.{k}") for k, v in layers.items()},
        default=_entry(src.get("default", {}), where, "default"), source=where)


def requantize_weights(wz: np.ndarray, scale: np.ndarray, bias: np.ndarray, bits: int,
                       axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Re-quantize zero-point-free integer weights ``wz`` (scales ``scale`` per output channel
    along ``axis``) to symmetric ``bits``-bit values; the int32 ``bias`` (scale x_scale *
    w_scale) follows the new weight scales. Channels already inside the range are unchanged."""
    qmax = (1 << (bits - 1)) - 1
    k = wz.shape[axis]
    moved = np.moveaxis(wz.astype(np.int64), axis, 0).reshape(k, -1)
    amax = np.abs(moved).max(axis=1).astype(np.float64)
    factor = np.where(amax > qmax, amax / qmax, 1.0)
    new = np.clip(np.rint(moved / factor[:, None]), -qmax - 1, qmax).astype(np.int64)
    new = np.moveaxis(new.reshape(np.moveaxis(wz, axis, 0).shape), 0, axis)
    new_scale = np.asarray(scale, dtype=np.float64) * factor
    new_bias = np.rint(np.asarray(bias, dtype=np.float64) / factor).astype(np.int64)
    return new, new_scale, new_bias
