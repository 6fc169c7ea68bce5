"""The imported graph as canonicalize reads it: values, their quantization (:class:`_QAct`),
the QDQ structure around each op (:class:`_Graph`), naming, and the shape rules shared by
the rewrite (transpose-conv accumulator bounds, nearest-upsample scales).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from tvm_accel import numerics, precision
from tvm_accel.canonicalize.records import (
    _AUTO_NAME,
    LayerRecord,
)
from tvm_accel.errors import ModelError
from tvm_accel.frontend import sanitize_name
from tvm_accel.layers import DTYPE_RANGE

R = relax.op


# --- graph helpers ---------------------------------------------------------------------------
def _op_name(e) -> str | None:
    if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
        return e.op.name
    return None


def _ints(a) -> list[int]:
    return [int(x) for x in a]


def _shape(e) -> tuple[int, ...] | None:
    ty = getattr(e, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return tuple(int(d) for d in ty.shape)
    except (TypeError, ValueError):
        return None


def _dtype(e) -> str | None:
    ty = getattr(e, "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


@dataclass
class _QAct:
    """A quantized activation: ``dequantize(var, scale, zp)`` with scalar parameters."""

    var: relax.Expr
    scale: float
    zp: int
    dtype: str
    #: value range width (2..8) of the integer tensor (sub-byte: recorded range)
    bits: int = 8

    def same_as(self, scale: float, zp: int, dtype: str) -> bool:
        return self.dtype == dtype and self.zp == zp and abs(self.scale - scale) <= 1e-7 * scale

    @property
    def reach(self) -> int:
        return numerics.input_reach(self.dtype, self.zp)


@dataclass
class _Out:
    """The quantize that ends a pattern, with folded activation bounds."""

    scale: float
    zp: int
    dtype: str
    qmin: int
    qmax: int
    activation: str = ""
    #: the relu/clip values folded into qmin/qmax, outermost first
    act_exprs: list = field(default_factory=list)
    #: output bits (2..8): 8 unless a sub-byte range was recorded or configured
    bits: int = 8

    @property
    def full_range(self) -> bool:
        lo, hi = DTYPE_RANGE[self.dtype]
        return self.qmin <= lo and self.qmax >= hi


class _Plan:
    """Emits the integer replacement of one quantize binding."""

    def __init__(self, record: LayerRecord, emit: Callable):
        self.record = record
        self.emit = emit  # emit(bb, lookup) -> Expr


#: module attribute: layer var name -> ONNX node name, where they differ
LAYER_NAMES_ATTR = "tvm_accel_layer_names"


def layer_span(name: str) -> tvm.ir.Span:
    """The span naming a layer's core call (read back by :func:`span_layer`)."""
    return tvm.ir.Span(tvm.ir.SourceName(name), 0, 0, 0, 0)


def span_layer(call) -> str | None:
    """The layer name a core call's span carries, if any."""
    span = getattr(call, "span", None)
    return str(span.source_name.name) if span is not None else None


class _NamingBuilder:
    """The block builder a plan emits through: it puts the layer's name on its core call
    (the binding named ``<layer>_acc``) as the call's span."""

    def __init__(self, bb: relax.BlockBuilder, layer: str):
        self._bb, self._core = bb, f"{layer}_acc"

    def emit(self, expr, name_hint: str = ""):
        if name_hint == self._core and isinstance(expr, relax.Call):
            expr = relax.Call(expr.op, expr.args, expr.attrs, expr.ty_args,
                              span=layer_span(self._core[:-4]))
        return self._bb.emit(expr, name_hint=name_hint)

    def __getattr__(self, key):
        return getattr(self._bb, key)


class _Graph:
    def __init__(self, func: relax.Function, names: dict[str, str],
                 qranges: dict[str, tuple[int, int]] | None = None,
                 wbits: dict[str, int] | None = None):
        self.func = func
        self.bind: dict[relax.Var, relax.Expr] = {}
        self.order: list[relax.VarBinding] = []
        #: quantize var -> (qmin, qmax) of a sub-byte activation (recorded or configured)
        self.ranges: dict[relax.Var, tuple[int, int]] = {}
        qranges = qranges or {}
        for block in func.body.blocks:
            for b in block.bindings:
                if isinstance(b, relax.VarBinding):
                    self.bind[b.var] = b.value
                    self.order.append(b)
                    if b.var.name in qranges:
                        lo, hi = qranges[b.var.name]
                        self.ranges[b.var] = (lo, hi)
        self.wbits = dict(wbits or {})
        self.names = names
        self.used: set[str] = set()
        self.count = 0

    def value(self, e):
        seen = 0
        while isinstance(e, relax.Var) and e in self.bind and seen < 64:
            e = self.bind[e]
            seen += 1
        return e

    def const(self, e) -> np.ndarray | None:
        e = self.value(e)
        if isinstance(e, tvm.ir.GenericConst):
            return e.value.numpy()
        return None

    def op(self, e) -> str | None:
        return _op_name(self.value(e))

    # -- quantization parameters --------------------------------------------------------------
    def dq_act(self, e) -> _QAct | None:
        c = self.value(e)
        if _op_name(c) != "relax.dequantize":
            return None
        data, s, z = c.args
        s, z = self.const(s), self.const(z)
        dt = _dtype(data)
        if (s is None or z is None or s.size != 1 or z.size != 1 or dt not in DTYPE_RANGE
                or self.const(data) is not None):
            return None
        rng = self.ranges.get(data) if isinstance(data, relax.Var) else None
        bits = precision.range_bits(*rng, dt) if rng is not None else 8
        return _QAct(data, float(s.ravel()[0]), int(z.ravel()[0]), dt, bits)

    def narrow(self, var: relax.Var, out: _Out) -> None:
        """Intersect ``out``'s clip with the sub-byte range recorded for ``var``."""
        rng = self.ranges.get(var)
        if rng is None:
            return
        out.qmin, out.qmax = max(out.qmin, rng[0]), min(out.qmax, rng[1])
        out.bits = precision.range_bits(*rng, out.dtype)

    def recorded_weight_bits(self, e) -> int | None:
        """Bits recorded by the frontend for the weight dequantize behind ``e``."""
        for _ in range(3):
            if isinstance(e, relax.Var) and e.name in self.wbits:
                return int(self.wbits[e.name])
            c = self.value(e)
            if _op_name(c) != "relax.permute_dims":
                return None
            e = c.args[0]
        return None

    def quantize_out(self, call) -> _Out | None:
        data, s, z = call.args
        s, z = self.const(s), self.const(z)
        dt = str(call.attrs.out_dtype)
        if s is None or z is None or s.size != 1 or z.size != 1 or dt not in DTYPE_RANGE:
            return None
        lo, hi = DTYPE_RANGE[dt]
        return _Out(float(s.ravel()[0]), int(z.ravel()[0]), dt, lo, hi)

    def peel_activation(self, e, out: _Out):
        """Fold relu / clip on top of ``e`` into ``out``'s qmin/qmax; returns the core expr."""
        acts = []
        while True:
            c = self.value(e)
            op = _op_name(c)
            if op == "relax.nn.relu":
                lo, hi = 0.0, np.inf
                acts.append("relu")
            elif op == "relax.clip":
                lo, hi = float(c.args[1].value), float(c.args[2].value)
                acts.append("clip")
            else:
                break
            out.act_exprs.append(e)
            if np.isfinite(lo):
                out.qmin = max(out.qmin, out.zp + int(np.round(lo / out.scale)))
            if np.isfinite(hi):
                out.qmax = min(out.qmax, out.zp + int(np.round(hi / out.scale)))
            e = c.args[0]
        out.activation = "+".join(reversed(acts))
        return e

    # -- naming ---------------------------------------------------------------------------------
    def layer_name(self, candidates, kind: str) -> tuple[str, str]:
        """(layer name, ONNX name) from the first var named after an ONNX node; no side
        effects (see :meth:`claim`)."""
        for v in candidates:
            n = getattr(v, "name", "") if isinstance(v, relax.Var) else ""
            if n in self.names:
                return sanitize_name(self.names[n]), self.names[n]
            if n and not _AUTO_NAME.fullmatch(n):
                return n, n
        return f"{kind}_{self.count}", f"{kind}_{self.count}"

    def claim(self, name: str) -> str:
        """Register a layer name (made unique with a suffix)."""
        self.count += 1
        base, k = name, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name


def _per_channel(a: np.ndarray, k: int, what: str, layer: str) -> np.ndarray:
    a = np.asarray(a).ravel()
    if a.size == 1:
        return np.repeat(a, k)
    if a.size != k:
        raise ModelError(f"layer '{layer}': {what} has {a.size} values for {k} output channels; "
                         "quantize weights per tensor or per output channel")
    return a


def _clamp(bb, x, out: _Out, name: str):
    """Clip an integer tensor already in ``out.dtype`` to ``[qmin, qmax]`` (no-op if full)."""
    lo, hi = DTYPE_RANGE[out.dtype]
    if out.qmin > lo:
        x = bb.emit(R.maximum(x, relax.const(out.qmin, out.dtype)), name_hint=f"{name}_max")
    if out.qmax < hi:
        x = bb.emit(R.minimum(x, relax.const(out.qmax, out.dtype)), name_hint=f"{name}_min")
    return x


def deconv_acc_bound(wz: np.ndarray, bias: np.ndarray, groups: int, strides, dilation,
                     reach: int) -> np.ndarray:
    """Per output channel bound of a transpose conv's accumulator: the worst output pixel sums
    the taps of one stride phase (``i * DH = r mod SH``) over the group's input channels."""
    c, kg, kh, kw = wz.shape
    aw = np.abs(wz.astype(np.int64)).reshape(groups, c // groups, kg, kh, kw).sum(axis=1)
    best = np.zeros((groups, kg), dtype=np.int64)
    for rh in range(strides[0]):
        ih = [i for i in range(kh) if (i * dilation[0]) % strides[0] == rh]
        for rw in range(strides[1]):
            iw = [j for j in range(kw) if (j * dilation[1]) % strides[1] == rw]
            if ih and iw:
                best = np.maximum(best, aw[:, :, ih][:, :, :, iw].sum(axis=(2, 3)))
    return best.reshape(-1) * reach + np.abs(bias.astype(np.int64))


def nearest_upsample_scale(attrs, in_shape, out_shape) -> tuple[int, int] | None:
    """``(SH, SW)`` if a ``resize2d`` with ``attrs`` maps output pixel ``i`` to input pixel
    ``i // S`` on both spatial axes (nearest neighbour, integer factors), else None.

    The mapping is computed with the ONNX Resize formulas of the call's coordinate
    transformation mode and rounding method, so any combination that reduces to ``i // S``
    (e.g. ``asymmetric`` + ``floor``, ``half_pixel`` + ``round_prefer_floor``, ONNX's default)
    is accepted and anything else is refused.
    """
    if str(attrs.method) != "nearest_neighbor" or str(attrs.layout) != "NCHW":
        return None
    mode = str(attrs.coordinate_transformation_mode)
    rnd = str(attrs.rounding_method) or "round"
    scales = []
    for n_in, n_out in zip(in_shape[2:], out_shape[2:], strict=True):
        if n_in <= 0 or n_out % n_in:
            return None
        s = n_out // n_in
        i = np.arange(n_out, dtype=np.float64)
        if mode == "asymmetric":
            src = i / s
        elif mode in ("half_pixel", "pytorch_half_pixel"):
            src = (i + 0.5) / s - 0.5
            if mode == "pytorch_half_pixel" and n_out == 1:
                src = np.zeros_like(i)
        elif mode == "tf_half_pixel_for_nn":
            src = (i + 0.5) / s
        elif mode == "align_corners":
            src = i * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros_like(i)
        else:
            return None
        if rnd == "floor":
            idx = np.floor(src)
        elif rnd == "ceil":
            idx = np.ceil(src)
        elif rnd in ("round_prefer_floor", "round_prefer_ceil", "round"):
            half = src - np.floor(src) == 0.5
            if rnd == "round" and np.any(half):
                return None  # ties: the rounding convention would matter
            near = np.floor(src + 0.5)
            idx = np.where(half, np.floor(src) if rnd == "round_prefer_floor" else np.ceil(src),
                           near)
        else:
            return None
        idx = np.clip(idx, 0, n_in - 1).astype(np.int64)
        if not np.array_equal(idx, np.arange(n_out) // s):
            return None
        scales.append(int(s))
    return scales[0], scales[1]
