"""Tuning tasks of the MARSELLUS target: one task per distinct layer workload over its declared
knobs (:func:`tvm_marsellus.strategy.layer_knob_spaces`: engine and tile sizes), measured as
that one layer on the simulator (:mod:`tvm_accel.tuning.layer_tasks`).

The cost the tuners minimise is simulated time (cycles at the config's clock); every
measurement also reports the CLUSTER energy of the run in uJ (:func:`measure_layer_energy`),
which lands in ``MeasureResult.energy_uj``, in the records' ``measure`` key and in ``tvmc
tune``'s table. Tasks do not carry the compile-time operating point, so the energy is at the
nominal point (0.8 V / 420 MHz), the one a blob compiled without ``--target-marsellus-vdd``
runs at.
"""

from __future__ import annotations

from typing import Any

from tvm_accel.layers import LayerGraph
from tvm_accel.tuning.layer_tasks import layer_cost, layer_tasks, run_layer
from tvm_accel.tuning.task import Task
from tvm_marsellus.hw_config import MarsellusConfig

__all__ = ["measure_layer_energy", "tuning_tasks"]


def measure_layer_energy(context: tuple[str, LayerGraph, Any], config: dict
                         ) -> tuple[int, float, float]:
    """Cycles, seconds and CLUSTER energy (uJ, summed over the run's layers at the program's
    operating point: nominal for a tuning measurement) of one layer under ``config``."""
    from tvm_marsellus.energy import energy_uj
    from tvm_marsellus.runtime import operating_point

    program, stats = run_layer(context, config)
    op = operating_point(program)
    cycles, seconds = layer_cost(stats, context[2])
    return cycles, seconds, float(sum(energy_uj(st, op) for _, st in stats))


def tuning_tasks(graph: LayerGraph, cfg: MarsellusConfig) -> list[Task]:
    """One task per layer of ``graph`` whose knob space has a choice, in layer order."""
    from tvm_marsellus.strategy import layer_knob_spaces

    return layer_tasks("marsellus", graph, cfg, layer_knob_spaces(graph, cfg),
                       measure=measure_layer_energy)
