"""Model zoo for tests, benchmarks and the demo: ONNX models built with ``onnx.helper``.

Every builder is deterministic (weights from ``numpy.random.default_rng(seed)``) and returns a
float ``onnx.ModelProto`` (opset 17, NCHW, static shapes). Batch norm is folded into the conv
weights and bias at build time: each output channel gets its own gain, so per-channel weight
quantization has something to do. :func:`quantize` turns a float model into a QDQ model with
onnxruntime's static quantizer and a seeded random calibration set; results are cached on disk
(``$TVM_ACCEL_CACHE`` or ``~/.cache/tvm_accel/zoo``) under a hash of the float model and the
quantization options, so ResNet-18 is quantized once per machine.

Nothing is downloaded: the weights are random, so accuracy is meaningless, but shapes, operator
mix and quantization statistics are those of the real networks.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class _Builder:
    """Small helper that accumulates nodes and initializers with unique names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count: dict[str, int] = {}

    def name(self, base: str) -> str:
        i = self._count.get(base, 0)
        self._count[base] = i + 1
        return f"{base}_{i}" if i else base

    def init(self, base: str, value: np.ndarray) -> str:
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), n))
        return n

    def node(self, op: str, inputs: list[str], name: str | None = None, **attrs) -> str:
        name = self.name(name or op.lower())
        out = f"{name}_out"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    # --- layers ----------------------------------------------------------------------------
    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None,
             name: str = "conv", bias: bool = True, relu: bool = False, groups: int = 1) -> str:
        """Conv with He-initialized weights and a folded batch norm (per-channel gain/shift)."""
        pad = k // 2 if pad is None else pad
        fan_in = cin // groups * k * k
        w = self.rng.normal(0.0, np.sqrt(2.0 / fan_in), (cout, cin // groups, k, k))
        gain = self.rng.uniform(0.5, 1.5, (cout, 1, 1, 1))  # folded BN gamma / sqrt(var)
        name = self.name(name)
        inputs = [x, self.init(f"{name}.weight", (w * gain).astype(np.float32))]
        if bias:
            inputs.append(self.init(f"{name}.bias",
                                    self.rng.normal(0.0, 0.1, cout).astype(np.float32)))
        out = f"{name}_out"
        self.nodes.append(helper.make_node(
            "Conv", inputs, [out], name=name, kernel_shape=[k, k], strides=[stride, stride],
            pads=[pad] * 4, group=groups))
        return self.relu(out, f"{name}_relu") if relu else out

    def gemm(self, x: str, cin: int, cout: int, name: str = "fc", bias: bool = True) -> str:
        name = self.name(name)
        w = self.rng.normal(0.0, np.sqrt(1.0 / cin), (cout, cin)).astype(np.float32)
        inputs = [x, self.init(f"{name}.weight", w)]
        if bias:
            inputs.append(self.init(f"{name}.bias",
                                    self.rng.normal(0.0, 0.1, cout).astype(np.float32)))
        out = f"{name}_out"
        self.nodes.append(helper.make_node("Gemm", inputs, [out], name=name, transB=1))
        return out

    def relu(self, x: str, name: str = "relu") -> str:
        return self.node("Relu", [x], name)

    def add(self, a: str, b: str, name: str = "add") -> str:
        return self.node("Add", [a, b], name)

    def basic_block(self, x: str, cin: int, cout: int, stride: int, name: str) -> str:
        """ResNet basic block: conv3x3-relu-conv3x3 + shortcut (1x1 projection if needed), relu."""
        y = self.conv(x, cin, cout, 3, stride, name=f"{name}.conv1", relu=True)
        y = self.conv(y, cout, cout, 3, 1, name=f"{name}.conv2")
        if stride != 1 or cin != cout:
            x = self.conv(x, cin, cout, 1, stride, 0, name=f"{name}.downsample")
        return self.relu(self.add(y, x, f"{name}.add"), f"{name}.relu")

    def model(self, name: str, x: str, shape: tuple[int, ...], outs: list[str],
              out_shapes: list[tuple[int, ...] | None] | None = None) -> onnx.ModelProto:
        out_shapes = out_shapes or [None] * len(outs)
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, list(shape))],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, s)
             for o, s in zip(outs, out_shapes, strict=True)],
            self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="tvm_accel.zoo")
        m.ir_version = 8
        m = onnx.shape_inference.infer_shapes(m)
        onnx.checker.check_model(m)
        return m


def _input_name() -> str:
    return "input"


# --- networks ------------------------------------------------------------------------------
def resnet20(seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """CIFAR ResNet-20: 3x32x32, 16/32/64 channels, 3 stages x 3 basic blocks, GAP, FC 10."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, 3, 16, 3, name="conv1", relu=True)
    cin = 16
    for s, c in enumerate((16, 32, 64)):
        for i in range(3):
            stride = 2 if s > 0 and i == 0 else 1
            y = b.basic_block(y, cin, c, stride, f"layer{s + 1}.{i}")
            cin = c
    y = b.node("GlobalAveragePool", [y], "avgpool")
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, 64, 10, "fc")
    return b.model("resnet20", x, (batch, 3, 32, 32), [y])


def resnet18(seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """ImageNet ResNet-18: 3x224x224, 7x7/2 conv, 3x3/2 maxpool, [2,2,2,2] basic blocks,
    GAP, FC 1000."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, 3, 64, 7, 2, 3, name="conv1", relu=True)
    y = b.node("MaxPool", [y], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    cin = 64
    for s, c in enumerate((64, 128, 256, 512)):
        for i in range(2):
            stride = 2 if s > 0 and i == 0 else 1
            y = b.basic_block(y, cin, c, stride, f"layer{s + 1}.{i}")
            cin = c
    y = b.node("GlobalAveragePool", [y], "avgpool")
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, 512, 1000, "fc")
    return b.model("resnet18", x, (batch, 3, 224, 224), [y])


def tiny_cnn(seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """Demo network (3x32x32 -> 10): conv-relu, maxpool, a residual block, conv/2, GAP, FC."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, 3, 16, 3, name="conv1", relu=True)
    y = b.node("MaxPool", [y], "pool1", kernel_shape=[2, 2], strides=[2, 2])
    y = b.basic_block(y, 16, 16, 1, "block1")
    y = b.conv(y, 16, 32, 3, 2, name="conv2", relu=True)
    y = b.node("GlobalAveragePool", [y], "avgpool")
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, 32, 10, "fc")
    return b.model("tiny_cnn", x, (batch, 3, 32, 32), [y])


# --- single operators (tests) --------------------------------------------------------------
def single_conv(cin: int = 16, cout: int = 16, k: int = 3, stride: int = 1, pad: int | None = None,
                batch: int = 1, hw: int = 8, relu: bool = False, bias: bool = True,
                groups: int = 1, seed: int = 0) -> onnx.ModelProto:
    """One Conv (+ optional Relu) on a (batch, cin, hw, hw) input."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, cin, cout, k, stride, pad, name="conv", bias=bias, relu=relu, groups=groups)
    return b.model("single_conv", x, (batch, cin, hw, hw), [y])


def single_dense(cin: int = 64, cout: int = 32, batch: int = 1, relu: bool = False,
                 bias: bool = True, seed: int = 0) -> onnx.ModelProto:
    """One Gemm (transB=1) (+ optional Relu) on a (batch, cin) input."""
    b = _Builder(seed)
    x = _input_name()
    y = b.gemm(x, cin, cout, "fc", bias=bias)
    if relu:
        y = b.relu(y, "fc_relu")
    return b.model("single_dense", x, (batch, cin), [y])


def conv_residual(c: int = 16, hw: int = 8, k: int = 3, batch: int = 1,
                  seed: int = 0) -> onnx.ModelProto:
    """``relu(conv(x) + x)``: a conv whose output meets the skip connection in an Add."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, c, c, k, name="conv")
    y = b.relu(b.add(y, x, "add"), "relu")
    return b.model("conv_residual", x, (batch, c, hw, hw), [y])


def conv_pool(kind: str = "max", c: int = 16, hw: int = 8, batch: int = 1,
              seed: int = 0) -> onnx.ModelProto:
    """conv-relu followed by a pool: ``kind`` is ``max`` (3x3/2 pad 1), ``avg`` (2x2/2) or
    ``gap`` (GlobalAveragePool)."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, c, c, 3, name="conv", relu=True)
    if kind == "max":
        y = b.node("MaxPool", [y], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    elif kind == "avg":
        y = b.node("AveragePool", [y], "avgpool", kernel_shape=[2, 2], strides=[2, 2])
    elif kind == "gap":
        y = b.node("GlobalAveragePool", [y], "gap")
    else:
        raise ValueError(f"unknown pool kind {kind!r} (max, avg, gap)")
    return b.model(f"conv_{kind}pool", x, (batch, c, hw, hw), [y])


def conv_concat(c: int = 8, hw: int = 8, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Two convs of the same input (different output ranges) concatenated on channels, then a
    1x1 conv."""
    b = _Builder(seed)
    x = _input_name()
    y1 = b.conv(x, c, c, 3, name="conv_a", relu=True)
    y2 = b.conv(x, c, c, 1, name="conv_b")
    y = b.node("Concat", [y1, y2], "concat", axis=1)
    y = b.conv(y, 2 * c, c, 1, name="conv_c")
    return b.model("conv_concat", x, (batch, c, hw, hw), [y])


def conv_flatten_dense(c: int = 8, hw: int = 4, cout: int = 10, batch: int = 1,
                       seed: int = 0) -> onnx.ModelProto:
    """conv-relu, Flatten, Gemm: the classifier head of small CNNs."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, c, c, 3, name="conv", relu=True)
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, c * hw * hw, cout, "fc")
    return b.model("conv_flatten_dense", x, (batch, c, hw, hw), [y])


def conv_unary(op: str = "Sigmoid", c: int = 8, hw: int = 8, batch: int = 1,
               seed: int = 0) -> onnx.ModelProto:
    """conv, one elementwise op (``Relu``, ``Clip`` (0..6), or ops the canonicalizer does not
    know such as ``Sigmoid``, ``Softmax``), then another conv."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, c, c, 3, name="conv1")
    if op == "Clip":  # ReLU6
        lo, hi = b.init("clip_min", np.float32(0.0)), b.init("clip_max", np.float32(6.0))
        y = b.node("Clip", [y, lo, hi], "clip")
    else:
        y = b.node(op, [y], op.lower(), **({"axis": 1} if op == "Softmax" else {}))
    y = b.conv(y, c, c, 3, name="conv2")
    return b.model(f"conv_{op.lower()}", x, (batch, c, hw, hw), [y])


MODELS = {
    "resnet20": resnet20,
    "resnet18": resnet18,
    "tiny_cnn": tiny_cnn,
    "single_conv": single_conv,
    "single_dense": single_dense,
    "conv_residual": conv_residual,
    "conv_pool": conv_pool,
    "conv_concat": conv_concat,
    "conv_flatten_dense": conv_flatten_dense,
    "conv_unary": conv_unary,
}


# --- quantization ----------------------------------------------------------------------------
def input_shape(model: onnx.ModelProto) -> tuple[int, ...]:
    """Static shape of the model's (single) graph input."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return tuple(int(d.dim_value) for d in dims)


def random_input(model: onnx.ModelProto, seed: int = 0, n: int = 1) -> list[np.ndarray]:
    """``n`` seeded float32 inputs for ``model`` (standard normal, like normalized images)."""
    rng = np.random.default_rng(seed)
    shape = input_shape(model)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def cache_dir() -> Path:
    """Where quantized models are cached: ``$TVM_ACCEL_CACHE`` or ``~/.cache/tvm_accel/zoo``."""
    env = os.environ.get("TVM_ACCEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tvm_accel" / "zoo"


def quantize(model: onnx.ModelProto, activation_type: str = "int8", per_channel: bool = True,
             calib_samples: int = 4, seed: int = 0, symmetric_weights: bool = True,
             symmetric_activations: bool = False, cache: bool = True) -> onnx.ModelProto:
    """Quantize a float model to QDQ with onnxruntime's static quantizer.

    ``activation_type`` is ``"int8"`` or ``"uint8"`` (weights are always int8, symmetric unless
    ``symmetric_weights=False``); ``per_channel`` selects per-output-channel weight scales.
    ``symmetric_activations`` forces activation zero points to 0 (int8) / 128 (uint8), which
    keeps ReLU/Clip nodes in the graph instead of folding them into the output range.
    Calibration (MinMax) runs on ``calib_samples`` seeded standard-normal inputs. With
    ``cache`` the result is stored under :func:`cache_dir` keyed by a hash of the float model,
    the options and the onnxruntime version.
    """
    import onnxruntime
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    act = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}.get(activation_type)
    if act is None:
        raise ValueError(f"activation_type must be 'int8' or 'uint8', not {activation_type!r}")
    key = hashlib.sha256(model.SerializeToString(deterministic=True))
    key.update(repr((activation_type, per_channel, calib_samples, seed, symmetric_weights,
                     symmetric_activations, onnxruntime.__version__)).encode())
    path = cache_dir() / f"{model.graph.name}-{key.hexdigest()[:16]}.onnx"
    if cache and path.exists():
        try:
            return onnx.load(str(path))
        except Exception:  # a truncated cache entry: rebuild it
            path.unlink(missing_ok=True)

    samples = random_input(model, seed, calib_samples)
    in_name = model.graph.input[0].name

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(samples)

        def get_next(self):
            x = next(self._it, None)
            return None if x is None else {in_name: x}

    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "float.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, str(src))  # quantize_static mutates a ModelProto it is given
        quantize_static(str(src), str(out), _Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=act, weight_type=QuantType.QInt8,
                        per_channel=per_channel,
                        extra_options={"WeightSymmetric": symmetric_weights,
                                       "ActivationSymmetric": symmetric_activations})
        qmodel = onnx.load(str(out))
    qmodel.graph.name = model.graph.name
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
        onnx.save(qmodel, str(tmp_path))
        os.replace(tmp_path, path)  # atomic: concurrent test runs never see half a file
    return qmodel


def quantized(name: str, activation_type: str = "int8", per_channel: bool = True,
              **kwargs) -> onnx.ModelProto:
    """Build zoo model ``name`` with ``kwargs`` and quantize it (cached)."""
    if name not in MODELS:
        raise ValueError(f"unknown zoo model {name!r} ({', '.join(MODELS)})")
    return quantize(MODELS[name](**kwargs), activation_type, per_channel)
