"""Dilated convolution on MARSELLUS by input-phase decomposition (neither the RBE nor the
cluster kernels have dilated windows).

A stride-1 conv with dilation ``d`` reads, for output rows ``a, a + d, a + 2d, ...``, only
input rows ``p, p + d, ...`` with ``p = (a - pad) mod d``: the dense kernel convolved with
that input sub-image. So the layer is ``dh x dw`` dense convs (a 3x3 stays a 3x3 RBE job),
each gathering its sub-image through a strided DMA_IN view and scattering its outputs through
a strided DMA_OUT view (:class:`~tvm_marsellus.strategy.phases.PhaseConv`); their weights are
one copy in L2.

First the kernel rows / columns that read only padding for every output are dropped (an ASPP
branch of dilation 12 over an 8x8 map: its outer taps never reach the input); what is left
with one row and one column is an ordinary 1x1 conv, with more taps along one axis only that
axis is decomposed."""

from __future__ import annotations

from dataclasses import replace

from tvm_accel.errors import MappingError
from tvm_accel.layers import ConvLayer, LayerGraph, conv_output_shape
from tvm_marsellus.strategy.phases import PhaseConv, phase_padding


def live_taps(k: int, d: int, pad: int, size: int, out: int) -> range:
    """Taps ``i`` of an axis (kernel ``k``, dilation ``d``, padding ``pad`` before, input
    ``size``, ``out`` outputs) that read the input for some output: ``0 <= o + i*d - pad <
    size`` for an ``o`` in ``[0, out)``. They are consecutive."""
    live = [i for i in range(k) if i * d - pad < size and i * d - pad + out - 1 >= 0]
    return range(live[0], live[-1] + 1) if live else range(0)


def dilated_phases(layer: ConvLayer, graph: LayerGraph) -> list[ConvLayer]:
    """The phase convs of a dilated conv, or the conv itself with its dead taps dropped when
    what is left is dense. MappingError (the CPU runs it) for a stride above 1."""
    if tuple(layer.strides) != (1, 1):
        raise MappingError(f"layer {layer.name}: dilated conv with stride {tuple(layer.strides)} "
                           "(the input-phase decomposition needs stride 1)")
    shape = tuple(int(x) for x in graph.tensors[layer.input].shape)
    _, _, ho, wo = conv_output_shape(layer, shape)
    h, w = shape[2:]
    (kh, kw), (dh, dw) = layer.kernel, (int(d) for d in layer.dilation)
    pt, pl, _, _ = layer.padding
    rows, cols = live_taps(kh, dh, pt, h, ho), live_taps(kw, dw, pl, w, wo)
    if not rows or not cols:
        raise MappingError(f"layer {layer.name}: every tap of the dilated kernel reads padding "
                           "only")
    dh, dw = (dh if len(rows) > 1 else 1), (dw if len(cols) > 1 else 1)
    weight = layer.weight[:, :, rows.start:rows.stop, cols.start:cols.stop]
    top, left = pt - rows.start * int(layer.dilation[0]), pl - cols.start * int(layer.dilation[1])
    kh, kw = weight.shape[2:]
    if (dh, dw) == (1, 1):
        return [replace(layer, weight=weight, dilation=(1, 1),
                        padding=(top, left, phase_padding(ho, kh, top, h)[1],
                                 phase_padding(wo, kw, left, w)[1]))]
    out = []
    for a in range(dh):
        for b in range(dw):
            (na, pa, qa, ha), (nb, pb, qb, wb) = (_axis(a, dh, top, h, ho),
                                                  _axis(b, dw, left, w, wo))
            if not na or not nb:
                continue
            if not ha or not wb:
                raise MappingError(f"layer {layer.name}: dilation {tuple(layer.dilation)} "
                                   f"above the input size {h}x{w} leaves an empty input phase")
            pads = (-qa, -qb, phase_padding(na, kh, -qa, ha)[1],
                    phase_padding(nb, kw, -qb, wb)[1])
            out.append(PhaseConv(
                name=f"{layer.name}_ph{a}_{b}", input=layer.input, output=layer.output,
                weight=weight, bias=layer.bias, input_zero_point=layer.input_zero_point,
                strides=(1, 1), padding=pads, requant=layer.requant, groups=layer.groups,
                weight_bits=layer.weight_bits, parent=layer.name, in_phase=(pa, pb),
                in_step=(dh, dw), out_phase=(a, b), out_step=(dh, dw), out_count=(na, nb)))
    return out


def _axis(a: int, d: int, pad: int, size: int, out: int) -> tuple[int, int, int, int]:
    """Output phase ``a`` of an axis with dilation ``d``: its outputs ``a, a + d, ...``, the
    input phase ``p`` they read, the offset ``q`` of their first window in that sub-image
    (``-q`` is the phase conv's padding before) and the sub-image's size."""
    p = (a - pad) % d
    return len(range(a, out, d)), p, (a - pad - p) // d, len(range(p, size, d))
