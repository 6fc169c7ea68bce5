"""Tuning tasks of the MARSELLUS target: one task per distinct layer workload over its declared
knobs (:func:`tvm_marsellus.strategy.layer_knob_spaces`: engine and tile sizes), measured as
that one layer on the simulator (:mod:`tvm_accel.tuning.layer_tasks`). The cost is simulated
time; energy at the operating point is not part of the measurement yet.
"""

from __future__ import annotations

from tvm_accel.layers import LayerGraph
from tvm_accel.tuning.layer_tasks import layer_tasks
from tvm_accel.tuning.task import Task
from tvm_marsellus.hw_config import MarsellusConfig

__all__ = ["tuning_tasks"]


def tuning_tasks(graph: LayerGraph, cfg: MarsellusConfig) -> list[Task]:
    """One task per layer of ``graph`` whose knob space has a choice, in layer order."""
    from tvm_marsellus.strategy import layer_knob_spaces

    return layer_tasks("marsellus", "tvm_marsellus", graph, cfg, layer_knob_spaces(graph, cfg))
