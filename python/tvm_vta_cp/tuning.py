"""Tuning tasks of the VTA target: one task per distinct conv / dense / residual-add workload of
an offloaded function over the static template's declared tile and thread knobs
(:func:`tvm_vta_cp.strategy.knobs.knob_space`), measured as that one layer on the simulator
(:mod:`tvm_accel.tuning.layer_tasks`).

A conv the CP strategy rewrote is tuned as the conv VTA runs (the rewritten shapes), so its
tiles are tuned for the embedding ``auto`` chose. The embedding choice itself
(:func:`tvm_vta_cp.embedding.embedding_space`, decided before partitioning) is not a task:
``auto`` already measures every one of its options (the static template and the top-k
candidates) on the simulator. Transposed convs are not tasks (their knobs are per
sub-convolution phase).
"""

from __future__ import annotations

from tvm_accel.layers import AddLayer, ConvLayer, LayerGraph
from tvm_accel.tuning.layer_tasks import layer_inputs, layer_tasks
from tvm_accel.tuning.task import Task
from tvm_vta_cp.hw_config import VTAConfig

__all__ = ["tuning_tasks"]


def tuning_tasks(graph: LayerGraph, cfg: VTAConfig) -> list[Task]:
    """One task per tunable layer of ``graph`` (conv, dense, add), in layer order."""
    from tvm_vta_cp.strategy.knobs import knob_space

    spaces = {}
    for layer in graph.layers:
        if not isinstance(layer, ConvLayer | AddLayer):
            continue
        dtypes = tuple(graph.tensors[n].dtype for n in [*layer_inputs(layer), layer.output])
        spaces[layer.name] = knob_space(layer, graph.tensors[layer_inputs(layer)[0]].shape,
                                        cfg, dtypes)
    return layer_tasks("vta", graph, cfg, spaces)
