"""The target protocol: what the shared core asks of each accelerator package.

A target plugs into the core by subclassing :class:`AccelTarget` and calling
:func:`register_target` at import time. The core then drives every stage (canonicalize,
partition, lower, run) through these methods, so no core module names a specific target.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from tvm_accel.errors import AccelError
from tvm_accel.layers import LayerGraph, Requant


class AccelTarget(ABC):
    """Base class of an accelerator target (``vta``, ``dpu``, ``marsellus``)."""

    #: target kind as written in ``--target "vta, llvm"``
    name: str = ""
    #: Python package; the runtime packed function is ``<package>.run``
    package: str = ""

    @property
    def runtime_func(self) -> str:
        return f"{self.package}.run"

    @abstractmethod
    def load_config(self, path_or_name: str | None = None) -> Any:
        """Parse and validate a hardware config (file path or bundled name; None = default)."""

    @abstractmethod
    def requant_recipe(self, scale: np.ndarray, acc_bound: np.ndarray, zero_point: int,
                       qmin: int, qmax: int) -> Requant:
        """Integer recipe approximating ``round(acc * scale[c]) + zero_point`` clipped to
        ``[qmin, qmax]`` for accumulators with ``|acc[c]| <= acc_bound[c]``."""

    @abstractmethod
    def add_recipe(self, scale_a: float, scale_b: float, zero_point: int, qmin: int,
                   qmax: int) -> tuple[int, int, Requant]:
        """Integer multipliers ``(ma, mb)`` and the requant applied to
        ``(a - za) * ma + (b - zb) * mb`` for an add with output scale 1 (scales pre-divided)."""

    @abstractmethod
    def pattern_table(self) -> list[tuple]:
        """Pattern entries ``(name, pattern, annotations, check)``, highest priority first."""

    #: knob keys that are options of the whole compile, not layer names
    global_knobs: frozenset[str] = frozenset()

    @abstractmethod
    def compile_function(self, graph: LayerGraph, config: Any, knobs: dict | None = None,
                         name: str = "") -> bytes:
        """Compile one offloaded function's layer graph into a program blob."""

    def prepare_offload(self, mod, config: Any, knobs: dict | None = None, report=None):
        """Target-specific rewrites of the canonical module before partitioning (the VTA
        target's layout rewrites); ``report`` (a CompileReport or None) collects what was done.
        The default changes nothing."""
        return mod

    def finish_offload(self, mod, config: Any, report=None):
        """Target-specific rewrites of the module after its offloaded functions are lowered to
        runtime calls (VTA folds its NCHWnc blocking into the layout-rewrite host functions);
        the default changes nothing."""
        return mod

    def tuning_tasks(self, graph: LayerGraph, config: Any) -> list:
        """The tunable workloads of one offloaded function's layer graph, as
        :class:`tvm_accel.tuning.Task` objects (one per layer or group, in program order). A
        task's best configuration is applied as ``knobs[layer] = config`` for each of its
        layers. The default: nothing to tune."""
        return []

    @abstractmethod
    def disassemble(self, blob: bytes, layer: str | None = None, limit: int = 0) -> str:
        """Readable assembly of a blob, one instruction per line with its dependency flags."""


_TARGETS: dict[str, AccelTarget] = {}

# Target kind -> package that registers it; imported on first use.
_KNOWN = {"vta": "tvm_vta_cp", "dpu": "tvm_dpu", "marsellus": "tvm_marsellus"}


def register_target(target: AccelTarget) -> AccelTarget:
    _TARGETS[target.name] = target
    return target


def get_target(name: str) -> AccelTarget:
    """Look up a target by kind, importing its package if needed."""
    if name not in _TARGETS and name in _KNOWN:
        import importlib

        importlib.import_module(_KNOWN[name])
    if name not in _TARGETS:
        raise AccelError(f"unknown accelerator target '{name}' (available: "
                         f"{', '.join(sorted(set(_KNOWN) | set(_TARGETS)))})")
    return _TARGETS[name]


def available_targets() -> list[str]:
    """Every registered or installable target kind."""
    return sorted(set(_KNOWN) | set(_TARGETS))
