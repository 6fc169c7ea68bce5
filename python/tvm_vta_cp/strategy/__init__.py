"""Static VTA strategy: TVM's ``conv2d_packed`` / ``dense_packed`` templates for a layer graph.

Stages, one module each (the design is in ``docs/vta.md``):

1. ``placement`` - check the function, decide each tensor's DRAM halo and place it packed;
2. ``geometry`` - a conv (or a transpose conv's phase) in blocks and tiles;
3. ``alu_tail`` - the requantize recipe as exact int32 ALU ops;
4. ``knobs`` - the knob space of a layer and the cost model choosing its defaults;
5. ``conv`` (and dense), ``deconv``, ``add``, ``pool`` (max / average / global average on
   the ALU), ``upsample`` (nearest, as data movement) - one schedule per operator, each
   emitting its stream through ``emitter`` (micro-op kernels, dependency tokens); ``concat``
   (inputs placed in their channel-block slice, or copied on VTA), ``activation`` (the
   squeeze-excitation product and LeakyReLU as ALU ops).

``reference`` is the CP paper's baseline variant of the template (dilation by zero-inflated
kernels), planned with ``plan(..., reference=True)``.
"""

from __future__ import annotations

from tvm_accel.errors import MappingError
from tvm_accel.layers import (
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DeconvLayer,
    LayerGraph,
    LutLayer,
    MulLayer,
    PoolLayer,
    UpsampleLayer,
)
from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.layout import cdiv
from tvm_vta_cp.program import LayerProgram, VTAProgram
from tvm_vta_cp.strategy.activation import lut_on_alu, multiply
from tvm_vta_cp.strategy.add import add
from tvm_vta_cp.strategy.concat import concat, concat_views
from tvm_vta_cp.strategy.conv import conv
from tvm_vta_cp.strategy.deconv import deconv
from tvm_vta_cp.strategy.placement import (
    PlanContext,
    check_dram,
    check_function,
    halos,
    place_tensors,
)
from tvm_vta_cp.strategy.pool import pool
from tvm_vta_cp.strategy.reference import reference_graph
from tvm_vta_cp.strategy.upsample import upsample

__all__ = ["plan"]


def plan(graph: LayerGraph, cfg: VTAConfig, knobs: dict[str, dict] | None = None,
         reference: bool = False) -> VTAProgram:
    """Compile a layer graph into per-layer VTA instruction streams and a DRAM memory map.

    ``knobs`` maps layer names to (partial) knob dicts overriding the defaults; names of layers
    not in the graph are ignored (tuning records may cover several functions). ``reference``
    plans the CP paper's TVM baseline (dilated kernels zero-inflated, ``strategy.reference``)."""
    if reference:
        graph = reference_graph(graph)
    check_function(graph, cfg)
    halo, fill, use_halo = halos(graph)
    views = concat_views(graph, halo, fill, cfg)
    ctx = place_tensors(graph, cfg, halo, fill, views)
    knobs = knobs or {}
    layers = [_schedule(ctx, layer, knobs.get(layer.name), use_halo, views)
              for layer in graph.layers]
    return _program(ctx, graph, layers)


def _schedule(ctx: PlanContext, layer, user_knobs: dict | None,
              use_halo: dict[str, bool], views: dict) -> LayerProgram:
    """The layer's instruction stream, by the schedule of its operator."""
    if isinstance(layer, ConvLayer):
        return conv(ctx, layer, user_knobs, use_halo[layer.name])
    if isinstance(layer, DeconvLayer):
        return deconv(ctx, layer, user_knobs, use_halo[layer.name])
    if isinstance(layer, AddLayer):
        return add(ctx, layer, user_knobs)
    if isinstance(layer, PoolLayer):
        return pool(ctx, layer, user_knobs)
    if isinstance(layer, UpsampleLayer):
        return upsample(ctx, layer, user_knobs)
    if isinstance(layer, ConcatLayer):
        return concat(ctx, layer, views)
    if isinstance(layer, MulLayer):
        return multiply(ctx, layer)
    if isinstance(layer, LutLayer):
        return lut_on_alu(ctx, layer)
    raise MappingError(f"layer {layer.name}: no VTA schedule for {type(layer).__name__}")


def _program(ctx: PlanContext, graph: LayerGraph, layers: list[LayerProgram]) -> VTAProgram:
    """The function's program: its layers and the DRAM image they need (rounded up)."""
    size = cdiv(ctx.dram.size, ctx.dram.align) * ctx.dram.align
    check_dram(size, "its activations, weights and micro-ops")
    return VTAProgram(dram_size=max(size, ctx.dram.align), const_image=ctx.dram.const_image,
                      tensors=ctx.placements, inputs=list(graph.inputs),
                      outputs=list(graph.outputs), layers=layers)
