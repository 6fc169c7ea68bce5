"""Dense-prediction networks at a reduced width and a 64x64 input: a small U-Net (double convs,
max-pool downsampling, ConvTranspose and nearest-Resize upsampling, concatenated skips) and a
DeepLabv3 ASPP head (parallel 1x1 and dilated 3x3 convs and image pooling, concatenated) on a
small stride-8 backbone. Batch norms are folded into the convs."""

from __future__ import annotations

import onnx

from tvm_accel.zoo.builder import INPUT_NAME, Builder, check_hw, scaled


def _double_conv(b: Builder, x: str, cin: int, cout: int, name: str) -> str:
    y = b.conv(x, cin, cout, 3, name=f"{name}.conv1", relu=True)
    return b.conv(y, cout, cout, 3, name=f"{name}.conv2", relu=True)


def unet(seed: int = 0, batch: int = 1, hw: int = 64, width: float = 0.25, levels: int = 3,
         out_channels: int = 2) -> onnx.ModelProto:
    """U-Net (Ronneberger, Fischer and Brox, 2015) with ``levels`` 2x2 max-pool
    downsamplings: double conv3x3 -> ReLU per level (64, 128, ... channels scaled by
    ``width``), a double-conv bottleneck, then per level up: a 2x upsampling halving the
    channels, concat with the encoder feature of that level (skip), double conv; conv1x1 to
    ``out_channels``. The upsampling alternates between the paper's 2x2/2 up-convolution
    (ConvTranspose; the deepest level) and a nearest Resize x2 followed by a 1x1 conv (the
    common variant), so the network has both. Padded convs keep the sizes equal (no cropping
    of the skips, as in most reimplementations); ``hw`` a multiple of 2^``levels``."""
    check_hw(hw, 2 ** levels, "unet")
    b = Builder(seed)
    c = [scaled(64 * 2 ** i, width) for i in range(levels + 1)]
    y, cin, skips = INPUT_NAME, 3, []
    for i in range(levels):
        y = _double_conv(b, y, cin, c[i], f"down{i + 1}")
        skips.append(y)
        y = b.pool(y, "max", 2, 2, 0, name=f"pool{i + 1}")
        cin = c[i]
    y = _double_conv(b, y, cin, c[levels], "bottleneck")
    for j, i in enumerate(reversed(range(levels))):
        if j % 2 == 0:
            y = b.deconv(y, c[i + 1], c[i], 2, 2, 0, name=f"up{i + 1}.upconv")
        else:
            y = b.upsample(y, 2, f"up{i + 1}.resize")
            y = b.conv(y, c[i + 1], c[i], 1, name=f"up{i + 1}.reduce")
        y = b.concat([skips[i], y], f"up{i + 1}.concat")
        y = _double_conv(b, y, 2 * c[i], c[i], f"up{i + 1}")
    y = b.conv(y, c[0], out_channels, 1, name="head")
    return b.model("unet", INPUT_NAME, (batch, 3, hw, hw), [y])


def deeplab_aspp(seed: int = 0, batch: int = 1, hw: int = 64, width: float = 0.25,
                 rates: tuple[int, ...] = (6, 12), num_classes: int = 21,
                 image_pool: bool = True) -> onnx.ModelProto:
    """DeepLabv3's Atrous Spatial Pyramid Pooling head (Chen, Papandreou, Schroff and Adam,
    2017) on a small backbone
    of three conv3x3/2 -> ReLU (64, 128, 256 channels x ``width``: output stride 8): a 1x1
    conv (rate 1), one 3x3 conv per dilation of ``rates`` and, with ``image_pool``, the image
    pooling branch (GlobalAveragePool -> conv1x1 -> nearest Resize back to the feature
    size), each 256 x ``width`` channels -> ReLU, concatenated, conv1x1 -> ReLU, conv1x1 to
    ``num_classes`` logits at stride 8 (upsampling them to the input is post-processing, left
    out). The paper's rates at output stride 16 are 6/12/18; the 64x64 input keeps 6 and 12.
    ``hw`` a multiple of 8."""
    check_hw(hw, 8, "deeplab_aspp")
    b = Builder(seed)
    y, cin = INPUT_NAME, 3
    for i, cout in enumerate(scaled(v, width) for v in (64, 128, 256)):
        y = b.conv(y, cin, cout, 3, 2, name=f"backbone{i + 1}", relu=True)
        cin = cout
    ca = scaled(256, width)
    branches = [b.conv(y, cin, ca, 1, name="aspp.conv1x1", relu=True)]
    for r in rates:
        branches.append(b.conv(y, cin, ca, 3, name=f"aspp.rate{r}", dilation=r, relu=True))
    if image_pool:
        p = b.node("GlobalAveragePool", [y], "aspp.image_pool")
        p = b.conv(p, cin, ca, 1, name="aspp.image_pool_conv", relu=True)
        branches.append(b.upsample(p, hw // 8, "aspp.image_pool_resize"))
    y = b.concat(branches, "aspp.concat")
    y = b.conv(y, ca * len(branches), ca, 1, name="aspp.project", relu=True)
    y = b.conv(y, ca, num_classes, 1, name="classifier")
    return b.model("deeplab_aspp", INPUT_NAME, (batch, 3, hw, hw), [y])
