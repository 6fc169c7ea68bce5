"""Target-independent integer layer IR: what an offloaded Relax function computes.

Lowering turns each offloaded ``Codegen`` function into a :class:`LayerGraph` of the layers below;
a target's strategy turns that into its program. All arithmetic is the canonical integer
arithmetic of the numerics contract (ARCHITECTURE.md section 4), and :func:`reference_execute`
computes it in numpy (int64, no overflow) so strategies can be tested without TVM.

Requantize (one recipe form for every target)::

    t = acc >> pre_shift                      # arithmetic (floor) shift
    t = t * multiplier[c] + round_add[c]      # per output channel c
    t = (t >> shift) + zero_point
    y = clip(t, qmin, qmax)                   # qmin/qmax also carry a fused ReLU/Clip

Targets choose ``pre_shift``, ``multiplier``, ``round_add`` and ``shift`` so the integers best
approximate the float scale under their hardware limits (``scale`` keeps the float value for the
error report).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DTYPE_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


@dataclass
class Requant:
    """Integer requantize recipe; arrays are per output channel (length K) or length 1."""

    pre_shift: int
    multiplier: np.ndarray
    round_add: np.ndarray
    shift: int
    zero_point: int
    qmin: int
    qmax: int
    scale: np.ndarray = field(default_factory=lambda: np.ones(1))

    def apply(self, acc: np.ndarray, channel_axis: int = 1) -> np.ndarray:
        """Apply to an int64 array whose ``channel_axis`` indexes the multiplier arrays."""
        shape = [1] * acc.ndim
        shape[channel_axis] = -1
        m = np.asarray(self.multiplier, dtype=np.int64).reshape(shape)
        r = np.asarray(self.round_add, dtype=np.int64).reshape(shape)
        t = (acc.astype(np.int64) >> self.pre_shift) * m + r
        t = (t >> self.shift) + self.zero_point
        return np.clip(t, self.qmin, self.qmax)

    @property
    def effective_scale(self) -> np.ndarray:
        return np.asarray(self.multiplier, dtype=np.float64) / 2.0 ** (self.pre_shift + self.shift)

    @property
    def max_rel_error(self) -> float:
        """Largest relative error of the integer scale against the float scale."""
        s = np.broadcast_to(np.asarray(self.scale, dtype=np.float64), self.effective_scale.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            err = np.abs(self.effective_scale - s) / np.abs(s)
        err = np.where(s == 0, 0.0, err)
        return float(err.max()) if err.size else 0.0


@dataclass
class Tensor:
    """A quantized activation: NCHW (or N x C for dense) integer tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class ConvLayer:
    """``acc = conv(x - input_zero_point, weight) + bias``; ``y = requant(acc)``.

    ``weight`` already has the weight zero point subtracted (OIHW, int64 values). A dense layer
    is a 1x1 convolution on an (N, C, 1, 1) view with ``is_dense`` set; its tensors are (N, C).
    Spatial padding pads ``x`` with ``input_zero_point`` (i.e. real 0.0).
    """

    name: str
    input: str
    output: str
    weight: np.ndarray
    bias: np.ndarray
    input_zero_point: int
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    requant: Requant
    is_dense: bool = False
    op_name: str = "conv2d"

    @property
    def kernel(self) -> tuple[int, int]:
        return int(self.weight.shape[2]), int(self.weight.shape[3])


@dataclass
class AddLayer:
    """Residual add: ``t = (a - za) * ma + (b - zb) * mb``; ``y = requant(t)`` (pre_shift 0,
    multiplier 1)."""

    name: str
    inputs: tuple[str, str]
    output: str
    a_zero_point: int
    b_zero_point: int
    a_multiplier: int
    b_multiplier: int
    requant: Requant
    op_name: str = "add"


Layer = ConvLayer | AddLayer


@dataclass
class LayerGraph:
    """Layers in topological order over named tensors; ``inputs``/``outputs`` are the function's."""

    tensors: dict[str, Tensor]
    layers: list[Layer]
    inputs: list[str]
    outputs: list[str]


def conv_output_shape(layer: ConvLayer, in_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    n, _, h, w = in_shape if len(in_shape) == 4 else (*in_shape, 1, 1)
    kh, kw = layer.kernel
    pt, pl, pb, pr = layer.padding
    sh, sw = layer.strides
    return (n, layer.weight.shape[0], (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1)


def conv_accumulate(x: np.ndarray, layer: ConvLayer) -> np.ndarray:
    """int64 accumulator of a conv layer on an NCHW (or NC) integer input."""
    x4 = x.reshape(x.shape[0], x.shape[1], 1, 1) if x.ndim == 2 else x
    xc = x4.astype(np.int64) - layer.input_zero_point
    pt, pl, pb, pr = layer.padding
    xp = np.pad(xc, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    kh, kw = layer.kernel
    sh, sw = layer.strides
    n, k, ho, wo = conv_output_shape(layer, x4.shape)
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    win = win[:, :, : (ho - 1) * sh + 1 : sh, : (wo - 1) * sw + 1 : sw]
    acc = np.einsum("nchwij,kcij->nkhw", win, layer.weight.astype(np.int64), optimize=True)
    return acc + layer.bias.astype(np.int64).reshape(1, -1, 1, 1)


def reference_execute(graph: LayerGraph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a layer graph in numpy with the canonical integer semantics (the contract)."""
    env = dict(inputs)
    for layer in graph.layers:
        if isinstance(layer, ConvLayer):
            acc = conv_accumulate(env[layer.input], layer)
            y = layer.requant.apply(acc)
            if layer.is_dense:
                y = y.reshape(y.shape[0], y.shape[1])
        else:
            a, b = (env[n].astype(np.int64) for n in layer.inputs)
            t = (a - layer.a_zero_point) * layer.a_multiplier + (b - layer.b_zero_point) * (
                layer.b_multiplier)
            y = layer.requant.apply(t)
        env[layer.output] = y.astype(graph.tensors[layer.output].dtype)
    return {name: env[name] for name in graph.outputs}
