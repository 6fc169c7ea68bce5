"""The zoo's node builder: :class:`Builder` accumulates ONNX nodes and seeded initializers
(convs with a folded or an explicit batch norm, pools, activations, squeeze-excitation, ...)
and closes them into a checked float model (opset 17, NCHW, static shapes)."""

from __future__ import annotations

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
             name: str = "conv", bias: bool = True, relu: bool = False, groups: int = 1,
             dilation: int = 1, bn: bool = False) -> str:
        """Conv with He-initialized weights and a folded batch norm (per-channel gain/shift);
        ``k`` and ``stride`` an int or ``(h, w)``, ``pad`` an int or ONNX's 4 pads (default:
        "same" for the ``dilation``). ``bn=True`` keeps the batch norm as a
        BatchNormalization node after a conv without bias, as a training framework exports
        it (:meth:`batch_norm`)."""
        kh, kw = (k, k) if isinstance(k, int) else k
        pads = [dilation * (kh // 2), dilation * (kw // 2)] * 2 if pad is None else (
            [pad] * 4 if isinstance(pad, int) else list(pad))
        strides = [stride] * 2 if isinstance(stride, int) else list(stride)
        fan_in = cin // groups * kh * kw
        w = self.rng.normal(0.0, np.sqrt(2.0 / fan_in), (cout, cin // groups, kh, kw))
        if not bn:
            w = w * self.rng.uniform(0.5, 1.5, (cout, 1, 1, 1))  # folded BN gamma / sqrt(var)
        name = self.name(name)
        inputs = [x, self.init(f"{name}.weight", w.astype(np.float32))]
        if bias and not bn:
            inputs.append(self.init(f"{name}.bias",
                                    self.rng.normal(0.0, 0.1, cout).astype(np.float32)))
        out = f"{name}_out"
        attrs: dict[str, Any] = dict(kernel_shape=[kh, kw], strides=strides, pads=pads,
                                     group=groups)
        if dilation != 1:
            attrs["dilations"] = [dilation, dilation]
        self.nodes.append(helper.make_node("Conv", inputs, [out], name=name, **attrs))
        if bn:
            out = self.batch_norm(out, cout, f"{name}.bn")
        return self.relu(out, f"{name}_relu") if relu else out

    def batch_norm(self, x: str, c: int, name: str = "bn") -> str:
        """BatchNormalization (inference form) with seeded gamma, beta, running mean and
        variance."""
        name = self.name(name)
        params = [self.init(f"{name}.{p}", v.astype(np.float32)) for p, v in (
            ("weight", self.rng.uniform(0.5, 1.5, c)), ("bias", self.rng.normal(0.0, 0.1, c)),
            ("running_mean", self.rng.normal(0.0, 0.1, c)),
            ("running_var", self.rng.uniform(0.5, 1.5, c)))]
        out = f"{name}_out"
        self.nodes.append(helper.make_node("BatchNormalization", [x, *params], [out],
                                           name=name, epsilon=1e-5))
        return out

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

    def relu6(self, x: str, name: str = "relu6") -> str:
        """ReLU6 as ONNX exports it: Clip(x, 0, 6)."""
        name = self.name(name)
        lo = self.init(f"{name}.min", np.array(0.0, dtype=np.float32))
        hi = self.init(f"{name}.max", np.array(6.0, dtype=np.float32))
        return self.node("Clip", [x, lo, hi], name)

    def silu(self, x: str, name: str = "silu") -> str:
        """SiLU / swish, x * sigmoid(x), as exporters write it: a Sigmoid and a Mul."""
        return self.node("Mul", [x, self.node("Sigmoid", [x], f"{name}.sigmoid")],
                         f"{name}.mul")

    def act(self, x: str, kind: str | None, name: str) -> str:
        """Activation ``kind``: relu, relu6, silu, leaky (LeakyRelu 0.1) or None (linear)."""
        if kind is None:
            return x
        if kind == "relu":
            return self.relu(x, f"{name}_relu")
        if kind == "relu6":
            return self.relu6(x, f"{name}_relu6")
        if kind == "silu":
            return self.silu(x, f"{name}_silu")
        if kind == "leaky":
            return self.node("LeakyRelu", [x], f"{name}_leaky", alpha=0.1)
        raise ValueError(f"unknown activation {kind!r} (relu, relu6, silu, leaky)")

    def squeeze_excite(self, x: str, c: int, cr: int, name: str) -> str:
        """Squeeze-and-excitation (EfficientNet's form): GlobalAveragePool -> 1x1 conv to
        ``cr`` channels -> SiLU -> 1x1 conv back to ``c`` -> Sigmoid, times ``x`` per
        channel."""
        s = self.node("GlobalAveragePool", [x], f"{name}.squeeze")
        s = self.silu(self.conv(s, c, cr, 1, name=f"{name}.reduce"), f"{name}.reduce_silu")
        s = self.conv(s, cr, c, 1, name=f"{name}.expand")
        return self.node("Mul", [x, self.node("Sigmoid", [s], f"{name}.gate")],
                         f"{name}.scale")

    def add(self, a: str, b: str, name: str = "add") -> str:
        return self.node("Add", [a, b], name)

    def pool(self, x: str, kind: str, k: int, stride: int, pad: int | list[int] = 0,
             name: str | None = None, count_include_pad: bool = True,
             ceil_mode: bool = False) -> str:
        """MaxPool / AveragePool (``kind`` max / avg) with a square kernel; ``pad`` is one value
        or the 4 ONNX pads (top, left, bottom, right)."""
        pads = list(pad) if isinstance(pad, (list, tuple)) else [pad] * 4
        attrs: dict[str, Any] = dict(kernel_shape=[k, k], strides=[stride, stride], pads=pads)
        if ceil_mode:
            attrs["ceil_mode"] = 1
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

    def inverted_residual(self, x: str, cin: int, cout: int, expand: int, stride: int,
                          name: str, k: int = 3, act: str = "relu6", se: float = 0.0) -> str:
        """MobileNetV2's inverted residual / EfficientNet's MBConv: 1x1 expansion to
        ``expand`` x ``cin`` channels (skipped for 1) -> ``act``, k x k depthwise (``stride``)
        -> ``act``, squeeze-excitation to ``se`` x ``cin`` channels (0: none), linear 1x1
        projection to ``cout``; a residual add when the shape is kept."""
        hidden = cin * expand
        y = x
        if expand != 1:
            y = self.act(self.conv(x, cin, hidden, 1, name=f"{name}.expand"), act,
                         f"{name}.expand")
        y = self.act(self.conv(y, hidden, hidden, k, stride, name=f"{name}.dw", groups=hidden),
                     act, f"{name}.dw")
        if se:
            y = self.squeeze_excite(y, hidden, max(1, int(cin * se)), f"{name}.se")
        y = self.conv(y, hidden, cout, 1, name=f"{name}.project")
        return self.add(y, x, f"{name}.add") if stride == 1 and cin == cout else y

    def fire(self, x: str, cin: int, squeeze: int, e1: int, e3: int, name: str) -> str:
        """SqueezeNet's fire module: 1x1 squeeze -> relu, then 1x1 and 3x3 expands (relu)
        concatenated."""
        s = self.conv(x, cin, squeeze, 1, name=f"{name}.squeeze", relu=True)
        a = self.conv(s, squeeze, e1, 1, name=f"{name}.expand1x1", relu=True)
        b = self.conv(s, squeeze, e3, 3, name=f"{name}.expand3x3", relu=True)
        return self.concat([a, b], f"{name}.concat")

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




def scaled(c: int, width: float) -> int:
    """Channel count scaled by ``width`` (at least 4, a multiple of 4)."""
    return max(4, int(round(c * width / 4.0)) * 4) if width != 1.0 else c


def check_hw(hw: int, multiple: int, name: str) -> None:
    """``hw`` must be a positive multiple of the network's total stride."""
    if hw < multiple or hw % multiple:
        raise ValueError(f"{name}: hw must be a positive multiple of {multiple}, got {hw}")
