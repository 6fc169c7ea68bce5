"""The canonicalizer proper: each quantized op of the graph -> a plan of integer Relax ops with
its recipe (conv2d, dense, transpose conv, add, pools, upsample, concat, layout ops,
standalone clips and requantizes), applied in one pass by
:func:`~tvm_accel.canonicalize.canonicalize`.
"""

from __future__ import annotations

import difflib
from typing import Any

import numpy as np
from tvm import relax

from tvm_accel import numerics, precision
from tvm_accel.canonicalize.avg_pools import (
    ceil_mode_is_floor,
    clipped_window_pool,
    emit_window_sum_pool,
    stepped_global_pool,
)
from tvm_accel.canonicalize.elementwise import (
    batchnorm_plan,
    fold_batchnorm,
    lut_plan,
    mul_plan,
    peel_batchnorm,
)
from tvm_accel.canonicalize.graph import (
    _clamp,
    _dtype,
    _Graph,
    _ints,
    _op_name,
    _Out,
    _per_channel,
    _Plan,
    _QAct,
    _shape,
    deconv_acc_bound,
    nearest_upsample_scale,
)
from tvm_accel.canonicalize.guard import GuardedRecipe, guard_add, guard_weighted
from tvm_accel.canonicalize.narrow import Request, narrow_activations
from tvm_accel.canonicalize.records import (
    _FLOAT_OP_NAMES,
    _LAYOUT_OPS,
    _WEIGHTED_OPS,
    BIAS_SCALE_RTOL,
    LayerRecord,
    _Recipes,
)
from tvm_accel.errors import ConfigError, ModelError
from tvm_accel.layers import Requant

R = relax.op


# --- the pass --------------------------------------------------------------------------------
class _Canonicalizer:
    def __init__(self, graph: _Graph, recipes: _Recipes,
                 config: precision.PrecisionConfig | None = None):
        self.g = graph
        self.rc = recipes
        self.plans: dict[relax.Var, _Plan] = {}
        self.report: list[LayerRecord] = []
        self.config = config
        #: ONNX layer name -> configured weight bits
        self.cfg_w: dict[str, int] = {}
        #: config layer names that matched a layer of the model
        self.cfg_seen: set[str] = set()
        #: layer name (canonical output var; the core op is ``<layer>_acc``) -> {"w", "i", "o"}
        self.layer_bits: dict[str, dict[str, int | None]] = {}

    def apply_config(self) -> None:
        """Turn the precision config into weight bits and narrowed activations (before run: an
        ``i`` narrows the producer of the layer's input, which comes earlier in the graph; a
        narrowed activation's new scale must reach every reader, see
        :mod:`~tvm_accel.canonicalize.narrow`)."""
        cfg = self.config
        if cfg is None:
            return
        params = set(self.g.func.params)
        requests: dict[relax.Var, list[Request]] = {}
        layers: set[str] = set()  # the quantized layers' ONNX names (what a config can name)
        for b in self.g.order:
            call = b.value
            if _op_name(call) != "relax.quantize" or (isinstance(call.args[0], relax.Var)
                                                      and call.args[0] in params):
                continue
            out = self.g.quantize_out(call)
            if out is None:
                continue
            core = self.g.peel_activation(call.args[0], _Out(out.scale, out.zp, out.dtype,
                                                             out.qmin, out.qmax))
            op_e, _ = self._split_bias(core)
            weighted = op_e is not None and self.g.op(op_e) in _WEIGHTED_OPS
            cands = [core] + ([op_e] if weighted else [])
            _, onnx_name = self.g.layer_name(cands, "layer")
            layers.add(onnx_name)
            if onnx_name in cfg.layers:
                self.cfg_seen.add(onnx_name)
            lp = cfg.for_layer(onnx_name, weighted)
            keep = bool(lp.keep_scale)
            if lp.w is not None and weighted:
                self.cfg_w[onnx_name] = lp.w
            if lp.o is not None:
                requests.setdefault(b.var, []).append(
                    Request(lp.o, keep, f"layers.{onnx_name}.o", out.scale, out.zp))
            if lp.i is not None:
                c = self.g.value(op_e if weighted else core)
                x = self.g.dq_act(c.args[0]) if isinstance(c, relax.Call) and c.args else None
                if x is None or not isinstance(x.var, relax.Var):
                    raise ConfigError(f"{cfg.source}: layers.{onnx_name}.i: the layer's input is "
                                      "not a quantized activation that can be narrowed")
                requests.setdefault(x.var, []).append(
                    Request(lp.i, keep, f"layers.{onnx_name}.i", x.scale, x.zp))
        missing = sorted(set(cfg.layers) - self.cfg_seen)
        if missing:
            near = difflib.get_close_matches(missing[0], sorted(layers), n=5, cutoff=0)
            raise ConfigError(f"{cfg.source}: layers.{missing[0]}: no quantized layer of that "
                              f"name in the model (nearest: {', '.join(near) or 'none'})")
        narrow_activations(self.g, requests, cfg.source)

    @property
    def _config_source(self) -> str:
        """Where the precision config came from, for its error messages."""
        return self.config.source if self.config is not None else "precision config"

    def _input_clamp(self, b: relax.VarBinding, call, out: _Out) -> _Plan:
        """The model's input quantize with a sub-byte range: quantize, then clip."""
        name = self.g.claim(b.var.name)
        rec = LayerRecord(name, self.g.names.get(b.var.name, b.var.name), "quantize", True,
                          out.dtype, out.scale, out.zp,
                          detail={"qmin": out.qmin, "qmax": out.qmax,
                                  "bits": {"w": None, "i": None, "o": out.bits}})
        return _Plan(rec, self._clamped_quantize(call, out, name))

    @staticmethod
    def _clamped_quantize(call, out: _Out, name: str):
        """Emitter of ``call`` (a quantize) followed by the clip to ``out``'s range."""

        def emit(bb, look):
            q = bb.emit(relax.Call(call.op, [look(a) for a in call.args], call.attrs,
                                   call.ty_args), name_hint=f"{name}_q")
            q = bb.emit(R.maximum(q, relax.const(out.qmin, out.dtype)), name_hint=f"{name}_max")
            return bb.emit(R.minimum(q, relax.const(out.qmax, out.dtype)), name_hint=name)

        return emit

    def _bits(self, out: _Out, xs, w: int | None = None) -> dict[str, int | None]:
        """W/I/O bits of a layer (``i``: the widest of its inputs)."""
        return {"w": w, "i": max((x.bits for x in xs), default=None), "o": out.bits}

    def _weights_for_bits(self, onnx_name: str, wvar, wz: np.ndarray, sw: np.ndarray,
                          bias: np.ndarray, axis: int):
        """Apply a configured weight width (re-quantize) and return ``(wz, sw, bias, bits)``;
        bits otherwise from the frontend's record, else from the values."""
        wb = self.cfg_w.get(onnx_name)
        if wb is not None:
            wz, sw, bias = precision.requantize_weights(wz, sw, bias, wb, axis)
            return wz, sw, bias, wb
        wb = self.g.recorded_weight_bits(wvar)
        return wz, sw, bias, wb if wb is not None else precision.signed_bits(wz)

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
                # the model's input quantize stays (clipped if its range is sub-byte)
                if out is not None and b.var in self.g.ranges:
                    self.g.narrow(b.var, out)
                    plan = self._input_clamp(b, call, out)
                    self.plans[b.var] = plan
                    self.report.append(plan.record)
                    self.layer_bits[plan.record.name] = plan.record.detail["bits"]
                continue
            if out is None:
                self._float_record(core, _Out(float("nan"), 0, str(call.attrs.out_dtype), 0, 0),
                                   "output quantization is not 8-bit per-tensor")
                continue
            self.g.narrow(b.var, out)
            core = self.g.peel_activation(core, out)
            plan, reason = None, "not a recognised QDQ pattern"
            try:
                for m in (self._conv, self._deconv, self._dense, self._add, self._avg_pool,
                          self._global_pool, self._concat, self._max_pool, self._resize,
                          self._passthrough, self._elementwise):
                    plan = m(core, out)
                    if plan is not None:
                        break
            except numerics.RecipeError as e:  # the target cannot represent this scale
                plan, reason = None, f"no integer recipe: {e}"
                if "not a power of two" in reason:  # fix-point hardware: say how to get there
                    reason += " ('tvmc quantize --scheme power-of-two' makes such a model)"
            if plan is None:  # stays dequantize -> op -> quantize, on the CPU
                self._float_record(core, out, reason)
                if b.var in self.g.ranges:  # a sub-byte output: its readers rely on the range
                    self.plans[b.var] = _Plan(self.report[-1],
                                              self._clamped_quantize(call, out, b.var.name))
                continue
            self.plans[b.var] = plan
            self.report.append(plan.record)
            bits = plan.record.detail.get("bits")
            if bits is not None:
                self.layer_bits[plan.record.name] = bits

    def _elementwise(self, core, out: _Out):
        """A table lookup, a product of two quantized tensors or a BatchNormalization
        (elementwise.py)."""
        return lut_plan(self, core, out) or mul_plan(self, core, out) or batchnorm_plan(
            self, core, out)

    def _float_record(self, core, out: _Out, reason: str):
        op_e, _ = self._split_bias(core)
        anchor = _WEIGHTED_OPS.get(self.g.op(op_e) or "") if op_e is not None else None
        data, bn = peel_batchnorm(self.g, core)  # a BN is a tuple item, not a call
        op = anchor or (self.g.op(core) or ("batch_norm" if bn else "?")).removeprefix("relax.")
        op = _FLOAT_OP_NAMES.get(op, op)
        name, onnx_name = self.g.layer_name([core], op.replace("nn.", ""))
        name = self.g.claim(name)
        # the float ops keep their Relax vars: partition.explain finds the reason through them
        # (a conv the BN was to fold into shares it)
        conv = (data, self._split_bias(data)[0]) if bn is not None else ()
        rvars = [v.name for v in (core, op_e, *conv, *out.act_exprs) if isinstance(v, relax.Var)]
        self.report.append(LayerRecord(name, onnx_name, op, False, out.dtype, out.scale, out.zp,
                                       detail={"reason": reason, "relax_vars": rvars}))

    def _record(self, name, onnx_name, op, out: _Out, err=None, parts=(), **detail
                ) -> LayerRecord:
        """Record of an integer layer; ``parts``: other exprs of the layer (a bias add), whose
        ONNX nodes are reported as fused into it (``detail["absorbed"]``, with the
        activations)."""
        detail.setdefault("bits", {"w": None, "i": None, "o": out.bits})
        detail["absorbed"] = [v.name for v in (*parts, *out.act_exprs)
                              if isinstance(v, relax.Var) and v.name != name]
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
                if self.g.op(x) in _WEIGHTED_OPS:
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
        core, bn = peel_batchnorm(self.g, core)  # Conv -> BN, no Q/DQ between
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
        if bn is not None:
            wz, sw, bias = fold_batchnorm(bn, wz, sw, bias, x.scale, name)
        wz, sw, bias, wbits = self._weights_for_bits(onnx_name, conv.args[1], wz, sw, bias, 0)
        g = self._guarded("conv2d", x.scale * sw / out.scale,
                          numerics.conv_acc_bound(wz, 0 * bias, x.dtype, x.zp), bias, sw, out)
        bias, rq, err, bound = g.bias, g.rq, g.err, g.bound
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

        rec = self._record(name, onnx_name, "conv2d", out, err,
                           parts=(core, op_e, *(bn.vars if bn else ())), **attrs,
                           batchnorm="folded" if bn is not None else "none",
                           bits=self._bits(out, [x], wbits),
                           kernel=tuple(int(d) for d in w.shape),
                           weight_per_channel=bool(np.unique(sw).size > 1),
                           bias=bias_kind, input_scale=x.scale, input_zero_point=x.zp,
                           input_dtype=x.dtype, **self._rq_detail(rq, bound),
                           **g.detail)
        return _Plan(rec, emit)

    def _guarded(self, op: str, scale, weight_bound, bias, weight_scale, out: _Out
                 ) -> GuardedRecipe:
        """The recipe of a weighted layer through the requantize guard (guard.py)."""
        solver = self.rc.for_op(op)
        return guard_weighted(solver, None if solver is self.rc.cpu else self.rc.cpu, scale,
                              weight_bound, bias, weight_scale, out.zp, out.qmin, out.qmax,
                              self.rc.max_requant_error)

    @staticmethod
    def _rq_detail(rq: Requant, bound) -> dict:
        return {"pre_shift": rq.pre_shift, "shift": rq.shift,
                "multiplier_min": int(np.min(rq.multiplier)),
                "multiplier_max": int(np.max(rq.multiplier)),
                "acc_bound_max": int(np.max(bound)), "requant": rq}

    # -- conv2d_transpose -----------------------------------------------------------------------
    def _deconv(self, core, out: _Out):
        op_e, bias_e = self._split_bias(core)
        if op_e is None or self.g.op(op_e) != "relax.nn.conv2d_transpose":
            return None
        dc = self.g.value(op_e)
        a = dc.attrs
        if (a.data_layout != "NCHW" or a.kernel_layout != "IOHW"
                or (a.out_layout or "NCHW") != "NCHW"):
            return None
        x = self.g.dq_act(dc.args[0])
        if x is None:
            return None
        name, onnx_name = self.g.layer_name([core, op_e], "conv2d_transpose")
        wq = self._weight_dq(dc.args[1], name)
        if wq is None:
            return None
        w, sw, zw, axis, transposed = wq
        if transposed or w.ndim != 4:
            return None
        g = int(a.groups)
        kg = int(w.shape[1])
        k = kg * g
        # ONNX ConvTranspose weights (C, K/groups, KH, KW) are quantized per axis 1: one scale
        # per output channel of a group, shared by the groups
        for what, v in (("weight scale", sw), ("weight zero point", zw)):
            if np.asarray(v).size > 1 and (axis != 1 or np.asarray(v).size != kg):
                raise ModelError(f"layer '{name}': transpose-conv {what}s must be per tensor or "
                                 f"per output channel (axis 1, {kg} values), got axis {axis} "
                                 f"with {np.asarray(v).size}")
        sw_k = np.asarray(sw, dtype=np.float64).ravel()
        zw_k = np.asarray(zw, dtype=np.int64).ravel()
        sw_k = np.tile(np.broadcast_to(sw_k, (kg,)), g)
        wz = w.astype(np.int64) - np.broadcast_to(zw_k, (kg,)).reshape(1, kg, 1, 1)
        bias, bias_kind = self._bias_ints(bias_e, k, x.scale, sw_k, name)
        if bias is None:
            return None
        if onnx_name in self.cfg_w and g != 1:
            raise ConfigError(f"{self._config_source}: layers.{onnx_name}.w: re-quantizing the "
                              "weights of a grouped transpose conv is not supported")
        wz, sw_k, bias, wbits = self._weights_for_bits(onnx_name, dc.args[1], wz, sw_k, bias, 1)
        strides, dil = _ints(a.strides), _ints(a.dilation)
        gr = self._guarded("conv2d_transpose", x.scale * sw_k / out.scale,
                           deconv_acc_bound(wz, 0 * bias, g, strides, dil, x.reach), bias, sw_k,
                           out)
        bias, rq, err, bound = gr.bias, gr.rq, gr.err, gr.bound
        attrs = dict(strides=strides, padding=_ints(a.padding),
                     output_padding=_ints(a.output_padding), dilation=dil, groups=g)

        name = self.g.claim(name)

        def emit(bb, look):
            xi = bb.emit(R.astype(look(x.var), "int32"), name_hint=f"{name}_xi")
            xc = bb.emit(R.subtract(xi, relax.const(x.zp, "int32")), name_hint=f"{name}_xc")
            acc = bb.emit(R.nn.conv2d_transpose(xc, relax.const(wz.astype(np.int32), "int32"),
                                                data_layout="NCHW", kernel_layout="IOHW",
                                                out_dtype="int32", **attrs),
                          name_hint=f"{name}_acc")
            acc = bb.emit(R.add(acc, relax.const(bias.astype(np.int32).reshape(1, k, 1, 1),
                                                 "int32")), name_hint=f"{name}_biased")
            return numerics.emit_requant(bb, acc, rq, out.dtype, 1, name=f"{name}_rq",
                                         out_name=name)

        rec = self._record(name, onnx_name, "conv2d_transpose", out, err, parts=(core, op_e),
                           **attrs,
                           bits=self._bits(out, [x], wbits),
                           kernel=tuple(int(d) for d in w.shape),
                           weight_per_channel=bool(np.unique(sw_k).size > 1),
                           bias=bias_kind, input_scale=x.scale, input_zero_point=x.zp,
                           input_dtype=x.dtype, **self._rq_detail(rq, bound),
                           **gr.detail)
        return _Plan(rec, emit)

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
        wt, sw, bias, wbits = self._weights_for_bits(onnx_name, mm.args[1], wt, sw, bias, 1)
        g = self._guarded("dense", x.scale * sw / out.scale,
                          numerics.conv_acc_bound(wt.T, 0 * bias, x.dtype, x.zp), bias, sw, out)
        bias, rq, err, bound = g.bias, g.rq, g.err, g.bound

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

        rec = self._record(name, onnx_name, "dense", out, err, parts=(core, op_e), units=k,
                           in_features=wt.shape[0],
                           bits=self._bits(out, [x], wbits),
                           weight_per_channel=bool(np.unique(sw).size > 1), bias=bias_kind,
                           input_scale=x.scale, input_zero_point=x.zp, input_dtype=x.dtype,
                           **self._rq_detail(rq, bound), **g.detail)
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
        ma, mb, rq, err, guard = guard_add(self.rc.add, self.rc.cpu_add, sa, sb, out.zp,
                                           out.qmin, out.qmax, self.rc.max_requant_error)

        name = self.g.claim(name)

        def emit(bb, look):
            return numerics.emit_add(bb, look(a.var), look(b.var), a.zp, b.zp, ma, mb, rq,
                                     out.dtype, name=f"{name}_rq", out_name=name,
                                     acc_name=f"{name}_acc")

        rec = self._record(name, onnx_name, "add", out, err, bits=self._bits(out, [a, b]),
                           a_scale=a.scale, a_zero_point=a.zp,
                           b_scale=b.scale, b_zero_point=b.zp, a_multiplier=ma, b_multiplier=mb,
                           shift=rq.shift, pre_shift=0, requant=rq, **guard)
        return _Plan(rec, emit)

    # -- rescaling helpers ----------------------------------------------------------------------
    def _rescale_rq(self, op: str, x: _QAct, out: _Out, extra_scale: float = 1.0,
                    bound=None) -> Requant:
        """Recipe (of ``op``'s kind, see ``_Recipes.for_op``) bringing ``x - zx`` times
        ``extra_scale`` to ``out``; ``bound`` bounds ``|acc|`` (default ``x``'s reach)."""
        bound = x.reach if bound is None else bound
        return self.rc.for_op(op)(np.array([x.scale * extra_scale / out.scale]),
                                  np.array([bound]), out.zp, out.qmin, out.qmax)

    def _selection_rq(self, op: str, x: _QAct, out: _Out) -> Requant | None:
        """For ops that only select values (max pool, upsample, concat inputs): None when
        ``x`` already has ``out``'s quantization and no activation narrows the range (the
        integers pass through), else the rescale recipe (scale 1 for a clamp only)."""
        if x.same_as(out.scale, out.zp, out.dtype) and out.full_range:
            return None
        return self._rescale_rq(op, x, out)

    @staticmethod
    def _emit_rescale(bb, v, zx: int, rq: Requant, out_dtype: str, name: str):
        """The rescale tail: ``astype(v, int32) - zx`` then the requant chain."""
        xi = bb.emit(R.astype(v, "int32"), name_hint=f"{name}_xi")
        xc = bb.emit(R.subtract(xi, relax.const(zx, "int32")), name_hint=f"{name}_xc")
        return numerics.emit_requant(bb, xc, rq, out_dtype, 1, name=f"{name}_rq", out_name=name)

    def _rq_error(self, rq: Requant | None, bound) -> tuple[Any, dict]:
        if rq is None:
            return None, {"rescale": False}
        return numerics.recipe_error(rq, bound), {"rescale": True, **self._rq_detail(rq, bound)}

    # -- CPU-only ops ---------------------------------------------------------------------------
    def _finish(self, bb, xint, x: _QAct, out: _Out, name: str, rq: Requant | None):
        """Bring an integer tensor with x's quantization to ``out``: clip only when ``rq`` is
        None (equal parameters), else the requantize chain on ``xint - zx``."""
        if rq is None:
            return _clamp(bb, xint, out, name)
        return self._emit_rescale(bb, xint, x.zp, rq, out.dtype, name)

    def _passthrough(self, core, out: _Out):
        """Layout ops on the integer tensor, or a bare requantize / relu / clip (CPU)."""
        c = self.g.value(core)
        op = _op_name(c)
        if op == "relax.dequantize":
            x = self.g.dq_act(core)
            if x is None:
                return None
            kind, rebuild = (out.activation or "requantize"), None
        elif op in _LAYOUT_OPS:
            x = self.g.dq_act(c.args[0])
            if x is None:
                return None
            kind = op.removeprefix("relax.")
            rebuild = c
        else:
            return None
        cands = [core] if rebuild is not None else [*out.act_exprs, core]
        name, onnx_name = self.g.layer_name(cands, kind)
        rq = None if x.same_as(out.scale, out.zp, out.dtype) else self._rescale_rq(kind, x, out)
        err, detail = self._rq_error(rq, x.reach)
        name = self.g.claim(name)

        if rebuild is None and rq is None and out.full_range:
            def emit(bb, look):  # quantize(dequantize(x)) with equal parameters: x itself
                return look(x.var)
        else:
            def emit(bb, look):
                xi = look(x.var)
                if rebuild is not None:
                    final = rq is None and out.full_range
                    xi = bb.emit(relax.Call(rebuild.op, [xi, *rebuild.args[1:]], rebuild.attrs,
                                            rebuild.ty_args),
                                 name_hint=name if final else f"{name}_int")
                return self._finish(bb, xi, x, out, name, rq)

        rec = self._record(name, onnx_name, kind, out, err, bits=self._bits(out, [x]),
                           input_scale=x.scale,
                           input_zero_point=x.zp, input_dtype=x.dtype, **detail)
        return _Plan(rec, emit)

    # -- selection ops: max pool, nearest upsample ---------------------------------------------
    def _selection(self, core, out: _Out, kind: str, c, x: _QAct, detail: dict):
        """``<name>_acc = op(x_int)`` (same attributes) [+ the rescale tail]."""
        name, onnx_name = self.g.layer_name([core], kind)
        rq = self._selection_rq(kind, x, out)
        err, rdetail = self._rq_error(rq, x.reach)
        name = self.g.claim(name)

        def emit(bb, look):
            v = bb.emit(relax.Call(c.op, [look(x.var), *c.args[1:]], c.attrs, c.ty_args),
                        name_hint=f"{name}_acc")
            return v if rq is None else self._emit_rescale(bb, v, x.zp, rq, out.dtype, name)

        rec = self._record(name, onnx_name, kind, out, err, bits=self._bits(out, [x]),
                           input_scale=x.scale,
                           input_zero_point=x.zp, input_dtype=x.dtype, **detail, **rdetail)
        return _Plan(rec, emit)

    def _max_pool(self, core, out: _Out):
        c = self.g.value(core)
        if _op_name(c) != "relax.nn.max_pool2d":
            return None
        a = c.attrs
        if a.layout != "NCHW" or (a.out_layout or "NCHW") != "NCHW":
            return None
        x = self.g.dq_act(c.args[0])
        if x is None:
            return None
        if bool(a.ceil_mode):
            c = _floor_mode_max_pool(c)
            if c is None:
                return None
            a = c.attrs
        detail = dict(pool_size=_ints(a.pool_size), strides=_ints(a.strides),
                      padding=_ints(a.padding), dilation=_ints(a.dilation), ceil_mode=False)
        return self._selection(core, out, "max_pool2d", c, x, detail)

    def _resize(self, core, out: _Out):
        c = self.g.value(core)
        if _op_name(c) != "relax.image.resize2d":
            return None
        x = self.g.dq_act(c.args[0])
        ishape, oshape = _shape(c.args[0]), _shape(c)
        if x is None or ishape is None or oshape is None or len(ishape) != 4:
            return None
        scale = nearest_upsample_scale(c.attrs, ishape, oshape)
        if scale is None:
            return None  # linear/cubic, fractional scales or another index mapping: float
        detail = dict(scale=scale, coordinate_transformation_mode=str(
            c.attrs.coordinate_transformation_mode), rounding_method=str(c.attrs.rounding_method))
        return self._selection(core, out, "upsample", c, x, detail)

    # -- pools ----------------------------------------------------------------------------------
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
        if kind == "global_avg_pool2d" and keep:
            plan = stepped_global_pool(self, core, out, x, shape)
            if plan is not None:  # a window the target's pool cannot hold: in steps
                return plan
        name, onnx_name = self.g.layer_name([core], kind)
        bound = n * x.reach
        rq = self._rescale_rq(kind, x, out, 1.0 / n, bound)
        err, detail = self._rq_error(rq, bound)
        name = self.g.claim(name)

        def emit(bb, look):
            xi = bb.emit(R.astype(look(x.var), "int32"), name_hint=f"{name}_xi")
            xc = bb.emit(R.subtract(xi, relax.const(x.zp, "int32")), name_hint=f"{name}_xc")
            acc = bb.emit(R.sum(xc, axis=axes, keepdims=keep), name_hint=f"{name}_acc")
            return numerics.emit_requant(bb, acc, rq, out.dtype, 1, name=f"{name}_rq",
                                         out_name=name)

        rec = self._record(name, onnx_name, kind, out, err, window=n, input_scale=x.scale,
                           bits=self._bits(out, [x]),
                           input_zero_point=x.zp, input_dtype=x.dtype, **detail)
        return _Plan(rec, emit)

    def _avg_pool(self, core, out: _Out):
        c = self.g.value(core)
        if _op_name(c) != "relax.nn.avg_pool2d":
            return None
        a = c.attrs
        x = self.g.dq_act(c.args[0])
        shape = _shape(c.args[0])
        pad = _ints(a.padding)
        if (x is None or shape is None or a.layout != "NCHW"
                or (a.out_layout or "NCHW") != "NCHW"
                or any(d != 1 for d in _ints(a.dilation))):
            return None
        if ((any(pad) and not bool(a.count_include_pad))
                or (bool(a.ceil_mode) and not ceil_mode_is_floor(c))):
            return clipped_window_pool(self, core, out, x, c)  # divisors vary at the border
        kh, kw = _ints(a.pool_size)
        n = kh * kw
        name, onnx_name = self.g.layer_name([core], "avg_pool2d")
        bound = n * x.reach
        rq = self._rescale_rq("avg_pool2d", x, out, 1.0 / n, bound)
        err, detail = self._rq_error(rq, bound)
        name = self.g.claim(name)

        def emit(bb, look):
            return emit_window_sum_pool(bb, look(x.var), x.zp, (kh, kw), _ints(a.strides), pad,
                                        rq, out.dtype, name)

        rec = self._record(name, onnx_name, "avg_pool2d", out, err, window=n,
                           bits=self._bits(out, [x]),
                           pool_size=[kh, kw], strides=_ints(a.strides), padding=pad,
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
        acts = [self.g.dq_act(f) for f in tup.fields]
        xs = [x for x in acts if x is not None]
        if len(xs) != len(acts):
            return None
        axis = int(c.attrs.axis)
        name, onnx_name = self.g.layer_name([core], "concat")
        rqs = [self._selection_rq("concat", x, out) for x in xs]
        errs = [self._rq_error(rq, x.reach)[0] for rq, x in zip(rqs, xs, strict=True)]
        errs = [e for e in errs if e is not None]
        name = self.g.claim(name)

        def emit(bb, look):
            parts = [look(x.var) if rq is None else
                     self._emit_rescale(bb, look(x.var), x.zp, rq, out.dtype, f"{name}_in{i}")
                     for i, (x, rq) in enumerate(zip(xs, rqs, strict=True))]
            return bb.emit(R.concat(parts, axis=axis), name_hint=f"{name}_acc")

        err = (numerics.ApproximationError(max(e.max_rel_error for e in errs),
                                           max(e.max_lsb_error for e in errs)) if errs else None)
        rec = self._record(name, onnx_name, "concat", out, err, inputs=len(xs),
                           bits=self._bits(out, xs),
                           rescaled_inputs=len(errs), axis=axis,
                           requants=[rq for rq in rqs])
        return _Plan(rec, emit)


def _floor_mode_max_pool(c) -> relax.Call | None:
    """A ceil-mode max pool as the floor-mode one with the extra bottom / right padding its
    last windows read (max pools pad with the lowest value, so the two are equal): every
    target's plain pool then runs it. None if a shape is not static."""
    ishape, oshape = _shape(c.args[0]), _shape(c)
    if ishape is None or oshape is None or len(ishape) != 4:
        return None
    a = c.attrs
    k, s, d, p = _ints(a.pool_size), _ints(a.strides), _ints(a.dilation), _ints(a.padding)
    extra = [max(0, (oshape[2 + i] - 1) * s[i] + (k[i] - 1) * d[i] + 1
                 - (ishape[2 + i] + p[i] + p[2 + i])) for i in range(2)]
    return R.nn.max_pool2d(c.args[0], k, s, [p[0], p[1], p[2] + extra[0], p[3] + extra[1]], d,
                           ceil_mode=False, layout="NCHW")
