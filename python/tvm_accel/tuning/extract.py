"""Task extraction: the distinct tunable workloads of a model for one target and config."""

from __future__ import annotations

import json
from typing import Any

from tvm_accel.target import AccelTarget
from tvm_accel.tuning.task import Task

__all__ = ["extract_tasks"]


def extract_tasks(mod, target: AccelTarget, config: Any = None, knobs: dict | None = None,
                  host: str = "llvm", precision: Any = None) -> list[Task]:
    """Compile ``mod`` (a Relax module from :func:`tvm_accel.frontend.load_onnx`) once with
    the default knobs and return the tasks of its offloaded functions in program order;
    identical workloads merge into one task whose ``weight`` counts the uses and whose
    ``layers`` lists every layer that will take its best configuration."""
    from tvm_accel.pipeline import compile_model

    cfg = target.load_config(config)
    _, report = compile_model(mod, target, cfg, knobs, host, precision=precision)
    shapes = {r.layer: r.shape for r in report.nodes}  # the layers' own shapes
    merged: dict[tuple[str, str], Task] = {}
    for fn in report.functions:
        for task in target.tuning_tasks(fn.graph, cfg):
            key = (task.name, json.dumps(list(task.workload), sort_keys=True, default=str))
            if key in merged:
                merged[key].weight += task.weight
                merged[key].layers += task.layers
            else:
                task.shape = shapes.get(task.layers[0], "")
                merged[key] = task
    return list(merged.values())
