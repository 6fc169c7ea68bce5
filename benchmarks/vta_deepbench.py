"""DeepBench inference-server convolutions on the VTA static strategy (TVM's conv2d template).

Every layer of ``deepbench_conv_inference_server.csv`` (NCHW int8, seeded random int8 weights and
input, a valid VTA requantize recipe) goes through ``strategy.plan`` + ``runtime.execute_program``
on the C simulator. Printed per layer: shape, useful MACs, simulated cycles, GEMM utilization
(useful MACs / (cycles x MACs per cycle)), channel/batch padding overhead (padded MACs / MACs - 1),
instruction count, compile time and simulator wall time; then the geometric-mean utilization, the
total wall time, the five worst layers and the simulator speed on the largest layers.

    python benchmarks/vta_deepbench.py [--config vta_8x8x8] [--limit N] [--ids 0,5,27]
                                       [--check] [--csv PATH]

``--check`` compares each layer with ``layers.reference_execute`` (numpy; slow for the largest
layers). Figures are information for issue notes, never assertions.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tvm_accel.layers import ConvLayer, LayerGraph, Requant, Tensor, conv_output_shape

DEFAULT_CSV = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / \
    "deepbench_conv_inference_server.csv"


def _requant(weight: np.ndarray, bias: np.ndarray) -> Requant:
    """A valid VTA recipe for a scale that spreads the typical accumulator over int8."""
    k = weight.shape[0]
    w = np.abs(weight.astype(np.int64)).reshape(k, -1)
    bound = w.sum(axis=1) * 128 + np.abs(bias.astype(np.int64))
    typical = np.sqrt((weight.astype(np.float64).reshape(k, -1) ** 2).sum(axis=1)) * 74.0
    scale = 40.0 / np.maximum(typical, 1.0)
    try:
        from tvm_vta_cp.numerics import requant_recipe

        return requant_recipe(scale, bound, 0, -128, 127)
    except ImportError:  # fall back to a simple recipe: pre-shift until the product fits
        pre = 0
        while (int(bound.max()) >> pre) * 32767 >= 1 << 30:
            pre += 1
        shift = max(0, int(math.floor(math.log2(32767 / (scale.max() * 2**pre)))))
        m = np.clip(np.round(scale * 2.0 ** (pre + shift)), 1, 32767).astype(np.int64)
        return Requant(pre, m, np.full(k, (1 << shift) >> 1), shift, 0, -128, 127, scale)


def load_rows(path: str, ids: str = "", limit: int = 0) -> list[dict]:
    """The CSV's layer rows; ``ids`` (comma-separated) keeps those layers, ``limit`` the first
    N (shared by the DeepBench benchmarks of every target)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if ids:
        keep = {int(i) for i in ids.split(",")}
        rows = [r for r in rows if int(r["id"]) in keep]
    return rows[:limit] if limit else rows


def parse_args(description: str, default_config: str | None, argv=None) -> argparse.Namespace:
    """The options every DeepBench script takes: ``--config --csv --limit --ids --check``."""
    ap = argparse.ArgumentParser(description=description.split("\n\n")[0])
    ap.add_argument("--config", default=default_config)
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--limit", type=int, default=0, help="only the first N layers")
    ap.add_argument("--ids", default="", help="comma-separated layer ids")
    ap.add_argument("--check", action="store_true", help="compare with reference_execute")
    return ap.parse_args(argv)


def geomean(values: list[float]) -> float:
    """Geometric mean (0 for none; values floored at 1e-9 so a 0 does not poison it)."""
    if not values:
        return 0.0
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


@dataclass
class LayerRuns:
    """Plans and simulates single DeepBench layers for one target: ``plan(graph)`` ->
    program, ``execute(program, inputs)`` -> (outputs, stats), ``error`` the planner's mapping
    error; totals the planning and simulation seconds of the layers that map and, with
    ``check``, whether every one is bit-exact against ``reference_execute``."""

    plan: Callable
    execute: Callable
    error: type
    check: bool = False
    t_plan: float = 0.0
    t_sim: float = 0.0
    exact: bool = True

    def run(self, graph: LayerGraph, inputs: dict, refused: str = ""):
        """``(program, stats, planning seconds)``, or the reason the layer stays on the CPU
        (``refused`` by the target's pattern checks, or the planner's mapping error)."""
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
        self.t_plan, self.t_sim = self.t_plan + t1 - t0, self.t_sim + t2 - t1
        if self.check:
            self.exact &= bool(np.array_equal(outs["y"], reference_execute(graph, inputs)["y"]))
        return prog, stats, t1 - t0


def make_layer(row: dict, seed: int, recipe=None):
    """The row as a one-conv int8 graph with seeded random weights, bias and input;
    ``recipe(weight, bias) -> Requant`` gives the target's requantize recipe (default VTA's)."""
    w, h, c, n, k = (int(row[x]) for x in ("w", "h", "c", "n", "k"))
    fw, fh, pw, ph = (int(row[x]) for x in ("filter_w", "filter_h", "pad_w", "pad_h"))
    sw, sh = int(row["stride_w"]), int(row["stride_h"])
    rng = np.random.default_rng(seed)
    weight = rng.integers(-128, 128, size=(k, c, fh, fw), dtype=np.int64)
    bias = rng.integers(-(1 << 12), 1 << 12, size=k, dtype=np.int64)
    layer = ConvLayer(f"conv{row['id']}", "x", "y", weight, bias, 0, (sh, sw), (ph, pw, ph, pw),
                      (recipe or _requant)(weight, bias))
    out = conv_output_shape(layer, (n, c, h, w))
    graph = LayerGraph({"x": Tensor("x", (n, c, h, w), "int8"), "y": Tensor("y", out, "int8")},
                       [layer], ["x"], ["y"])
    x = rng.integers(-128, 128, size=(n, c, h, w), dtype=np.int64).astype(np.int8)
    return graph, {"x": x}


def main(argv=None) -> int:
    args = parse_args(__doc__, "vta_1x16x16", argv)

    from tvm_vta_cp.hw_config import load_config
    from tvm_vta_cp.runtime import execute_program
    from tvm_vta_cp.strategy import plan

    cfg = load_config(args.config)
    rows = load_rows(args.csv, args.ids, args.limit)

    hdr = (f"{'id':>3} {'shape':<42} {'MACs':>12} {'cycles':>12} {'util':>6} {'pad':>6} "
           f"{'insns':>7} {'compile':>8} {'sim':>7}  knobs")
    print(f"# VTA static strategy on DeepBench, config {cfg.name} "
          f"({cfg.macs_per_cycle} MACs/cycle)")
    print(hdr)
    results, t_all = [], time.perf_counter()
    for row in rows:
        graph, inputs = make_layer(row, seed=int(row["id"]))
        t0 = time.perf_counter()
        prog = plan(graph, cfg)
        t1 = time.perf_counter()
        outs, stats = execute_program(prog, inputs, cfg)
        t2 = time.perf_counter()
        ly, st = prog.layers[0], stats[0][1]
        util = ly.macs / (st.cycles * cfg.macs_per_cycle)
        pad = ly.padded_macs / ly.macs - 1
        status = ""
        if args.check:
            from tvm_accel.layers import reference_execute

            ok = np.array_equal(outs["y"], reference_execute(graph, inputs)["y"])
            status = " ok" if ok else " MISMATCH"
        kn = ",".join(f"{k.replace('tile_', '').replace('_nthread', 'T')}={v}"
                      for k, v in ly.knobs.items())
        print(f"{row['id']:>3} {ly.shape:<42} {ly.macs:>12,} {st.cycles:>12,} {util:>6.1%} "
              f"{pad:>6.1%} {ly.n_insns:>7} {t1 - t0:>7.2f}s {t2 - t1:>6.2f}s  {kn}{status}",
              flush=True)
        results.append(dict(id=int(row["id"]), shape=ly.shape, macs=ly.macs, cycles=st.cycles,
                            util=util, pad=pad, compile=t1 - t0, sim=t2 - t1,
                            ok=status != " MISMATCH"))
    wall = time.perf_counter() - t_all
    if not results:
        return 0
    geo = geomean([r["util"] for r in results])
    print(f"\nsummary: {len(results)} layers, geomean GEMM utilization {geo:.1%}, "
          f"total compile {sum(r['compile'] for r in results):.1f}s, "
          f"total simulate {sum(r['sim'] for r in results):.1f}s, wall {wall:.1f}s"
          + (f", mismatches {sum(not r['ok'] for r in results)}" if args.check else ""))
    print("5 worst layers by utilization:")
    for r in sorted(results, key=lambda r: r["util"])[:5]:
        print(f"  id {r['id']:>3} {r['shape']:<42} util {r['util']:6.1%}  "
              f"padding overhead {r['pad']:6.1%}")
    print("largest layers (simulator speed = useful MACs / simulator wall time):")
    for r in sorted(results, key=lambda r: -r["macs"])[:5]:
        print(f"  id {r['id']:>3} {r['shape']:<42} {r['macs'] / 1e9:6.2f} GMAC in "
              f"{r['sim']:6.2f}s = {r['macs'] / r['sim'] / 1e9:6.2f} GMAC/s")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
