"""Tile geometry and buffer sizes: output-tile options, input windows, PM bytes of weight
chunks, the format unit and strided 1x1 subsampling."""

from __future__ import annotations

from tvm_accel.layers import (
    ConvLayer,
    PoolLayer,
    conv_output_shape,
)
from tvm_dpu.hw_config import DPUConfig


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _options(n: int, pref: int) -> list[int]:
    opts = sorted({min(n, m) for m in range(pref, n + pref, pref)} | ({n} if n < pref else set()))
    return opts


def _conv_geometry(layer: ConvLayer, in_shape):
    n, k, ho, wo = conv_output_shape(layer, in_shape)
    c = in_shape[1]
    kh, kw = layer.kernel
    return c, k, ho, wo, kh, kw


def conv_span(layer: ConvLayer) -> tuple[int, int]:
    """Input rows x columns one output pixel of a conv reads: its dilated kernel (the CONV's
    window, and the overlap of neighbouring tiles' input windows, grow with the dilation)."""
    return layer.dilated_kernel


def conv_dilation(layer: ConvLayer) -> int:
    """The CONV's dilation field (the pattern check keeps H and W dilations equal)."""
    dh, dw = (int(d) for d in layer.dilation)
    if dh != dw:
        raise ValueError(f"layer {layer.name}: dilation {dh}x{dw} differs between H and W")
    return dh


def _param_bytes(layer: ConvLayer, kt: int, ic: int) -> int:
    kh, kw = layer.kernel
    per = kh * kw * (1 if layer.is_depthwise else ic)
    return kt * per + 4 * kt


def _pm_block(nbytes: int) -> tuple[int, int, int]:
    """PM LOAD shape (rows, cols, chans) covering ``nbytes`` (padded by at most rows x 64)."""
    units = _cdiv(max(1, nbytes), 64)
    rows = _cdiv(units, 4095)
    return rows, _cdiv(units, rows), 64


def _pm_bytes(nbytes: int) -> int:
    r, c, ch = _pm_block(nbytes)
    return r * c * ch


def _in_window(y0: int, n: int, stride: int, pad: int, k: int, size: int):
    start = y0 * stride - pad
    end = (y0 + n - 1) * stride - pad + k
    a, b = max(0, start), min(size, end)
    return a, b - a, a - start, end - b


def _subsamples(layer: ConvLayer, fmt: bool) -> bool:
    """A strided 1x1 conv without padding (a ResNet projection shortcut) reads only every
    stride-th row and column: its LOAD takes just those (DDR strides times the conv's strides)
    and the CONV runs with stride 1, so the input tile and its DDR traffic shrink by the
    strides' product."""
    return (tuple(layer.kernel) == (1, 1) and tuple(layer.strides) != (1, 1) and not fmt
            and not any(layer.padding) and not layer.is_dense)


def format_applies(layer: ConvLayer, c: int, cfg: DPUConfig) -> bool:
    """The format unit (W-direction im2col on LOAD) can feed this conv: few input channels
    (e.g. an RGB first layer), a kernel width it can gather and no dilation (it gathers
    neighbouring pixels)."""
    kw = layer.kernel[1]
    return (cfg.format_unit and not layer.is_depthwise and layer.groups == 1 and kw > 1
            and tuple(layer.dilation) == (1, 1)
            and c <= cfg.FORMAT_MAX_CHANNELS and kw <= cfg.FORMAT_MAX_FACTOR
            and c * kw <= 4095)


def _pool_window(pool: PoolLayer, th: int, tw: int, hc: int, wc: int) -> tuple[int, int]:
    """Conv output rows x columns a ``th x tw`` pool output tile reads (at most)."""
    (kh, kw), (sh, sw) = pool.kernel, pool.strides
    return min(hc, (th - 1) * sh + kh), min(wc, (tw - 1) * sw + kw)
