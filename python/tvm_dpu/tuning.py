"""Tuning tasks of the DPU target: one task per distinct layer workload with a declared knob
space (:func:`tvm_dpu.strategy.knob_space`: output-channel tile, H/W tile, format, pipeline),
measured as that one layer on the simulator (:mod:`tvm_accel.tuning.layer_tasks`).

Not tasks yet: the fused groups' own knobs and the fusion / parallel-stream choices (the
fusion search measures its candidates itself), and transposed convs (per-phase knobs).
"""

from __future__ import annotations

from tvm_accel.layers import DeconvLayer, LayerGraph
from tvm_accel.tuning.layer_tasks import layer_inputs, layer_tasks
from tvm_accel.tuning.task import Task
from tvm_dpu.hw_config import DPUConfig

__all__ = ["tuning_tasks"]


def tuning_tasks(graph: LayerGraph, cfg: DPUConfig) -> list[Task]:
    """One task per layer of ``graph`` whose knob space has a choice, in layer order."""
    from tvm_dpu.strategy import knob_space

    spaces = {}
    for layer in graph.layers:
        if isinstance(layer, DeconvLayer):
            continue
        try:
            spaces[layer.name] = knob_space(layer, graph.tensors[layer_inputs(layer)[0]].shape,
                                            cfg)
        except (ValueError, TypeError, KeyError):
            continue  # a layer kind without declared knobs
    return layer_tasks("dpu", "tvm_dpu", graph, cfg, spaces)
