"""Mixed-precision (2..8-bit) QDQ models: an int8 QDQ model narrowed per node to the bits of a
HAWQ-style assignment (INT4/UINT4 Q/DQ where ONNX has them, clipped ranges otherwise), and the
assignments of the mixed networks the benchmarks use.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tvm_accel import zoo
from tvm_accel.layers import DTYPE_RANGE
from tvm_accel.precision import bits_range, rescale_bias, widen
from tvm_accel.quantize.ort import cache_dir, ort_quantize

# --- mixed precision (sub-byte) QDQ models -----------------------------------------------------
#: version of the mixed-precision rewrite (part of the cache key of :func:`quantize_mixed`)
_MIXED_VERSION = 3


#: HAWQ-style bit assignment for :func:`resnet20_mixed`, the MARSELLUS paper's ResNet-20 (Sec.
#: IV: 4-bit activations, weights by stage): every activation is 4-bit, the residual stream and
#: the block outputs too (the adds read and write 4 bits); weights 6/3-4/2-3 bits by stage, the
#: stem's and the FC's 8-bit
RESNET20_HAWQ: dict[str, dict[str, int]] = {
    "conv1": {"w": 8, "o": 4},
    **{f"layer1.{i}.{c}": {"w": 6, "o": 4} for i in range(3) for c in ("conv1", "conv2")},
    **{f"layer2.{i}.conv1": {"w": 3, "o": 4} for i in range(3)},
    **{f"layer2.{i}.conv2": {"w": 4, "o": 4} for i in range(3)},
    "layer2.0.downsample": {"w": 8, "o": 4},
    **{f"layer3.{i}.conv1": {"w": 2, "o": 4} for i in range(3)},
    **{f"layer3.{i}.conv2": {"w": 3, "o": 4} for i in range(3)},
    "layer3.0.downsample": {"w": 6, "o": 4},
    **{f"layer{s}.{i}.add": {"o": 4} for s in (1, 2, 3) for i in range(3)},
    "fc": {"w": 8},
}


#: 4-bit ResNet-18 for :func:`resnet18_mixed`: HAWQ-V3's uniform W4A4 network (68.5% top-1,
#: the MARSELLUS paper's "full HAWQ-quantized 4-bit" ResNet-18 on the RBE at 4x4 bits): every
#: conv of the blocks has 4-bit weights, and every activation a conv reads is 4-bit (conv
#: outputs, residual add outputs, the stem's output and the max pool's); the stem's and the
#: FC's weights stay 8-bit, as in HAWQ-V3
RESNET18_4BIT: dict[str, dict[str, int]] = {
    "conv1": {"o": 4},
    "maxpool": {"o": 4},
    **{f"layer{s}.{i}.{c}": {"w": 4, "o": 4}
       for s in range(1, 5) for i in range(2) for c in ("conv1", "conv2")},
    **{f"layer{s}.{i}.add": {"o": 4} for s in range(1, 5) for i in range(2)},
    **{f"layer{s}.0.downsample": {"w": 4, "o": 4} for s in range(2, 5)},
}


#: bit assignment for :func:`mobilenet_tiny_mixed`: 4-bit depthwise outputs, 4/6-bit pointwise
MOBILENET_TINY_MIXED: dict[str, dict[str, int]] = {
    **{f"dw{i}": {"w": 8, "o": 4} for i in range(1, 5)},
    **{f"pw{i}": {"w": 4 if i % 2 else 6} for i in range(1, 5)},
}


def _to_i4(a: np.ndarray, name: str, signed: bool) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT4 if signed else TensorProto.UINT4,
                              list(a.shape), a.astype(np.int64).ravel().tolist())


def apply_mixed_precision(qmodel: onnx.ModelProto, bits: dict[str, dict[str, int]],
                          native_int4: bool = True) -> onnx.ModelProto:
    """Turn an int8 QDQ model (from :func:`quantize`) into a mixed-precision one.

    ``bits`` maps node names to ``{"w": W, "o": O}`` (2..8, missing = 8; ``w`` for Conv/Gemm
    only, ``o`` for any node with a quantized output, e.g. an Add or a MaxPool):

    - ``w``: the weights are re-quantized to symmetric W-bit values (per channel as before);
      4-bit weights become an INT4 initializer (opset 21) when ``native_int4``, other widths
      stay in the int8 container;
    - ``o``: the output activation keeps its real range but gets ``2^O - 1`` levels (scale
      ``s * 255 / (2^O - 1)``, zero point scaled alike: :func:`tvm_accel.precision.widen`, in
      initializers of its own, as onnxruntime shares them between tensors with equal
      parameters); a 4-bit output uses UINT4/INT4 Q/DQ
      when ``native_int4``, other widths a ``Clip`` between Q and DQ (a *clipped range*,
      see :mod:`tvm_accel.precision`).

    Every bias is re-quantized afterwards to ``x_scale * w_scale`` (input scales may change).
    onnxruntime runs the result; it is the ground truth the tests compare against.
    """
    m = onnx.ModelProto.FromString(qmodel.SerializeToString())
    q = _Initializers(m)
    nodes = {n.name: n for n in m.graph.node}
    unknown = sorted(set(bits) - set(nodes))
    if unknown:
        raise ValueError(f"apply_mixed_precision: no node named {unknown[0]!r}")
    prod = {o: n for n in m.graph.node for o in n.output}
    old_bias: dict[str, np.ndarray] = {}
    for n in m.graph.node:  # float value of every bias before anything moves
        if n.op_type in ("Conv", "Gemm") and len(n.input) > 2 and n.input[2] in prod:
            dq = prod[n.input[2]]
            old_bias[n.name] = q.arr(dq.input[0]).astype(np.float64) * q.arr(dq.input[1])
    use_i4 = False
    for name, spec in bits.items():
        n = nodes[name]
        wb, ob = int(spec.get("w", 8)), int(spec.get("o", 8))
        if wb < 8:
            use_i4 |= _narrow_weights(q, prod[n.input[1]], wb, native_int4)
        if ob < 8:
            use_i4 |= _narrow_output(q, n, ob, native_int4)
    _requantize_biases(q, old_bias)
    if use_i4:
        for o in m.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = max(o.version, 21)
        m.ir_version = max(m.ir_version, 10)
    del m.graph.value_info[:]
    onnx.checker.check_model(m)
    return m


class _Initializers:
    """A model's initializers by name, read as arrays and replaced in place."""

    def __init__(self, model: onnx.ModelProto):
        self.graph = model.graph
        self.inits = {t.name: t for t in model.graph.initializer}

    def arr(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.inits[name])

    def put(self, name: str, value: np.ndarray) -> None:
        self.inits[name].CopyFrom(numpy_helper.from_array(value, name))

    def add(self, name: str, value: np.ndarray) -> None:
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        self.inits[name] = self.graph.initializer[-1]

    def drop(self, name: str) -> None:
        self.graph.initializer.remove(self.inits.pop(name))


def _narrow_weights(q: _Initializers, dq: onnx.NodeProto, wb: int, native_int4: bool) -> bool:
    """Re-quantize the weights of weight DequantizeLinear ``dq`` to symmetric ``wb``-bit values
    (per channel as before); True when they became an INT4 initializer."""
    w, s = q.arr(dq.input[0]).astype(np.int64), q.arr(dq.input[1]).astype(np.float64)
    qmax = (1 << (wb - 1)) - 1
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1) if s.size > 1 else 0
    k = w.shape[axis] if s.size > 1 else 1
    moved = np.moveaxis(w, axis, 0).reshape(k, -1) if s.size > 1 else w.reshape(1, -1)
    amax = np.maximum(np.abs(moved).max(axis=1), 1).astype(np.float64)
    f = amax / qmax
    new = np.clip(np.rint(moved / f[:, None]), -qmax - 1, qmax)
    new = (np.moveaxis(new.reshape(np.moveaxis(w, axis, 0).shape), 0, axis)
           if s.size > 1 else new.reshape(w.shape))
    q.put(dq.input[1], (s * f.reshape(s.shape)).astype(np.float32))
    if wb == 4 and native_int4:
        q.inits[dq.input[0]].CopyFrom(_to_i4(new, dq.input[0], True))
        zp = q.arr(dq.input[2])
        q.inits[dq.input[2]].CopyFrom(_to_i4(zp, dq.input[2], True))
        return True
    q.put(dq.input[0], new.astype(np.int8))
    return False


def _output_quantize(g: onnx.GraphProto, n: onnx.NodeProto) -> onnx.NodeProto:
    """The QuantizeLinear of ``n``'s output, after a ReLU/Clip onnxruntime kept."""
    t = n.output[0]
    q = None
    for _ in range(3):
        users = [c for c in g.node if t in c.input]
        q = next((c for c in users if c.op_type == "QuantizeLinear"), None)
        act = next((c for c in users if c.op_type in ("Relu", "Clip")), None)
        if q is not None or act is None:
            break
        t = act.output[0]
    if q is None:
        raise ValueError(f"apply_mixed_precision: {n.name} has no output quantize")
    return q


def _narrow_output(q: _Initializers, n: onnx.NodeProto, ob: int, native_int4: bool) -> bool:
    """Give ``n``'s output activation ``2^ob - 1`` levels over its real range: UINT4/INT4 Q/DQ
    (True) or a Clip between Q and DQ (a clipped range)."""
    g = q.graph
    qn = _output_quantize(g, n)
    _own_params(q, qn)
    s, zp = q.arr(qn.input[1]), q.arr(qn.input[2])
    signed = zp.dtype == np.int8
    dtype = "int8" if signed else "uint8"
    lo, hi = bits_range(ob, dtype)
    scale, z = widen(float(s.ravel()[0]), int(zp.ravel()[0]), DTYPE_RANGE[dtype], ob, dtype)
    new_s = np.full(s.shape, scale, dtype=np.float32)
    new_zp = np.full(zp.shape, z)
    q.put(qn.input[1], new_s)
    if ob == 4 and native_int4:
        q.inits[qn.input[2]].CopyFrom(_to_i4(new_zp, qn.input[2], signed))
        return True
    q.put(qn.input[2], new_zp.astype(zp.dtype))
    out = qn.output[0]
    clipped = f"{out}_clipped"
    bounds = [f"{qn.name}_clip_lo", f"{qn.name}_clip_hi"]
    for bname, v in zip(bounds, (lo, hi), strict=True):
        q.add(bname, np.array(v, dtype=zp.dtype))
    for c in g.node:
        for i, x in enumerate(c.input):
            if x == out:
                c.input[i] = clipped
    clip = helper.make_node("Clip", [out, *bounds], [clipped], name=f"{qn.name}_clip")
    g.node.insert(list(g.node).index(qn) + 1, clip)
    return False


def _own_params(q: _Initializers, qn: onnx.NodeProto) -> None:
    """Give quantize ``qn`` and the DequantizeLinears of its output their own scale and zero
    point initializers: onnxruntime shares them between tensors with equal parameters (a max
    pool's output and its input), and narrowing one tensor must not move another."""
    out = qn.output[0]
    nodes = [qn, *(c for c in q.graph.node if c.op_type == "DequantizeLinear" and c.input
                   and c.input[0] == out)]
    for k, what in ((1, "scale"), (2, "zero_point")):
        old = qn.input[k]
        new = f"{out}_narrowed_{what}"
        q.add(new, q.arr(old))
        for c in nodes:
            if len(c.input) > k and c.input[k] == old:
                c.input[k] = new
        if not any(old in c.input for c in q.graph.node):
            q.drop(old)


def _requantize_biases(q: _Initializers, old_bias: dict[str, np.ndarray]) -> None:
    """Bias scale = x_scale * w_scale again (input scales may have changed), same float bias."""
    prod = {o: n for n in q.graph.node for o in n.output}
    for n in q.graph.node:
        if n.name not in old_bias:
            continue
        bdq, wdq = prod[n.input[2]], prod[n.input[1]]
        xdq = prod[n.input[0]]
        sx = float(q.arr(xdq.input[1]).ravel()[0])
        bias, bs = rescale_bias(old_bias[n.name], np.ones(q.arr(bdq.input[1]).shape, np.float32),
                                sx, q.arr(wdq.input[1]))
        q.put(bdq.input[1], bs)
        q.put(bdq.input[0], bias)


def quantize_mixed(model: onnx.ModelProto, bits: dict[str, dict[str, int]],
                   activation_type: str = "uint8", native_int4: bool = True, seed: int = 0,
                   cache: bool = True) -> onnx.ModelProto:
    """Mixed-precision QDQ model: :func:`quantize` (int8, per channel) then
    :func:`apply_mixed_precision` with ``bits``; cached like :func:`quantize`."""
    import onnxruntime

    key = hashlib.sha256(model.SerializeToString(deterministic=True))
    key.update(repr((sorted((k, sorted(v.items())) for k, v in bits.items()), activation_type,
                     native_int4, seed, onnxruntime.__version__,
                     f"mixed-v{_MIXED_VERSION}")).encode())
    path = cache_dir() / f"{model.graph.name}-mixed-{key.hexdigest()[:16]}.onnx"
    if cache and path.exists():
        try:
            return onnx.load(str(path))
        except Exception:
            path.unlink(missing_ok=True)
    q = apply_mixed_precision(ort_quantize(model, activation_type, seed=seed, cache=cache), bits,
                              native_int4)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
        onnx.save(q, str(tmp_path))
        os.replace(tmp_path, path)
    return q


def resnet20_mixed(seed: int = 0, batch: int = 1, native_int4: bool = True) -> onnx.ModelProto:
    """ResNet-20 quantized in the HAWQ spirit (:data:`RESNET20_HAWQ`: weights 2/3/4/6/8 bits,
    4-bit activations), as a QDQ model onnxruntime runs."""
    return quantize_mixed(zoo.resnet20(seed, batch), RESNET20_HAWQ, native_int4=native_int4,
                          seed=seed)


def resnet18_mixed(seed: int = 0, batch: int = 1, native_int4: bool = True) -> onnx.ModelProto:
    """ImageNet ResNet-18 with :data:`RESNET18_4BIT` (HAWQ-V3's W4A4: 4-bit weights in the
    blocks, 4-bit activations), as a QDQ model onnxruntime runs."""
    return quantize_mixed(zoo.resnet18(seed, batch), RESNET18_4BIT, native_int4=native_int4,
                          seed=seed)


def mobilenet_tiny_mixed(seed: int = 0, batch: int = 1,
                         native_int4: bool = True) -> onnx.ModelProto:
    """:func:`mobilenet_tiny` with :data:`MOBILENET_TINY_MIXED` (4-bit depthwise outputs)."""
    return quantize_mixed(zoo.mobilenet_tiny(seed, batch), MOBILENET_TINY_MIXED,
                          native_int4=native_int4, seed=seed)
