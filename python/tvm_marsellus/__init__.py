"""MARSELLUS target: a RISC-V SoC with the RBE convolution engine and a 16-core XpulpNN cluster
(MARSELLUS paper, seeds/001) as a TVM BYOC target named ``marsellus``.

Device half: ``hw_config`` (JSON config + cycle-model constants), ``energy`` (operating points
and energy), ``codegen`` (64-byte command ISA with semaphore sync), ``layout`` (host <-> device
packing: RBE bit planes, HWC), ``program`` (program container and blob), ``simulator``
(binding of ``sim/marsellus``).

Compiler half: ``numerics`` (NormQuant requantize recipes), ``patterns`` (pattern table with
named checks), ``strategy`` (engine choice, DORY-style tiling, memory map, double-buffered
command generation, knobs), ``runtime`` (``tvm_marsellus.run`` on the simulator, per-layer
profiler records with energy). Design notes: ``docs/marsellus.md``.

Importing this package registers the target, its runtime function and the ``marsellus`` Relax
pipeline, so ``tvm.compile(mod, target="llvm", relax_pipeline="marsellus")`` works.
"""

from __future__ import annotations

import numpy as np
import tvm

from tvm_accel.errors import ConfigError
from tvm_accel.layers import LayerGraph, Requant
from tvm_accel.pipeline import (
    canonicalize_for,
    offload,
    register_target_pipeline,
    target_pipeline,
)
from tvm_accel.target import AccelTarget, TargetOption, register_target
from tvm_marsellus import codegen, energy, hw_config, patterns, simulator
from tvm_marsellus.energy import NOMINAL, OperatingPoint
from tvm_marsellus.hw_config import MarsellusConfig, load_config

#: knob key carrying the compile-time operating point ``{"vdd", "freq_mhz", "abb"}``
OP_KNOB = "operating_point"


class MarsellusTarget(AccelTarget):
    name = "marsellus"
    package = "tvm_marsellus"
    activation_type = "uint8"  # unsigned activations, the PULP deployment flows' convention
    #: knobs for the whole function: the operating point, ``biased_hwc``,
    #: ``cluster_marshals_out``, ``objective`` (``energy`` / ``latency``, what the engine
    #: choice of residual adds minimises) and ``prefetch_weights`` (a layer loads the next
    #: layer's first weight group; ``strategy.plan``)
    global_knobs = frozenset({OP_KNOB, "biased_hwc", "cluster_marshals_out", "objective",
                              "prefetch_weights"})

    def load_config(self, path_or_name=None) -> MarsellusConfig:
        return hw_config.load_config(path_or_name)

    def requant_recipe(self, scale: np.ndarray, acc_bound: np.ndarray, zero_point: int,
                       qmin: int, qmax: int) -> Requant:
        from tvm_marsellus.numerics import requant_recipe

        return requant_recipe(scale, acc_bound, zero_point, qmin, qmax)

    def add_recipe(self, scale_a: float, scale_b: float, zero_point: int, qmin: int,
                   qmax: int) -> tuple[int, int, Requant]:
        from tvm_marsellus.numerics import add_recipe

        return add_recipe(scale_a, scale_b, zero_point, qmin, qmax)

    def recipe_for(self, op: str):
        """Average pools divide on the cluster AVGPOOL (one 16-bit kappa + shift), and a
        concat's rescaled input or a rescaling upsample is copied by a 1x1 AVGPOOL
        (``strategy.concat``, ``strategy.resize``); the product of two tensors (a
        squeeze-excitation gate) requantizes on the cluster MUL (one 16-bit kappa + shift)."""
        if op in ("avg_pool2d", "global_avg_pool2d", "concat", "upsample", "multiply"):
            from tvm_marsellus.numerics import avgpool_recipe

            return avgpool_recipe
        return None

    def pattern_table(self):
        return patterns.pattern_table()

    def plan(self, graph: LayerGraph, config: MarsellusConfig, knobs: dict | None = None):
        """The strategy at the operating point of the knobs (nominal when unset), on the config
        at that point's clock (:meth:`MarsellusConfig.at_clock`: L3 keeps its bandwidth in
        time), recorded in each layer's metadata for the energy report."""
        from tvm_marsellus import strategy

        knobs = dict(knobs or {})
        op = operating_point_of(knobs.pop(OP_KNOB, None))
        program = strategy.plan(graph, config.at_clock(op.freq_mhz), knobs, op)
        for ly in program.layers:
            ly.meta["op"] = [op.vdd, op.freq_mhz, bool(op.abb)]
        return program

    def execute(self, program, inputs, config: MarsellusConfig, trace_path: str | None = None):
        from tvm_marsellus.runtime import execute_program

        return execute_program(program, inputs, config, trace_path)

    def compile_function(self, graph: LayerGraph, config: MarsellusConfig,
                         knobs: dict | None = None, name: str = "") -> bytes:
        from tvm_marsellus import program

        op = operating_point_of((knobs or {}).get(OP_KNOB))
        return program.build_blob(self.plan(graph, config, knobs), config.at_clock(op.freq_mhz),
                                  name)

    def finish_offload(self, mod, config: MarsellusConfig, report=None):
        """The report's row of a layer whose function runs in batch passes says so after the
        pattern it matched (``--dump-offloads``); the module is unchanged."""
        if report is None:
            return mod
        from tvm_marsellus.program import load_blob

        notes = {}
        for fn in report.functions:
            prog, _, _ = load_blob(fn.blob)
            if prog.passes > 1:
                notes.update(dict.fromkeys(fn.patterns, prog.layers[0].meta.get("batch", "")))
        for r in report.nodes:
            if r.kind == "layer" and notes.get(r.layer) and notes[r.layer] not in r.reason:
                r.reason = f"{r.reason}; {notes[r.layer]}"
        return mod

    def options(self) -> list[TargetOption]:
        return [
            TargetOption("config", "MARSELLUS hardware config JSON or bundled name "
                         "(marsellus_default)", metavar="FILE"),
            TargetOption("vdd", "MARSELLUS supply voltage for the energy report (0.5..0.8, "
                         "default 0.8)", type=float, metavar="V"),
            TargetOption("freq", "MARSELLUS clock (default: the maximum at the voltage)",
                         type=float, metavar="MHZ"),
            TargetOption("abb", "MARSELLUS adaptive body biasing on", type=bool),
            TargetOption("objective", "what the MARSELLUS engine choices minimise (default "
                         "energy: residual adds on the RBE, no marshaling; latency: on the "
                         "cores, faster)", choices=("energy", "latency")),
        ]

    def knobs_from_options(self, values: dict) -> dict | None:
        """The objective and the operating point (vdd, freq, abb) as global knobs."""
        vdd, freq, abb = values.get("vdd"), values.get("freq"), bool(values.get("abb"))
        knobs = {}
        if values.get("objective") is not None:
            knobs["objective"] = values["objective"]
        if vdd is None and freq is None and not abb:
            return knobs or None
        try:
            op = operating_point_of({"vdd": 0.8 if vdd is None else vdd, "freq_mhz": freq,
                                     "abb": abb})
        except ConfigError as e:  # name the flags the user typed
            given = " ".join(f"--target-marsellus-{k} {v}" for k, v in (("vdd", vdd),
                                                                        ("freq", freq))
                             if v is not None)
            raise ConfigError(f"{given}: {e}" if given else str(e)) from None
        return {**knobs, OP_KNOB: {"vdd": op.vdd, "freq_mhz": op.freq_mhz, "abb": op.abb}}

    def tuning_tasks(self, graph: LayerGraph, config) -> list:
        from tvm_marsellus.tuning import tuning_tasks

        return tuning_tasks(graph, config)

    def disassemble(self, blob: bytes, layer: str | None = None, limit: int = 0) -> str:
        from tvm_marsellus.codegen import format_cmd
        from tvm_marsellus.program import load_blob

        program, cfg, name = load_blob(blob)
        lines = [f"; marsellus function {name}  config {cfg.name}  L2 {program.l2_bytes} bytes"
                 + (f"  {program.passes} batch passes" if program.passes > 1 else "")]
        for t in program.tensors.values():
            lines.append(f"; tensor {t.name} {t.layout}{list(t.shape)} {t.bits}-bit "
                         f"{'signed' if t.signed else 'unsigned'} @ {t.mem}+{t.offset}")
        for ly in program.layers:
            if layer is not None and ly.name != layer:
                continue
            meta = {k: v for k, v in ly.meta.items() if k not in ("op", "shape")}
            lines.append(f"\n{ly.name}:  ; {ly.op} {ly.meta.get('shape', '')} on {ly.engine}  "
                         f"{len(ly.commands)} commands  {meta}")
            body = [f"  {format_cmd(c)}" for c in ly.commands]
            if limit and len(body) > limit:
                body = body[:limit] + [f"  ... {len(body) - limit} more"]
            lines += body
        return "\n".join(lines)


def operating_point_of(spec) -> OperatingPoint:
    """An :class:`OperatingPoint` from None (nominal), an OperatingPoint or a dict with ``vdd``,
    optional ``freq_mhz`` (default: the maximum at vdd) and ``abb``."""
    if spec is None:
        return NOMINAL
    if isinstance(spec, OperatingPoint):
        return spec
    abb = bool(spec.get("abb", False))
    vdd = float(spec.get("vdd", NOMINAL.vdd))
    if spec.get("freq_mhz") is None:
        return OperatingPoint.at(vdd, abb)
    return OperatingPoint(vdd, float(spec["freq_mhz"]), abb)


TARGET = register_target(MarsellusTarget())
register_target_pipeline(TARGET)


def pipeline(config: str | MarsellusConfig | None = None, knobs: dict | None = None,
             op: OperatingPoint | None = None):
    """The ``marsellus`` pipeline for a non-default config, knobs or operating point:
    ``relax_pipeline=pipeline(...)``."""
    knobs = dict(knobs or {})
    if op is not None:
        knobs[OP_KNOB] = {"vdd": op.vdd, "freq_mhz": op.freq_mhz, "abb": op.abb}
    return target_pipeline(TARGET, config, knobs)


def partition_for_marsellus(mod: tvm.IRModule) -> tvm.IRModule:
    """Canonicalize (NormQuant recipe) and partition: the IR just before lowering."""
    from tvm_accel.partition import partition

    return partition(canonicalize_for(mod, TARGET), TARGET.pattern_table())


def lower_marsellus(mod: tvm.IRModule, config: str | MarsellusConfig | None = None,
                    knobs: dict | None = None) -> tvm.IRModule:
    """Canonicalize, partition and lower to ``tvm_marsellus.run`` calls (host ops untouched)."""
    return offload(canonicalize_for(mod, TARGET), TARGET, load_config(config), knobs)


from tvm_marsellus import runtime as _runtime  # noqa: E402,F401  (registers tvm_marsellus.run)

__all__ = ["OP_KNOB", "TARGET", "MarsellusConfig", "MarsellusTarget", "codegen", "energy",
           "hw_config", "load_config", "lower_marsellus", "operating_point_of",
           "partition_for_marsellus", "pipeline", "simulator"]
