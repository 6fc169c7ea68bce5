"""DPU target: a Xilinx-DPU-style FPGA overlay (DPUV3INT8 / DNNVM papers) as a TVM BYOC target
named ``dpu``.

Hardware side, one module each: ``hw_config`` (JSON config: DDR regions, PM, per-PE FM, unit
parallelism and timing), ``codegen`` (256-bit ISA with DPON/DPBY dependency fields: encoder,
decoder, program blob), ``asm`` (assembly formatter and parser), ``layout`` (host <-> device
packing), ``simulator`` (binding of the C simulator in ``sim/dpu``), ``timeline`` (Chrome trace
-> PNG timeline).

Compiler side: ``numerics`` (power-of-two requantize recipe), ``patterns`` (pattern table with
named checks), ``xgraph`` (XGraph-style view of a layer graph), ``program`` (what the strategy
hands codegen), ``strategy/`` (tiling, FM/PM allocation, chains, DPON/DPBY dependencies, list
scheduling, stream merging, emitters), ``fusion`` (DNNVM's fusion templates and search),
``tuning``, ``runtime`` (``tvm_dpu.run`` on the simulator, profiler records). Design notes:
``docs/dpu.md``.

Importing this package registers the target, its runtime function and the ``dpu`` Relax
pipeline, so ``tvm.compile(mod, target="llvm", relax_pipeline="dpu")`` works.
"""

from __future__ import annotations

import numpy as np
import tvm

from tvm_accel.layers import LayerGraph, Requant
from tvm_accel.pipeline import (
    canonicalize_for,
    offload,
    register_target_pipeline,
    target_pipeline,
)
from tvm_accel.target import AccelTarget, TargetOption, register_target
from tvm_dpu import hw_config, patterns
from tvm_dpu.hw_config import DPUConfig, load_config


class DPUTarget(AccelTarget):
    name = "dpu"
    package = "tvm_dpu"
    quantize_scheme = "power-of-two"  # the DPU requantizes by shifting
    global_knobs = frozenset({"@fusion"})  # tvm_dpu.fusion.FUSION_KNOB

    def load_config(self, path_or_name=None) -> DPUConfig:
        return hw_config.load_config(path_or_name)

    def requant_recipe(self, scale: np.ndarray, acc_bound: np.ndarray, zero_point: int,
                       qmin: int, qmax: int) -> Requant:
        from tvm_dpu.numerics import requant_recipe

        return requant_recipe(scale, acc_bound, zero_point, qmin, qmax)

    def add_recipe(self, scale_a: float, scale_b: float, zero_point: int, qmin: int,
                   qmax: int) -> tuple[int, int, Requant]:
        from tvm_dpu.numerics import add_recipe

        return add_recipe(scale_a, scale_b, zero_point, qmin, qmax)

    def recipe_for(self, op: str):
        """Average pools divide on AVGPOOL (16-bit multiplier + shift), not by shifting only;
        the product of two tensors (a squeeze-excitation gate) requantizes on ELTMUL by a
        shift, like a conv."""
        if op in ("avg_pool2d", "global_avg_pool2d"):
            from tvm_dpu.numerics import avgpool_recipe

            return avgpool_recipe
        if op == "multiply":
            return self.requant_recipe
        return None

    def global_pool_steps(self, h: int, w: int, dtype: str, zero_points: tuple[int, int]):
        """Global average pools beyond AVGPOOL's 15 x 15 window run in steps."""
        from tvm_dpu.numerics import global_pool_steps

        return global_pool_steps(h, w, dtype, zero_points)

    def pattern_table(self):
        return patterns.pattern_table()

    def plan(self, graph: LayerGraph, config: DPUConfig, knobs: dict | None = None):
        from tvm_dpu import strategy

        return strategy.plan(graph, config, knobs)

    def execute(self, program, inputs, config: DPUConfig, trace_path: str | None = None):
        from tvm_dpu.runtime import execute_program

        return execute_program(program, inputs, config, trace_path)

    def compile_function(self, graph: LayerGraph, config: DPUConfig, knobs: dict | None = None,
                         name: str = "") -> bytes:
        from tvm_dpu import codegen

        return codegen.build_blob(self.plan(graph, config, knobs), config, name)

    def options(self) -> list[TargetOption]:
        return [TargetOption("config", "DPU hardware config JSON or bundled name (dpu_default, "
                             "dpu_8pe)", metavar="FILE")]

    def tuning_tasks(self, graph: LayerGraph, config) -> list:
        from tvm_dpu.tuning import tuning_tasks

        return tuning_tasks(graph, config)

    def disassemble(self, blob: bytes, layer: str | None = None, limit: int = 0) -> str:
        from tvm_dpu.asm import ISA
        from tvm_dpu.codegen import load_blob

        program, cfg, name = load_blob(blob)
        isa = ISA(cfg)
        lines = [f"; dpu function {name}  config {cfg.name}  regions {program.region_sizes}"]
        for t in program.tensors.values():
            lines.append(f"; tensor {t.name} {t.dtype}{list(t.shape)} @ {t.region}+{t.offset} "
                         f"images {t.n_alloc}")
        for ly in program.layers:
            if layer is not None and ly.name != layer:
                continue
            part = "" if ly.stream is None else f"  (part of stream {ly.stream})"
            lines.append(f"\n{ly.name}:  ; {ly.op} {ly.shape}  {ly.n_insns} insns  "
                         f"knobs {ly.knobs}{part}")
            body = isa.disassemble(ly.insns)
            if limit and len(body) > limit:
                body = body[:limit] + [f"  ... {len(body) - limit} more"]
            lines += body
        return "\n".join(lines)


TARGET = register_target(DPUTarget())
register_target_pipeline(TARGET)


def pipeline(config: str | DPUConfig | None = None, knobs: dict | None = None):
    """The ``dpu`` pipeline for a non-default config or knobs: ``relax_pipeline=pipeline(...)``."""
    return target_pipeline(TARGET, config, knobs)


def partition_for_dpu(mod: tvm.IRModule) -> tvm.IRModule:
    """Canonicalize (power-of-two recipe) and partition: the IR just before lowering."""
    from tvm_accel.partition import partition

    return partition(canonicalize_for(mod, TARGET), TARGET.pattern_table())


def lower_dpu(mod: tvm.IRModule, config: str | DPUConfig | None = None,
              knobs: dict | None = None) -> tvm.IRModule:
    """Canonicalize, partition and lower to ``tvm_dpu.run`` calls (host ops untouched)."""
    return offload(canonicalize_for(mod, TARGET), TARGET, load_config(config), knobs)


from tvm_dpu import runtime as _runtime  # noqa: E402,F401  (registers tvm_dpu.run)

__all__ = ["TARGET", "DPUConfig", "DPUTarget", "load_config", "lower_dpu", "partition_for_dpu",
           "pipeline"]
