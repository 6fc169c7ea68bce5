"""Integer forms of the elementwise operators between Q/DQ nodes (docs/architecture.md section
4.1): activations as a table lookup, the product of two quantized tensors and a
BatchNormalization (folded into the conv before it, or a per-channel multiply-add).

**Table lookup.** A quantized 8-bit input has 256 values, so any elementwise function of one
quantized tensor -- Sigmoid, Tanh, HardSigmoid, LeakyRelu, PRelu (one table per channel), and
the compositions an exporter writes with Q/DQ nodes inside (SiLU as ``Sigmoid -> Q -> DQ ->
Mul(x, .)``, HardSwish as ``HardSigmoid -> Q -> DQ -> Mul(x, .)``) -- is a 256-entry table
indexed by the input code. The table is computed as onnxruntime computes the QDQ graph (and as
its QLinear lookup-table kernels and TFLite build theirs): each code dequantized in float32
(``(q - zp) * scale``), the float ops in float32 in graph order, an intermediate
QuantizeLinear / DequantizeLinear as onnxruntime rounds (``rint(v / scale)``, half to even),
the output quantized alike. The integer graph then reads the table: exact for the function as
written; it differs from onnxruntime only where onnxruntime's own float kernels (MLAS's
logistic / tanh approximations, fused multiply-adds) round a value to the other side of a
quantization boundary, by 1 LSB.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from tvm import relax
from tvm.ir.prim.expr import FloatImm, IntImm

from tvm_accel import numerics
from tvm_accel.canonicalize.graph import _dtype, _Graph, _op_name, _Out, _Plan, _QAct, _shape
from tvm_accel.layers import DTYPE_RANGE, Requant

R = relax.op
_F32 = np.float32
_PRIM_SCALARS = (IntImm, FloatImm)

#: entries of one table: every value of an 8-bit input
TABLE_SIZE = 256

#: how deep the table builder follows ``quantize -> dequantize`` pairs back to one input
_MAX_DEPTH = 4

#: most operators one table composes
_MAX_OPS = 64


class _Unfit(Exception):
    """Control flow of the table builder (never leaves this module): the expression is not an
    elementwise function of the chosen input."""


def _binary(fn):
    return lambda ev, c: fn(ev.operand(c.args[0]), ev.operand(c.args[1]))


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return _F32(1) / (_F32(1) + np.exp(-v))


def _where_negative(v: np.ndarray, slope: np.ndarray) -> np.ndarray:
    return np.where(v >= 0, v, slope * v).astype(_F32)


def _clip(ev, c) -> np.ndarray:
    lo, hi = (float(a.value) for a in c.args[1:3])
    return np.clip(ev.operand(c.args[0]), _F32(lo), _F32(hi))


#: float ops the table builder evaluates (numpy float32, onnxruntime's arithmetic)
_OPS = {
    "relax.sigmoid": lambda ev, c: _sigmoid(ev.operand(c.args[0])),
    "relax.tanh": lambda ev, c: np.tanh(ev.operand(c.args[0])),
    "relax.nn.silu": lambda ev, c: (lambda v: v * _sigmoid(v))(ev.operand(c.args[0])),
    "relax.nn.relu": lambda ev, c: np.maximum(ev.operand(c.args[0]), _F32(0)),
    "relax.negative": lambda ev, c: -ev.operand(c.args[0]),
    "relax.clip": _clip,
    "relax.nn.leakyrelu": lambda ev, c: _where_negative(ev.operand(c.args[0]),
                                                        _F32(c.attrs.alpha)),
    "relax.nn.prelu": lambda ev, c: _where_negative(ev.operand(c.args[0]),
                                                    ev.slope(c.args[1], int(c.attrs.axis))),
    "relax.add": _binary(np.add),
    "relax.subtract": _binary(np.subtract),
    "relax.multiply": _binary(np.multiply),
    "relax.divide": _binary(np.divide),
    "relax.maximum": _binary(np.maximum),
    "relax.minimum": _binary(np.minimum),
}


def quantize_f32(v: np.ndarray, scale: float, zp: int, qmin: int, qmax: int) -> np.ndarray:
    """onnxruntime's QuantizeLinear of float32 values: ``clip(rint(v / scale) + zp)`` (the
    division in float32, round half to even), as int64."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = np.rint(np.asarray(v, _F32) / _F32(scale)).astype(np.float64) + zp
    return np.clip(q, qmin, qmax).astype(np.int64)


def dequantize_f32(q: np.ndarray, scale: float, zp: int) -> np.ndarray:
    """onnxruntime's DequantizeLinear: ``(q - zp) * scale`` in float32."""
    return (np.asarray(q, np.int64) - zp).astype(_F32) * _F32(scale)


def constant_f32(g: _Graph, e) -> np.ndarray | None:
    """A float constant, or the dequantize of a constant computed in float32 as onnxruntime
    does (a quantized PRelu slope or BatchNormalization scale), else None."""
    c = g.value(e)
    if isinstance(c, _PRIM_SCALARS):  # a scalar argument (a clip bound)
        return np.asarray([float(c.value)], _F32)
    arr = g.const(c)
    if arr is not None:
        return np.asarray(arr, _F32) if arr.dtype.kind == "f" else None
    if _op_name(c) != "relax.dequantize":
        return None
    q, s, z = (g.const(a) for a in c.args)
    if q is None or s is None or z is None:
        return None
    if s.size > 1 or z.size > 1:  # per axis: broadcast along the dequantize's axis
        shape = [1] * q.ndim
        shape[int(c.attrs.axis) % max(q.ndim, 1)] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    return (q.astype(np.int64) - z.astype(np.int64)).astype(_F32) * s.astype(_F32)


@dataclass
class _TableBuilder:
    """Evaluates an expression over every code of ``root`` (one table row per channel when a
    constant is per channel): values are ``(1 or C, 256)`` float32 arrays."""

    g: _Graph
    root: _QAct
    channels: int
    ndim: int
    #: vars of the float ops evaluated (reported as part of the layer)
    vars: list = field(default_factory=list)
    #: quantize vars passed through (intermediate layers composed into the table)
    composed: list = field(default_factory=list)
    #: the float ops, in evaluation order (the record's description)
    ops: list = field(default_factory=list)

    def codes(self) -> np.ndarray:
        lo, hi = DTYPE_RANGE[self.root.dtype]
        return np.arange(lo, hi + 1, dtype=np.int64)

    def operand(self, e, depth: int = 0) -> np.ndarray:
        const = constant_f32(self.g, e)
        if const is not None:
            return self._per_channel(const)
        return self.value(e, depth)

    def slope(self, e, axis: int) -> np.ndarray:
        """A PRelu slope along ``axis`` (the channel axis only)."""
        s = constant_f32(self.g, e)
        if s is None or s.ndim != 1 or s.size not in (1, self.channels) or (
                s.size > 1 and axis != 1):
            raise _Unfit
        return s.reshape(-1, 1)

    def value(self, e, depth: int = 0) -> np.ndarray:
        if len(self.ops) > _MAX_OPS:
            raise _Unfit
        c = self.g.value(e)
        op = _op_name(c)
        if op == "relax.dequantize":
            return self._dequantized(e, depth)
        fn = _OPS.get(op or "")
        if op is None or fn is None or _dtype(c) != "float32":
            raise _Unfit
        self.ops.append(op.removeprefix("relax.").removeprefix("nn."))
        if isinstance(e, relax.Var):
            self.vars.append(e)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = np.asarray(fn(_Bound(self, depth), c), dtype=_F32)
        if out.ndim != 2:
            raise _Unfit
        return out

    def _dequantized(self, e, depth: int) -> np.ndarray:
        a = self.g.dq_act(e)
        if a is None:
            raise _Unfit
        if a.var.same_as(self.root.var):
            return dequantize_f32(self.codes(), a.scale, a.zp).reshape(1, -1)
        # an intermediate quantized tensor computed from the same input: follow it back
        q = self.g.value(a.var)
        if (depth >= _MAX_DEPTH or _op_name(q) != "relax.quantize"
                or a.var in self.g.ranges):
            raise _Unfit
        out = self.g.quantize_out(q)
        if out is None:
            raise _Unfit
        inner = self.value(q.args[0], depth + 1)
        if np.isnan(inner).any():
            raise _Unfit
        self.composed.append(a.var)
        codes = quantize_f32(inner, out.scale, out.zp, out.qmin, out.qmax)
        return dequantize_f32(codes, a.scale, a.zp)

    def _per_channel(self, a: np.ndarray) -> np.ndarray:
        """A constant broadcast against the input: a scalar, or one value per channel (axis
        1); anything else is not elementwise over channels."""
        if a.size == 1:
            return a.reshape(1, 1)
        if a.ndim > self.ndim or self.ndim < 2:
            raise _Unfit
        shape = (1,) * (self.ndim - a.ndim) + a.shape
        if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] != self.channels:
            raise _Unfit
        return a.reshape(-1, 1)


@dataclass
class _Bound:
    """The builder as an op sees it: operands evaluated at the current depth."""

    builder: _TableBuilder
    depth: int

    def operand(self, e) -> np.ndarray:
        return self.builder.operand(e, self.depth)

    def slope(self, e, axis: int) -> np.ndarray:
        return self.builder.slope(e, axis)


def _dequantize_leaves(g: _Graph, e, limit: int = _MAX_OPS) -> list[_QAct]:
    """The quantized activations an expression of float ops reads (candidate table inputs)."""
    out: list[_QAct] = []
    stack, seen = [e], 0
    while stack and seen < limit:
        seen += 1
        x = stack.pop()
        a = g.dq_act(x)
        if a is not None:
            if not any(a.var.same_as(b.var) for b in out):
                out.append(a)
            continue
        c = g.value(x)
        if _op_name(c) in _OPS:
            stack.extend(reversed(list(c.args)))
    return out


@dataclass
class Table:
    """A table-lookup layer: ``table[k, code - lo]`` is the output for input ``code`` in
    channel ``k`` (one row when every channel shares it)."""

    x: _QAct
    table: np.ndarray          # (K, 256) of the output dtype
    function: str              # the float ops it replaces, e.g. "sigmoid"
    vars: list                 # Relax vars of those ops
    composed: list             # quantize vars of intermediate layers it passed through


def build_table(g: _Graph, core, out: _Out) -> Table | None:
    """The table of ``quantize(core)`` if ``core`` is an elementwise function of one quantized
    tensor made of the ops the builder knows, else None."""
    if _op_name(g.value(core)) not in _OPS:
        return None
    for x in _dequantize_leaves(g, core):
        shape = _shape(x.var)
        if shape is None:
            continue
        builder = _TableBuilder(g, x, shape[1] if len(shape) >= 2 else 1, len(shape))
        try:
            values = builder.value(core)
        except _Unfit:
            continue
        if np.isnan(values).any():
            continue
        rows = np.broadcast_to(values, (values.shape[0], TABLE_SIZE))
        q = quantize_f32(rows, out.scale, out.zp, out.qmin, out.qmax).astype(out.dtype)
        if q.shape[0] > 1 and np.all(q == q[:1]):
            q = q[:1]
        return Table(x, q, "+".join(dict.fromkeys(builder.ops)), builder.vars,
                     builder.composed)
    return None


def emit_lut(bb, x, table: np.ndarray, in_dtype: str, name: str):
    """Emit the canonical table lookup of the integer tensor ``x`` (NCHW or NC)::

        xi = astype(x, int32)                      # <name>_xi
        idx = add(xi, offset)                      # <name>_idx
        y = take(T, idx, axis=0, mode="clip")      # <name>_acc, the output dtype

    ``T`` is the flattened ``(K, 256)`` table (K = 1, or one row per channel), ``offset`` the
    int32 scalar ``-lo`` (K = 1) or the ``(1, K, 1, 1)`` constant ``256 * k - lo`` (``lo``
    the input dtype's minimum): ``idx`` is the row-major index of ``(channel, code - lo)``.
    Every op is kept, even a zero offset, so the pattern is fixed (``clip`` never acts: every
    index is in range)."""
    lo = DTYPE_RANGE[in_dtype][0]
    k = table.shape[0]
    ndim = len(x.ty.shape)
    offset = (np.asarray(-lo, np.int32) if k == 1 else
              (np.arange(k, dtype=np.int32) * TABLE_SIZE - lo).reshape(
                  (1, k) + (1,) * (ndim - 2)))
    xi = bb.emit(R.astype(x, "int32"), name_hint=f"{name}_xi")
    idx = bb.emit(R.add(xi, relax.const(offset, "int32")), name_hint=f"{name}_idx")
    flat = np.ascontiguousarray(table.reshape(-1))
    return bb.emit(R.take(relax.const(flat, str(table.dtype)), idx, axis=0, mode="clip"),
                   name_hint=f"{name}_acc")


def apply_lut(x: np.ndarray, table: np.ndarray, in_dtype: str) -> np.ndarray:
    """numpy reference of :func:`emit_lut` (channel axis 1)."""
    lo = DTYPE_RANGE[in_dtype][0]
    idx = x.astype(np.int64) - lo
    if table.shape[0] == 1:
        return table[0][idx]
    ch = np.arange(table.shape[0]).reshape((1, -1) + (1,) * (x.ndim - 2))
    return table[ch, idx]


# --- BatchNormalization ----------------------------------------------------------------------
@dataclass
class BatchNorm:
    """An inference BatchNormalization as the per-channel affine map ``y = x * a + b``
    (float32, onnxruntime's arithmetic: ``a = scale / sqrt(var + eps)``, ``b = B - mean * a``)."""

    data: relax.Expr
    a: np.ndarray
    b: np.ndarray
    vars: list


def peel_batchnorm(g: _Graph, core) -> tuple[relax.Expr, BatchNorm | None]:
    """``batch_norm(data, ...)[0]`` with constant parameters on the channel axis ->
    ``(data, BatchNorm)``; anything else -> ``(core, None)``."""
    item = g.value(core)
    if not isinstance(item, relax.TupleGetItem) or int(item.index) != 0:
        return core, None
    bn = g.value(item.tuple_value)
    if _op_name(bn) != "relax.nn.batch_norm" or int(bn.attrs.axis) != 1 or bool(
            bn.attrs.training):
        return core, None
    params = [constant_f32(g, p) for p in bn.args[1:5]]
    if any(p is None for p in params):
        return core, None
    gamma, beta, mean, var = (np.asarray(p, _F32).ravel() for p in params)
    if bool(bn.attrs.scale) is False:
        gamma = np.ones_like(gamma)
    if bool(bn.attrs.center) is False:
        beta = np.zeros_like(beta)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = (_F32(1) / np.sqrt(var + _F32(bn.attrs.epsilon))) * gamma
        b = beta - mean * a
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return core, None
    vars_ = [v for v in (core, item.tuple_value) if isinstance(v, relax.Var)]
    return bn.args[0], BatchNorm(bn.args[0], a.astype(_F32), b.astype(_F32), vars_)


def fold_batchnorm(bn: BatchNorm, wz: np.ndarray, sw: np.ndarray, bias: np.ndarray,
                   sx: float, layer: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A BatchNormalization reading a conv's float output, folded into the conv: channel
    ``c``'s weight scale becomes ``sw * |a|`` (its integer weights change sign with ``a``)
    and its int32 bias ``sign(a) * B + round(b / (sx * sw * |a|))`` -- the conv a quantizer
    would make from the folded float conv with per-channel weight scales (the same integer
    weights; the BN shift rounded into the bias as onnxruntime rounds a bias). Raises
    :class:`~tvm_accel.numerics.RecipeError` (the pair stays float) for a zero ``a`` or a bias
    beyond int32."""
    a, b = bn.a.astype(np.float64), bn.b.astype(np.float64)
    k = wz.shape[0]
    if a.size not in (1, k):
        raise numerics.RecipeError(f"layer '{layer}': BatchNormalization has {a.size} channels "
                                   f"for {k} conv outputs")
    a, b = np.broadcast_to(a, (k,)), np.broadcast_to(b, (k,))
    if np.any(a == 0):
        raise numerics.RecipeError(f"layer '{layer}': BatchNormalization scale is 0 in "
                                   f"channel {int(np.argmax(a == 0))}")
    sign = np.where(a < 0, -1, 1).astype(np.int64)
    sw2 = sw * np.abs(a)
    bias2 = sign * bias + np.rint(b / (sx * sw2)).astype(np.int64)
    if np.any(np.abs(bias2) >= 2 ** 31):
        raise numerics.RecipeError(f"layer '{layer}': the folded BatchNormalization shift "
                                   "does not fit the int32 bias")
    return wz * sign.reshape((-1,) + (1,) * (wz.ndim - 1)), sw2, bias2


def affine_requant(x: _QAct, bn: BatchNorm, out: _Out) -> Requant:
    """The per-channel multiply-add of a BatchNormalization on a quantized tensor:
    ``y = ((x - zx) * m[c] + r[c]) >> S`` then the zero point and the clip, with
    ``m = round(sx * a / sy * 2^S)`` (signed) and ``r = round(b / sy * 2^S) + 2^(S-1)`` (the
    BN shift rides on the rounding constant). ``S`` keeps ``|m| < 2^31``, so the error is far
    below an LSB and the product fits int64."""
    k = np.asarray(x.scale * bn.a.astype(np.float64) / out.scale)
    shift_b = np.asarray(bn.b.astype(np.float64) / out.scale)
    biggest = float(np.max(np.abs(k))) if k.size else 0.0
    shift = 40 if biggest == 0 else int(np.clip(30 - np.ceil(np.log2(biggest)), 1, 40))
    mult = np.rint(k * 2.0 ** shift).astype(np.int64)
    radd = np.rint(shift_b * 2.0 ** shift).astype(np.int64) + (1 << (shift - 1))
    n = max(mult.size, radd.size)
    return Requant(pre_shift=0, multiplier=np.broadcast_to(mult, (n,)).copy(),
                   round_add=np.broadcast_to(radd, (n,)).copy(), shift=shift,
                   zero_point=out.zp, qmin=out.qmin, qmax=out.qmax,
                   scale=np.broadcast_to(k, (n,)).copy())



# --- plans (called by the canonicalizer, rewrite._Canonicalizer) ------------------------------
def lut_plan(canon, core, out: _Out) -> _Plan | None:
    """``quantize(f(dequantize(x)))`` for an elementwise ``f`` -> the table lookup. A ReLU /
    Clip folded into ``out``'s range is evaluated in float like the rest of ``f`` (the clamp
    to ``qmin``/``qmax`` then only adds a sub-byte range)."""
    t = build_table(canon.g, out.act_exprs[0] if out.act_exprs else core, out)
    if t is None:
        return None
    x = t.x
    name, onnx_name = canon.g.layer_name([*out.act_exprs, core], "lut")
    composed = [canon.plans[v].record.onnx_name for v in t.composed if v in canon.plans]
    name = canon.g.claim(name)

    def emit(bb, look):
        return emit_lut(bb, look(x.var), t.table, x.dtype, name)

    rec = canon._record(name, onnx_name, "lut", out, None, parts=t.vars,
                        bits=canon._bits(out, [x]), function=t.function,
                        table=t.table, table_channels=int(t.table.shape[0]), composed=composed,
                        input_scale=x.scale, input_zero_point=x.zp, input_dtype=x.dtype)
    return _Plan(rec, emit)


def mul_plan(canon, core, out: _Out) -> _Plan | None:
    """``quantize(dequantize(a) * dequantize(b))`` of two quantized tensors (broadcasting,
    e.g. a squeeze-excitation gate) -> ``(a - za) * (b - zb)`` in int32, then ``RQ`` with scale
    ``sa * sb / sy`` (the generic int64 CPU recipe unless the target's ``recipe_for``
    claims ``multiply``)."""
    c = canon.g.value(core)
    if _op_name(c) != "relax.multiply":
        return None
    a, b = (canon.g.dq_act(v) for v in c.args)
    if a is None or b is None:
        return None
    name, onnx_name = canon.g.layer_name([core], "multiply")
    bound = a.reach * b.reach
    rq = canon.rc.for_op("multiply")(np.array([a.scale * b.scale / out.scale]),
                                     np.array([bound]), out.zp, out.qmin, out.qmax)
    err = numerics.recipe_error(rq, bound)
    name = canon.g.claim(name)

    def emit(bb, look):
        xs = []
        for tag, v in (("a", a), ("b", b)):
            t = bb.emit(R.astype(look(v.var), "int32"), name_hint=f"{name}_{tag}i")
            xs.append(bb.emit(R.subtract(t, relax.const(v.zp, "int32")),
                              name_hint=f"{name}_{tag}c"))
        acc = bb.emit(R.multiply(*xs), name_hint=f"{name}_acc")
        return numerics.emit_requant(bb, acc, rq, out.dtype, 1, name=f"{name}_rq",
                                     out_name=name)

    rec = canon._record(name, onnx_name, "multiply", out, err, bits=canon._bits(out, [a, b]),
                        a_scale=a.scale, a_zero_point=a.zp, b_scale=b.scale,
                        b_zero_point=b.zp, **canon._rq_detail(rq, bound))
    return _Plan(rec, emit)


def batchnorm_plan(canon, core, out: _Out) -> _Plan | None:
    """``quantize(batch_norm(dequantize(x)))`` -> the per-channel multiply-add
    (:func:`affine_requant`) in the rescale form ``astype(x, int32) - zx -> RQ``."""
    data, bn = peel_batchnorm(canon.g, core)
    if bn is None:
        return None
    x = canon.g.dq_act(data)
    shape = _shape(data)
    if x is None or shape is None or len(shape) < 2 or bn.a.size not in (1, shape[1]):
        return None
    name, onnx_name = canon.g.layer_name([core, *bn.vars], "batch_norm")
    rq = affine_requant(x, bn, out)
    err = numerics.recipe_error(replace(rq, multiplier=np.abs(rq.multiplier),
                                        scale=np.abs(rq.scale)), x.reach)
    name = canon.g.claim(name)

    def emit(bb, look):
        return canon._emit_rescale(bb, look(x.var), x.zp, rq, out.dtype, name)

    rec = canon._record(name, onnx_name, "batch_norm", out, err, parts=bn.vars,
                        bits=canon._bits(out, [x]), input_scale=x.scale, input_zero_point=x.zp,
                        input_dtype=x.dtype, **canon._rq_detail(rq, x.reach))
    return _Plan(rec, emit)
