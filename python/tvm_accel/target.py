"""The target protocol: what the shared core asks of each accelerator package.

A target plugs into the core by subclassing :class:`AccelTarget` and calling
:func:`register_target` at import time; an installed package announces itself under the entry
point group ``tvm_accel.targets`` (``vta = "tvm_vta_cp:TARGET"``), which :func:`get_target`
loads on first use. The core then drives every stage (canonicalize, partition, lower, plan,
run, the command line's ``--target-<kind>-*`` options, tuning) through these methods, so no
core module names a specific target.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import numpy as np

from tvm_accel.errors import AccelError
from tvm_accel.layers import LayerGraph, Requant

#: entry point group under which installed packages register their targets
ENTRY_POINT_GROUP = "tvm_accel.targets"


@dataclass(frozen=True)
class TargetOption:
    """One command-line option of a target, ``--target-<kind>-<name>`` (upstream tvmc builds
    its target options from the registered targets the same way). ``type`` is ``str``,
    ``int``, ``float`` or ``bool`` (a flag); ``choices`` restricts the values. Ranges and
    other rules are the target's to check in :meth:`AccelTarget.knobs_from_options` or
    :meth:`AccelTarget.load_config`, with a message naming the option."""

    name: str
    help: str
    type: type = str
    choices: tuple | None = None
    metavar: str | None = None


class AccelTarget(ABC):
    """Base class of an accelerator target (``vta``, ``dpu``, ``marsellus``)."""

    #: target kind as written in ``--target "vta, llvm"``
    name: str = ""
    #: Python package; the runtime packed function is ``<package>.run``
    package: str = ""
    #: how a float model is quantized for this target (``tvmc quantize --scheme`` and
    #: ``--activation-type``; :func:`tvm_accel.explore.measure.model_for`)
    quantize_scheme: str = "per-channel"
    activation_type: str = "int8"

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
        ``[qmin, qmax]`` for accumulators with ``|acc[c]| <= acc_bound[c]``. A target whose
        recipe trades accuracy for cost may also take ``max_error`` (output LSBs): canonicalize
        then passes the requantize guard's limit, which the recipe must not exceed."""

    @abstractmethod
    def add_recipe(self, scale_a: float, scale_b: float, zero_point: int, qmin: int,
                   qmax: int) -> tuple[int, int, Requant]:
        """Integer multipliers ``(ma, mb)`` and the requant applied to
        ``(a - za) * ma + (b - zb) * mb`` for an add with output scale 1 (scales pre-divided)."""

    def recipe_for(self, op: str) -> Callable | None:
        """The recipe solver (``requant_recipe``'s signature) of a pooling or other operator
        the target offloads with its own division (e.g. average pools on a 16-bit multiplier);
        None: canonicalize's default for ``op``."""
        return None

    def global_pool_steps(self, h: int, w: int, dtype: str,
                          zero_points: tuple[int, int]) -> list[tuple[int, int]] | None:
        """Windows ``[(kh, kw), ...]`` of a global average pool over ``h x w`` (input
        ``dtype``, input and output ``zero_points``) in steps (each step but the last an
        average pool with stride = window, the last the global pool of what is left; the
        products are ``h`` and ``w``) when the target can run the steps but not the one window;
        the steps become the canonical form, the reference included
        (:mod:`tvm_accel.canonicalize.avg_pools`). None: one step."""
        return None

    @abstractmethod
    def pattern_table(self) -> list:
        """The target's :class:`~tvm_accel.partition.OffloadPattern` s, highest priority
        first."""

    #: knob keys that are options of the whole compile, not layer names
    global_knobs: frozenset[str] = frozenset()

    @abstractmethod
    def compile_function(self, graph: LayerGraph, config: Any, knobs: dict | None = None,
                         name: str = "") -> bytes:
        """Compile one offloaded function's layer graph into a program blob."""

    @abstractmethod
    def plan(self, graph: LayerGraph, config: Any, knobs: dict | None = None) -> Any:
        """The strategy: a layer graph -> the target's program (instruction streams and memory
        map), before it is serialised into a blob."""

    @abstractmethod
    def execute(self, program: Any, inputs: dict[str, np.ndarray], config: Any,
                trace_path: str | None = None) -> tuple[dict[str, np.ndarray], list]:
        """Run a planned program on the simulator: ``(outputs, [(layer, stats), ...])``."""

    def options(self) -> list[TargetOption]:
        """The target's ``--target-<kind>-*`` command-line options; every target has
        ``config`` (a hardware config file or bundled name), read by :meth:`load_config`."""
        return [TargetOption("config", f"{self.name} hardware config JSON or bundled name",
                             metavar="FILE")]

    def knobs_from_options(self, values: dict[str, Any]) -> dict | None:
        """The compile-time knobs (global knobs such as a strategy or an operating point) that
        the parsed options ``values`` (option name -> value, None when not given; ``config``
        included) stand for; None: none. Raise :class:`AccelError` naming the option for a
        value the parser could not check."""
        return None

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


def register_target(target: AccelTarget) -> AccelTarget:
    _TARGETS[target.name] = target
    return target


def _installed() -> dict[str, Any]:
    """Entry points of the installed target packages, by target kind."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_targets() -> list[str]:
    """Every registered or installed target kind, sorted."""
    return sorted(set(_installed()) | set(_TARGETS))


def get_target(name: str) -> AccelTarget:
    """Look up a target by kind, loading its installed package on first use."""
    if name not in _TARGETS:
        ep = _installed().get(name)
        if ep is not None:
            ep.load()  # importing the package registers the target
    if name not in _TARGETS:
        raise AccelError(f"unknown accelerator target '{name}' (available: "
                         f"{', '.join(available_targets())})")
    return _TARGETS[name]

