"""Mobile networks as their papers describe them, at a reduced width (``width``) and a small
input (``hw``, 64 by default): MobileNetV2 (inverted residuals, ReLU6, depthwise convs),
EfficientNet-B0 (MBConv with SiLU, squeeze-excitation, 5x5 depthwise) and SqueezeNet 1.1
(fire modules, ceil-mode max pools).

Batch norms are folded into the convs (the builder's per-channel gain); the classifier keeps
the papers' 1000 classes unless ``num_classes`` says otherwise. ``max_repeats`` caps the
number of blocks per stage (the papers' depth by default) for quick tests.
"""

from __future__ import annotations

from typing import Any

import onnx

from tvm_accel.zoo.builder import INPUT_NAME, Builder, check_hw, scaled

#: MobileNetV2 (Sandler et al., 2018, Table 2): (expansion t, channels c, repeats n, stride s)
MOBILENET_V2_CFG = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

#: EfficientNet-B0 (Tan & Le 2019, Table 1): (expansion, kernel, stride, channels, repeats)
EFFICIENTNET_B0_CFG = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
                       (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))

#: SqueezeNet 1.1 fire modules (squeeze, expand 1x1, expand 3x3); "M" = 3x3/2 ceil-mode max pool
SQUEEZENET_1_1_CFG: tuple[Any, ...] = (
    (16, 64, 64), (16, 64, 64), "M", (32, 128, 128), (32, 128, 128), "M",
    (48, 192, 192), (48, 192, 192), (64, 256, 256), (64, 256, 256))


def _classifier(b: Builder, y: str, c: int, num_classes: int) -> str:
    y = b.node("GlobalAveragePool", [y], "avgpool")
    y = b.node("Flatten", [y], "flatten", axis=1)
    return b.gemm(y, c, num_classes, "fc")


def _repeats(n: int, max_repeats: int | None) -> int:
    return n if max_repeats is None else max(1, min(n, max_repeats))


def mobilenet_v2(seed: int = 0, batch: int = 1, hw: int = 64, width: float = 0.35,
                 num_classes: int = 1000, max_repeats: int | None = None) -> onnx.ModelProto:
    """MobileNetV2: conv3x3/2 32 -> ReLU6, 17 inverted residual blocks (1x1 expansion x6 ->
    ReLU6, 3x3 depthwise -> ReLU6, linear 1x1 projection; residual add when the shape is kept),
    conv1x1 1280 -> ReLU6, GAP, FC. Every width scales with ``width`` except the last conv's
    1280, kept as in the paper for multipliers below 1; ``hw`` a multiple of 32."""
    check_hw(hw, 32, "mobilenet_v2")
    b = Builder(seed)
    c = scaled(32, width)
    y = b.relu6(b.conv(INPUT_NAME, 3, c, 3, 2, name="conv1"), "conv1_relu6")
    for s, (t, cout, n, stride) in enumerate(MOBILENET_V2_CFG):
        cout = scaled(cout, width)
        for i in range(_repeats(n, max_repeats)):
            y = b.inverted_residual(y, c, cout, t, stride if i == 0 else 1,
                                    f"block{s + 1}.{i}")
            c = cout
    head = max(1280, scaled(1280, width))
    y = b.relu6(b.conv(y, c, head, 1, name="conv_last"), "conv_last_relu6")
    y = _classifier(b, y, head, num_classes)
    return b.model("mobilenet_v2", INPUT_NAME, (batch, 3, hw, hw), [y])


def efficientnet_b0(seed: int = 0, batch: int = 1, hw: int = 64, width: float = 0.25,
                    num_classes: int = 1000, max_repeats: int | None = None
                    ) -> onnx.ModelProto:
    """EfficientNet-B0: conv3x3/2 32 -> SiLU, 16 MBConv blocks (1x1 expansion x6 -> SiLU,
    3x3 or 5x5 depthwise -> SiLU, squeeze-excitation to a quarter of the block's input
    channels, linear 1x1 projection, residual add when the shape is kept), conv1x1 1280 ->
    SiLU, GAP, FC. SiLU is a Sigmoid and a Mul, as exporters write it; no drop-connect
    (inference). Widths scale with ``width`` (the head too: a width-reduced B0, not a
    compound-scaled one); ``hw`` a multiple of 32."""
    check_hw(hw, 32, "efficientnet_b0")
    b = Builder(seed)
    c = scaled(32, width)
    y = b.silu(b.conv(INPUT_NAME, 3, c, 3, 2, name="stem"), "stem_silu")
    for s, (t, k, stride, cout, n) in enumerate(EFFICIENTNET_B0_CFG):
        cout = scaled(cout, width)
        for i in range(_repeats(n, max_repeats)):
            y = b.inverted_residual(y, c, cout, t, stride if i == 0 else 1,
                                    f"block{s + 1}.{i}", k=k, act="silu", se=0.25)
            c = cout
    head = scaled(1280, width)
    y = b.silu(b.conv(y, c, head, 1, name="head"), "head_silu")
    y = _classifier(b, y, head, num_classes)
    return b.model("efficientnet_b0", INPUT_NAME, (batch, 3, hw, hw), [y])


def squeezenet1_1(seed: int = 0, batch: int = 1, hw: int = 64, width: float = 0.5,
                  num_classes: int = 1000) -> onnx.ModelProto:
    """SqueezeNet 1.1: conv3x3/2 64 (no padding) -> ReLU, 3x3/2 max pool (``ceil_mode``),
    8 fire modules with two more ceil-mode max pools, conv1x1 ``num_classes`` -> ReLU, GAP,
    Flatten (no dropout: inference). Widths scale with ``width``; ``hw`` at least 32."""
    if hw < 32:
        raise ValueError(f"squeezenet1_1: hw must be at least 32, got {hw}")
    b = Builder(seed)
    c = scaled(64, width)
    y = b.conv(INPUT_NAME, 3, c, 3, 2, 0, name="conv1", relu=True)
    y = b.pool(y, "max", 3, 2, 0, name="pool1", ceil_mode=True)
    fire, npool = 2, 2
    for m in SQUEEZENET_1_1_CFG:
        if m == "M":
            y = b.pool(y, "max", 3, 2, 0, name=f"pool{npool}", ceil_mode=True)
            npool += 1
            continue
        sq, e1, e3 = (scaled(v, width) for v in m)
        y = b.fire(y, c, sq, e1, e3, f"fire{fire}")
        c, fire = e1 + e3, fire + 1
    y = b.conv(y, c, num_classes, 1, name="conv10", relu=True)
    y = b.node("GlobalAveragePool", [y], "avgpool")
    y = b.node("Flatten", [y], "flatten", axis=1)
    return b.model("squeezenet1_1", INPUT_NAME, (batch, 3, hw, hw), [y])
