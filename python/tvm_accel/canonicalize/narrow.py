"""Narrowed activations of a precision config (:mod:`tvm_accel.precision`): the tensor keeps its
calibrated real range on fewer levels (scale widened, every reader follows) or, with
``keep_scale``, is clipped at its scale (with a :class:`~tvm_accel.precision.PrecisionWarning`).

Widening rewrites the imported graph before the canonicalizer reads it, as if the model had been
quantized so (:func:`tvm_accel.quantize.apply_mixed_precision`): the tensor's quantize and every
dequantize reading it get the widened scale and zero point, and the int32 bias of each conv /
dense / transpose conv reading it is re-quantized to the new ``x_scale * w_scale``. The
canonicalizer then derives every recipe from the new parameters, so the integer graph (the
reference) stays consistent, and float leftovers (the model's output dequantize) read the same
values.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from tvm import relax

from tvm_accel import precision
from tvm_accel.canonicalize.graph import _Graph, _op_name
from tvm_accel.canonicalize.records import _WEIGHTED_OPS
from tvm_accel.errors import ConfigError
from tvm_accel.layers import DTYPE_RANGE


@dataclass(frozen=True)
class Request:
    """One config field asking for a tensor's width: ``layers.<name>.o`` or ``.i``, with the
    tensor's scale and zero point as that layer reads or writes it."""

    bits: int
    keep_scale: bool
    field: str
    scale: float
    zp: int


def narrow_activations(g: _Graph, requests: dict[relax.Var, list[Request]], source: str) -> None:
    """Apply every tensor's narrowest request (see the module docstring); ``source`` names the
    config in errors and warnings."""
    subs: dict[relax.Var, relax.Expr] = {}
    for var, reqs in requests.items():
        q = g.bind.get(var)
        dtype = str(var.ty.dtype)
        old = g.ranges.get(var, DTYPE_RANGE[dtype])
        narrowing = [r for r in reqs if not _holds(precision.bits_range(r.bits, dtype), old)]
        if not narrowing:
            continue
        bits = min(r.bits for r in narrowing)
        keeps = {r.keep_scale for r in narrowing}
        if len(keeps) > 1:
            a, b = (next(r.field for r in narrowing if r.keep_scale is k) for k in (True, False))
            raise ConfigError(f"{source}: {a} keeps the tensor's scale but {b} widens it: give "
                              "both entries the same keep_scale")
        first = min(narrowing, key=lambda r: r.bits)
        if keeps == {True}:
            _clip(g, var, bits, dtype, old, first.scale, first.zp, f"{source}: {first.field}")
            continue
        params = _params(g, q) if _op_name(q) == "relax.quantize" else None
        if params is None:
            raise ConfigError(f"{source}: {first.field}: the tensor is not the output of a "
                              "per-tensor quantize in the model, so its scale cannot widen; "
                              "add \"keep_scale\": true to clip it at its scale")
        _widen(g, var, q, params, bits, dtype, old, subs)
    if subs:
        _substitute(g, subs)


def _holds(rng: tuple[int, int], old: tuple[int, int]) -> bool:
    return rng[0] <= old[0] and old[1] <= rng[1]


def _params(g: _Graph, call: relax.Call) -> tuple[float, int] | None:
    """Scalar ``(scale, zero point)`` of a quantize / dequantize, else None."""
    s, z = g.const(call.args[1]), g.const(call.args[2])
    if s is None or z is None or s.size != 1 or z.size != 1:
        return None
    return float(s.ravel()[0]), int(z.ravel()[0])


def _clip(g: _Graph, var: relax.Var, bits: int, dtype: str, old: tuple[int, int], scale: float,
          zp: int, where: str) -> None:
    """``keep_scale``: clip to ``bits`` at the tensor's scale, warning about the share of its
    calibrated range that saturates; refused when the b-bit range excludes the zero point."""
    lo, hi = precision.bits_range(bits, dtype)
    if not lo <= zp <= hi:
        raise ConfigError(
            f"{where}: the {bits}-bit {dtype} range [{lo}, {hi}] excludes the tensor's zero "
            f"point {zp}, so clipping at its scale would destroy it; drop keep_scale (the "
            "scale then widens) or keep this tensor at 8 bits")
    kept = (max(old[0], lo), min(old[1], hi))
    g.ranges[var] = kept
    codes, lost = old[1] - old[0] + 1, (old[1] - old[0]) - (kept[1] - kept[0])
    real = [scale * (v - zp) for v in (*old, *kept)]
    warnings.warn(
        f"{where}: keep_scale clips the tensor to {bits} bits at its "
        f"{precision.range_bits(*old, dtype)}-bit scale: real values outside "
        f"[{real[2]:.4g}, {real[3]:.4g}] saturate, {100.0 * lost / codes:.1f}% of its "
        f"calibrated range [{real[0]:.4g}, {real[1]:.4g}] ({lost} of {codes} codes; the model "
        "carries no calibration data, so the share of actual values clipped depends on the "
        "inputs)", precision.PrecisionWarning, stacklevel=2)


def _widen(g: _Graph, var: relax.Var, q: relax.Call, params: tuple[float, int], bits: int,
           dtype: str, old: tuple[int, int], subs: dict[relax.Var, relax.Expr]) -> None:
    """Give ``var`` the widened scale (``subs``: its quantize, its dequantizes, the biases of
    the weighted layers reading it) and the full ``bits``-bit range."""
    subs[var] = _with_params(g, q, *precision.widen(*params, old, bits, dtype))
    for b in g.order:
        dq = b.value
        dq_params = _params(g, dq) if _op_name(dq) == "relax.dequantize" else None
        if dq_params is None or not dq.args[0].same_as(var):
            continue
        ds, dz = precision.widen(*dq_params, old, bits, dtype)
        subs[b.var] = _with_params(g, dq, ds, dz)
        for bias_var, bias_dq, (bias, bias_scale), w_scale in _reader_biases(g, b.var):
            new, bs = precision.rescale_bias(bias, bias_scale, ds, w_scale)
            subs[bias_var] = relax.Call(bias_dq.op, [relax.const(new, "int32"),
                                                     relax.const(bs, "float32"),
                                                     bias_dq.args[2]],
                                        bias_dq.attrs, bias_dq.ty_args)
    g.ranges[var] = precision.bits_range(bits, dtype)


def _with_params(g: _Graph, call: relax.Call, scale: float, zp: int) -> relax.Call:
    """``call`` (a quantize or dequantize) with scalar ``scale`` and ``zp`` in the dtypes and
    shapes of its own constants."""
    sv, zv = g.const(call.args[1]), g.const(call.args[2])
    assert sv is not None and zv is not None  # callers read them with _params
    return relax.Call(call.op, [call.args[0],
                                relax.const(np.full(sv.shape, scale, dtype=sv.dtype)),
                                relax.const(np.full(zv.shape, zp, dtype=zv.dtype))],
                      call.attrs, call.ty_args)


def _reader_biases(g: _Graph, dq_var: relax.Var):
    """``(bias dequantize var, its call, (bias, bias scale), weight scales)`` of each conv /
    dense / transpose conv reading ``dq_var`` whose bias is an int32 dequantize (a float bias
    follows by itself)."""
    ops = {b.var for b in g.order if _op_name(b.value) in _WEIGHTED_OPS
           and b.value.args[0].same_as(dq_var)}
    for b in g.order:
        if _op_name(b.value) != "relax.add":
            continue
        args = list(b.value.args)
        for i, a in enumerate(args):
            if not (isinstance(a, relax.Var) and a in ops):
                continue
            bias = _bias_dequantize(g, args[1 - i])
            w_scale = _weight_scale(g, g.bind[a].args[1])
            if bias is not None and w_scale is not None:
                yield (*bias, w_scale)


def _bias_dequantize(g: _Graph, e):
    """``(var, call, (bias, bias scale))`` of the int32 constant dequantize behind
    ``[reshape](e)``, else None."""
    for _ in range(2):
        if not isinstance(e, relax.Var) or e not in g.bind:
            return None
        c = g.bind[e]
        if _op_name(c) == "relax.reshape":
            e = c.args[0]
            continue
        if _op_name(c) != "relax.dequantize":
            return None
        bias, scale = g.const(c.args[0]), g.const(c.args[1])
        if bias is None or scale is None or bias.dtype != np.int32:
            return None
        return e, c, (bias, scale)
    return None


def _weight_scale(g: _Graph, e) -> np.ndarray | None:
    """The scales of the weight dequantize behind ``[permute_dims](e)``."""
    c = g.value(e)
    if _op_name(c) == "relax.permute_dims":
        c = g.value(c.args[0])
    if _op_name(c) != "relax.dequantize":
        return None
    return g.const(c.args[1])


def _substitute(g: _Graph, subs: dict[relax.Var, relax.Expr]) -> None:
    """Rebind the vars of ``subs`` to their new values in ``g`` and its function (same vars, so
    everything keyed by them stays valid)."""
    bb = relax.BlockBuilder()
    subs = {v: bb.normalize(e) for v, e in subs.items()}
    func = g.func
    blocks = []
    for block in func.body.blocks:
        binds = [relax.VarBinding(b.var, subs[b.var]) if isinstance(b, relax.VarBinding)
                 and b.var in subs else b for b in block.bindings]
        blocks.append(relax.DataflowBlock(binds) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(binds))
    g.func = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                            func.is_pure, func.attrs, func.span)
    g.bind.update(subs)
    g.order = [relax.VarBinding(b.var, subs[b.var]) if b.var in subs else b for b in g.order]
