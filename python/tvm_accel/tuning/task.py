"""Tuning tasks and measurement results, shared by every target and every tuner.

A :class:`Task` is one distinct tunable workload of a model (an offloaded layer, a fused group
or a candidate set), keyed by a stable :attr:`Task.workload` (operator, shapes, dtypes, the
numerics-relevant parameters and the hardware config fingerprint). It carries the declared
knob space of the target's strategy and a picklable ``measure`` callable: measuring a
configuration builds the task's program for it and runs it on the simulator, in a worker
process (:mod:`tvm_accel.tuning.measure`).

Error classes follow AutoTVM's ``MeasureErrorNo`` (the records keep its numbers).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from tvm_accel.knobs import KnobSpace

__all__ = ["MeasureError", "MeasureInput", "MeasureResult", "Task"]


class MeasureError(IntEnum):
    """AutoTVM's error numbers (``result[1]`` of a record)."""

    NO_ERROR = 0
    INSTANTIATION_ERROR = 1  # the configuration is invalid (a knob check rejects it)
    COMPILE_HOST = 2
    COMPILE_DEVICE = 3       # the strategy/codegen failed for this configuration
    RUNTIME_DEVICE = 4       # the simulator reported an error
    WRONG_ANSWER = 5
    BUILD_TIMEOUT = 6
    RUN_TIMEOUT = 7          # the measurement exceeded its timeout
    UNKNOWN_ERROR = 8        # the worker crashed or raised something unexpected


@dataclass
class MeasureResult:
    """Outcome of one measurement: ``costs`` in seconds of simulated time (cycles / clock),
    ``cycles`` as counted, ``energy_uj`` when the target reports energy, the error class and
    message, and the wall time the measurement took."""

    costs: tuple[float, ...]
    error: MeasureError = MeasureError.NO_ERROR
    cycles: int = 0
    energy_uj: float | None = None
    message: str = ""
    all_cost: float = 0.0
    timestamp: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error == MeasureError.NO_ERROR


@dataclass
class Task:
    """One tunable workload.

    ``measure(context, config) -> (cycles, seconds, energy_uj | None)`` is a module-level
    function (picklable, so workers can run it) that raises ``ValueError`` for an invalid
    configuration and :class:`tvm_accel.errors.AccelError` (or ``RuntimeError``) when the build
    or the simulation fails; ``context`` is whatever it needs (picklable: a layer graph, the
    hardware config). ``loop_features`` describes the task's loop/tile structure (extents,
    MACs, bytes) so a cost model trained on one task transfers to others of the same target.
    """

    name: str                         # e.g. "vta.conv2d"
    target: str                       # accelerator name
    workload: tuple                   # JSON-able, stable across processes and runs
    space: KnobSpace
    measure: Callable[[Any, dict], tuple[int, float, float | None]]
    context: Any = None
    weight: int = 1                   # how many times the model uses the workload
    layers: list[str] = field(default_factory=list)  # layer names using it
    config_name: str = ""
    config_fingerprint: str = ""      # hex digest of the hardware config
    loop_features: tuple[float, ...] = ()
    shape: str = ""                   # the first layer's shape text, as the reports show it

    @property
    def key(self) -> str:
        """Short stable id of the workload (for file names and progress lines)."""
        text = json.dumps([self.name, list(self.workload)], sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def features(self, config: Mapping[str, Any]) -> list[float]:
        """Cost-model features: the knob features followed by the loop features."""
        return self.space.features(config) + [float(v) for v in self.loop_features]


@dataclass
class MeasureInput:
    """One configuration of one task to measure (``index`` = ``task.space.index_of(config)``)."""

    task: Task
    config: dict
    index: int = -1

    def __post_init__(self):
        if self.index < 0:
            self.index = self.task.space.index_of(self.config)
