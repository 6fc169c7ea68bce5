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
from collections.abc import Mapping, Sequence
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
    def conv(self, x: str, cin: int, cout: int, k: int | tuple[int, int],
             stride: int | tuple[int, int] = 1, pad: int | tuple[int, ...] | None = None,
             name: str = "conv", bias: bool = True, relu: bool = False, groups: int = 1) -> str:
        """Conv with He-initialized weights and a folded batch norm (per-channel gain/shift);
        ``k`` and ``stride`` an int or ``(h, w)``, ``pad`` an int or ONNX's 4 pads."""
        kh, kw = (k, k) if isinstance(k, int) else k
        pads = [kh // 2, kw // 2] * 2 if pad is None else (
            [pad] * 4 if isinstance(pad, int) else list(pad))
        strides = [stride] * 2 if isinstance(stride, int) else list(stride)
        fan_in = cin // groups * kh * kw
        w = self.rng.normal(0.0, np.sqrt(2.0 / fan_in), (cout, cin // groups, kh, kw))
        gain = self.rng.uniform(0.5, 1.5, (cout, 1, 1, 1))  # folded BN gamma / sqrt(var)
        name = self.name(name)
        inputs = [x, self.init(f"{name}.weight", (w * gain).astype(np.float32))]
        if bias:
            inputs.append(self.init(f"{name}.bias",
                                    self.rng.normal(0.0, 0.1, cout).astype(np.float32)))
        out = f"{name}_out"
        self.nodes.append(helper.make_node(
            "Conv", inputs, [out], name=name, kernel_shape=[kh, kw], strides=strides,
            pads=pads, group=groups))
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

    def pool(self, x: str, kind: str, k: int, stride: int, pad: int | list[int] = 0,
             name: str | None = None, count_include_pad: bool = True) -> str:
        """MaxPool / AveragePool (``kind`` max / avg) with a square kernel; ``pad`` is one value
        or the 4 ONNX pads (top, left, bottom, right)."""
        pads = list(pad) if isinstance(pad, (list, tuple)) else [pad] * 4
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=pads)
        if kind == "avg":
            attrs["count_include_pad"] = int(count_include_pad)
            return self.node("AveragePool", [x], name or "avgpool", **attrs)
        if kind != "max":
            raise ValueError(f"unknown pool kind {kind!r} (max, avg)")
        return self.node("MaxPool", [x], name or "maxpool", **attrs)

    def concat(self, xs: list[str], name: str = "concat") -> str:
        return self.node("Concat", xs, name, axis=1)

    def upsample(self, x: str, scale: int = 2, name: str = "upsample",
                 coordinate_transformation_mode: str = "half_pixel",
                 nearest_mode: str = "round_prefer_floor", mode: str = "nearest") -> str:
        """ONNX Resize (opset 11+ form of Upsample) by ``scale`` on H and W."""
        name = self.name(name)
        sc = self.init(f"{name}.scales", np.array([1, 1, scale, scale], dtype=np.float32))
        out = f"{name}_out"
        attrs = dict(mode=mode, coordinate_transformation_mode=coordinate_transformation_mode)
        if mode == "nearest":
            attrs["nearest_mode"] = nearest_mode
        self.nodes.append(helper.make_node("Resize", [x, "", sc], [out], name=name, **attrs))
        return out

    def deconv(self, x: str, cin: int, cout: int, k: int, stride: int = 2, pad: int = 0,
               output_padding: int = 0, name: str = "deconv", bias: bool = True,
               relu: bool = False, groups: int = 1) -> str:
        """ConvTranspose with weights (cin, cout/groups, k, k) and a per-channel gain."""
        fan_in = cin // groups * k * k // (stride * stride) or 1
        w = self.rng.normal(0.0, np.sqrt(2.0 / fan_in), (cin, cout // groups, k, k))
        w = w * self.rng.uniform(0.5, 1.5, (1, cout // groups, 1, 1))
        name = self.name(name)
        inputs = [x, self.init(f"{name}.weight", w.astype(np.float32))]
        if bias:
            inputs.append(self.init(f"{name}.bias",
                                    self.rng.normal(0.0, 0.1, cout).astype(np.float32)))
        out = f"{name}_out"
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups)
        if output_padding:
            attrs["output_padding"] = [output_padding] * 2
        self.nodes.append(helper.make_node("ConvTranspose", inputs, [out], name=name, **attrs))
        return self.relu(out, f"{name}_relu") if relu else out

    def basic_block(self, x: str, cin: int, cout: int, stride: int, name: str) -> str:
        """ResNet basic block: conv3x3-relu-conv3x3 + shortcut (1x1 projection if needed), relu."""
        y = self.conv(x, cin, cout, 3, stride, name=f"{name}.conv1", relu=True)
        y = self.conv(y, cout, cout, 3, 1, name=f"{name}.conv2")
        if stride != 1 or cin != cout:
            x = self.conv(x, cin, cout, 1, stride, 0, name=f"{name}.downsample")
        return self.relu(self.add(y, x, f"{name}.add"), f"{name}.relu")

    def bottleneck(self, x: str, cin: int, width: int, stride: int, name: str) -> str:
        """ResNet-50 bottleneck (v1.5: the stride sits on the 3x3): 1x1 -> 3x3 -> 1x1 (4 x width)
        + shortcut (1x1 projection when the shape changes), relu."""
        cout = 4 * width
        y = self.conv(x, cin, width, 1, 1, 0, name=f"{name}.conv1", relu=True)
        y = self.conv(y, width, width, 3, stride, name=f"{name}.conv2", relu=True)
        y = self.conv(y, width, cout, 1, 1, 0, name=f"{name}.conv3")
        if stride != 1 or cin != cout:
            x = self.conv(x, cin, cout, 1, stride, 0, name=f"{name}.downsample")
        return self.relu(self.add(y, x, f"{name}.add"), f"{name}.relu")

    def inception(self, x: str, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int,
                  pp: int, name: str) -> str:
        """Inception-v1 module: 1x1 | 1x1 -> 3x3 | 1x1 -> 5x5 | maxpool 3x3/1 -> 1x1, concat."""
        b1 = self.conv(x, cin, c1, 1, name=f"{name}.b1", relu=True)
        b2 = self.conv(x, cin, c3r, 1, name=f"{name}.b2a", relu=True)
        b2 = self.conv(b2, c3r, c3, 3, name=f"{name}.b2b", relu=True)
        b3 = self.conv(x, cin, c5r, 1, name=f"{name}.b3a", relu=True)
        b3 = self.conv(b3, c5r, c5, 5, name=f"{name}.b3b", relu=True)
        b4 = self.pool(x, "max", 3, 1, 1, name=f"{name}.pool")
        b4 = self.conv(b4, cin, pp, 1, name=f"{name}.b4", relu=True)
        return self.concat([b1, b2, b3, b4], f"{name}.concat")

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


def _ch(c: int, width: float) -> int:
    """Channel count scaled by ``width`` (at least 4, a multiple of 4)."""
    return max(4, int(round(c * width / 4.0)) * 4) if width != 1.0 else c


def _check_hw(hw: int, multiple: int, name: str) -> None:
    if hw < multiple or hw % multiple:
        raise ValueError(f"{name}: hw must be a positive multiple of {multiple}, got {hw}")


def resnet50(seed: int = 0, batch: int = 1, hw: int = 224) -> onnx.ModelProto:
    """ImageNet ResNet-50 (v1.5): 7x7/2 conv, 3x3/2 maxpool, bottleneck blocks [3, 4, 6, 3]
    (widths 64..512, outputs 256..2048), GAP, FC 1000; input 3 x ``hw`` x ``hw``."""
    _check_hw(hw, 32, "resnet50")
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, 3, 64, 7, 2, 3, name="conv1", relu=True)
    y = b.pool(y, "max", 3, 2, 1, name="maxpool")
    cin = 64
    for s, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for i in range(blocks):
            stride = 2 if s > 0 and i == 0 else 1
            y = b.bottleneck(y, cin, width, stride, f"layer{s + 1}.{i}")
            cin = 4 * width
    y = b.node("GlobalAveragePool", [y], "avgpool")
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, 2048, 1000, "fc")
    return b.model("resnet50", x, (batch, 3, hw, hw), [y])


VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
             512, 512, 512, "M")


def vgg16(seed: int = 0, batch: int = 1, hw: int = 224, width: float = 1.0,
          num_classes: int = 1000, fc: int = 4096) -> onnx.ModelProto:
    """VGG-16: 13 conv3x3-relu in 5 stages, each closed by a 2x2/2 maxpool, then FC ``fc`` ->
    FC ``fc`` -> FC ``num_classes`` (ReLU between). ``hw`` (a multiple of 32) and ``width``
    (channel multiplier) shrink it for tests; the defaults are the real network (138 M
    weights)."""
    _check_hw(hw, 32, "vgg16")
    b = _Builder(seed)
    x = _input_name()
    y, cin, stage, i = x, 3, 1, 1
    for v in VGG16_CFG:
        if v == "M":
            y = b.pool(y, "max", 2, 2, 0, name=f"pool{stage}")
            stage, i = stage + 1, 1
            continue
        c = _ch(v, width)
        y = b.conv(y, cin, c, 3, name=f"conv{stage}_{i}", relu=True)
        cin, i = c, i + 1
    y = b.node("Flatten", [y], "flatten", axis=1)
    f = _ch(fc, width)
    y = b.relu(b.gemm(y, cin * (hw // 32) ** 2, f, "fc6"), "fc6_relu")
    y = b.relu(b.gemm(y, f, f, "fc7"), "fc7_relu")
    y = b.gemm(y, f, num_classes, "fc8")
    return b.model("vgg16", x, (batch, 3, hw, hw), [y])


#: Inception-v1 modules: (name, 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj); "M" = maxpool
GOOGLENET_CFG = (("3a", 64, 96, 128, 16, 32, 32), ("3b", 128, 128, 192, 32, 96, 64), "M",
                 ("4a", 192, 96, 208, 16, 48, 64), ("4b", 160, 112, 224, 24, 64, 64),
                 ("4c", 128, 128, 256, 24, 64, 64), ("4d", 112, 144, 288, 32, 64, 64),
                 ("4e", 256, 160, 320, 32, 128, 128), "M",
                 ("5a", 256, 160, 320, 32, 128, 128), ("5b", 384, 192, 384, 48, 128, 128))


def googlenet(seed: int = 0, batch: int = 1, hw: int = 224, width: float = 1.0,
              num_classes: int = 1000) -> onnx.ModelProto:
    """GoogLeNet / Inception-v1: 7x7/2 conv, 3x3/2 maxpool, 1x1 + 3x3 convs, 3x3/2 maxpool,
    9 inception modules (4 parallel branches joined by a concat) with two more 3x3/2 maxpools,
    GAP, FC ``num_classes`` (no LRN, no auxiliary heads). ``hw`` (multiple of 32) and ``width``
    shrink it for tests."""
    _check_hw(hw, 32, "googlenet")
    b = _Builder(seed)
    x = _input_name()
    c = lambda v: _ch(v, width)  # noqa: E731
    y = b.conv(x, 3, c(64), 7, 2, 3, name="conv1", relu=True)
    y = b.pool(y, "max", 3, 2, 1, name="pool1")
    y = b.conv(y, c(64), c(64), 1, name="conv2_reduce", relu=True)
    y = b.conv(y, c(64), c(192), 3, name="conv2", relu=True)
    y = b.pool(y, "max", 3, 2, 1, name="pool2")
    cin, npool = c(192), 3
    for m in GOOGLENET_CFG:
        if m == "M":
            y = b.pool(y, "max", 3, 2, 1, name=f"pool{npool}")
            npool += 1
            continue
        name, *chs = m
        c1, c3r, c3, c5r, c5, pp = (c(v) for v in chs)
        y = b.inception(y, cin, c1, c3r, c3, c5r, c5, pp, f"inception{name}")
        cin = c1 + c3 + c5 + pp
    y = b.node("GlobalAveragePool", [y], "avgpool")
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, cin, num_classes, "fc")
    return b.model("googlenet", x, (batch, 3, hw, hw), [y])


def yolov3_tiny(seed: int = 0, batch: int = 1, hw: int = 416, width: float = 1.0,
                num_classes: int = 80, leaky: bool = False) -> onnx.ModelProto:
    """A YOLOv3-tiny-like detector: a conv3x3 / maxpool 2x2 backbone (16..1024 channels, the
    last maxpool with stride 1 and bottom/right padding), a 13x13-style head (1x1 256 -> 3x3 512
    -> 1x1 3*(5+classes)) and a second head at twice the resolution: 1x1 128 -> nearest
    upsample x2 -> concat with the stride-16 backbone feature -> 3x3 256 -> 1x1. Outputs the two
    raw head maps (no decoding). Activations are ReLU (``leaky=True``: LeakyRelu 0.1 as in the
    original, which stays float). ``hw`` is a multiple of 32."""
    _check_hw(hw, 32, "yolov3_tiny")
    b = _Builder(seed)
    x = _input_name()
    c = lambda v: _ch(v, width)  # noqa: E731

    def conv(y, cin, cout, k, name, act=True):
        y = b.conv(y, cin, cout, k, name=name)
        if not act:
            return y
        if leaky:
            return b.node("LeakyRelu", [y], f"{name}_leaky", alpha=0.1)
        return b.relu(y, f"{name}_relu")

    y, cin = x, 3
    route = None
    for i, v in enumerate((16, 32, 64, 128, 256)):
        y = conv(y, cin, c(v), 3, f"conv{i}")
        cin = c(v)
        if v == 256:
            route = y
        y = b.pool(y, "max", 2, 2, 0, name=f"pool{i}")
    y = conv(y, cin, c(512), 3, "conv5")
    y = b.pool(y, "max", 2, 1, [0, 0, 1, 1], name="pool5")
    y = conv(y, c(512), c(1024), 3, "conv6")
    neck = conv(y, c(1024), c(256), 1, "conv7")
    nout = 3 * (5 + num_classes)
    h1 = conv(neck, c(256), c(512), 3, "conv8")
    h1 = conv(h1, c(512), nout, 1, "head1", act=False)
    u = conv(neck, c(256), c(128), 1, "conv9")
    u = b.upsample(u, 2, "upsample")
    y = b.concat([u, route], "route")
    h2 = conv(y, c(128) + c(256), c(256), 3, "conv10")
    h2 = conv(h2, c(256), nout, 1, "head2", act=False)
    g = hw // 32
    return b.model("yolov3_tiny", x, (batch, 3, hw, hw), [h1, h2],
                   [(batch, nout, g, g), (batch, nout, 2 * g, 2 * g)])


def encoder_decoder(seed: int = 0, batch: int = 1, hw: int = 32, c: int = 16,
                    out_channels: int = 3) -> onnx.ModelProto:
    """Small encoder-decoder (segmentation-style): conv3x3 c -> conv3x3/2 2c -> conv3x3/2 4c;
    decoder ConvTranspose 4x4/2 (pad 1) 4c -> 2c, concat with the 2c encoder feature (skip),
    conv1x1 -> 2c, ConvTranspose 3x3/2 (pad 1, output_padding 1) 2c -> c, conv1x1 -> out
    channels. ReLU after every conv/deconv but the last. ``hw`` is a multiple of 4."""
    _check_hw(hw, 4, "encoder_decoder")
    b = _Builder(seed)
    x = _input_name()
    e1 = b.conv(x, 3, c, 3, name="enc1", relu=True)
    e2 = b.conv(e1, c, 2 * c, 3, 2, name="enc2", relu=True)
    e3 = b.conv(e2, 2 * c, 4 * c, 3, 2, name="enc3", relu=True)
    d1 = b.deconv(e3, 4 * c, 2 * c, 4, 2, 1, name="dec1", relu=True)
    d1 = b.concat([d1, e2], "skip")
    d1 = b.conv(d1, 4 * c, 2 * c, 1, name="fuse", relu=True)
    d2 = b.deconv(d1, 2 * c, c, 3, 2, 1, 1, name="dec2", relu=True)
    y = b.conv(d2, c, out_channels, 1, name="head")
    return b.model("encoder_decoder", x, (batch, 3, hw, hw), [y])


# --- single operators (tests) --------------------------------------------------------------
def single_conv(cin: int = 16, cout: int = 16, k: int | tuple[int, int] = 3,
                stride: int | tuple[int, int] = 1, pad: int | tuple[int, ...] | None = None,
                batch: int = 1, hw: int | tuple[int, int] = 8, relu: bool = False,
                bias: bool = True, groups: int = 1, seed: int = 0) -> onnx.ModelProto:
    """One Conv (+ optional Relu) on a (batch, cin, h, w) input (``hw`` an int or ``(h, w)``;
    ``k``, ``stride``, ``pad`` as :meth:`_Builder.conv`, e.g. DeepBench's 5x20 speech kernel)."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, cin, cout, k, stride, pad, name="conv", bias=bias, relu=relu, groups=groups)
    h, w = (hw, hw) if isinstance(hw, int) else hw
    return b.model("single_conv", x, (batch, cin, h, w), [y])


def single_pool(kind: str = "max", c: int = 8, k: int = 3, stride: int = 2,
                pad: int | list[int] = 1, hw: int = 8, batch: int = 1,
                count_include_pad: bool = True, conv: bool = True,
                seed: int = 0) -> onnx.ModelProto:
    """(conv3x3 ->) one pool on a (batch, c, hw, hw) input: ``kind`` ``max`` / ``avg`` (k x k,
    ``stride``, ``pad`` one value or 4 ONNX pads) or ``gap`` (GlobalAveragePool). The conv
    gives the pool a quantized input (onnxruntime leaves a pool on the model input float)."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, c, c, 3, name="conv") if conv else x
    if kind == "gap":
        y = b.node("GlobalAveragePool", [y], "gap")
    else:
        y = b.pool(y, kind, k, stride, pad, name=f"{kind}pool",
                   count_include_pad=count_include_pad)
    return b.model(f"single_{kind}pool", x, (batch, c, hw, hw), [y])


def single_upsample(c: int = 8, hw: int = 6, scale: int = 2, batch: int = 1,
                    coordinate_transformation_mode: str = "half_pixel",
                    nearest_mode: str = "round_prefer_floor", mode: str = "nearest",
                    conv: bool = True, seed: int = 0) -> onnx.ModelProto:
    """(conv3x3 ->) Resize by an integer ``scale`` (nearest by default: ONNX's Upsample) on a
    (batch, c, hw, hw) input."""
    b = _Builder(seed)
    x = _input_name()
    y = b.conv(x, c, c, 3, name="conv") if conv else x
    y = b.upsample(y, scale, "upsample", coordinate_transformation_mode, nearest_mode, mode)
    return b.model("single_upsample", x, (batch, c, hw, hw), [y])


def single_deconv(cin: int = 8, cout: int = 8, k: int = 3, stride: int = 2, pad: int = 1,
                  output_padding: int = 0, groups: int = 1, hw: int = 6, batch: int = 1,
                  relu: bool = False, bias: bool = True, seed: int = 0) -> onnx.ModelProto:
    """One ConvTranspose (+ optional Relu) on a (batch, cin, hw, hw) input."""
    b = _Builder(seed)
    x = _input_name()
    y = b.deconv(x, cin, cout, k, stride, pad, output_padding, name="deconv", bias=bias,
                 relu=relu, groups=groups)
    return b.model("single_deconv", x, (batch, cin, hw, hw), [y])


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


def mobilenet_tiny(seed: int = 0, batch: int = 1, width: float = 1.0) -> onnx.ModelProto:
    """CIFAR-sized MobileNet-v1-like net (3x32x32 -> 10): conv3x3/2, then depthwise 3x3 +
    pointwise 1x1 pairs (stride 2 at 16 and 8 pixels), GAP, FC."""
    b = _Builder(seed)
    x = _input_name()
    c = _ch(16, width)
    y = b.conv(x, 3, c, 3, 2, name="conv1", relu=True)
    for i, (cout, stride) in enumerate(((32, 1), (64, 2), (64, 1), (128, 2))):
        cout = _ch(cout, width)
        y = b.conv(y, c, c, 3, stride, name=f"dw{i + 1}", relu=True, groups=c)
        y = b.conv(y, c, cout, 1, name=f"pw{i + 1}", relu=True)
        c = cout
    y = b.node("GlobalAveragePool", [y], "avgpool")
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, c, 10, "fc")
    return b.model("mobilenet_tiny", x, (batch, 3, 32, 32), [y])


MODELS = {
    "mobilenet_tiny": mobilenet_tiny,
    "resnet20": resnet20,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "vgg16": vgg16,
    "googlenet": googlenet,
    "yolov3_tiny": yolov3_tiny,
    "encoder_decoder": encoder_decoder,
    "tiny_cnn": tiny_cnn,
    "single_conv": single_conv,
    "single_pool": single_pool,
    "single_upsample": single_upsample,
    "single_deconv": single_deconv,
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


def random_calibration(model: onnx.ModelProto, seed: int = 0, n: int = 4,
                       shapes: Mapping[str, Sequence[int]] | None = None
                       ) -> list[dict[str, np.ndarray]]:
    """``n`` seeded samples for every graph input of ``model`` (standard normal float32, drawn
    sample by sample, input by input, from one generator): the random calibration set of
    :func:`quantize`. For a single-input model the arrays are those of :func:`random_input`.
    ``shapes`` overrides the shape of an input (e.g. one with a dynamic dimension)."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    shapes = dict(shapes or {})
    specs = [(v.name, tuple(shapes.get(v.name) or
                            (int(d.dim_value) for d in v.type.tensor_type.shape.dim)))
             for v in model.graph.input if v.name not in inits]
    return [{name: rng.standard_normal(shape).astype(np.float32) for name, shape in specs}
            for _ in range(n)]


def cache_dir() -> Path:
    """Where quantized models are cached: ``$TVM_ACCEL_CACHE`` or ``~/.cache/tvm_accel/zoo``."""
    env = os.environ.get("TVM_ACCEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tvm_accel" / "zoo"


def quantize(model: onnx.ModelProto, activation_type: str = "int8",
             per_channel: bool | None = None, calib_samples: int = 4, seed: int = 0,
             symmetric_weights: bool = True, symmetric_activations: bool = False,
             cache: bool = True, power_of_two: bool = False,
             calibration: Sequence[Mapping[str, np.ndarray]] | None = None) -> onnx.ModelProto:
    """Quantize a float model to QDQ with onnxruntime's static quantizer.

    ``activation_type`` is ``"int8"`` or ``"uint8"`` (weights are always int8, symmetric unless
    ``symmetric_weights=False``); ``per_channel`` selects per-output-channel weight scales
    (default: True, or False with ``power_of_two``).
    ``symmetric_activations`` forces activation zero points to 0 (int8) / 128 (uint8), which
    keeps ReLU/Clip nodes in the graph instead of folding them into the output range.
    Calibration (MinMax) runs on ``calibration`` when given (a sequence of samples, each a
    mapping from every graph input name to an array of the input's shape and dtype; the
    caller validates them, see :mod:`tvm_accel.quantize`), else on ``calib_samples`` seeded
    standard-normal inputs (:func:`random_calibration`). With ``cache`` the result is stored
    under :func:`cache_dir` keyed by a hash of the float model, the options, the calibration
    data and the onnxruntime version.

    ``power_of_two=True`` makes a fix-point model for hardware that requantizes by shifting
    (a DPU): activations and weights symmetric, then :func:`make_power_of_two` rounds every
    scale up to a power of two, re-quantizes weights and biases for the new scales and fuses
    each ReLU/Clip into the conv/dense/add that feeds it (see there).
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
    if per_channel is None:
        per_channel = not power_of_two
    if power_of_two:
        symmetric_weights = symmetric_activations = True
    key = hashlib.sha256(model.SerializeToString(deterministic=True))
    opts = (activation_type, per_channel, calib_samples, seed, symmetric_weights,
            symmetric_activations, onnxruntime.__version__)
    if power_of_two:
        opts += (f"power_of_two-v{_POW2_VERSION}",)
    key.update(repr(opts).encode())
    if calibration is not None:
        for sample in calibration:
            for name in sorted(sample):
                a = np.ascontiguousarray(sample[name])
                key.update(repr((name, a.dtype.str, a.shape)).encode())
                key.update(a.tobytes())
    path = cache_dir() / f"{model.graph.name}-{key.hexdigest()[:16]}.onnx"
    if cache and path.exists():
        try:
            return onnx.load(str(path))
        except Exception:  # a truncated cache entry: rebuild it
            path.unlink(missing_ok=True)

    samples = (list(calibration) if calibration is not None
               else random_calibration(model, seed, calib_samples))

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(samples)

        def get_next(self):
            return next(self._it, None)

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
    if power_of_two:
        qmodel = make_power_of_two(qmodel, model)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
        onnx.save(qmodel, str(tmp_path))
        os.replace(tmp_path, path)  # atomic: concurrent test runs never see half a file
    return qmodel


# --- power-of-two (fix-point) scales -----------------------------------------------------------
#: bump when make_power_of_two changes (part of the cache key)
_POW2_VERSION = 2
#: ops whose output a following ReLU/Clip is fused into (their canonical form folds it)
_FUSE_INTO = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add"}


def pow2_ceil(scale) -> np.ndarray:
    """Smallest power of two ``>= scale`` (elementwise, float32; zeros stay zero)."""
    a = np.asarray(scale, dtype=np.float64)
    pos = a > 0
    out = np.where(pos, 2.0 ** np.ceil(np.log2(np.where(pos, a, 1.0))), a)
    return out.astype(np.float32)


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
        if q is None or q.op_type != "QuantizeLinear":
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
      ``fuse_activations``;
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

    def float_value(dq, qv: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
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


def quantized(name: str, activation_type: str = "int8", per_channel: bool | None = None,
              power_of_two: bool = False, **kwargs) -> onnx.ModelProto:
    """Build zoo model ``name`` with ``kwargs`` and quantize it (cached)."""
    if name not in MODELS:
        raise ValueError(f"unknown zoo model {name!r} ({', '.join(MODELS)})")
    return quantize(MODELS[name](**kwargs), activation_type, per_channel,
                    power_of_two=power_of_two)


# --- mixed precision (sub-byte) QDQ models -----------------------------------------------------
#: version of the mixed-precision rewrite (part of the cache key of :func:`quantize_mixed`)
_MIXED_VERSION = 1
#: HAWQ-style bit assignment for :func:`resnet20_mixed` (weights 2/3/6/8, activations 4/8):
#: first conv and FC stay 8-bit, the middle of the network is the most compressed
RESNET20_HAWQ: dict[str, dict[str, int]] = {
    "conv1": {"w": 8, "o": 8},
    **{f"layer1.{i}.conv1": {"w": 6, "o": 4} for i in range(3)},
    **{f"layer1.{i}.conv2": {"w": 6} for i in range(3)},
    **{f"layer2.{i}.conv1": {"w": 3, "o": 4} for i in range(3)},
    **{f"layer2.{i}.conv2": {"w": 4} for i in range(3)},
    "layer2.0.downsample": {"w": 8},
    **{f"layer3.{i}.conv1": {"w": 2, "o": 4} for i in range(3)},
    **{f"layer3.{i}.conv2": {"w": 3} for i in range(3)},
    "layer3.0.downsample": {"w": 6},
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
      ``s * 255 / (2^O - 1)``, zero point scaled alike); a 4-bit output uses UINT4/INT4 Q/DQ
      when ``native_int4``, other widths a ``Clip`` between Q and DQ (a *clipped range*,
      see :mod:`tvm_accel.precision`).

    Every bias is re-quantized afterwards to ``x_scale * w_scale`` (input scales may change).
    onnxruntime runs the result; it is the ground truth the tests compare against.
    """
    m = onnx.ModelProto.FromString(qmodel.SerializeToString())
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    prod = {o: n for n in g.node for o in n.output}
    nodes = {n.name: n for n in g.node}
    unknown = sorted(set(bits) - set(nodes))
    if unknown:
        raise ValueError(f"apply_mixed_precision: no node named {unknown[0]!r}")

    def arr(name: str) -> np.ndarray:
        return numpy_helper.to_array(inits[name])

    def put(name: str, value: np.ndarray) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(value, name))

    old_bias: dict[str, float] = {}
    for n in g.node:  # float value of every bias before anything moves
        if n.op_type in ("Conv", "Gemm") and len(n.input) > 2 and n.input[2] in prod:
            dq = prod[n.input[2]]
            old_bias[n.name] = arr(dq.input[0]).astype(np.float64) * arr(dq.input[1])
    use_i4 = False
    for name, spec in bits.items():
        n = nodes[name]
        wb = int(spec.get("w", 8))
        if wb < 8:
            dq = prod[n.input[1]]
            w, s = arr(dq.input[0]).astype(np.int64), arr(dq.input[1]).astype(np.float64)
            qmax = (1 << (wb - 1)) - 1
            axis = next((a.i for a in dq.attribute if a.name == "axis"), 1) if s.size > 1 else 0
            k = w.shape[axis] if s.size > 1 else 1
            moved = np.moveaxis(w, axis, 0).reshape(k, -1) if s.size > 1 else w.reshape(1, -1)
            amax = np.maximum(np.abs(moved).max(axis=1), 1).astype(np.float64)
            f = amax / qmax
            new = np.clip(np.rint(moved / f[:, None]), -qmax - 1, qmax)
            new = (np.moveaxis(new.reshape(np.moveaxis(w, axis, 0).shape), 0, axis)
                   if s.size > 1 else new.reshape(w.shape))
            put(dq.input[1], (s * f.reshape(s.shape)).astype(np.float32))
            if wb == 4 and native_int4:
                inits[dq.input[0]].CopyFrom(_to_i4(new, dq.input[0], True))
                zp = arr(dq.input[2])
                inits[dq.input[2]].CopyFrom(_to_i4(zp, dq.input[2], True))
                use_i4 = True
            else:
                put(dq.input[0], new.astype(np.int8))
        ob = int(spec.get("o", 8))
        if ob < 8:
            t = n.output[0]
            q = None
            for _ in range(3):  # the output quantize, after a ReLU/Clip ORT kept
                users = [c for c in g.node if t in c.input]
                q = next((c for c in users if c.op_type == "QuantizeLinear"), None)
                act = next((c for c in users if c.op_type in ("Relu", "Clip")), None)
                if q is not None or act is None:
                    break
                t = act.output[0]
            if q is None:
                raise ValueError(f"apply_mixed_precision: {name} has no output quantize")
            s, zp = arr(q.input[1]), arr(q.input[2])
            signed = zp.dtype == np.int8
            lv = (1 << ob) - 1
            new_s = (s.astype(np.float64) * 255.0 / lv).astype(np.float32)
            lo, hi = (-(1 << (ob - 1)), (1 << (ob - 1)) - 1) if signed else (0, lv)
            new_zp = np.clip(np.rint(zp.astype(np.float64) * lv / 255.0), lo, hi)
            put(q.input[1], new_s)
            if ob == 4 and native_int4:
                inits[q.input[2]].CopyFrom(_to_i4(new_zp, q.input[2], signed))
                use_i4 = True
            else:
                put(q.input[2], new_zp.astype(zp.dtype))
                out = q.output[0]
                clipped = f"{out}_clipped"
                bounds = [f"{q.name}_clip_lo", f"{q.name}_clip_hi"]
                for bname, v in zip(bounds, (lo, hi), strict=True):
                    g.initializer.append(numpy_helper.from_array(np.array(v, dtype=zp.dtype),
                                                                 bname))
                    inits[bname] = g.initializer[-1]
                for c in g.node:
                    for i, x in enumerate(c.input):
                        if x == out:
                            c.input[i] = clipped
                clip = helper.make_node("Clip", [out, *bounds], [clipped], name=f"{q.name}_clip")
                g.node.insert(list(g.node).index(q) + 1, clip)
    prod = {o: n for n in g.node for o in n.output}
    for n in g.node:  # bias scale = x_scale * w_scale again
        if n.name not in old_bias:
            continue
        bdq, wdq = prod[n.input[2]], prod[n.input[1]]
        xdq = prod[n.input[0]]
        sx = float(arr(xdq.input[1]).ravel()[0])
        bs = (sx * arr(wdq.input[1]).astype(np.float64)).astype(np.float32)
        bs = np.broadcast_to(bs, arr(bdq.input[1]).shape) if bs.size == 1 else bs
        put(bdq.input[1], np.ascontiguousarray(bs))
        put(bdq.input[0], np.rint(old_bias[n.name] / bs.astype(np.float64)).astype(np.int32))
    if use_i4:
        for o in m.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = max(o.version, 21)
        m.ir_version = max(m.ir_version, 10)
    del g.value_info[:]
    onnx.checker.check_model(m)
    return m


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
    q = apply_mixed_precision(quantize(model, activation_type, seed=seed, cache=cache), bits,
                              native_int4)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
        onnx.save(q, str(tmp_path))
        os.replace(tmp_path, path)
    return q


def resnet20_mixed(seed: int = 0, batch: int = 1, native_int4: bool = True) -> onnx.ModelProto:
    """ResNet-20 quantized in the HAWQ spirit (:data:`RESNET20_HAWQ`: weights 2/3/4/6/8 bits,
    activations 4/8 bits), as a QDQ model onnxruntime runs."""
    return quantize_mixed(resnet20(seed, batch), RESNET20_HAWQ, native_int4=native_int4,
                          seed=seed)


def resnet18_mixed(seed: int = 0, batch: int = 1, native_int4: bool = True) -> onnx.ModelProto:
    """ImageNet ResNet-18 with :data:`RESNET18_4BIT` (HAWQ-V3's W4A4: 4-bit weights in the
    blocks, 4-bit activations), as a QDQ model onnxruntime runs."""
    return quantize_mixed(resnet18(seed, batch), RESNET18_4BIT, native_int4=native_int4,
                          seed=seed)


def mobilenet_tiny_mixed(seed: int = 0, batch: int = 1,
                         native_int4: bool = True) -> onnx.ModelProto:
    """:func:`mobilenet_tiny` with :data:`MOBILENET_TINY_MIXED` (4-bit depthwise outputs)."""
    return quantize_mixed(mobilenet_tiny(seed, batch), MOBILENET_TINY_MIXED,
                          native_int4=native_int4, seed=seed)
