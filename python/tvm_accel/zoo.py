"""Model zoo for ``tvmc zoo``, tests, benchmarks and the demo: float ONNX networks built with
``onnx.helper``.

Every builder is deterministic (weights from ``numpy.random.default_rng(seed)``) and returns a
float ``onnx.ModelProto`` (opset 17, NCHW, static shapes). Batch norm is folded into the conv
weights and bias at build time: each output channel gets its own gain, so per-channel weight
quantization has something to do. Quantizing them is :mod:`tvm_accel.quantize`'s job.

Nothing is downloaded: the weights are random, so accuracy is meaningless, but shapes, operator
mix and quantization statistics are those of the real networks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Builder:
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
        attrs: dict[str, Any] = dict(kernel_shape=[k, k], strides=[stride, stride], pads=pads)
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
        attrs: dict[str, Any] = dict(kernel_shape=[k, k], strides=[stride, stride],
                                     pads=[pad] * 4, group=groups)
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


#: the graph input's name in every zoo model
INPUT_NAME = "input"


# --- networks ------------------------------------------------------------------------------
def resnet20(seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """CIFAR ResNet-20: 3x32x32, 16/32/64 channels, 3 stages x 3 basic blocks, GAP, FC 10."""
    b = Builder(seed)
    x = INPUT_NAME
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
    b = Builder(seed)
    x = INPUT_NAME
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
    b = Builder(seed)
    x = INPUT_NAME
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
    b = Builder(seed)
    x = INPUT_NAME
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


#: VGG-16 conv widths; "M" = maxpool
VGG16_CFG: tuple[Any, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(seed: int = 0, batch: int = 1, hw: int = 224, width: float = 1.0,
          num_classes: int = 1000, fc: int = 4096) -> onnx.ModelProto:
    """VGG-16: 13 conv3x3-relu in 5 stages, each closed by a 2x2/2 maxpool, then FC ``fc`` ->
    FC ``fc`` -> FC ``num_classes`` (ReLU between). ``hw`` (a multiple of 32) and ``width``
    (channel multiplier) shrink it for tests; the defaults are the real network (138 M
    weights)."""
    _check_hw(hw, 32, "vgg16")
    b = Builder(seed)
    x = INPUT_NAME
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
GOOGLENET_CFG: tuple[Any, ...] = (
    ("3a", 64, 96, 128, 16, 32, 32), ("3b", 128, 128, 192, 32, 96, 64), "M",
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
    b = Builder(seed)
    x = INPUT_NAME
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
    b = Builder(seed)
    x = INPUT_NAME
    c = lambda v: _ch(v, width)  # noqa: E731

    def conv(y, cin, cout, k, name, act=True):
        y = b.conv(y, cin, cout, k, name=name)
        if not act:
            return y
        if leaky:
            return b.node("LeakyRelu", [y], f"{name}_leaky", alpha=0.1)
        return b.relu(y, f"{name}_relu")

    y, cin = x, 3
    route = ""
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
    b = Builder(seed)
    x = INPUT_NAME
    e1 = b.conv(x, 3, c, 3, name="enc1", relu=True)
    e2 = b.conv(e1, c, 2 * c, 3, 2, name="enc2", relu=True)
    e3 = b.conv(e2, 2 * c, 4 * c, 3, 2, name="enc3", relu=True)
    d1 = b.deconv(e3, 4 * c, 2 * c, 4, 2, 1, name="dec1", relu=True)
    d1 = b.concat([d1, e2], "skip")
    d1 = b.conv(d1, 4 * c, 2 * c, 1, name="fuse", relu=True)
    d2 = b.deconv(d1, 2 * c, c, 3, 2, 1, 1, name="dec2", relu=True)
    y = b.conv(d2, c, out_channels, 1, name="head")
    return b.model("encoder_decoder", x, (batch, 3, hw, hw), [y])


def mobilenet_tiny(seed: int = 0, batch: int = 1, width: float = 1.0) -> onnx.ModelProto:
    """CIFAR-sized MobileNet-v1-like net (3x32x32 -> 10): conv3x3/2, then depthwise 3x3 +
    pointwise 1x1 pairs (stride 2 at 16 and 8 pixels), GAP, FC."""
    b = Builder(seed)
    x = INPUT_NAME
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


#: the networks by name, in the order ``tvmc zoo`` lists them
MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "tiny_cnn": tiny_cnn,
    "resnet20": resnet20,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_tiny": mobilenet_tiny,
    "vgg16": vgg16,
    "googlenet": googlenet,
    "yolov3_tiny": yolov3_tiny,
    "encoder_decoder": encoder_decoder,
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
