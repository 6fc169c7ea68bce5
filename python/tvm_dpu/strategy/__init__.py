"""DPU strategy: a layer graph -> DPU instruction streams, DDR map and PARAM image.

Stages of :func:`plan`, in order (the design is described in ``docs/dpu.md``):

1. ``fuse``: fusion options, DNNVM fusion search and concurrent pool / conv streams
   (:mod:`tvm_dpu.fusion`), concats written in place by their producers;
2. ``planner``: one stream per layer or fused group (``emit_conv``, ``emit_misc``,
   ``emit_chain``, ``emit_fused`` on top of ``emit``; tiles and knobs from ``tiling``,
   ``knobs``, ``chains``, ``space_to_depth``; DPON/DPBY tokens from ``dependencies``);
3. ``merge``: the streams of the function merged into one, ordered by ``list_schedule``;
4. ``planner``: region sizes and the :class:`~tvm_dpu.program.DPUProgram`.
"""

from __future__ import annotations

from tvm_accel.layers import LayerGraph
from tvm_dpu.hw_config import DPUConfig
from tvm_dpu.program import DPUProgram
from tvm_dpu.strategy.fuse import fuse, fusion_options
from tvm_dpu.strategy.merge import merge_streams
from tvm_dpu.strategy.planner import Planner


def plan(graph: LayerGraph, cfg: DPUConfig, knobs: dict[str, dict] | None = None) -> DPUProgram:
    """Compile a layer graph into DPU streams (one per layer or fused group), a DDR map and the
    PARAM image.

    ``knobs`` maps layer names (and fused group names ``a+b``) to (partial) knob dicts overriding
    the defaults; ``knobs["@fusion"]`` controls the fusion search: ``{"enabled": False}`` runs
    layer by layer, ``{"<candidate name>": False}`` forbids a candidate, ``True`` forces it,
    ``{"parallel": False}`` turns off the concurrent pool / conv streams, ``{"overlap": False}``
    keeps every group a stream of its own. With fusion on, a concat whose inputs can be written
    in place disappears: its producers save straight into their channel range of its output."""
    cfg.validate("DPU config")
    knobs = knobs or {}
    options = fusion_options(knobs)
    groups, report, knobs, on_chip, views = fuse(graph, cfg, knobs, options)
    p = Planner(graph, cfg, on_chip, views)
    layers, parts, sides = p.streams(groups, knobs)
    if options.overlap and len(layers) > 1:
        merge_streams(layers, parts, cfg, p.region_use, sides)
    return p.program(graph, layers, report)
