"""Target-independent integer layer IR: what an offloaded Relax function computes.

Lowering turns each offloaded ``Codegen`` function into a :class:`LayerGraph` of the layers below;
a target's strategy turns that into its program. All arithmetic is the canonical integer
arithmetic of the numerics contract (docs/architecture.md section 4), and :func:`reference_execute`
computes it in numpy (int64, no overflow) so strategies can be tested without TVM.

Requantize (one recipe form for every target)::

    t = acc >> pre_shift                      # arithmetic (floor) shift
    t = t * multiplier[c] + round_add[c]      # per output channel c
    t = (t >> shift) + zero_point
    y = clip(t, qmin, qmax)                   # qmin/qmax also carry a fused ReLU/Clip

Targets choose ``pre_shift``, ``multiplier``, ``round_add`` and ``shift`` so the integers best
approximate the float scale under their hardware limits (``scale`` keeps the float value for the
error report).

Layer kinds (each docstring gives the exact integer semantics; ``reference_execute`` implements
them): :class:`ConvLayer` (conv2d, grouped/depthwise conv, dense), :class:`AddLayer` (element-wise
add), :class:`PoolLayer` (max / average / global average pooling), :class:`ConcatLayer` (channel
concat), :class:`UpsampleLayer` (nearest-neighbour upsample by integer factors),
:class:`DeconvLayer` (transpose convolution), :class:`LutLayer` (a 256-entry table lookup: an
activation between Q/DQ nodes) and :class:`MulLayer` (the product of two quantized tensors).
Tensors are NCHW (NC for dense); every accumulator is computed in int64 so no intermediate can
overflow in the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """A quantized activation: NCHW (or N x C for dense) integer tensor.

    ``bits`` (2..8) is the value range inside the int8/uint8 container: signed
    ``[-2^(bits-1), 2^(bits-1) - 1]``, unsigned ``[0, 2^bits - 1]`` (sub-byte activations)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    bits: int = 8


@dataclass
class ConvLayer:
    """``acc = conv(x - input_zero_point, weight) + bias``; ``y = requant(acc)``.

    ``weight`` already has the weight zero point subtracted (OIHW, int64 values); with
    ``groups`` > 1 it is (K, C / groups, KH, KW) and output channel ``k`` reads input channels
    ``g * C/groups .. (g + 1) * C/groups - 1`` of its group ``g = k // (K / groups)``
    (depthwise: ``groups == C``). ``dilation`` (dh, dw) spaces the kernel taps: tap ``(i, j)``
    reads input row ``oy * SH + i * dh`` (padded coordinates), so the kernel spans
    ``(KH - 1) * dh + 1`` rows (likewise for columns). A dense layer is a 1x1 convolution on
    an (N, C, 1, 1) view with ``is_dense`` set; its tensors are (N, C). Spatial padding pads
    ``x`` with ``input_zero_point`` (i.e. real 0.0).
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
    groups: int = 1
    #: weight precision (2..8): ``weight`` values lie in the signed ``weight_bits`` range
    weight_bits: int = 8
    #: kernel dilation (dh, dw); 1 is a dense stencil
    dilation: tuple[int, int] = (1, 1)
    #: a table lookup fused after the requantize (an activation, docs/architecture.md 4.4):
    #: ``(K, 256)`` rows (K = 1, or one per channel), ``y = lut[c, y - lut_lo]``; None: none
    lut: np.ndarray | None = None
    #: the smallest code of the requantized dtype (-128 for int8, 0 for uint8)
    lut_lo: int = -128

    @property
    def kernel(self) -> tuple[int, int]:
        return int(self.weight.shape[2]), int(self.weight.shape[3])

    def apply_lut(self, y: np.ndarray, channel_axis: int = 1) -> np.ndarray:
        """The fused table lookup on the requantized output ``y`` (identity without one)."""
        if self.lut is None:
            return y
        lut = np.asarray(self.lut, dtype=np.int64)
        idx = y.astype(np.int64) - self.lut_lo
        if lut.shape[0] == 1:
            return lut[0][idx]
        shape = [1] * y.ndim
        shape[channel_axis] = lut.shape[0]
        return lut.reshape(-1)[idx + 256 * np.arange(lut.shape[0]).reshape(shape)]

    @property
    def dilated_kernel(self) -> tuple[int, int]:
        """Rows and columns the kernel spans: ``(KH - 1) * dh + 1`` x ``(KW - 1) * dw + 1``."""
        (kh, kw), (dh, dw) = self.kernel, self.dilation
        return (kh - 1) * int(dh) + 1, (kw - 1) * int(dw) + 1

    @property
    def is_depthwise(self) -> bool:
        """One input channel per group (``weight`` is (K, 1, KH, KW)) and ``groups > 1``."""
        return self.groups > 1 and int(self.weight.shape[1]) == 1


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


@dataclass
class PoolLayer:
    """Max or average pooling over ``kernel`` windows with ``strides`` and ``padding``
    (top, left, bottom, right); output size ``(H + pt + pb - KH) // SH + 1`` (floor, no ceil
    mode).

    - ``kind == "max"``: ``v = max`` over the window of ``x`` padded with the minimum of the input
      dtype (-128 for int8, 0 for uint8), so padding never wins; then ``y = v`` if ``requant``
      is None (same quantization in and out), else ``y = requant(v - input_zero_point)``.
    - ``kind == "avg"``: ``acc = sum`` over the window of ``x - input_zero_point``, padded with 0
      (i.e. real 0.0; the divisor is always ``KH * KW``: ONNX ``count_include_pad=1``, or no
      padding); ``y = requant(acc)``. The division by the window is part of the requant scale
      (``s_in / (s_out * KH * KW)``). A global average pool is ``kind == "avg"`` with the
      kernel equal to the input's H x W and ``op_name == "global_avg_pool2d"``.
    """

    name: str
    input: str
    output: str
    kind: str
    kernel: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    input_zero_point: int = 0
    requant: Requant | None = None
    op_name: str = ""

    def __post_init__(self):
        if self.kind not in ("max", "avg"):
            raise ValueError(f"pool kind must be 'max' or 'avg', not {self.kind!r}")
        if self.kind == "avg" and self.requant is None:
            raise ValueError("an average pool needs a requant (the window divisor lives there)")
        if not self.op_name:
            self.op_name = f"{self.kind}_pool2d"

    @property
    def window(self) -> int:
        return int(self.kernel[0]) * int(self.kernel[1])


@dataclass
class ConcatLayer:
    """Concatenation along channels (axis 1) of ``inputs`` in order.

    Input ``i`` is taken as is when ``requants[i]`` is None (its quantization equals the
    output's), else as ``requants[i](x_i - input_zero_points[i])`` (the canonical requant
    chain, e.g. a power-of-two shift that aligns the scales). A DPU-style target implements
    the identity inputs "by placement": the producers write straight into their channel range
    of the output.
    """

    name: str
    inputs: tuple[str, ...]
    output: str
    input_zero_points: tuple[int, ...]
    requants: tuple[Requant | None, ...]
    axis: int = 1
    op_name: str = "concat"


@dataclass
class UpsampleLayer:
    """Nearest-neighbour upsample by integer factors: ``v[n, c, i, j] = x[n, c, i // SH, j // SW]``
    with ``scale == (SH, SW)``; ``y = v`` if ``requant`` is None, else
    ``y = requant(v - input_zero_point)``. (ONNX Resize/Upsample in nearest mode with integer
    scales maps output pixel ``i`` to input ``i // S`` for the ``asymmetric``/``half_pixel``
    coordinate modes with floor / round-prefer-floor rounding; the canonicalizer only produces
    this layer when the mapping is exactly that.)
    """

    name: str
    input: str
    output: str
    scale: tuple[int, int]
    input_zero_point: int = 0
    requant: Requant | None = None
    op_name: str = "upsample"


@dataclass
class DeconvLayer:
    """Transpose convolution (ONNX ConvTranspose), then ``y = requant(acc)``.

    ``weight`` is (C, K / groups, KH, KW) (IOHW) with the weight zero point already subtracted.
    With ``xc = x - input_zero_point``, every input pixel scatters into a full-size
    accumulator::

        full[n, g*Kg + k, ih*SH + i*DH, iw*SW + j*DW] += xc[n, c, ih, iw] * weight[c, k, i, j]

    for ``c`` in group ``g`` (``Kg = K / groups``); the output is the crop
    ``full[:, :, pt : pt + Ho, pl : pl + Wo] + bias`` with
    ``Ho = (H - 1) * SH - pt - pb + DH * (KH - 1) + output_padding[0] + 1`` (same for W), where
    positions beyond ``full`` (reached only through ``output_padding``) hold 0. ``padding`` is
    (top, left, bottom, right).
    """

    name: str
    input: str
    output: str
    weight: np.ndarray
    bias: np.ndarray
    input_zero_point: int
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    output_padding: tuple[int, int]
    requant: Requant
    groups: int = 1
    dilation: tuple[int, int] = (1, 1)
    op_name: str = "conv2d_transpose"

    @property
    def kernel(self) -> tuple[int, int]:
        return int(self.weight.shape[2]), int(self.weight.shape[3])

    @property
    def out_channels(self) -> int:
        return int(self.weight.shape[1]) * self.groups


@dataclass
class LutLayer:
    """Table lookup of an 8-bit input (an activation: docs/architecture.md section 4.4):
    ``y[n, c, ...] = table[c if K > 1 else 0, x[n, c, ...] - lo]`` with ``table`` the
    ``(K, 256)`` outputs (K = 1, or one row per channel) and ``lo`` the input dtype's minimum
    (-128 for int8, 0 for uint8)."""

    name: str
    input: str
    output: str
    table: np.ndarray
    op_name: str = "lut"


def lut_execute(x: np.ndarray, layer: LutLayer, dtype: str) -> np.ndarray:
    """numpy semantics of a :class:`LutLayer` whose input has ``dtype`` (channel axis 1)."""
    idx = x.astype(np.int64) - DTYPE_RANGE[dtype][0]
    t = np.asarray(layer.table)
    if t.shape[0] == 1:
        return t[0][idx]
    ch = np.arange(t.shape[0]).reshape((1, -1) + (1,) * (x.ndim - 2))
    return t[ch, idx]


@dataclass
class MulLayer:
    """Product of two quantized tensors (a squeeze-excitation gate):
    ``y = requant((a - za) * (b - zb))``, numpy broadcasting (e.g. ``b`` of shape (N, C, 1, 1)
    against ``a`` of (N, C, H, W)); the int64 product is exact."""

    name: str
    inputs: tuple[str, str]
    output: str
    a_zero_point: int
    b_zero_point: int
    requant: Requant
    op_name: str = "multiply"


Layer = (ConvLayer | AddLayer | PoolLayer | ConcatLayer | UpsampleLayer | DeconvLayer | LutLayer
         | MulLayer)


@dataclass
class LayerGraph:
    """Layers in topological order over named tensors; ``inputs``/``outputs`` are the function's."""

    tensors: dict[str, Tensor]
    layers: list[Layer]
    inputs: list[str]
    outputs: list[str]


def conv_output_shape(layer: ConvLayer, in_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """NCHW output shape of a conv layer (dilation included) on an NCHW or NC input."""
    n, _, h, w = in_shape if len(in_shape) == 4 else (*in_shape, 1, 1)
    kh, kw = layer.dilated_kernel
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
    dh, dw = (int(d) for d in layer.dilation)
    sh, sw = layer.strides
    n, k, ho, wo = conv_output_shape(layer, x4.shape)
    win = np.lib.stride_tricks.sliding_window_view(xp, layer.dilated_kernel, axis=(2, 3))
    win = win[:, :, : (ho - 1) * sh + 1 : sh, : (wo - 1) * sw + 1 : sw, ::dh, ::dw]
    w = layer.weight.astype(np.int64)
    g = int(layer.groups)
    if g == 1:
        acc = np.einsum("nchwij,kcij->nkhw", win, w, optimize=True)
    else:
        c = xc.shape[1]
        if c % g or k % g or w.shape[1] != c // g:
            raise ValueError(f"layer {layer.name}: {c} input / {k} output channels and weight "
                             f"{w.shape} do not fit {g} groups")
        wg = win.reshape(n, g, c // g, ho, wo, kh, kw)
        acc = np.einsum("ngchwij,gkcij->ngkhw", wg, w.reshape(g, k // g, c // g, kh, kw),
                        optimize=True).reshape(n, k, ho, wo)
    return acc + layer.bias.astype(np.int64).reshape(1, -1, 1, 1)


def pool_output_shape(layer: PoolLayer, in_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    n, c, h, w = in_shape
    kh, kw = layer.kernel
    pt, pl, pb, pr = layer.padding
    sh, sw = layer.strides
    return (n, c, (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1)


def pool_execute(x: np.ndarray, layer: PoolLayer, dtype: str | None = None) -> np.ndarray:
    """int64 result of a pool layer before its final cast (requant applied if any); ``dtype``
    is the input tensor's (its minimum pads a max pool; default ``x.dtype``)."""
    pt, pl, pb, pr = layer.padding
    kh, kw = layer.kernel
    sh, sw = layer.strides
    _, _, ho, wo = pool_output_shape(layer, x.shape)
    if layer.kind == "max":
        lo = DTYPE_RANGE.get(str(dtype or x.dtype), (np.iinfo(np.int64).min, 0))[0]
        xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=lo)
    else:
        xc = x.astype(np.int64) - layer.input_zero_point
        xp = np.pad(xc, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    win = win[:, :, : (ho - 1) * sh + 1 : sh, : (wo - 1) * sw + 1 : sw]
    if layer.kind == "avg":
        if layer.requant is None:
            raise AttributeError(f"layer {layer.name}: an average pool has no requant")
        return layer.requant.apply(win.sum(axis=(4, 5)))
    v = win.max(axis=(4, 5))
    return v if layer.requant is None else layer.requant.apply(v - layer.input_zero_point)


def upsample_execute(x: np.ndarray, layer: UpsampleLayer) -> np.ndarray:
    sh, sw = layer.scale
    v = x.astype(np.int64).repeat(sh, axis=2).repeat(sw, axis=3)
    return v if layer.requant is None else layer.requant.apply(v - layer.input_zero_point)


def concat_execute(xs: list[np.ndarray], layer: ConcatLayer) -> np.ndarray:
    parts = []
    for x, z, rq in zip(xs, layer.input_zero_points, layer.requants, strict=True):
        v = x.astype(np.int64)
        parts.append(v if rq is None else rq.apply(v - z))
    return np.concatenate(parts, axis=layer.axis)


def deconv_output_shape(layer: DeconvLayer, in_shape: tuple[int, ...]) -> tuple[int, ...]:
    n, _, h, w = in_shape
    kh, kw = layer.kernel
    pt, pl, pb, pr = layer.padding
    sh, sw = layer.strides
    dh, dw = layer.dilation
    oph, opw = layer.output_padding
    return (n, layer.out_channels, (h - 1) * sh - pt - pb + dh * (kh - 1) + oph + 1,
            (w - 1) * sw - pl - pr + dw * (kw - 1) + opw + 1)


def deconv_accumulate(x: np.ndarray, layer: DeconvLayer) -> np.ndarray:
    """int64 accumulator (bias included, before requant) of a transpose convolution."""
    xc = x.astype(np.int64) - layer.input_zero_point
    n, c, h, w = xc.shape
    g = int(layer.groups)
    w_ = layer.weight.astype(np.int64)
    kg = int(w_.shape[1])
    if c % g or w_.shape[0] != c:
        raise ValueError(f"layer {layer.name}: {c} input channels and weight {w_.shape} do not "
                         f"fit {g} groups")
    kh, kw = layer.kernel
    sh, sw = layer.strides
    dh, dw = layer.dilation
    pt, pl, _, _ = layer.padding
    _, k, ho, wo = deconv_output_shape(layer, xc.shape)
    fh = max((h - 1) * sh + dh * (kh - 1) + 1, pt + ho)
    fw = max((w - 1) * sw + dw * (kw - 1) + 1, pl + wo)
    full = np.zeros((n, k, fh, fw), dtype=np.int64)
    xg = xc.reshape(n, g, c // g, h, w)
    wgt = w_.reshape(g, c // g, kg, kh, kw)
    for i in range(kh):
        for j in range(kw):
            contrib = np.einsum("ngchw,gck->ngkhw", xg, wgt[:, :, :, i, j],
                                optimize=True).reshape(n, k, h, w)
            full[:, :, i * dh: i * dh + (h - 1) * sh + 1: sh,
                 j * dw: j * dw + (w - 1) * sw + 1: sw] += contrib
    return full[:, :, pt: pt + ho, pl: pl + wo] + layer.bias.astype(np.int64).reshape(1, -1, 1, 1)


@dataclass
class SubConv:
    """One convolution of the sub-kernel decomposition of a transpose convolution.

    ``conv`` is a stride-1 :class:`ConvLayer` on the deconv's input (same input zero point,
    bias and requant; its padding pads with the zero point, i.e. real 0). Its output rows
    ``crop[0] .. crop[0] + count[0] - 1`` (columns likewise) are the deconv's output rows
    ``offset[0], offset[0] + SH, ...``: the shuffle interleaves the ``SH x SW`` phases.
    """

    phase: tuple[int, int]
    conv: ConvLayer
    crop: tuple[int, int]
    count: tuple[int, int]
    offset: tuple[int, int]


def deconv_subconvs(layer: DeconvLayer, in_shape: tuple[int, ...]) -> list[SubConv]:
    """Transpose convolution as ``SH * SW`` ordinary convolutions plus a shuffle (the DPU
    paper's "deconvolution = convolution series", section VIII), for dilation 1.

    Output row ``oy`` receives the kernel taps ``i = r + SH * t`` of phase ``r = (oy + pt) mod
    SH`` from input rows ``q - t`` with ``q = (oy + pt) // SH``: a stride-1 correlation of the
    input with the phase's taps in reverse order (the sub-kernel, ``ceil((KH - r) / SH)`` rows;
    a phase without taps gets one zero row, i.e. bias only), padded by ``taps - 1`` in front.
    Weights become OIHW per group, so the sub-convs keep ``groups``.
    """
    if tuple(layer.dilation) != (1, 1):
        raise ValueError(f"layer {layer.name}: sub-kernel decomposition needs dilation 1")
    _, c, h, w = in_shape
    g = int(layer.groups)
    wt = layer.weight.astype(np.int64)
    kg = int(wt.shape[1])
    kh, kw = layer.kernel
    sh, sw = layer.strides
    pt, pl, _, _ = layer.padding
    _, k, ho, wo = deconv_output_shape(layer, in_shape)
    # OIHW per group: (g*Kg + k, c_local, i, j) = weight[g*C/g + c_local, k, i, j]
    oihw = wt.reshape(g, c // g, kg, kh, kw).transpose(0, 2, 1, 3, 4).reshape(k, c // g, kh, kw)

    def axis_plan(r, s, ksz, pad, n_in, n_out):
        taps = list(range(r, ksz, s))[::-1] or [None]
        first = (r - pad) % s                       # first output index of this phase
        count = len(range(first, n_out, s))
        crop = (first + pad) // s                   # sub-conv output index of that output
        after = max(0, crop + count - n_in)         # padding behind so every needed row exists
        return taps, first, count, crop, after

    subs = []
    for rh in range(sh):
        th, oy0, nh, qh, pbh = axis_plan(rh, sh, kh, pt, h, ho)
        for rw in range(sw):
            tw, ox0, nw, qw, pbw = axis_plan(rw, sw, kw, pl, w, wo)
            if nh == 0 or nw == 0:
                continue
            sub = np.zeros((k, c // g, len(th), len(tw)), dtype=np.int64)
            for a, i in enumerate(th):
                for b, j in enumerate(tw):
                    if i is not None and j is not None:
                        sub[:, :, a, b] = oihw[:, :, i, j]
            conv = ConvLayer(name=f"{layer.name}_sub{rh}{rw}", input=layer.input,
                             output=f"{layer.name}_sub{rh}{rw}", weight=sub, bias=layer.bias,
                             input_zero_point=layer.input_zero_point, strides=(1, 1),
                             padding=(len(th) - 1, len(tw) - 1, pbh, pbw),
                             requant=layer.requant, groups=g)
            subs.append(SubConv((rh, rw), conv, (qh, qw), (nh, nw), (oy0, ox0)))
    return subs


def deconv_by_subconvs(x: np.ndarray, layer: DeconvLayer) -> np.ndarray:
    """:func:`deconv_accumulate` computed with :func:`deconv_subconvs` and the shuffle (int64
    accumulators, bias included)."""
    n, k, ho, wo = deconv_output_shape(layer, x.shape)
    out = np.zeros((n, k, ho, wo), dtype=np.int64)
    sh, sw = layer.strides
    for sc in deconv_subconvs(layer, x.shape):
        acc = conv_accumulate(x, sc.conv)
        (qh, qw), (nh, nw), (oy, ox) = sc.crop, sc.count, sc.offset
        out[:, :, oy::sh, ox::sw] = acc[:, :, qh:qh + nh, qw:qw + nw]
    return out


def reference_execute(graph: LayerGraph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a layer graph in numpy with the canonical integer semantics (the contract)."""
    env = dict(inputs)
    for layer in graph.layers:
        if isinstance(layer, ConvLayer):
            acc = conv_accumulate(env[layer.input], layer)
            y = layer.apply_lut(layer.requant.apply(acc))
            if layer.is_dense:
                y = y.reshape(y.shape[0], y.shape[1])
        elif isinstance(layer, AddLayer):
            a, b = (env[n].astype(np.int64) for n in layer.inputs)
            t = (a - layer.a_zero_point) * layer.a_multiplier + (b - layer.b_zero_point) * (
                layer.b_multiplier)
            y = layer.requant.apply(t)
        elif isinstance(layer, PoolLayer):
            y = pool_execute(env[layer.input], layer, graph.tensors[layer.input].dtype)
        elif isinstance(layer, ConcatLayer):
            y = concat_execute([env[n] for n in layer.inputs], layer)
        elif isinstance(layer, UpsampleLayer):
            y = upsample_execute(env[layer.input], layer)
        elif isinstance(layer, DeconvLayer):
            y = layer.requant.apply(deconv_accumulate(env[layer.input], layer))
        elif isinstance(layer, MulLayer):
            a, b = (env[n].astype(np.int64) for n in layer.inputs)
            y = layer.requant.apply((a - layer.a_zero_point) * (b - layer.b_zero_point))
        elif isinstance(layer, LutLayer):
            y = lut_execute(env[layer.input], layer, graph.tensors[layer.input].dtype)
        else:
            raise TypeError(f"unknown layer type {type(layer).__name__}")
        env[layer.output] = y.astype(graph.tensors[layer.output].dtype)
    return {name: env[name] for name in graph.outputs}


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in shape)


def _pair(prefix: str, a: int, b: int) -> str:
    return f"{prefix}{a}" + (f"x{b}" if b != a else "")


def layer_shape_text(layer, in_shapes: Sequence[Sequence[int]], out_shape: Sequence[int],
                     note: str = "") -> str:
    """The shape column of every report (``--profile``, ``--dump-offloads``, ``tune``,
    ``disassemble``), one format for all targets: the layer's own NCHW input(s) and output,
    batch included, then its window, e.g. ``1x3x32x32 -> 1x16x32x32 k3x3 s1 p1`` (``p`` one
    value when all sides are equal, else top,left,bottom,right; ``d`` dilation, ``g``
    groups, ``op`` output padding, ``x`` an upsample's scale). Targets give the shapes of the
    layer as the model states it (not of a layout they rewrote it to); ``note`` appends a
    target's detail (e.g. ``4 phases``)."""
    text = f"{', '.join(_dims(s) for s in in_shapes)} -> {_dims(out_shape)}"
    kernel = None if getattr(layer, "is_dense", False) else getattr(layer, "kernel", None)
    parts = []
    if kernel is not None and len(kernel) == 2:
        parts.append("k{}x{}".format(*(int(k) for k in kernel)))
    strides = getattr(layer, "strides", None)
    if kernel is not None and strides is not None:
        parts.append(_pair("s", *(int(s) for s in strides)))
    pad = tuple(int(p) for p in getattr(layer, "padding", ()) or ())
    if kernel is not None and any(pad):
        parts.append("p" + (str(pad[0]) if len(set(pad)) == 1 else ",".join(map(str, pad))))
    dil = tuple(int(d) for d in getattr(layer, "dilation", (1, 1)))
    if kernel is not None and dil != (1, 1):
        parts.append(_pair("d", *dil))
    if any(int(p) for p in getattr(layer, "output_padding", ()) or ()):
        parts.append("op" + ",".join(str(int(p)) for p in layer.output_padding))
    if int(getattr(layer, "groups", 1)) > 1:
        parts.append(f"g{int(layer.groups)}")
    scale = getattr(layer, "scale", None)
    if isinstance(layer, UpsampleLayer) and scale is not None:
        parts.append(_pair("x", *(int(s) for s in scale)))
    if note:
        parts.append(note)
    return " ".join([text, *parts])
