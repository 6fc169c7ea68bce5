"""VTA target: a VTA-style GEMM accelerator as a TVM BYOC target named ``vta``.

Stages, one module each: ``hw_config`` (JSON config), ``patterns`` (pattern table with named
checks), ``strategy`` (TVM's static conv2d/dense template: NCHWnc packing, tiling, virtual
threads), ``codegen`` (128-bit ISA encoder, blob), ``runtime`` (``tvm_vta_cp.run`` on the C
simulator), ``numerics`` (requantize recipe on the ALU).

Importing this package registers the target, its runtime function and the ``vta`` Relax pipeline,
so ``tvm.compile(mod, target="llvm", relax_pipeline="vta")`` works.
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
from tvm_accel.target import AccelTarget, register_target
from tvm_vta_cp import hw_config, patterns
from tvm_vta_cp.hw_config import VTAConfig, load_config


class VTATarget(AccelTarget):
    name = "vta"
    package = "tvm_vta_cp"

    def load_config(self, path_or_name=None) -> VTAConfig:
        return hw_config.load_config(path_or_name)

    def requant_recipe(self, scale: np.ndarray, acc_bound: np.ndarray, zero_point: int,
                       qmin: int, qmax: int) -> Requant:
        from tvm_vta_cp.numerics import requant_recipe

        return requant_recipe(scale, acc_bound, zero_point, qmin, qmax)

    def add_recipe(self, scale_a: float, scale_b: float, zero_point: int, qmin: int,
                   qmax: int) -> tuple[int, int, Requant]:
        from tvm_vta_cp.numerics import add_recipe

        return add_recipe(scale_a, scale_b, zero_point, qmin, qmax)

    def pattern_table(self):
        return patterns.pattern_table()

    def compile_function(self, graph: LayerGraph, config: VTAConfig, knobs: dict | None = None,
                         name: str = "") -> bytes:
        from tvm_vta_cp import codegen, strategy

        return codegen.build_blob(strategy.plan(graph, config, knobs), config, name)

    def disassemble(self, blob: bytes, layer: str | None = None, limit: int = 0) -> str:
        from tvm_vta_cp.codegen import ISA, load_blob

        program, cfg, name = load_blob(blob)
        isa = ISA(cfg)
        lines = [f"; vta function {name}  config {cfg.name}  dram {program.dram_size} bytes"]
        for t in program.tensors.values():
            lines.append(f"; tensor {t.name} {t.dtype}{list(t.shape)} @ {t.offset} "
                         f"halo {list(t.halo)} fill {t.fill}")
        for ly in program.layers:
            if layer is not None and ly.name != layer:
                continue
            lines.append(f"\n{ly.name}:  ; {ly.op} {ly.shape}  {ly.n_insns} insns  "
                         f"knobs {ly.knobs}")
            body = isa.disassemble(ly.insns)
            if limit and len(body) > limit:
                body = body[:limit] + [f"  ... {len(body) - limit} more"]
            lines += body
        return "\n".join(lines)


TARGET = register_target(VTATarget())
register_target_pipeline(TARGET)


def pipeline(config: str | VTAConfig | None = None, knobs: dict | None = None):
    """The ``vta`` pipeline for a non-default config or knobs: ``relax_pipeline=pipeline(...)``."""
    return target_pipeline(TARGET, config, knobs)


def partition_for_vta(mod: tvm.IRModule) -> tvm.IRModule:
    """Canonicalize (VTA recipe) and partition: the IR just before lowering."""
    from tvm_accel.partition import partition

    return partition(canonicalize_for(mod, TARGET), TARGET.pattern_table())


def lower_vta(mod: tvm.IRModule, config: str | VTAConfig | None = None,
              knobs: dict | None = None) -> tvm.IRModule:
    """Canonicalize, partition and lower to ``tvm_vta_cp.run`` calls (host ops untouched)."""
    return offload(canonicalize_for(mod, TARGET), TARGET, load_config(config), knobs)


from tvm_vta_cp import runtime as _runtime  # noqa: E402,F401  (registers tvm_vta_cp.run)

__all__ = ["TARGET", "VTAConfig", "load_config", "lower_vta", "partition_for_vta", "pipeline"]
