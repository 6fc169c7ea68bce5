"""The classic image networks: ResNets, VGG-16, GoogLeNet, a YOLOv3-tiny-like detector, a small
encoder-decoder, a CIFAR MobileNet-v1-like net and the demo's tiny CNN."""

from __future__ import annotations

from typing import Any

import onnx

from tvm_accel.zoo.builder import INPUT_NAME, Builder, check_hw, scaled


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


def resnet50(seed: int = 0, batch: int = 1, hw: int = 224) -> onnx.ModelProto:
    """ImageNet ResNet-50 (v1.5): 7x7/2 conv, 3x3/2 maxpool, bottleneck blocks [3, 4, 6, 3]
    (widths 64..512, outputs 256..2048), GAP, FC 1000; input 3 x ``hw`` x ``hw``."""
    check_hw(hw, 32, "resnet50")
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
    check_hw(hw, 32, "vgg16")
    b = Builder(seed)
    x = INPUT_NAME
    y, cin, stage, i = x, 3, 1, 1
    for v in VGG16_CFG:
        if v == "M":
            y = b.pool(y, "max", 2, 2, 0, name=f"pool{stage}")
            stage, i = stage + 1, 1
            continue
        c = scaled(v, width)
        y = b.conv(y, cin, c, 3, name=f"conv{stage}_{i}", relu=True)
        cin, i = c, i + 1
    y = b.node("Flatten", [y], "flatten", axis=1)
    f = scaled(fc, width)
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
    check_hw(hw, 32, "googlenet")
    b = Builder(seed)
    x = INPUT_NAME
    c = lambda v: scaled(v, width)  # noqa: E731
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
    check_hw(hw, 32, "yolov3_tiny")
    b = Builder(seed)
    x = INPUT_NAME
    c = lambda v: scaled(v, width)  # noqa: E731

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
    check_hw(hw, 4, "encoder_decoder")
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
    c = scaled(16, width)
    y = b.conv(x, 3, c, 3, 2, name="conv1", relu=True)
    for i, (cout, stride) in enumerate(((32, 1), (64, 2), (64, 1), (128, 2))):
        cout = scaled(cout, width)
        y = b.conv(y, c, c, 3, stride, name=f"dw{i + 1}", relu=True, groups=c)
        y = b.conv(y, c, cout, 1, name=f"pw{i + 1}", relu=True)
        c = cout
    y = b.node("GlobalAveragePool", [y], "avgpool")
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, c, 10, "fc")
    return b.model("mobilenet_tiny", x, (batch, 3, 32, 32), [y])




def conv_bn_net(seed: int = 0, batch: int = 1, hw: int = 64, width: float = 1.0,
                num_classes: int = 10) -> onnx.ModelProto:
    """A plain Conv-BN-activation CNN as a training framework exports it: the batch norms
    stay BatchNormalization nodes (after bias-free convs). Three stages of conv3x3 -> BN ->
    ReLU and conv3x3 -> BN -> LeakyRelu 0.1 (32, 64, 128 channels x ``width``), the first two
    closed by a 2x2/2 AveragePool, then GAP, Flatten, FC. ``hw`` a multiple of 4."""
    check_hw(hw, 4, "conv_bn_net")
    b = Builder(seed)
    y, cin = INPUT_NAME, 3
    for s, c in enumerate(scaled(v, width) for v in (32, 64, 128)):
        y = b.conv(y, cin, c, 3, name=f"stage{s + 1}.conv1", bn=True, relu=True)
        y = b.act(b.conv(y, c, c, 3, name=f"stage{s + 1}.conv2", bn=True), "leaky",
                  f"stage{s + 1}.conv2")
        if s < 2:
            y = b.pool(y, "avg", 2, 2, 0, name=f"stage{s + 1}.pool")
        cin = c
    y = b.node("GlobalAveragePool", [y], "avgpool")
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, cin, num_classes, "fc")
    return b.model("conv_bn_net", INPUT_NAME, (batch, 3, hw, hw), [y])
