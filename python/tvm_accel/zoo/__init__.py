"""Model zoo for ``tvmc zoo``, tests, benchmarks and the demo: float ONNX networks built with
``onnx.helper`` (:class:`~tvm_accel.zoo.builder.Builder`).

Every builder is deterministic (weights from ``numpy.random.default_rng(seed)``) and returns a
float ``onnx.ModelProto`` (opset 17, NCHW, static shapes). Batch norm is folded into the conv
weights and bias at build time (each output channel gets its own gain, so per-channel weight
quantization has something to do), except in :func:`conv_bn_net`, which keeps
BatchNormalization nodes as a training framework exports them. Quantizing them is
:mod:`tvm_accel.quantize`'s job.

Families: :mod:`~tvm_accel.zoo.classic` (ResNets, VGG-16, GoogLeNet, YOLOv3-tiny, an
encoder-decoder, MobileNet-v1-like, a Conv-BN net), :mod:`~tvm_accel.zoo.mobile`
(MobileNetV2, EfficientNet-B0, SqueezeNet 1.1) and :mod:`~tvm_accel.zoo.segmentation`
(U-Net, DeepLabv3 ASPP).

Nothing is downloaded: the weights are random, so accuracy is meaningless, but shapes, operator
mix and quantization statistics are those of the real networks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from tvm_accel.zoo.builder import INPUT_NAME, OPSET, Builder, check_hw, scaled
from tvm_accel.zoo.classic import (
    GOOGLENET_CFG,
    VGG16_CFG,
    conv_bn_net,
    encoder_decoder,
    googlenet,
    mobilenet_tiny,
    resnet18,
    resnet20,
    resnet50,
    tiny_cnn,
    vgg16,
    yolov3_tiny,
)
from tvm_accel.zoo.mobile import (
    EFFICIENTNET_B0_CFG,
    MOBILENET_V2_CFG,
    SQUEEZENET_1_1_CFG,
    efficientnet_b0,
    mobilenet_v2,
    squeezenet1_1,
)
from tvm_accel.zoo.segmentation import deeplab_aspp, unet

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
    "mobilenet_v2": mobilenet_v2,
    "efficientnet_b0": efficientnet_b0,
    "squeezenet1_1": squeezenet1_1,
    "unet": unet,
    "deeplab_aspp": deeplab_aspp,
    "conv_bn_net": conv_bn_net,
}


def input_shape(model: onnx.ModelProto) -> tuple[int, ...]:
    """Static shape of the model's (single) graph input."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return tuple(int(d.dim_value) for d in dims)


def random_input(model: onnx.ModelProto, seed: int = 0, n: int = 1) -> list[np.ndarray]:
    """``n`` seeded float32 inputs for ``model`` (standard normal, like normalized images)."""
    rng = np.random.default_rng(seed)
    shape = input_shape(model)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


__all__ = ["EFFICIENTNET_B0_CFG", "GOOGLENET_CFG", "INPUT_NAME", "MOBILENET_V2_CFG", "MODELS",
           "OPSET", "SQUEEZENET_1_1_CFG", "VGG16_CFG", "Builder", "check_hw", "conv_bn_net",
           "deeplab_aspp", "efficientnet_b0", "encoder_decoder", "googlenet", "input_shape",
           "mobilenet_tiny", "mobilenet_v2", "random_input", "resnet18", "resnet20", "resnet50",
           "scaled", "squeezenet1_1", "tiny_cnn", "unet", "vgg16", "yolov3_tiny"]
