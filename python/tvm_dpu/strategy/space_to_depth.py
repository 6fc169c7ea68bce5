"""W space-to-depth: convs wider than the CONV's 4-bit kernel field rewritten as narrower convs
on more channels, reading an alias of their input's DDR bytes."""

from __future__ import annotations

import dataclasses

import numpy as np

from tvm_accel.layers import (
    ConvLayer,
    LayerGraph,
)


def w_space_to_depth_factor(kernel: tuple[int, int], stride_w: int, width: int,
                            pad_l: int, pad_r: int, groups: int = 1,
                            dilation: tuple[int, int] = (1, 1)) -> int | None:
    """The factor ``f`` of the W space-to-depth that brings a kernel wider than the CONV's
    4-bit field (``kw > 15``) within it, or None. In the DPU's HWC DDR layout an ``(H, W, C)``
    tensor *is* the ``(H, W / f, f * C)`` tensor whose pixel ``w'`` holds the pixels ``f w' ..
    f w' + f - 1``: the conv then runs on ``f C`` channels with a ``ceil(kw / f)``-wide kernel
    and W stride ``stride_w / f``, the same sums, so it needs no data movement at all. Needs
    ``f | stride_w`` (the DeepBench speech layers: 20 wide, stride 2), ``f | width`` and ``f``
    dividing both W paddings, groups 1 and no dilation; the smallest such ``f`` is used."""
    kh, kw = kernel
    if kw <= 15 or kh > 15 or groups != 1 or tuple(dilation) != (1, 1):
        return None
    for f in range(2, stride_w + 1):
        if (stride_w % f == 0 and width % f == 0 and pad_l % f == 0 and pad_r % f == 0
                and -(-kw // f) <= 15):
            wo = (width + pad_l + pad_r - kw) // stride_w + 1
            if (width + pad_l + pad_r) // f - (-(-kw // f)) == (wo - 1) * (stride_w // f):
                return f
    return None


#: suffix of the tensor a W space-to-depth conv reads (an alias of its input's DDR bytes)
S2D_SUFFIX = "@s2d"


def space_to_depth(graph: LayerGraph) -> tuple[LayerGraph, dict[str, str]]:
    """``graph`` with every conv wider than the CONV fields rewritten by
    :func:`w_space_to_depth_factor` (weights re-laid ``[o][r C + c][ky][j] = w[o][c][ky][f j +
    r]``, zero past ``kw``), reading the alias tensor ``<input>@s2d<f>`` of shape ``(N, f C, H,
    W / f)``; returns it and the aliases (alias -> tensor). A conv that cannot be rewritten is
    left as it is (the pattern table keeps it on the CPU)."""
    aliases: dict[str, str] = {}
    tensors, layers = dict(graph.tensors), []
    for ly in graph.layers:
        if not isinstance(ly, ConvLayer) or ly.is_dense or ly.kernel[1] <= 15:
            layers.append(ly)
            continue
        n, c, h, w = graph.tensors[ly.input].shape
        f = w_space_to_depth_factor(ly.kernel, ly.strides[1], w, ly.padding[1], ly.padding[3],
                                    ly.groups, getattr(ly, "dilation", (1, 1)))
        if f is None:
            layers.append(ly)
            continue
        k, _, kh, kw = ly.weight.shape
        kw2 = -(-kw // f)
        wt = np.zeros((k, c, kh, kw2 * f), dtype=ly.weight.dtype)
        wt[..., :kw] = ly.weight
        # [o][c][ky][j * f + r] -> [o][r * C + c][ky][j]
        wt = wt.reshape(k, c, kh, kw2, f).transpose(0, 4, 1, 2, 3).reshape(k, f * c, kh, kw2)
        alias = f"{ly.input}{S2D_SUFFIX}{f}"
        t = graph.tensors[ly.input]
        tensors[alias] = dataclasses.replace(t, name=alias, shape=(n, f * c, h, w // f))
        aliases[alias] = ly.input
        pt, pl, pb, pr = ly.padding
        layers.append(dataclasses.replace(
            ly, input=alias, weight=wt, strides=(ly.strides[0], ly.strides[1] // f),
            padding=(pt, pl // f, pb, pr // f)))
    if not aliases:
        return graph, {}
    return LayerGraph(tensors, layers, list(graph.inputs), list(graph.outputs)), aliases
