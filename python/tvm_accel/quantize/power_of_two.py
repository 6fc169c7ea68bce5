"""Power-of-two (fix-point) QDQ models for hardware that requantizes by shifting (the DPU):
every scale rounded up to a power of two, weights and biases re-quantized for it, ReLU/Clip
fused into the layer before it, concat inputs sharing one scale, a LeakyRelu slope of 0.1 set
to the fix-point 26/256 (what Vitis AI's quantizer makes).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

# --- power-of-two (fix-point) scales -----------------------------------------------------------
#: bump when make_power_of_two changes (part of the cache key)
_POW2_VERSION = 3

#: the fix-point LeakyReLU slope: Vitis AI's quantizer sets a model's 0.1 to 26/256 = 0.1015625
#: (the slope the DPUCZDX8G computes; its product guide, PG338, "ReLU Type")
LEAKY_FIXED_SLOPE = 26 / 256


#: ops whose output a following ReLU/Clip is fused into (their canonical form folds it)
_FUSE_INTO = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add"}


def pow2_ceil(scale) -> np.ndarray:
    """Smallest power of two ``>= scale`` (elementwise, float32; zeros stay zero)."""
    a = np.asarray(scale, dtype=np.float64)
    pos = a > 0
    out = np.where(pos, 2.0 ** np.ceil(np.log2(np.where(pos, a, 1.0))), a)
    return out.astype(np.float32)


def _fix_leaky_slopes(g: onnx.GraphProto) -> int:
    """Set the slope of every LeakyRelu whose alpha is nearest to 26/256 on a 1/256 grid (a
    model's 0.1) to :data:`LEAKY_FIXED_SLOPE`, as Vitis AI's quantizer does; the QDQ model then
    says what the fix-point hardware computes (onnxruntime runs the 26/256 slope too). Other
    slopes are kept. Returns the number of slopes set."""
    fixed = 0
    for n in g.node:
        if n.op_type != "LeakyRelu":
            continue
        attr = next((a for a in n.attribute if a.name == "alpha"), None)
        alpha = attr.f if attr is not None else 0.01  # the ONNX default
        if attr is not None and round(alpha * 256) == 26 and alpha != LEAKY_FIXED_SLOPE:
            attr.f = LEAKY_FIXED_SLOPE
            fixed += 1
    return fixed


def _fuse_activations(g: onnx.GraphProto) -> int:
    """Remove the Q/DQ pair between a conv/dense/add and the ReLU/Clip that alone consumes it
    (``Conv -> Q -> DQ -> Relu -> Q`` becomes ``Conv -> Relu -> Q``), as fix-point hardware
    fuses the activation into the layer's output stage. Returns the number of fusions."""
    prod = {o: n for n in g.node for o in n.output}
    uses: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    outputs = {o.name for o in g.output}
    fused = 0
    for n in list(g.node):
        if n.op_type not in ("Relu", "Clip"):
            continue
        dq = prod.get(n.input[0])
        q = prod.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        if dq is None or q is None or q.op_type != "QuantizeLinear":
            continue
        src = prod.get(q.input[0])
        if src is None or src.op_type not in _FUSE_INTO:
            continue
        names = (q.input[0], q.output[0], dq.output[0])
        if any(uses.get(t, 0) != 1 or t in outputs for t in names):
            continue
        n.input[0] = q.input[0]
        g.node.remove(q)
        g.node.remove(dq)
        fused += 1
    used = {i for n in g.node for i in n.input}
    for t in [t for t in g.initializer if t.name not in used]:
        g.initializer.remove(t)
    return fused


def _unify_concat_scales(g, inits, prod, arr, put) -> None:
    """Give every input of a Concat the largest scale among its inputs and output.

    Concat by placement (a DPU writes each input's channels into the output buffer) needs one
    scale for all of them, as Vitis AI's quantizer enforces. onnxruntime calibrates each tensor
    on its own, so the concat output's scale (covering all inputs' ranges) is applied to the
    inputs: their producers then requantize to it, at coarser steps but without clipping. A
    tensor's Q and DQ nodes share one scale initializer, so the model stays consistent; chained
    concats are handled by iterating to a fixed point.
    """
    def scale_name(tensor: str) -> str | None:
        dq = prod.get(tensor)
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[1] not in inits:
            return None
        return dq.input[1]

    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    changed = True
    while changed:
        changed = False
        for n in g.node:
            if n.op_type != "Concat":
                continue
            names = [scale_name(i) for i in n.input]
            q_out = next((c for c in consumers.get(n.output[0], [])
                          if c.op_type == "QuantizeLinear" and c.input[1] in inits), None)
            if q_out is None or any(nm is None for nm in names):
                continue
            names.append(q_out.input[1])
            if any(arr(nm).size != 1 for nm in names):
                continue
            top = max(float(arr(nm)) for nm in names)
            for nm in names:
                if float(arr(nm)) != top:
                    put(nm, np.array(top, dtype=arr(nm).dtype).reshape(arr(nm).shape))
                    changed = True


def make_power_of_two(qmodel: onnx.ModelProto, float_model: onnx.ModelProto | None = None,
                      fuse_activations: bool = True) -> onnx.ModelProto:
    """Rewrite a symmetric QDQ model so that every scale is a power of two (a copy).

    - ReLU/Clip after a conv/dense/add are fused (:func:`_fuse_activations`) when
      ``fuse_activations``; a LeakyRelu slope of 0.1 becomes 26/256 (:func:`_fix_leaky_slopes`);
    - every activation scale becomes the power of two at or above it (:func:`pow2_ceil`): the
      calibrated range still fits, at up to 2x coarser steps; zero points are kept (0); the
      inputs of a Concat take the concat's scale (:func:`_unify_concat_scales`);
    - every weight scale likewise; the int8 weights are re-quantized from the float weights of
      ``float_model`` (matched by initializer name; else from the dequantized int8 values)
      with round-half-even and clipped to the quantizer's range ([-127, 127] when symmetric);
    - every int32 bias gets the scale ``x_scale * w_scale`` of its new input and weight scales
      (exact in float32: a product of powers of two) and is re-quantized from the float bias
      the same way, clipped to int32.

    The result is still a valid QDQ model that onnxruntime runs; every conv/dense/add scale
    ratio is then a power of two (avg pools too when the window is a power of two).
    """
    q = onnx.ModelProto()
    q.CopyFrom(qmodel)
    g = q.graph
    if fuse_activations:
        _fuse_activations(g)
    _fix_leaky_slopes(g)
    inits = {t.name: t for t in g.initializer}
    floats = ({t.name: numpy_helper.to_array(t) for t in float_model.graph.initializer}
              if float_model is not None else {})
    prod = {o: n for n in g.node for o in n.output}

    def arr(name: str) -> np.ndarray:
        return numpy_helper.to_array(inits[name])

    def put(name: str, value: np.ndarray) -> None:
        # (np.ascontiguousarray would turn a 0-d scale into shape (1,))
        inits[name].CopyFrom(numpy_helper.from_array(np.array(value, order="C"), name))

    def axis_of(n) -> int:
        return next((a.i for a in n.attribute if a.name == "axis"), 1)

    def float_value(dq, qv: np.ndarray, scale: np.ndarray, zp: np.ndarray | float
                    ) -> np.ndarray:
        for cand in (dq.input[0].removesuffix("_quantized"), dq.output[0]):
            f = floats.get(cand)
            if f is not None and f.shape == qv.shape:
                return f.astype(np.float64)
        return (qv.astype(np.float64) - zp) * scale

    def bshape(a: np.ndarray, ndim: int, axis: int) -> np.ndarray:
        if a.size == 1:
            return a.reshape(())
        shape = [1] * ndim
        shape[axis % ndim] = -1
        return a.reshape(shape)

    qdq = [n for n in g.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    const_dq = [n for n in qdq if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    act_scales = {n.input[1] for n in qdq if n.input[0] not in inits}
    for name in act_scales:
        put(name, pow2_ceil(arr(name)))
    _unify_concat_scales(g, inits, prod, arr, put)
    weight_dq = [n for n in const_dq if arr(n.input[0]).dtype in (np.int8, np.uint8)]
    bias_dq = [n for n in const_dq if arr(n.input[0]).dtype == np.int32]
    for dq in weight_dq:
        wq, s_old = arr(dq.input[0]), arr(dq.input[1])
        zp = arr(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros((), wq.dtype)
        ax = axis_of(dq)
        s_new = pow2_ceil(s_old)
        sb = bshape(s_old.astype(np.float64), wq.ndim, ax)
        zb = bshape(zp.astype(np.float64), wq.ndim, ax)
        wf = float_value(dq, wq, sb, zb)
        lo, hi = ((-127 if wq.min() > -128 else -128), 127) if wq.dtype == np.int8 else (0, 255)
        wn = np.clip(np.rint(wf / bshape(s_new.astype(np.float64), wq.ndim, ax)) + zb, lo, hi)
        put(dq.input[1], s_new)
        put(dq.input[0], wn.astype(wq.dtype))
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    for dq in bias_dq:
        bq, s_old = arr(dq.input[0]), arr(dq.input[1])
        user = next((n for n in consumers.get(dq.output[0], [])
                     if n.op_type in ("Conv", "ConvTranspose", "Gemm") and len(n.input) > 2
                     and n.input[2] == dq.output[0]), None)
        xdq = prod.get(user.input[0]) if user is not None else None
        wdq = prod.get(user.input[1]) if user is not None else None
        if (xdq is None or wdq is None or xdq.op_type != "DequantizeLinear"
                or wdq.op_type != "DequantizeLinear"):
            raise ValueError(f"bias {dq.input[0]}: cannot find its layer's input and weight "
                             "scales")
        sx, sw = arr(xdq.input[1]).astype(np.float32), arr(wdq.input[1]).astype(np.float32)
        s_new = (sx * sw).astype(np.float32).reshape(-1)
        if s_new.size == 1 and s_old.size > 1:
            s_new = np.repeat(s_new, s_old.size)
        s_new = s_new.reshape(s_old.shape) if s_new.size == s_old.size else s_new
        bf = float_value(dq, bq, s_old.astype(np.float64).reshape(-1), 0.0)
        i32 = np.iinfo(np.int32)
        bn = np.clip(np.rint(bf / s_new.astype(np.float64).reshape(-1)), i32.min, i32.max)
        put(dq.input[1], s_new)
        put(dq.input[0], bn.astype(np.int32).reshape(bq.shape))
    onnx.checker.check_model(q)
    return q
