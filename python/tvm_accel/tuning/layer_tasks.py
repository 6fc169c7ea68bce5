"""Per-layer tuning tasks, shared by the targets: a layer's workload key, the one-layer graph
it is measured as, and the measurement itself (the target's ``plan`` and ``execute``, see
:class:`~tvm_accel.target.AccelTarget`, on seeded random inputs; timing does not depend on the
data).

The workload key holds everything of the layer that its program's timing can depend on: the
layer kind, its scalar fields (strides, padding, dilation, groups, zero points, multipliers,
kernel, ...), the shapes of its array fields (weights and biases, not their values), the shape
of its requantize recipe (pre-shift, shift, per-channel or uniform multiplier, zero point,
clip range) and the shapes and dtypes of its tensors. Two layers with equal keys share a task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tvm_accel.knobs import KnobSpace
from tvm_accel.layers import LayerGraph, Requant, Tensor
from tvm_accel.target import get_target
from tvm_accel.tuning.task import Task

__all__ = ["layer_cost", "layer_inputs", "layer_tasks", "layer_workload", "loop_features",
           "measure_layer", "run_layer", "seeded_inputs", "single_layer_graph"]

_NAMES = frozenset({"name", "input", "output", "inputs", "outputs"})


def layer_inputs(layer) -> list[str]:
    """The tensors a layer reads."""
    ins = getattr(layer, "inputs", None)
    return list(ins) if ins is not None else [layer.input]


def _key_value(v: Any) -> Any:
    if isinstance(v, Requant):
        m = np.asarray(v.multiplier).reshape(-1)
        return ["requant", int(v.pre_shift), int(v.shift), bool(np.all(m == m[0])),
                int(v.zero_point), int(v.qmin), int(v.qmax)]
    if isinstance(v, np.ndarray):
        return ["shape", list(v.shape)]
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (tuple, list)):
        return [_key_value(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _key_value(x) for k, x in sorted(v.items())}
    if dataclasses.is_dataclass(v):
        return [type(v).__name__, *(_key_value(getattr(v, f.name))
                                    for f in dataclasses.fields(v))]
    return repr(v)


def layer_workload(layer, graph: LayerGraph) -> tuple:
    """The stable, JSON-able workload key of ``layer`` in ``graph`` (see the module doc)."""
    fields = [[f.name, _key_value(getattr(layer, f.name))] for f in dataclasses.fields(layer)
              if f.name not in _NAMES]
    tensors = [[list(graph.tensors[n].shape), graph.tensors[n].dtype]
               for n in [*layer_inputs(layer), layer.output]]
    return (type(layer).__name__, tensors, fields)


def single_layer_graph(layer, graph: LayerGraph) -> LayerGraph:
    """``layer`` alone, reading its inputs as graph inputs."""
    ins = layer_inputs(layer)
    tensors = {n: Tensor(n, tuple(graph.tensors[n].shape), graph.tensors[n].dtype)
               for n in dict.fromkeys([*ins, layer.output])}
    return LayerGraph(tensors, [layer], list(dict.fromkeys(ins)), [layer.output])


def run_layer(context: tuple[str, LayerGraph, Any], config: dict) -> tuple[Any, list]:
    """Plan the one-layer graph of ``context`` (``(target kind, graph, hardware config)``)
    under ``config`` and run it on the simulator with seeded random inputs: ``(program,
    [(layer, stats), ...])`` as the target's ``execute`` returns them. An invalid
    configuration raises :class:`~tvm_accel.errors.KnobError` (a ``ValueError``) from the
    strategy's knob check."""
    kind, graph, cfg = context
    target = get_target(kind)
    prog = target.plan(graph, cfg, {graph.layers[0].name: dict(config)})
    _, stats = target.execute(prog, seeded_inputs(graph), cfg)
    return prog, stats


def seeded_inputs(graph: LayerGraph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs over each input's full integer range (the simulated timing does not depend
    on the data; a fixed seed keeps measurements reproducible)."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        info = np.iinfo(t.dtype) if np.dtype(t.dtype).kind in "iu" else None
        lo, hi = (int(info.min), int(info.max)) if info is not None else (-1, 1)
        inputs[name] = rng.integers(lo, hi + 1, size=t.shape).astype(t.dtype)
    return inputs


def measure_layer(context: tuple[str, LayerGraph, Any], config: dict
                  ) -> tuple[int, float, float | None]:
    """Simulated cycles and seconds of a one-layer graph under ``config`` (see
    :func:`run_layer`); no energy (targets that model it pass their own ``measure`` to
    :func:`layer_tasks`)."""
    cycles, seconds = layer_cost(run_layer(context, config)[1], context[2])
    return cycles, seconds, None


def layer_cost(stats: list, cfg: Any) -> tuple[int, float]:
    """Cycles summed over a run's per-layer ``stats`` and the seconds they take at the
    config's ``CLOCK_MHZ``."""
    cycles = int(sum(st.cycles for _, st in stats))
    return cycles, cycles / (float(cfg.CLOCK_MHZ) * 1e6)


def loop_features(layer, graph: LayerGraph) -> tuple[float, ...]:
    """Fixed-width structure features: log2 of the output size and of the weight size, and
    the first input's N, C, H, W (1 where absent)."""
    n, c, h, w = (*graph.tensors[layer_inputs(layer)[0]].shape, 1, 1, 1)[:4]
    out = int(np.prod(graph.tensors[layer.output].shape))
    weight = getattr(layer, "weight", None)
    wsize = int(np.prod(weight.shape)) if isinstance(weight, np.ndarray) else 1
    return (float(np.log2(max(out, 1))), float(np.log2(max(wsize, 1))), float(n), float(c),
            float(h), float(w))


def layer_tasks(target: str, graph: LayerGraph, cfg: Any,
                spaces: Mapping[str, KnobSpace],
                measure: Callable[[Any, dict], tuple[int, float, float | None]] = measure_layer
                ) -> list[Task]:
    """One task per layer of ``graph`` that has a knob space in ``spaces`` (layer order),
    measured by ``measure`` (a module-level function, so workers can unpickle it; default
    :func:`measure_layer`, cycles only)."""
    tasks = []
    for layer in graph.layers:
        space = spaces.get(layer.name)
        if space is None or space.size <= 1:
            continue
        op = "dense" if getattr(layer, "is_dense", False) else getattr(
            layer, "op_name", type(layer).__name__.lower())
        tasks.append(Task(
            name=f"{target}.{op}",
            target=target, workload=layer_workload(layer, graph), space=space,
            measure=measure, context=(target, single_layer_graph(layer, graph), cfg),
            layers=[layer.name], config_name=getattr(cfg, "name", ""),
            config_fingerprint=cfg.fingerprint.hex(),
            loop_features=loop_features(layer, graph)))
    return tasks
