"""Batch passes: a function whose tensors do not fit L2 / L3 for the whole batch is planned
for the largest sub-batch that fits (a divisor of the batch) and run once per sub-batch, the
host feeding each pass its images (``docs/marsellus.md``, Batch passes). Every layer the
strategy maps is per image, so the passes are bit-exact with the whole batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tvm_accel.layers import LayerGraph
from tvm_marsellus.program import MarsProgram
from tvm_marsellus.strategy.memory import CapacityError


def batch_of(graph: LayerGraph) -> int:
    """The batch every tensor of the graph shares (its leading dimension), 0 if they differ."""
    sizes = {int(t.shape[0]) for t in graph.tensors.values() if len(t.shape)}
    return sizes.pop() if len(sizes) == 1 else 0


def sub_batch(graph: LayerGraph, b: int) -> LayerGraph:
    """The graph with every tensor's batch set to ``b`` (layers and weights shared)."""
    tensors = {n: replace(t, shape=(b, *t.shape[1:])) for n, t in graph.tensors.items()}
    return LayerGraph(tensors, graph.layers, graph.inputs, graph.outputs)


def plan_in_passes(graph: LayerGraph, whole: CapacityError,
                   plan: Callable[[LayerGraph], MarsProgram]) -> MarsProgram:
    """``plan`` of the largest sub-batch that fits, as a program of ``passes`` runs, each
    layer's meta ``batch`` saying so; ``whole`` (the error of the whole batch) when the batch
    cannot be split, and when even one image does not fit, both reasons."""
    n = batch_of(graph)
    last = whole
    for b in (d for d in range(n - 1, 0, -1) if n % d == 0):
        try:
            prog = plan(sub_batch(graph, b))
        except CapacityError as e:
            last = e
            continue
        prog.passes = n // b
        note = f"batch {n} in {n // b} passes of {b} ({whole})"
        for ly in prog.layers:
            ly.meta["batch"] = note
        return prog
    if last is whole:
        raise whole
    raise CapacityError(f"{whole}; one image of the batch of {n} does not fit either: "
                        f"{last}") from None
