"""Tuning tasks of the DPU target.

- One task per distinct layer workload with a declared knob space
  (:func:`tvm_dpu.strategy.knobs.knob_space`: output-channel tile, H/W tile, format, pipeline),
  measured as that one layer on the simulator (:mod:`tvm_accel.tuning.layer_tasks`).
- One task per fusion candidate (DNNVM's templates, :mod:`tvm_dpu.fusion`) that fits the
  hardware, over the group's own knobs (:func:`tvm_dpu.strategy.knobs.fused_knob_space`),
  measured as the group's layers alone with the fusion forced on. Its best configuration is
  applied under the group's name (``"conv1+pool1"``), so the fusion search of a compile with
  records compares tuned versions of each candidate with tuned layers.

Not tasks: the fusion and parallel-stream choices themselves (the fusion search measures every
candidate against its layers alone and keeps the cheapest strategy, an exhaustive search of
that choice) and transposed convs (their knobs are per sub-convolution phase).
"""

from __future__ import annotations

from tvm_accel.layers import DeconvLayer, LayerGraph, Tensor
from tvm_accel.tuning.layer_tasks import (
    layer_cost,
    layer_inputs,
    layer_tasks,
    layer_workload,
    loop_features,
    seeded_inputs,
)
from tvm_accel.tuning.task import Task
from tvm_dpu.hw_config import DPUConfig

__all__ = ["group_graph", "measure_group", "tuning_tasks"]


def tuning_tasks(graph: LayerGraph, cfg: DPUConfig) -> list[Task]:
    """One task per layer of ``graph`` whose knob space has a choice (layer order), then one
    per fusion candidate whose group knob space has a choice."""
    from tvm_dpu.strategy.knobs import knob_space

    spaces = {}
    for layer in graph.layers:
        if isinstance(layer, DeconvLayer):
            continue
        try:
            spaces[layer.name] = knob_space(layer, graph.tensors[layer_inputs(layer)[0]].shape,
                                            cfg)
        except (ValueError, TypeError, KeyError):
            continue  # a layer kind without declared knobs
    return layer_tasks("dpu", graph, cfg, spaces) + _group_tasks(graph, cfg)


def group_graph(graph: LayerGraph, names: tuple[str, ...]) -> LayerGraph:
    """The layers ``names`` of ``graph`` alone: inputs are the tensors they read and do not
    produce, outputs the tensors they produce that no layer of the group reads."""
    by = {ly.name: ly for ly in graph.layers}
    layers = [by[n] for n in names]
    produced = [ly.output for ly in layers]
    read = [t for ly in layers for t in layer_inputs(ly)]
    inputs = [t for t in dict.fromkeys(read) if t not in produced]
    outputs = [t for t in produced if t not in read]
    tensors = {n: Tensor(n, tuple(graph.tensors[n].shape), graph.tensors[n].dtype)
               for n in dict.fromkeys(inputs + produced)}
    return LayerGraph(tensors, layers, inputs, outputs)


def measure_group(context: tuple[LayerGraph, DPUConfig, str], config: dict
                  ) -> tuple[int, float, None]:
    """Simulated cycles and seconds of a fused group (``context``: its graph, the config, the
    group's name) under ``config``, the fusion forced on (seeded random inputs; the timing does
    not depend on the data)."""
    from tvm_dpu.fusion import FUSION_KNOB
    from tvm_dpu.runtime import execute_program
    from tvm_dpu.strategy import plan

    graph, cfg, name = context
    prog = plan(graph, cfg, {name: dict(config), FUSION_KNOB: {name: True, "parallel": False}})
    if prog.fusion is None or name not in prog.fusion.chosen:
        raise ValueError(f"fusion candidate {name} was not built as one group")
    _, stats = execute_program(prog, seeded_inputs(graph), cfg)
    return (*layer_cost(stats, cfg), None)


def _group_tasks(graph: LayerGraph, cfg: DPUConfig) -> list[Task]:
    from tvm_dpu.strategy.fuse import fusion_candidates
    from tvm_dpu.strategy.knobs import fused_knob_space

    graph, found = fusion_candidates(graph, cfg)
    tasks = []
    for c, layers in found:
        first = layers[0]
        try:
            space = fused_knob_space(c.template, layers,
                                     graph.tensors[layer_inputs(first)[0]].shape, cfg)
        except (ValueError, TypeError, KeyError):
            continue
        if space.size <= 1:
            continue
        tasks.append(Task(
            name=f"dpu.fused.{c.template}", target="dpu",
            workload=(c.template, [layer_workload(ly, graph) for ly in layers]), space=space,
            measure=measure_group, context=(group_graph(graph, c.layers), cfg, c.name),
            layers=[c.name], config_name=getattr(cfg, "name", ""),
            config_fingerprint=cfg.fingerprint.hex(),
            loop_features=loop_features(first, graph)))
    return tasks
