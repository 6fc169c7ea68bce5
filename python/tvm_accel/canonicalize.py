"""QDQ -> explicit integer graph (ARCHITECTURE.md sections 2 and 4).

``canonicalize(mod, target)`` rewrites every recognised ``quantize(op(dequantize(x), ...))`` of
the imported model into integer Relax ops, with requantize constants from the target's recipe.
The result compiled for llvm is the reference every accelerator must match bit for bit.

Offloadable layers get a fixed op sequence that the targets' partition patterns match:

- conv2d (any groups): ``astype(x, int32) - zx`` -> ``conv2d(.., W - zw, out_dtype=int32)`` ->
  ``add(B (1,K,1,1))`` -> :func:`tvm_accel.numerics.emit_requant` (int64 chain, clip, cast);
- dense (Gemm / MatMul with constant weight, 2-D input): the same with ``matmul(xc, Wt (Cin,K))``
  and ``(1, K)`` constants;
- residual add of two quantized tensors: :func:`tvm_accel.numerics.emit_add`.

A ReLU / Clip between the op and its quantize is folded into ``qmin``/``qmax`` (exact: rounding
is monotone, so ``round(clip(v, lo, hi) / s) = clip(round(v / s), round(lo / s), round(hi / s))``).

CPU-only ops get an integer form of our own, with the generic int64 recipe
(:data:`tvm_accel.numerics.CPU_LIMITS`) whenever a rescale is needed:

- max_pool2d and layout ops (reshape/flatten, permute_dims, squeeze, expand_dims) run on the
  integer tensor directly (max and layout commute with the monotone dequantize); a requantize
  follows only if the output scale/zero point/dtype differ from the input's;
- global average pool (``mean`` over axes) and average pool (no padding, or padding counted):
  int32 window sum of ``x - zx`` then requantize with ``s_in / (s_out * window)``;
- concat: inputs whose quantization differs from the output's are requantized first;
- a standalone ReLU/Clip (or a bare ``quantize(dequantize(x))``): clip, or requantize.

Anything else stays as imported (``dequantize -> op -> quantize`` in float, on the CPU), and so do
the model's input ``quantize`` and output ``dequantize``. A pattern that is recognised but
inconsistent (bias scale != x_scale * w_scale, non-zero bias zero point, non-constant weights)
raises :class:`~tvm_accel.errors.ModelError` naming the layer.

Layer names come from the ONNX node names that :func:`tvm_accel.frontend.load_onnx` puts on the
Relax vars (module attribute ``onnx_node_names``); the canonical values are emitted with
``name_hint`` derived from the layer name: ``<name>_acc`` is the layer's core op (conv2d /
matmul / the add of the two scaled operands; the partition report keys layers by it),
``<name>_biased``, ``<name>_rq_*`` the requantize steps, and ``<name>`` the 8-bit output.
Without ONNX names, layers are named ``conv2d_0``, ``dense_1``, ``add_2``, ...
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import tvm
from tvm import relax

from tvm_accel import numerics
from tvm_accel.errors import ModelError
from tvm_accel.frontend import sanitize_name
from tvm_accel.layers import DTYPE_RANGE, Requant

R = relax.op
#: relative tolerance of "bias scale == x_scale * w_scale" (ORT computes it in float32)
BIAS_SCALE_RTOL = 1e-4
#: ops that only move or select values (commute with a monotone dequantize)
_LAYOUT_OPS = {"relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims",
               "relax.flatten"}
_AUTO_NAME = re.compile(r"(lv|gv)\d*")


# --- report ----------------------------------------------------------------------------------
@dataclass
class LayerRecord:
    """One quantized value of the model and how canonicalize handled it."""

    name: str                 # layer name (Relax var name of the integer output)
    onnx_name: str            # ONNX node name (= name when the model had none)
    op: str                   # conv2d, dense, add, max_pool2d, avg_pool2d, global_avg_pool2d,
    #                           concat, reshape, ..., relu, clip, requantize, or the float op
    integer: bool             # True: canonical integer ops; False: left float (CPU)
    out_dtype: str
    output_scale: float
    output_zero_point: int
    max_rel_error: float = 0.0  # integer scale vs float scale (worst channel / operand)
    max_lsb_error: float = 0.0  # worst-case deviation before the final rounding, output LSBs
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def layer(self) -> str:
        """Alias of ``name`` (the partition report keys layers by it)."""
        return self.name

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def format_report(report: list[LayerRecord]) -> str:
    """Fixed-width table of a canonicalize report (for the CLI)."""
    rows = [("layer", "op", "path", "dtype", "out scale", "rel err", "LSB err", "notes")]
    for r in report:
        d = r.detail
        notes = []
        if d.get("activation"):
            notes.append(d["activation"])
        if "pre_shift" in d:
            notes.append(f"pre>>{d['pre_shift']} >>{d['shift']}")
        if d.get("reason"):
            notes.append(d["reason"])
        rows.append((r.onnx_name, r.op, "int" if r.integer else "float", r.out_dtype,
                     f"{r.output_scale:.4g}", f"{r.max_rel_error:.2e}",
                     f"{r.max_lsb_error:.3f}", "; ".join(notes)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True))
                     + "  " + row[-1] for row in rows)


# --- recipes ---------------------------------------------------------------------------------
class _Recipes:
    """Where integer parameters come from: the target for offloadable layers, the generic
    int64 CPU recipe for CPU-only ops (and for everything when target is None)."""

    def __init__(self, target):
        if isinstance(target, str):
            from tvm_accel.target import get_target

            target = get_target(target)
        self.target_name = getattr(target, "name", "") or ("cpu" if target is None else "custom")
        self.cpu = partial(numerics.solve_requant, limits=numerics.CPU_LIMITS)
        if target is None:
            self.requant = self.cpu
            self.add = partial(numerics.solve_add, limits=numerics.CPU_LIMITS)
        else:
            self.requant = target.requant_recipe
            self.add = target.add_recipe


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

    @property
    def full_range(self) -> bool:
        lo, hi = DTYPE_RANGE[self.dtype]
        return self.qmin <= lo and self.qmax >= hi


class _Plan:
    """Emits the integer replacement of one quantize binding."""

    def __init__(self, record: LayerRecord, emit: Callable):
        self.record = record
        self.emit = emit  # emit(bb, lookup) -> Expr


class _Graph:
    def __init__(self, func: relax.Function, names: dict[str, str]):
        self.func = func
        self.bind: dict[relax.Var, relax.Expr] = {}
        self.order: list[relax.VarBinding] = []
        for block in func.body.blocks:
            for b in block.bindings:
                if isinstance(b, relax.VarBinding):
                    self.bind[b.var] = b.value
                    self.order.append(b)
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
        return _QAct(data, float(s.ravel()[0]), int(z.ravel()[0]), dt)

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


# --- the pass --------------------------------------------------------------------------------
class _Canonicalizer:
    def __init__(self, graph: _Graph, recipes: _Recipes):
        self.g = graph
        self.rc = recipes
        self.plans: dict[relax.Var, _Plan] = {}
        self.report: list[LayerRecord] = []

    # The matchers return a _Plan, None (not this pattern) or raise ModelError (inconsistent).
    def run(self):
        params = set(self.g.func.params)
        for b in self.g.order:
            call = b.value
            if _op_name(call) != "relax.quantize":
                continue
            out = self.g.quantize_out(call)
            core = call.args[0]
            if isinstance(core, relax.Var) and core in params:
                continue  # the model's input quantize stays
            if out is None:
                self._float_record(core, _Out(float("nan"), 0, str(call.attrs.out_dtype), 0, 0),
                                   "output quantization is not 8-bit per-tensor")
                continue
            core = self.g.peel_activation(core, out)
            plan, reason = None, "not a recognised QDQ pattern"
            try:
                for m in (self._conv, self._dense, self._add, self._avg_pool, self._global_pool,
                          self._concat, self._passthrough):
                    plan = m(core, out)
                    if plan is not None:
                        break
            except numerics.RecipeError as e:  # the target cannot represent this scale
                plan, reason = None, f"no integer recipe: {e}"
            if plan is None:  # stays dequantize -> op -> quantize, on the CPU
                self._float_record(core, out, reason)
                continue
            self.plans[b.var] = plan
            self.report.append(plan.record)

    def _float_record(self, core, out: _Out, reason: str):
        op_e, _ = self._split_bias(core)
        anchor = {"relax.nn.conv2d": "conv2d", "relax.matmul": "dense"}.get(
            self.g.op(op_e) if op_e is not None else None)
        op = anchor or (self.g.op(core) or "?").removeprefix("relax.")
        name, onnx_name = self.g.layer_name([core], op.replace("nn.", ""))
        name = self.g.claim(name)
        self.report.append(LayerRecord(name, onnx_name, op, False, out.dtype, out.scale, out.zp,
                                       detail={"reason": reason}))

    def _record(self, name, onnx_name, op, out: _Out, err=None, **detail) -> LayerRecord:
        if out.activation:
            detail["activation"] = out.activation
        detail.setdefault("qmin", out.qmin)
        detail.setdefault("qmax", out.qmax)
        return LayerRecord(name, onnx_name, op, True, out.dtype, out.scale, out.zp,
                           err.max_rel_error if err else 0.0,
                           err.max_lsb_error if err else 0.0, detail)

    # -- conv2d ---------------------------------------------------------------------------------
    def _split_bias(self, core):
        """``add(op, bias)`` -> (op_expr, bias_expr); a bare op -> (core, None)."""
        c = self.g.value(core)
        if _op_name(c) == "relax.add":
            a, b = c.args
            for x, y in ((a, b), (b, a)):
                if self.g.op(x) in ("relax.nn.conv2d", "relax.matmul"):
                    return x, y
            return None, None
        return core, None

    def _weight_dq(self, e, name: str):
        """dequantize(const int W, scale, zp) -> (W, scale, zp, axis), following one
        permute_dims; ModelError if the weight is quantized but not constant."""
        c = self.g.value(e)
        transposed = False
        if _op_name(c) == "relax.permute_dims":
            axes = c.attrs.axes
            if axes is not None and _ints(axes) != [1, 0]:
                return None
            transposed = True
            c = self.g.value(c.args[0])
        if _op_name(c) != "relax.dequantize":
            return None
        w = self.g.const(c.args[0])
        if w is None:
            raise ModelError(f"layer '{name}': quantized weights are not constants; bind the "
                             "weights (load_onnx does) before canonicalize")
        s, z = self.g.const(c.args[1]), self.g.const(c.args[2])
        if s is None or z is None:
            raise ModelError(f"layer '{name}': weight scale/zero point are not constants")
        return w, s, z, int(c.attrs.axis), transposed

    def _bias_ints(self, bias_expr, k: int, sx: float, sw: np.ndarray, name: str):
        """Integer bias (K,) from ``[reshape](dequantize(B))`` or a float constant."""
        if bias_expr is None:
            return np.zeros(k, dtype=np.int64), "none"
        e = self.g.value(bias_expr)
        if _op_name(e) == "relax.reshape":
            e = self.g.value(e.args[0])
        if _op_name(e) == "relax.dequantize":
            if _dtype(e.args[0]) != "int32":
                return None, None  # a quantized activation, not a bias: not this pattern
            b = self.g.const(e.args[0])
            bs, bz = self.g.const(e.args[1]), self.g.const(e.args[2])
            if b is None or bs is None or bz is None:
                raise ModelError(f"layer '{name}': the quantized bias is not constant; bind the "
                                 "weights (load_onnx does) before canonicalize")
            b = b.astype(np.int64).ravel()
            if b.size != k:
                return None, None
            if np.any(np.ravel(bz) != 0):
                raise ModelError(f"layer '{name}': bias zero point must be 0 (got "
                                 f"{np.ravel(bz)[np.ravel(bz) != 0][0]}); re-quantize the model")
            bs = _per_channel(bs, k, "bias scale", name).astype(np.float64)
            want = sx * sw
            bad = np.abs(bs - want) > BIAS_SCALE_RTOL * np.abs(want)
            if np.any(bad):
                i = int(np.argmax(bad))
                raise ModelError(
                    f"layer '{name}': bias scale {bs[i]:.6g} != input scale {sx:.6g} x weight "
                    f"scale {sw[i]:.6g} (channel {i}); re-quantize the model so that "
                    "bias_scale = x_scale * w_scale")
            return b, "int32"
        b = self.g.const(e)
        if b is not None and np.issubdtype(b.dtype, np.floating) and b.size in (1, k):
            # float bias next to quantized x and W: quantize it with x_scale * w_scale
            b = np.broadcast_to(b.ravel(), (k,)).astype(np.float64)
            return np.rint(b / (sx * sw)).astype(np.int64), "float (quantized at import)"
        return None, None

    def _conv(self, core, out: _Out):
        op_e, bias_e = self._split_bias(core)
        if op_e is None or self.g.op(op_e) != "relax.nn.conv2d":
            return None
        conv = self.g.value(op_e)
        a = conv.attrs
        if (a.data_layout != "NCHW" or a.kernel_layout != "OIHW"
                or (a.out_layout or "NCHW") != "NCHW"):
            return None
        x = self.g.dq_act(conv.args[0])
        if x is None:
            return None
        name, onnx_name = self.g.layer_name([core, op_e], "conv2d")
        wq = self._weight_dq(conv.args[1], name)
        if wq is None:
            return None
        w, sw, zw, axis, transposed = wq
        k = w.shape[0]
        if transposed:
            return None
        if np.asarray(sw).size > 1 and axis != 0:
            raise ModelError(f"layer '{name}': conv weights must be quantized per tensor or per "
                             f"output channel (axis 0), got axis {axis}")
        sw = _per_channel(sw, k, "weight scale", name).astype(np.float64)
        zw = _per_channel(zw, k, "weight zero point", name).astype(np.int64)
        wz = w.astype(np.int64) - zw.reshape(-1, 1, 1, 1)
        bias, bias_kind = self._bias_ints(bias_e, k, x.scale, sw, name)
        if bias is None:
            return None
        bound = numerics.conv_acc_bound(wz, bias, x.dtype, x.zp)
        scale = x.scale * sw / out.scale
        rq = self.rc.requant(scale, bound, out.zp, out.qmin, out.qmax)
        err = numerics.recipe_error(rq, bound)
        attrs = dict(strides=_ints(a.strides), padding=_ints(a.padding),
                     dilation=_ints(a.dilation), groups=int(a.groups))

        name = self.g.claim(name)

        def emit(bb, look):
            xi = bb.emit(R.astype(look(x.var), "int32"), name_hint=f"{name}_xi")
            xc = bb.emit(R.subtract(xi, relax.const(x.zp, "int32")), name_hint=f"{name}_xc")
            acc = bb.emit(R.nn.conv2d(xc, relax.const(wz.astype(np.int32), "int32"),
                                      data_layout="NCHW", kernel_layout="OIHW",
                                      out_dtype="int32", **attrs), name_hint=f"{name}_acc")
            acc = bb.emit(R.add(acc, relax.const(bias.astype(np.int32).reshape(1, k, 1, 1),
                                                 "int32")), name_hint=f"{name}_biased")
            return numerics.emit_requant(bb, acc, rq, out.dtype, 1, name=f"{name}_rq",
                                         out_name=name)

        rec = self._record(name, onnx_name, "conv2d", out, err, **attrs,
                           kernel=tuple(int(d) for d in w.shape),
                           weight_per_channel=bool(np.unique(sw).size > 1),
                           bias=bias_kind, input_scale=x.scale, input_zero_point=x.zp,
                           input_dtype=x.dtype, **self._rq_detail(rq, bound))
        return _Plan(rec, emit)

    @staticmethod
    def _rq_detail(rq: Requant, bound) -> dict:
        return {"pre_shift": rq.pre_shift, "shift": rq.shift,
                "multiplier_min": int(np.min(rq.multiplier)),
                "multiplier_max": int(np.max(rq.multiplier)),
                "acc_bound_max": int(np.max(bound)), "requant": rq}

    # -- dense ----------------------------------------------------------------------------------
    def _dense(self, core, out: _Out):
        op_e, bias_e = self._split_bias(core)
        if op_e is None or self.g.op(op_e) != "relax.matmul":
            return None
        mm = self.g.value(op_e)
        x = self.g.dq_act(mm.args[0])
        xs = _shape(mm.args[0])
        if x is None or xs is None or len(xs) != 2:
            return None
        name, onnx_name = self.g.layer_name([core, op_e], "dense")
        wq = self._weight_dq(mm.args[1], name)
        if wq is None:
            return None
        w, sw, zw, axis, transposed = wq
        if w.ndim != 2:
            return None
        # Wt (Cin, K): output channels along axis 1 of the matmul operand
        k_axis = 0 if transposed else 1
        k = w.shape[k_axis]
        if np.asarray(sw).size > 1 and axis != k_axis:
            raise ModelError(f"layer '{name}': dense weights must be quantized per tensor or per "
                             f"output channel, got axis {axis} of a {w.shape} weight")
        sw = _per_channel(sw, k, "weight scale", name).astype(np.float64)
        zw = _per_channel(zw, k, "weight zero point", name).astype(np.int64)
        wt = (w.T if transposed else w).astype(np.int64) - zw.reshape(1, k)   # (Cin, K)
        bias, bias_kind = self._bias_ints(bias_e, k, x.scale, sw, name)
        if bias is None:
            return None
        bound = numerics.conv_acc_bound(wt.T, bias, x.dtype, x.zp)
        rq = self.rc.requant(x.scale * sw / out.scale, bound, out.zp, out.qmin, out.qmax)
        err = numerics.recipe_error(rq, bound)

        name = self.g.claim(name)

        def emit(bb, look):
            xi = bb.emit(R.astype(look(x.var), "int32"), name_hint=f"{name}_xi")
            xc = bb.emit(R.subtract(xi, relax.const(x.zp, "int32")), name_hint=f"{name}_xc")
            acc = bb.emit(R.matmul(xc, relax.const(wt.astype(np.int32), "int32"),
                                   out_dtype="int32"), name_hint=f"{name}_acc")
            acc = bb.emit(R.add(acc, relax.const(bias.astype(np.int32).reshape(1, k), "int32")),
                          name_hint=f"{name}_biased")
            return numerics.emit_requant(bb, acc, rq, out.dtype, 1, name=f"{name}_rq",
                                         out_name=name)

        rec = self._record(name, onnx_name, "dense", out, err, units=k, in_features=wt.shape[0],
                           weight_per_channel=bool(np.unique(sw).size > 1), bias=bias_kind,
                           input_scale=x.scale, input_zero_point=x.zp, input_dtype=x.dtype,
                           **self._rq_detail(rq, bound))
        return _Plan(rec, emit)

    # -- residual add ---------------------------------------------------------------------------
    def _add(self, core, out: _Out):
        c = self.g.value(core)
        if _op_name(c) != "relax.add":
            return None
        a, b = (self.g.dq_act(x) for x in c.args)
        if a is None or b is None:
            return None
        name, onnx_name = self.g.layer_name([core], "add")
        sa, sb = a.scale / out.scale, b.scale / out.scale
        ma, mb, rq = self.rc.add(sa, sb, out.zp, out.qmin, out.qmax)
        err = numerics.add_error(sa, sb, ma, mb, rq)

        name = self.g.claim(name)

        def emit(bb, look):
            return numerics.emit_add(bb, look(a.var), look(b.var), a.zp, b.zp, ma, mb, rq,
                                     out.dtype, name=f"{name}_rq", out_name=name,
                                     acc_name=f"{name}_acc")

        rec = self._record(name, onnx_name, "add", out, err, a_scale=a.scale, a_zero_point=a.zp,
                           b_scale=b.scale, b_zero_point=b.zp, a_multiplier=ma, b_multiplier=mb,
                           shift=rq.shift, pre_shift=0, requant=rq)
        return _Plan(rec, emit)

    # -- CPU-only ops ---------------------------------------------------------------------------
    def _finish(self, bb, xint, x: _QAct, out: _Out, name: str, extra_scale: float = 1.0,
                acc=None, bound=None):
        """Bring an integer tensor with x's quantization (times ``extra_scale``) to ``out``:
        clip only if the parameters agree, else the CPU requantize chain. ``acc`` (int32, zero
        point removed) replaces ``xint - zx`` when given."""
        if acc is None and extra_scale == 1.0 and x.same_as(out.scale, out.zp, out.dtype):
            return _clamp(bb, xint, out, name)
        if acc is None:
            xi = bb.emit(R.astype(xint, "int32"), name_hint=f"{name}_xi")
            acc = bb.emit(R.subtract(xi, relax.const(x.zp, "int32")), name_hint=f"{name}_xc")
        rq = self._cpu_rq(x, out, extra_scale, bound)
        return numerics.emit_requant(bb, acc, rq, out.dtype, 1, name=f"{name}_rq",
                                     out_name=name)

    def _cpu_rq(self, x: _QAct, out: _Out, extra_scale: float = 1.0, bound=None) -> Requant:
        bound = x.reach if bound is None else bound
        return self.rc.cpu(np.array([x.scale * extra_scale / out.scale]), np.array([bound]),
                           out.zp, out.qmin, out.qmax)

    def _finish_error(self, x: _QAct, out: _Out, extra_scale=1.0, bound=None):
        if extra_scale == 1.0 and bound is None and x.same_as(out.scale, out.zp, out.dtype):
            return None, {"rescale": False}
        rq = self._cpu_rq(x, out, extra_scale, bound)
        b = x.reach if bound is None else bound
        return numerics.recipe_error(rq, b), {"rescale": True, **self._rq_detail(rq, b)}

    def _passthrough(self, core, out: _Out):
        """max_pool2d / layout ops on the integer tensor, or a bare requantize / relu / clip."""
        c = self.g.value(core)
        op = _op_name(c)
        if op == "relax.dequantize":
            x = self.g.dq_act(core)
            if x is None:
                return None
            kind, rebuild = (out.activation or "requantize"), None
        elif op == "relax.nn.max_pool2d" or op in _LAYOUT_OPS:
            if op == "relax.nn.max_pool2d" and c.attrs.layout != "NCHW":
                return None
            x = self.g.dq_act(c.args[0])
            if x is None:
                return None
            kind = op.removeprefix("relax.").removeprefix("nn.")
            rebuild = c
        else:
            return None
        cands = [core] if rebuild is not None else [*out.act_exprs, core]
        name, onnx_name = self.g.layer_name(cands, kind)
        err, detail = self._finish_error(x, out)
        name = self.g.claim(name)

        if rebuild is None and detail["rescale"] is False and out.full_range:
            def emit(bb, look):  # quantize(dequantize(x)) with equal parameters: x itself
                return look(x.var)
        else:
            def emit(bb, look):
                xi = look(x.var)
                if rebuild is not None:
                    final = not detail["rescale"] and out.full_range
                    xi = bb.emit(relax.Call(rebuild.op, [xi, *rebuild.args[1:]], rebuild.attrs,
                                            rebuild.ty_args),
                                 name_hint=name if final else f"{name}_int")
                return self._finish(bb, xi, x, out, name)

        rec = self._record(name, onnx_name, kind, out, err, input_scale=x.scale,
                           input_zero_point=x.zp, input_dtype=x.dtype, **detail)
        return _Plan(rec, emit)

    def _global_pool(self, core, out: _Out):
        c = self.g.value(core)
        if _op_name(c) != "relax.mean":
            return None
        x = self.g.dq_act(c.args[0])
        shape = _shape(c.args[0])
        if x is None or shape is None:
            return None
        axes = (list(range(len(shape))) if c.attrs.axis is None
                else [int(a) % len(shape) for a in c.attrs.axis])
        n = int(np.prod([shape[a] for a in axes]))
        keep = bool(c.attrs.keepdims)
        kind = "global_avg_pool2d" if sorted(axes) == [2, 3] and len(shape) == 4 else "mean"
        name, onnx_name = self.g.layer_name([core], kind)
        bound = n * x.reach
        err, detail = self._finish_error(x, out, 1.0 / n, bound)

        name = self.g.claim(name)

        def emit(bb, look):
            xi = bb.emit(R.astype(look(x.var), "int32"), name_hint=f"{name}_xi")
            xc = bb.emit(R.subtract(xi, relax.const(x.zp, "int32")), name_hint=f"{name}_xc")
            acc = bb.emit(R.sum(xc, axis=axes, keepdims=keep), name_hint=f"{name}_sum")
            return self._finish(bb, None, x, out, name, 1.0 / n, acc=acc, bound=bound)

        rec = self._record(name, onnx_name, kind, out, err, window=n, input_scale=x.scale,
                           input_zero_point=x.zp, input_dtype=x.dtype, **detail)
        return _Plan(rec, emit)

    def _avg_pool(self, core, out: _Out):
        c = self.g.value(core)
        if _op_name(c) != "relax.nn.avg_pool2d":
            return None
        a = c.attrs
        x = self.g.dq_act(c.args[0])
        shape = _shape(c.args[0])
        oshape = _shape(c)
        pad = _ints(a.padding)
        if (x is None or shape is None or oshape is None or a.layout != "NCHW"
                or (a.out_layout or "NCHW") != "NCHW" or bool(a.ceil_mode)
                or (any(pad) and not bool(a.count_include_pad))):
            return None  # border windows with a varying divisor: leave float
        kh, kw = _ints(a.pool_size)
        sh, sw = _ints(a.strides)
        dh, dw = _ints(a.dilation)
        ho, wo = oshape[2], oshape[3]
        n = kh * kw
        name, onnx_name = self.g.layer_name([core], "avg_pool2d")
        bound = n * x.reach
        err, detail = self._finish_error(x, out, 1.0 / n, bound)

        name = self.g.claim(name)

        def emit(bb, look):
            xi = bb.emit(R.astype(look(x.var), "int32"), name_hint=f"{name}_xi")
            xc = bb.emit(R.subtract(xi, relax.const(x.zp, "int32")), name_hint=f"{name}_xc")
            if any(pad):
                pt, pl, pb, pr = pad
                xc = bb.emit(R.nn.pad(xc, [0, 0, 0, 0, pt, pb, pl, pr]),
                             name_hint=f"{name}_pad")
            acc = None
            for i in range(kh):
                for j in range(kw):
                    y0, x0 = i * dh, j * dw
                    win = bb.emit(R.strided_slice(
                        xc, axes=[2, 3], begin=[y0, x0],
                        end=[y0 + (ho - 1) * sh + 1, x0 + (wo - 1) * sw + 1],
                        strides=[sh, sw]), name_hint=f"{name}_win")
                    acc = win if acc is None else bb.emit(R.add(acc, win),
                                                          name_hint=f"{name}_sum")
            return self._finish(bb, None, x, out, name, 1.0 / n, acc=acc, bound=bound)

        rec = self._record(name, onnx_name, "avg_pool2d", out, err, window=n,
                           input_scale=x.scale, input_zero_point=x.zp, input_dtype=x.dtype,
                           **detail)
        return _Plan(rec, emit)

    def _concat(self, core, out: _Out):
        c = self.g.value(core)
        if _op_name(c) != "relax.concat":
            return None
        tup = self.g.value(c.args[0])
        if not isinstance(tup, relax.Tuple):
            return None
        xs = [self.g.dq_act(f) for f in tup.fields]
        if any(x is None for x in xs):
            return None
        axis = int(c.attrs.axis)
        name, onnx_name = self.g.layer_name([core], "concat")
        errs = [self._finish_error(x, out)[0] for x in xs]
        errs = [e for e in errs if e is not None]

        name = self.g.claim(name)

        def emit(bb, look):
            parts = [self._finish(bb, look(x.var), x, out, f"{name}_in{i}")
                     for i, x in enumerate(xs)]
            return bb.emit(R.concat(parts, axis=axis), name_hint=name)

        err = (numerics.ApproximationError(max(e.max_rel_error for e in errs),
                                           max(e.max_lsb_error for e in errs)) if errs else None)
        rec = self._record(name, onnx_name, "concat", out, err, inputs=len(xs),
                           rescaled_inputs=len(errs), axis=axis)
        return _Plan(rec, emit)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, plans: dict, mod=None):
        super().__init__(mod)
        self.plans = plans

    def visit_var_binding_(self, binding):
        plan = self.plans.get(binding.var)
        if plan is None:
            return super().visit_var_binding_(binding)
        new = plan.emit(self.builder_, self.visit_expr)
        if not isinstance(binding.var, relax.DataflowVar) and isinstance(new, relax.DataflowVar):
            new = self.builder_.emit_output(new, name_hint=binding.var.name)
        self.set_var_remap(binding.var, new)


def canonicalize(mod: tvm.IRModule, target=None,
                 func_name: str = "main") -> tuple[tvm.IRModule, list[LayerRecord]]:
    """Rewrite the QDQ patterns of ``mod[func_name]`` into the canonical integer graph.

    ``target``: an :class:`~tvm_accel.target.AccelTarget` (or its kind, e.g. ``"vta"``, or any
    object with ``requant_recipe``/``add_recipe``) whose recipe is used for conv2d, dense and add;
    ``None`` uses the generic int64 CPU recipe. A recipe that raises
    :class:`tvm_accel.numerics.RecipeError` (scale not representable on the hardware) leaves
    that layer float, on the CPU, with the reason in its record. Returns the new module
    (weights as int32 constants, float QDQ leftovers removed by dead-code elimination) and one
    :class:`LayerRecord` per quantized value: integer layers and what stayed float.
    """
    recipes = _Recipes(target)
    func = mod[func_name]
    names = {}
    if mod.attrs is not None and "onnx_node_names" in mod.attrs:
        names = {str(k): str(v) for k, v in mod.attrs["onnx_node_names"].items()}
    graph = _Graph(func, names)
    canon = _Canonicalizer(graph, recipes)
    canon.run()
    new_func = _Rewriter(canon.plans, mod).visit_expr(func)
    out = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint != func_name},
                       attrs=mod.attrs)
    out[func_name] = new_func
    entries = [gv.name_hint for gv, f in out.functions_items() if isinstance(f, relax.Function)]
    out = relax.transform.DeadCodeElimination(entries)(out)
    relax.analysis.well_formed(out)
    return out, canon.report
