"""The layers the strategy decomposes into phases (``phases``): transpose convs (``deconv``),
dilated convs (``dilated``) and nearest upsamples (``resize``), replaced before the stages run."""

from __future__ import annotations

from tvm_accel.layers import ConvLayer, DeconvLayer, LayerGraph, UpsampleLayer
from tvm_marsellus.strategy.deconv import deconv_phases
from tvm_marsellus.strategy.dilated import dilated_phases
from tvm_marsellus.strategy.resize import upsample_phases


def expand_phases(graph: LayerGraph, knobs: dict | None) -> tuple[LayerGraph, dict | None,
                                                                   dict[str, object]]:
    """``graph`` with every transpose conv and dilated conv replaced by its phase convs (or,
    for a dilated conv whose pruned kernel is dense, one ordinary conv) and every nearest
    upsample by its phase copies (``resize``); the knobs of such a layer given to each of its
    phases; and the replaced layers by name. MappingError (the layer runs on the CPU) when a
    layer has no phase form."""
    layers, parents, user = [], {}, dict(knobs or {})
    for ly in graph.layers:
        if isinstance(ly, DeconvLayer):
            subs = deconv_phases(ly, graph)
        elif isinstance(ly, ConvLayer) and tuple(ly.dilation) != (1, 1):
            subs = dilated_phases(ly, graph)
        elif isinstance(ly, UpsampleLayer):
            subs = upsample_phases(ly, graph)
        else:
            layers.append(ly)
            continue
        parents[ly.name] = ly
        own = user.pop(ly.name, None)
        if own is not None:  # the layer's knobs hold for each of its phases
            user.update({s.name: dict(own) for s in subs})
        layers += subs
    if not parents:
        return graph, knobs, parents
    return LayerGraph(graph.tensors, layers, graph.inputs, graph.outputs), user, parents
