"""Transpose convolution (ONNX ConvTranspose) on MARSELLUS: its ``SH x SW`` output phases, each
a stride-1 conv of the input with the phase's sub-kernel (``tvm_accel.layers.deconv_subconvs``,
the decomposition VTA and the DPU use), written by DMA_OUT straight into every ``SH``-th row
and ``SW``-th column of the output (:class:`~tvm_marsellus.strategy.phases.PhaseConv`).

A sub-kernel of 2 or 3 taps per axis is embedded in a 3x3 kernel with zero taps (a single tap
stays 1x1) where the padding then stays below the kernel, so the phase is an ordinary RBE job
(4x4 / 2 kernels: four 2x2 sub-kernels, each a 3x3 job with one zero row and column: 9/4 of
the useful binary products, against a cluster kernel at the cores' MAC rate); the engine stage
then chooses between the RBE and the cores as for any conv; a phase the cores run gets its
compact sub-kernel back (``views``: no zero taps). Other sub-kernels run compact on the cores.
Only the useful MACs of a phase count (``tiling``'s count of a padded 3x3 would include the
zero taps)."""

from __future__ import annotations

import numpy as np

from tvm_accel.errors import MappingError
from tvm_accel.layers import DeconvLayer, LayerGraph, deconv_subconvs
from tvm_marsellus.strategy.phases import PhaseConv, phase_padding

#: square kernels of an RBE job
RBE_KERNELS = (1, 3)


def weight_bits(w: np.ndarray) -> int:
    """The narrowest signed precision (2..8 bits) holding every weight value."""
    lo, hi = int(w.min(initial=0)), int(w.max(initial=0))
    return next(b for b in range(2, 9) if -(1 << (b - 1)) <= lo and hi < (1 << (b - 1)))


def rbe_embedding(taps: int, top: int, count: int, size: int, k: int
                  ) -> tuple[int, int, int] | None:
    """Where ``taps`` taps go inside an RBE kernel of ``k`` taps along one axis: ``(zeros in
    front, padding before, padding after)`` with both paddings below ``k`` (the RBE's rule; a
    negative padding before crops the input, which the tile windows do), the smaller larger
    padding first; None when no placement keeps them below ``k``."""
    best = None
    for front in range(k - taps + 1):
        before, after = phase_padding(count, k, top + front, size)
        if before < k and after < k and (best is None or max(before, after) < max(best[1:])):
            best = (front, before, after)
    return best


def deconv_phases(layer: DeconvLayer, graph: LayerGraph) -> list[PhaseConv]:
    """The phase convs of a transpose conv (dilation 1, groups 1 or depthwise)."""
    if tuple(layer.dilation) != (1, 1):
        raise MappingError(f"layer {layer.name}: dilated transpose conv (its phases need "
                           "dilation 1)")
    shape = tuple(int(x) for x in graph.tensors[layer.input].shape)
    _, c, h, w = shape
    g = int(layer.groups)
    if g != 1 and not (g == c and int(layer.weight.shape[1]) == 1):
        raise MappingError(f"layer {layer.name}: grouped transpose conv other than depthwise")
    wbits = weight_bits(layer.weight)
    sh, sw = (int(s) for s in layer.strides)
    out = []
    for sc in deconv_subconvs(layer, shape):
        sub = sc.conv.weight
        (th, tw), (qh, qw), (nh, nw) = sub.shape[2:], sc.crop, sc.count
        top, left = th - 1 - qh, tw - 1 - qw

        def phase(weight, pads, compact=None, sc=sc):
            return PhaseConv(
                name=sc.conv.name, input=layer.input, output=layer.output, weight=weight,
                bias=layer.bias, input_zero_point=layer.input_zero_point, strides=(1, 1),
                padding=pads, requant=layer.requant, groups=g, weight_bits=wbits,
                parent=layer.name, out_phase=sc.offset, out_step=(sh, sw),
                out_count=sc.count, useful_taps=len(range(sc.phase[0], layer.kernel[0], sh))
                * len(range(sc.phase[1], layer.kernel[1], sw)), compact=compact)

        compact = phase(sub, (top, left, phase_padding(nh, th, top, h)[1],
                              phase_padding(nw, tw, left, w)[1]))
        for k in RBE_KERNELS if g == 1 else ():
            eh = rbe_embedding(th, top, nh, h, k) if th <= k else None
            ew = rbe_embedding(tw, left, nw, w, k) if tw <= k else None
            if eh and ew:
                weight = np.zeros((sub.shape[0], sub.shape[1], k, k), dtype=sub.dtype)
                weight[:, :, eh[0]:eh[0] + th, ew[0]:ew[0] + tw] = sub
                out.append(phase(weight, (eh[1], ew[1], eh[2], ew[2]),
                                 compact if (k, k) != (th, tw) else None))
                break
        else:
            out.append(compact)
    return out
