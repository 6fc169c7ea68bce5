"""The DeepBench harness the benchmark scripts share: the inference-server convolutions
(``deepbench_conv_inference_server.csv``) as one-conv int8 layer graphs with seeded random
weights and inputs, planned and simulated on a target, with the options and summaries every
script prints. Targets enter only as callables (their recipe, ``plan`` and ``execute``), so
this module names none. Figures are information for issue notes, never assertions.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tvm_accel.layers import ConvLayer, LayerGraph, Requant, Tensor, conv_output_shape

#: the CSV kept in the repository (``benchmarks/data``; the benchmark scripts run from a clone)
DEFAULT_CSV = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / \
    "deepbench_conv_inference_server.csv"


def typical_recipe(requant_recipe: Callable[..., Requant]
                   ) -> Callable[[np.ndarray, np.ndarray], Requant]:
    """``recipe(weight, bias)`` for :func:`make_layer`: a target's ``requant_recipe`` at a
    scale that spreads the typical accumulator of int8 inputs over int8, for the layer's
    worst-case accumulator bound."""

    def recipe(weight: np.ndarray, bias: np.ndarray) -> Requant:
        k = weight.shape[0]
        w = np.abs(weight.astype(np.int64)).reshape(k, -1)
        bound = w.sum(axis=1) * 128 + np.abs(bias.astype(np.int64))
        typical = np.sqrt((weight.astype(np.float64).reshape(k, -1) ** 2).sum(axis=1)) * 74.0
        return requant_recipe(40.0 / np.maximum(typical, 1.0), bound, 0, -128, 127)

    return recipe


def load_rows(path: str | Path, ids: str = "", limit: int = 0) -> list[dict]:
    """The CSV's layer rows; ``ids`` (comma-separated) keeps those layers, ``limit`` the first
    N."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if ids:
        keep = {int(i) for i in ids.split(",")}
        rows = [r for r in rows if int(r["id"]) in keep]
    return rows[:limit] if limit else rows


def parse_args(description: str, default_config: str | None, argv=None) -> argparse.Namespace:
    """The options every DeepBench script takes: ``--config --csv --limit --ids --check --jobs``."""
    ap = argparse.ArgumentParser(description=description.split("\n\n")[0])
    ap.add_argument("--config", default=default_config)
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--limit", type=int, default=0, help="only the first N layers")
    ap.add_argument("--ids", default="", help="comma-separated layer ids")
    ap.add_argument("--check", action="store_true", help="compare with reference_execute")
    ap.add_argument("--jobs", type=int, default=0,
                    help="worker processes (default: the CPUs this process may use)")
    args = ap.parse_args(argv)
    if args.jobs < 0:
        ap.error(f"--jobs {args.jobs}: give at least 1 (or 0 for every CPU)")
    if not args.jobs:
        from tvm_accel.evaluate import default_jobs

        args.jobs = default_jobs()
    return args


def geomean(values: list[float]) -> float:
    """Geometric mean (0 for none; values floored at 1e-9 so a 0 does not poison it)."""
    if not values:
        return 0.0
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


@dataclass
class LayerRun:
    """One layer planned and simulated: the program, the per-call stats, the seconds spent
    planning and simulating, and (with ``check``) whether the output equals
    ``reference_execute``'s (None when not checked)."""

    program: Any
    stats: list
    t_plan: float
    t_sim: float
    exact: bool | None = None


@dataclass
class LayerRuns:
    """Plans and simulates single DeepBench layers for one target: ``plan(graph)`` ->
    program, ``execute(program, inputs)`` -> (outputs, stats), ``error`` the planner's mapping
    error; ``check`` compares every output with ``reference_execute``."""

    plan: Callable
    execute: Callable
    error: type[Exception]
    check: bool = False

    def run(self, graph: LayerGraph, inputs: dict, refused: str = "") -> LayerRun | str:
        """The :class:`LayerRun`, or the reason the layer stays on the CPU (``refused`` by
        the target's pattern checks, or the planner's mapping error)."""
        from tvm_accel.layers import reference_execute

        t0 = time.perf_counter()
        try:
            if refused:
                raise self.error(refused)
            prog = self.plan(graph)
        except self.error as e:
            return str(e)
        t1 = time.perf_counter()
        outs, stats = self.execute(prog, inputs)
        t2 = time.perf_counter()
        exact = None
        if self.check:
            exact = bool(np.array_equal(outs["y"], reference_execute(graph, inputs)["y"]))
        return LayerRun(prog, stats, t1 - t0, t2 - t1, exact)


_MAPPED: dict[str, Any] = {}


def _mapped_row(i: int) -> Any:
    return _MAPPED["fn"](_MAPPED["rows"][i])


def _one_tvm_thread() -> None:
    os.environ["TVM_NUM_THREADS"] = "1"


def map_rows(fn: Callable[[dict], Any], rows: list[dict], jobs: int) -> Iterator[Any]:
    """``fn(row)`` for every row, yielded in row order as they finish. ``jobs`` > 1 runs the
    rows in that many worker processes forked from this one (``fn`` and its closure are
    inherited; only the row index and the result, which must pickle, cross the pipe; TVM's
    parallel loops run inline in them, see :func:`tvm_accel.evaluate.worker_start_method`);
    one job, or an OS without fork, runs them here."""
    from tvm_accel.evaluate import worker_start_method

    if jobs <= 1 or len(rows) <= 1 or worker_start_method() != "fork":
        yield from map(fn, rows)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    _MAPPED.update(fn=fn, rows=rows)
    try:
        with ProcessPoolExecutor(min(jobs, len(rows)),
                                 mp_context=multiprocessing.get_context("fork"),
                                 initializer=_one_tvm_thread) as pool:
            yield from pool.map(_mapped_row, range(len(rows)))
    finally:
        _MAPPED.clear()


def make_layer(row: dict, seed: int, recipe: Callable[[np.ndarray, np.ndarray], Requant]
               ) -> tuple[LayerGraph, dict[str, np.ndarray]]:
    """The row as a one-conv int8 graph with seeded random weights, bias and input;
    ``recipe(weight, bias) -> Requant`` gives the target's requantize recipe."""
    w, h, c, n, k = (int(row[x]) for x in ("w", "h", "c", "n", "k"))
    fw, fh, pw, ph = (int(row[x]) for x in ("filter_w", "filter_h", "pad_w", "pad_h"))
    sw, sh = int(row["stride_w"]), int(row["stride_h"])
    rng = np.random.default_rng(seed)
    weight = rng.integers(-128, 128, size=(k, c, fh, fw), dtype=np.int64)
    bias = rng.integers(-(1 << 12), 1 << 12, size=k, dtype=np.int64)
    layer = ConvLayer(f"conv{row['id']}", "x", "y", weight, bias, 0, (sh, sw), (ph, pw, ph, pw),
                      recipe(weight, bias))
    out = conv_output_shape(layer, (n, c, h, w))
    graph = LayerGraph({"x": Tensor("x", (n, c, h, w), "int8"), "y": Tensor("y", out, "int8")},
                       [layer], ["x"], ["y"])
    x = rng.integers(-128, 128, size=(n, c, h, w), dtype=np.int64).astype(np.int8)
    return graph, {"x": x}
