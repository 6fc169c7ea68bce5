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
   recomputed), ``o`` narrows the layer's output and ``i`` the tensor the layer reads (at its
   producer) to that many bits. A narrowed activation keeps its calibrated real range: its
   scale widens from its current range to the b-bit one (:func:`widen`: ``s * 255 / (2^b -
   1)`` from 8 bits, zero point mapped alike; ``s * 2^(8 - b)`` for a power-of-two scale),
   and every reader follows (the consumers' requantize recipes and the int32 biases of the
   layers reading it are computed from the new scale), as
   :func:`tvm_accel.quantize.apply_mixed_precision` does in the ONNX model.
   ``"keep_scale": true`` in an entry (or ``load_precision(..., keep_scale=True)``, ``tvmc
   compile --precision-keep-scale`` for every entry that does not say) instead clips the tensor
   to b bits at its current scale, with a :class:`PrecisionWarning` naming the share of its
   calibrated range that saturates: for activations already calibrated for the narrow range.
   ``default`` entries apply to the weighted layers (conv, dense, transpose conv) only.

Canonicalize turns both into ``qmin``/``qmax`` of the requantize clip (so the canonical integer
graph -- the reference -- computes exactly the b-bit values), records ``detail["bits"] =
{"w": W, "i": I, "o": O}`` on every integer layer, and stores :data:`LAYER_BITS_ATTR`
``{layer name: {"w", "i", "o"}}`` for the partitioner (a target's check can read the bits
under the annotation ``"precision"``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
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


def widen(scale: float, zp: int, old: tuple[int, int], bits: int, dtype: str
          ) -> tuple[float, int]:
    """Scale and zero point that put the real range of the integer range ``old`` (at ``scale``,
    ``zp``) on the ``bits``-bit range of ``dtype``: ``scale * (old width) / (2^bits - 1)``
    (float32, as a QDQ model stores it) and the zero point mapped alike, rounded (uint8 ``z``
    from 8 bits: ``round(z * (2^bits - 1) / 255)``). A power-of-two scale (a fix-point model)
    grows by the nearest power of two instead (``2^(8 - bits)`` from 8 bits), so shift-only
    hardware can still requantize it."""
    lo, hi = bits_range(bits, dtype)
    span = old[1] - old[0]
    mantissa, _ = np.frexp(scale)
    if mantissa == 0.5:
        factor = float(2.0 ** np.rint(np.log2(span / (hi - lo))))
        new_scale, new_zp = scale * factor, lo + int(np.rint((zp - old[0]) / factor))
    else:
        new_scale = float(np.float32(scale * span / (hi - lo)))
        new_zp = lo + int(np.rint((zp - old[0]) * (hi - lo) / span))
    return new_scale, min(max(new_zp, lo), hi)


def rescale_bias(bias: np.ndarray, bias_scale: np.ndarray, x_scale: float,
                 w_scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An int32 bias (scale ``bias_scale``) for a new input scale: the same real bias at
    ``x_scale * w_scale`` (float32, as ONNX stores it); returns ``(bias, bias_scale)``."""
    old_scale = np.asarray(bias_scale, dtype=np.float32)
    w = np.asarray(w_scale, dtype=np.float64).ravel()
    if w.size not in (1, old_scale.size):  # one scale per group's output channel (deconv)
        w = np.tile(w, old_scale.size // w.size)
    new_scale = (x_scale * w).astype(np.float32)
    new_scale = np.broadcast_to(new_scale, old_scale.shape) if new_scale.size == 1 else \
        new_scale.reshape(old_scale.shape)
    real = np.asarray(bias).astype(np.float64) * old_scale
    new = np.rint(real / new_scale.astype(np.float64)).astype(np.int32)
    return new, np.ascontiguousarray(new_scale)


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
class PrecisionWarning(UserWarning):
    """A precision config clips a tensor at its scale (``keep_scale``): part of its calibrated
    range saturates."""


@dataclass(frozen=True)
class LayerPrecision:
    """W/I/O bits of one layer (None: as the model says) and whether narrowing its activations
    keeps their scale (clips) instead of widening it (None: the config's choice)."""

    w: int | None = None
    i: int | None = None
    o: int | None = None
    keep_scale: bool | None = None


@dataclass
class PrecisionConfig:
    """A parsed precision config (see the module docstring for the JSON schema);
    ``keep_scale``: the choice of every entry that does not make its own."""

    layers: dict[str, LayerPrecision] = field(default_factory=dict)
    default: LayerPrecision = LayerPrecision()
    source: str = "<precision>"
    keep_scale: bool = False

    def for_layer(self, onnx_name: str, weighted: bool) -> LayerPrecision:
        """The bits for a layer: its entry, else (weighted layers only) the default; its
        ``keep_scale`` resolved the same way, then from the config."""
        d = self.default if weighted else LayerPrecision()
        own = self.layers.get(onnx_name, LayerPrecision())
        keep = next((k for k in (own.keep_scale, d.keep_scale) if k is not None),
                    self.keep_scale)
        return LayerPrecision(own.w if own.w is not None else d.w,
                              own.i if own.i is not None else d.i,
                              own.o if own.o is not None else d.o, keep)


def _entry(obj, where: str, what: str) -> LayerPrecision:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: {what} must be an object like {{\"w\": 4, \"i\": 8, "
                          f"\"o\": 4}}, got {type(obj).__name__}")
    bad = sorted(set(obj) - {"w", "i", "o", "keep_scale"})
    if bad:
        raise ConfigError(f"{where}: {what}.{bad[0]}: unknown field; use w, i, o and keep_scale")
    vals = {}
    for k in ("w", "i", "o"):
        v = obj.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not MIN_BITS <= v <= MAX_BITS):
            raise ConfigError(f"{where}: {what}.{k} = {v!r}: bits must be an integer in "
                              f"{MIN_BITS}..{MAX_BITS}")
        vals[k] = v
    keep = obj.get("keep_scale")
    if keep is not None and not isinstance(keep, bool):
        raise ConfigError(f"{where}: {what}.keep_scale = {keep!r}: must be true or false")
    return LayerPrecision(**vals, keep_scale=keep)


def load_precision(src, keep_scale: bool | None = None) -> PrecisionConfig:
    """Parse a precision config: a path to a JSON file, a JSON string, a dict, or a
    :class:`PrecisionConfig` (returned as is). ``keep_scale`` (not None) sets the config's
    choice for entries without their own. Errors are one-line :class:`ConfigError`s naming
    the file and the field."""
    cfg = _parse_precision(src)
    if keep_scale is not None and keep_scale != cfg.keep_scale:
        cfg = replace(cfg, keep_scale=keep_scale)
    return cfg


def _parse_precision(src) -> PrecisionConfig:
    """:func:`load_precision` without the ``keep_scale`` override."""
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
