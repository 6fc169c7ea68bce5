"""Applying tuning records at compile time (``tvmc compile --tuning-records``)."""

from __future__ import annotations

from typing import Any

from tvm_accel.layers import LayerGraph
from tvm_accel.target import AccelTarget

__all__ = ["apply_history"]


def apply_history(target: AccelTarget, graph: LayerGraph, config: Any, knobs: dict | None
                  ) -> tuple[dict | None, dict[str, dict]]:
    """``knobs`` with the best recorded configuration of each task of ``graph`` filled in
    (under an active :class:`tvm_accel.tuning.records.ApplyHistoryBest`), and which layers got
    one. A knob the user set explicitly for a layer wins over the record."""
    from tvm_accel.tuning.records import ApplyHistoryBest

    ctx = ApplyHistoryBest.current()
    if ctx is None:
        return knobs, {}
    out = dict(knobs or {})
    used: dict[str, dict] = {}
    for task in target.tuning_tasks(graph, config):
        best = ctx.query(task)
        if best is None:
            continue
        for layer in task.layers:
            mine = out.get(layer)
            out[layer] = {**best, **(mine if isinstance(mine, dict) else {})}
            used[layer] = dict(best)
    return out, used
