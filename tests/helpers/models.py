"""Single-operator and few-operator float models the tests build (one conv, pool, upsample,
transpose conv, dense, or a conv with a residual add, pool, concat, flatten + dense or unary op),
and :func:`quantized`, which quantizes them or a zoo network by name."""

from __future__ import annotations

import numpy as np
import onnx

from tvm_accel import zoo
from tvm_accel.quantize import ort_quantize
from tvm_accel.zoo import INPUT_NAME, Builder


# --- single operators (tests) --------------------------------------------------------------
def single_conv(cin: int = 16, cout: int = 16, k: int | tuple[int, int] = 3,
                stride: int | tuple[int, int] = 1, pad: int | tuple[int, ...] | None = None,
                batch: int = 1, hw: int | tuple[int, int] = 8, relu: bool = False,
                bias: bool = True, groups: int = 1, seed: int = 0) -> onnx.ModelProto:
    """One Conv (+ optional Relu) on a (batch, cin, h, w) input (``hw`` an int or ``(h, w)``;
    ``k``, ``stride``, ``pad`` as :meth:`Builder.conv`, e.g. DeepBench's 5x20 speech kernel)."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.conv(x, cin, cout, k, stride, pad, name="conv", bias=bias, relu=relu, groups=groups)
    h, w = (hw, hw) if isinstance(hw, int) else hw
    return b.model("single_conv", x, (batch, cin, h, w), [y])


def single_pool(kind: str = "max", c: int = 8, k: int = 3, stride: int = 2,
                pad: int | list[int] = 1, hw: int = 8, batch: int = 1,
                count_include_pad: bool = True, conv: bool = True, ceil_mode: bool = False,
                seed: int = 0) -> onnx.ModelProto:
    """(conv3x3 ->) one pool on a (batch, c, hw, hw) input: ``kind`` ``max`` / ``avg`` (k x k,
    ``stride``, ``pad`` one value or 4 ONNX pads, ``ceil_mode``) or ``gap``
    (GlobalAveragePool). The conv
    gives the pool a quantized input (onnxruntime leaves a pool on the model input float)."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.conv(x, c, c, 3, name="conv") if conv else x
    if kind == "gap":
        y = b.node("GlobalAveragePool", [y], "gap")
    else:
        y = b.pool(y, kind, k, stride, pad, name=f"{kind}pool",
                   count_include_pad=count_include_pad, ceil_mode=ceil_mode)
    return b.model(f"single_{kind}pool", x, (batch, c, hw, hw), [y])


def single_upsample(c: int = 8, hw: int = 6, scale: int = 2, batch: int = 1,
                    coordinate_transformation_mode: str = "half_pixel",
                    nearest_mode: str = "round_prefer_floor", mode: str = "nearest",
                    conv: bool = True, seed: int = 0) -> onnx.ModelProto:
    """(conv3x3 ->) Resize by an integer ``scale`` (nearest by default: ONNX's Upsample) on a
    (batch, c, hw, hw) input."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.conv(x, c, c, 3, name="conv") if conv else x
    y = b.upsample(y, scale, "upsample", coordinate_transformation_mode, nearest_mode, mode)
    return b.model("single_upsample", x, (batch, c, hw, hw), [y])


def single_deconv(cin: int = 8, cout: int = 8, k: int = 3, stride: int = 2, pad: int = 1,
                  output_padding: int = 0, groups: int = 1, hw: int = 6, batch: int = 1,
                  relu: bool = False, bias: bool = True, seed: int = 0) -> onnx.ModelProto:
    """One ConvTranspose (+ optional Relu) on a (batch, cin, hw, hw) input."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.deconv(x, cin, cout, k, stride, pad, output_padding, name="deconv", bias=bias,
                 relu=relu, groups=groups)
    return b.model("single_deconv", x, (batch, cin, hw, hw), [y])


def single_dense(cin: int = 64, cout: int = 32, batch: int = 1, relu: bool = False,
                 bias: bool = True, seed: int = 0) -> onnx.ModelProto:
    """One Gemm (transB=1) (+ optional Relu) on a (batch, cin) input."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.gemm(x, cin, cout, "fc", bias=bias)
    if relu:
        y = b.relu(y, "fc_relu")
    return b.model("single_dense", x, (batch, cin), [y])


def conv_residual(c: int = 16, hw: int = 8, k: int = 3, batch: int = 1,
                  seed: int = 0) -> onnx.ModelProto:
    """``relu(conv(x) + x)``: a conv whose output meets the skip connection in an Add."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.conv(x, c, c, k, name="conv")
    y = b.relu(b.add(y, x, "add"), "relu")
    return b.model("conv_residual", x, (batch, c, hw, hw), [y])


def conv_chain_residual(c: int = 16, hw: int = 8, batch: int = 1, seed: int = 0,
                        cin: int | None = None) -> onnx.ModelProto:
    """``relu(b(a(x)) + a(x))`` with convs ``a`` (+ relu; ``cin`` input channels, default
    ``c``) and ``b``: a conv output read by the next conv and by the Add (tensors passed from
    one accelerator call to the next)."""
    bld = Builder(seed)
    x = INPUT_NAME
    cin = c if cin is None else cin
    a = bld.conv(x, cin, c, 3, name="a", relu=True)
    y = bld.conv(a, c, c, 3, name="b")
    y = bld.relu(bld.add(y, a, "add"), "relu")
    return bld.model("conv_chain_residual", x, (batch, cin, hw, hw), [y])


def residual_blocks(c: int = 16, hw: int = 8, blocks: int = 2, batch: int = 1,
                    seed: int = 0) -> onnx.ModelProto:
    """``y = a(x)``, then ``blocks`` times ``y = relu(b_i(y) + y)``: each residual Add reads
    the previous one's result (a ResNet stage)."""
    bld = Builder(seed)
    x = INPUT_NAME
    y = bld.conv(x, c, c, 3, name="a", relu=True)
    for i in range(blocks):
        z = bld.conv(y, c, c, 3, name=f"b{i}")
        y = bld.relu(bld.add(z, y, f"add{i}"), f"relu{i}")
    return bld.model("residual_blocks", x, (batch, c, hw, hw), [y])


def conv_pool(kind: str = "max", c: int = 16, hw: int = 8, batch: int = 1,
              seed: int = 0) -> onnx.ModelProto:
    """conv-relu followed by a pool: ``kind`` is ``max`` (3x3/2 pad 1), ``avg`` (2x2/2) or
    ``gap`` (GlobalAveragePool)."""
    b = Builder(seed)
    x = INPUT_NAME
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
    b = Builder(seed)
    x = INPUT_NAME
    y1 = b.conv(x, c, c, 3, name="conv_a", relu=True)
    y2 = b.conv(x, c, c, 1, name="conv_b")
    y = b.node("Concat", [y1, y2], "concat", axis=1)
    y = b.conv(y, 2 * c, c, 1, name="conv_c")
    return b.model("conv_concat", x, (batch, c, hw, hw), [y])


def conv_flatten_dense(c: int = 8, hw: int = 4, cout: int = 10, batch: int = 1,
                       seed: int = 0) -> onnx.ModelProto:
    """conv-relu, Flatten, Gemm: the classifier head of small CNNs."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.conv(x, c, c, 3, name="conv", relu=True)
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, c * hw * hw, cout, "fc")
    return b.model("conv_flatten_dense", x, (batch, c, hw, hw), [y])


def conv_unary(op: str = "Sigmoid", c: int = 8, hw: int = 8, batch: int = 1,
               seed: int = 0, alpha: float | None = None) -> onnx.ModelProto:
    """conv, one elementwise op, then another conv: ``Relu``, ``Clip`` (0..6), an activation
    (``Sigmoid``, ``Tanh``, ``HardSigmoid``, ``HardSwish``, ``LeakyRelu``, ``PRelu`` with one
    slope per channel, ``SiLU`` as an exporter writes it: ``Mul(x, Sigmoid(x))``) or an op
    without an integer form (``Softmax``). ``alpha``: the LeakyRelu's slope (default ONNX's
    0.01)."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.conv(x, c, c, 3, name="conv1")
    if op == "Clip":  # ReLU6
        lo, hi = b.init("clip_min", np.float32(0.0)), b.init("clip_max", np.float32(6.0))
        y = b.node("Clip", [y, lo, hi], "clip")
    elif op == "PRelu":
        slope = b.init("slope", b.rng.uniform(0.05, 0.4, (c, 1, 1)).astype(np.float32))
        y = b.node("PRelu", [y, slope], "prelu")
    elif op == "SiLU":
        y = b.node("Mul", [y, b.node("Sigmoid", [y], "silu_sigmoid")], "silu")
    else:
        attrs = {"axis": 1} if op == "Softmax" else {}
        if alpha is not None:
            attrs["alpha"] = float(alpha)
        y = b.node(op, [y], op.lower(), **attrs)
    y = b.conv(y, c, c, 3, name="conv2")
    return b.model(f"conv_{op.lower()}", x, (batch, c, hw, hw), [y])


def dilated_conv(b: Builder, x: str, cin: int, cout: int, dilation: int, name: str,
                 relu: bool = True) -> str:
    """A 3x3 conv with ``dilation`` and padding ``dilation`` (DeepLab's atrous conv: same size)."""
    y = b.conv(x, cin, cout, 3, pad=dilation, name=name, relu=relu)
    conv = next(n for n in reversed(b.nodes) if n.op_type == "Conv")
    conv.attribute.append(onnx.helper.make_attribute("dilations", [dilation, dilation]))
    return y


def aspp_head(c: int = 8, hw: int = 16, dilations: tuple[int, ...] = (2, 6, 12),
              batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """DeepLab's ASPP head: a 1x1 conv and 3x3 atrous convs (dilation d, padding d) of the same
    input, concatenated on channels, then a 1x1 projection (each conv with ReLU)."""
    b = Builder(seed)
    x = INPUT_NAME
    ys = [b.conv(x, c, c, 1, name="aspp_1x1", relu=True)]
    ys += [dilated_conv(b, x, c, c, d, f"aspp_d{d}") for d in dilations]
    y = b.concat(ys, "aspp_concat")
    y = b.conv(y, c * len(ys), c, 1, name="aspp_project", relu=True)
    return b.model("aspp_head", x, (batch, c, hw, hw), [y])


def single_dilated_conv(cin: int = 16, cout: int = 16, dilation: int = 2, hw: int = 12,
                        batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """conv3x3 -> one 3x3 Conv with ``dilation`` (padding = dilation) + Relu."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.conv(x, cin, cin, 3, name="conv", relu=True)
    y = dilated_conv(b, y, cin, cout, dilation, "dilated")
    return b.model("single_dilated_conv", x, (batch, cin, hw, hw), [y])


def squeeze_excitation(c: int = 16, hw: int = 8, squeeze: int = 4, batch: int = 1,
                       seed: int = 0) -> onnx.ModelProto:
    """An EfficientNet block: conv-SiLU, then squeeze-excitation (GlobalAveragePool -> 1x1
    conv -> SiLU -> 1x1 conv -> Sigmoid -> Mul with the feature map), then a 1x1 conv."""
    b = Builder(seed)
    x = INPUT_NAME

    def silu(v, name):
        return b.node("Mul", [v, b.node("Sigmoid", [v], f"{name}_sigmoid")], name)

    y = silu(b.conv(x, c, c, 3, name="conv"), "conv_silu")
    g = b.node("GlobalAveragePool", [y], "se_pool")
    g = silu(b.conv(g, c, squeeze, 1, name="se_reduce"), "se_silu")
    g = b.node("Sigmoid", [b.conv(g, squeeze, c, 1, name="se_expand")], "se_gate")
    y = b.node("Mul", [y, g], "se_scale")
    y = b.conv(y, c, c, 1, name="project")
    return b.model("squeeze_excitation", x, (batch, c, hw, hw), [y])


def relu_batchnorm(c: int = 8, hw: int = 8, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """conv-relu, BatchNormalization (after the ReLU: nothing folds it into the conv, so the
    quantized model keeps it between Q/DQ nodes), then a conv."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.conv(x, c, c, 3, name="conv1", relu=True)
    params = [b.init(n, v.astype(np.float32)) for n, v in (
        ("bn_scale", b.rng.uniform(-1.5, 1.5, c)), ("bn_bias", b.rng.normal(0, .3, c)),
        ("bn_mean", b.rng.uniform(0, .5, c)), ("bn_var", b.rng.uniform(.2, 2, c)))]
    y = b.node("BatchNormalization", [y, *params], "bn")
    y = b.conv(y, c, c, 3, name="conv2")
    return b.model("relu_batchnorm", x, (batch, c, hw, hw), [y])


def conv_batchnorm(c: int = 8, hw: int = 8, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Conv 3x3 (no bias) -> BatchNormalization -> Relu, as a training export has it (the
    quantizer's pre-processing folds the BN into the conv)."""
    b = Builder(seed)
    x = INPUT_NAME
    w = b.init("conv_w", b.rng.normal(0, .3, (c, c, 3, 3)).astype(np.float32))
    y = b.node("Conv", [x, w], "conv", pads=[1] * 4)
    params = [b.init(n, v.astype(np.float32)) for n, v in (
        ("bn_scale", b.rng.uniform(-1.5, 1.5, c)), ("bn_bias", b.rng.normal(0, .2, c)),
        ("bn_mean", b.rng.normal(0, .2, c)), ("bn_var", b.rng.uniform(.5, 2, c)))]
    y = b.relu(b.node("BatchNormalization", [y, *params], "bn"), "relu")
    return b.model("conv_batchnorm", x, (batch, c, hw, hw), [y])


def conv_product(c: int = 8, hw: int = 8, other: str = "map", batch: int = 1,
                 seed: int = 0) -> onnx.ModelProto:
    """Two convs of the input multiplied, then a 1x1 conv: ``other`` is the second factor's
    shape, ``"map"`` (N, C, H, W) like the first or ``"spatial"`` (N, 1, H, W), a one-channel
    attention map broadcast over the channels."""
    b = Builder(seed)
    x = INPUT_NAME
    y = b.conv(x, c, c, 3, name="conv_a")
    g = b.conv(x, c, c if other == "map" else 1, 3, name="conv_b")
    y = b.conv(b.node("Mul", [y, g], "product"), c, c, 1, name="project")
    return b.model("conv_product", x, (batch, c, hw, hw), [y])


def conv_pool_flatten(c: int = 8, hw: int = 8, batch: int = 1, seed: int = 0
                      ) -> onnx.ModelProto:
    """conv-relu, GlobalAveragePool, Flatten as the model output (SqueezeNet's head)."""
    b = Builder(seed)
    y = b.relu(b.conv(INPUT_NAME, c, c, 3, name="conv"), "relu")
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y], "avgpool")], "flatten", axis=1)
    return b.model("conv_pool_flatten", INPUT_NAME, (batch, c, hw, hw), [y])


#: the builders above by name
MODELS = {name: globals()[name] for name in (
    "single_conv", "single_pool", "single_upsample", "single_deconv", "single_dilated_conv",
    "single_dense", "conv_residual", "conv_chain_residual", "residual_blocks", "conv_pool",
    "conv_concat", "conv_flatten_dense", "conv_unary", "aspp_head", "squeeze_excitation",
    "relu_batchnorm", "conv_batchnorm", "conv_product", "conv_pool_flatten")}


def quantized(name: str, activation_type: str = "int8", per_channel: bool | None = None,
              power_of_two: bool = False, **kwargs) -> onnx.ModelProto:
    """Build model ``name`` (one above or a zoo network) with ``kwargs`` and quantize it
    (cached)."""
    builder = MODELS.get(name) or zoo.MODELS.get(name)
    if builder is None:
        raise ValueError(f"unknown model {name!r} ({', '.join([*MODELS, *zoo.MODELS])})")
    return ort_quantize(builder(**kwargs), activation_type, per_channel,
                        power_of_two=power_of_two)


def ort_run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The first output of ``m`` run by onnxruntime (default session options) on input ``x``."""
    import onnxruntime as ort

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {m.graph.input[0].name: x})[0]


def output_step(m: onnx.ModelProto) -> float:
    """Scale of the model output's last QuantizeLinear (one output LSB)."""
    q = [n for n in m.graph.node if n.op_type == "QuantizeLinear"][-1]
    init = {t.name: t for t in m.graph.initializer}
    return float(onnx.numpy_helper.to_array(init[q.input[1]]))
