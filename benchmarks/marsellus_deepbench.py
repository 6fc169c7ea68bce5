"""DeepBench conv layers on MARSELLUS (8-bit): does every layer compile and run, where do its
tensors live (L2 or L3), which engine runs it, cycles, utilization and what bounds it.

Each layer of ``deepbench_conv_inference_server.csv`` becomes a one-conv layer graph with random
int8 weights and a NormQuant-compatible requantize recipe, is planned by the MARSELLUS strategy
(three-level tiling) and run on the simulator; ``--check`` also compares the output with
``reference_execute``. A layer the strategy cannot map is counted with its reason (a compile
would leave it on the CPU). Utilization = useful MACs / (cycles x the engine's 8-bit peak);
useful MACs leave out outputs whose window lies in the padding only, which the cores skip.
A layer whose batch does not fit L3 runs in passes of the largest sub-batch that fits (the
reason column says so); ``--csv`` takes another list in the same columns, e.g. DeepBench's
training set (batch 4-32).

    python benchmarks/marsellus_deepbench.py [--limit N] [--ids 0,5] [--check] [--jobs N]

Figures are information for issue notes, never assertions.
"""

from __future__ import annotations

import sys

import numpy as np

from tvm_accel.deepbench import LayerRuns, geomean, load_rows, make_layer, map_rows, parse_args
from tvm_accel.layers import Requant


def marsellus_recipe(weight: np.ndarray, bias: np.ndarray) -> Requant:
    """A NormQuant-compatible recipe spreading the accumulator bound over int8."""
    from tvm_marsellus.numerics import requant_recipe

    k = weight.shape[0]
    bound = np.abs(weight).reshape(k, -1).sum(1) * 128 + np.abs(bias)
    return requant_recipe(127.0 / (0.05 * bound + 1), bound, 0, -128, 127)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, None, argv)

    from tvm_accel.errors import MappingError
    from tvm_accel.profiler import bound_label
    from tvm_accel.report import format_table
    from tvm_marsellus.hw_config import load_config
    from tvm_marsellus.patterns import MAX_WINDOW
    from tvm_marsellus.runtime import execute_program
    from tvm_marsellus.strategy import plan

    cfg = load_config(args.config)
    rows = load_rows(args.csv, args.ids, args.limit)
    runs = LayerRuns(lambda g: plan(g, cfg), lambda p, x: execute_program(p, x, cfg),
                     MappingError, args.check)

    def measure(row: dict) -> dict:
        graph, inputs = make_layer(row, int(row["id"]), marsellus_recipe)
        layer = graph.layers[0]
        shape = (f"{graph.tensors['x'].shape}->{layer.weight.shape[0]} "
                 f"{layer.kernel[0]}x{layer.kernel[1]} s{layer.strides[0]}")
        refused = ("pattern: kernel, stride or padding above 255 (8-bit window fields)"
                   if max(*layer.kernel, *layer.strides, *layer.padding) > MAX_WINDOW else "")
        out = runs.run(graph, inputs, refused)
        if isinstance(out, str):
            return dict(failed=out, row=(row["id"], shape, "cpu", "-", "-", "-", "-", "-",
                                         out[:60]))
        prog = out.program
        (_, st), lp = out.stats[0], prog.layers[0]
        peak = cfg.rbe_and_gates / 64 if lp.engine == "rbe" else cfg.cluster_macs_per_cycle(8)
        # the layer's MACs less those of outputs whose window is padding only, which the
        # cores skip (the simulator's MAC counters)
        macs = min(lp.macs * prog.passes, st.rbe_macs + st.cluster_macs)
        util = min(1.0, macs / (st.cycles * peak)) if st.cycles else 0.0
        mem = "/".join(prog.tensors[t].mem for t in ("x", "y"))
        bound = bound_label({"off-chip": st.iodma_busy,
                             "on-chip": max(st.dma_in_busy, st.dma_out_busy),
                             "compute": max(st.rbe_busy, st.cluster_busy)})
        return dict(util=util, split=prog.passes > 1, t_plan=out.t_plan, t_sim=out.t_sim,
                    exact=out.exact,
                    row=(row["id"], shape, "RBE" if lp.engine == "rbe" else "cluster", mem,
                         "L3" if prog.l3_image else "L2", f"{st.cycles:,}",
                         f"{100 * util:.1f}%", bound, lp.meta.get("batch", "").split(" (")[0]))

    res = list(map_rows(measure, rows, args.jobs))
    failed = [(r["row"][0], r["failed"]) for r in res if "failed" in r]
    ran = [r for r in res if "failed" not in r]
    print(format_table(["id", "layer", "engine", "x/y in", "weights", "cycles", "util", "bound",
                        "reason"], [r["row"] for r in res]))
    geo = geomean([r["util"] for r in ran])
    exact = all(r["exact"] is not False for r in ran)
    print(f"\nlayers run: {len(ran)} / {len(rows)} ({sum(r['split'] for r in ran)} in batch "
          f"passes); geomean utilization {100 * geo:.1f}%; "
          f"plan {sum(r['t_plan'] for r in ran):.1f} s, simulation "
          f"{sum(r['t_sim'] for r in ran):.1f} s ({args.jobs} processes)"
          + (f"; bit-exact: {exact}" if args.check else ""))
    for lid, why in failed:
        print(f"  not mapped: layer {lid}: {why}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
