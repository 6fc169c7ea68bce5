"""The CP paper's baseline (``--target-vta-strategy tvm-reference``): TVM's VTA conv template
as the paper measured it.

TVM's ``conv2d_packed`` has no dilation: the paper's reference runs a dilated conv with "a
stencil that is blown up with zeros to match the dilated access pattern" (section 6.1), i.e.
the kernel ``KH x KW`` dilated by ``(dh, dw)`` becomes a dense ``(KH-1)*dh+1 x (KW-1)*dw+1``
kernel whose taps between the original ones are zero weights. Those zero taps are multiplied,
stored, loaded and counted like any other. Everything else is the static template (its tiling
follows ``conv2d_packed``'s knobs; see ``docs/vta.md``). The zero taps add nothing to any sum,
so the result is bit-exact with the dilated layer's reference.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tvm_accel.layers import ConvLayer, LayerGraph


def zero_inflated(layer: ConvLayer) -> ConvLayer:
    """``layer`` with its dilation blown up into zero taps of a dense kernel (dilation 1);
    an undilated layer is returned as it is."""
    dh, dw = (int(d) for d in layer.dilation)
    if (dh, dw) == (1, 1):
        return layer
    w = np.asarray(layer.weight)
    k, c, kh, kw = w.shape
    inflated = np.zeros((k, c, (kh - 1) * dh + 1, (kw - 1) * dw + 1), dtype=w.dtype)
    inflated[:, :, ::dh, ::dw] = w
    return replace(layer, weight=inflated, dilation=(1, 1))


def reference_graph(graph: LayerGraph) -> LayerGraph:
    """The graph the TVM reference template runs: every dilated conv zero-inflated."""
    layers = [zero_inflated(ly) if isinstance(ly, ConvLayer) else ly for ly in graph.layers]
    if all(a is b for a, b in zip(layers, graph.layers, strict=True)):
        return graph
    return replace(graph, layers=layers)
