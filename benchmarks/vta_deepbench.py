"""DeepBench inference-server convolutions on the VTA static strategy (TVM's conv2d template).

Every layer of ``deepbench_conv_inference_server.csv`` (NCHW int8, seeded random int8 weights and
input, a valid VTA requantize recipe) goes through ``strategy.plan`` + ``runtime.execute_program``
on the C simulator. Printed per layer: shape, useful MACs, simulated cycles, GEMM utilization
(useful MACs / (cycles x MACs per cycle)), channel/batch padding overhead (padded MACs / MACs - 1),
instruction count, compile time and simulator wall time; then the geometric-mean utilization, the
total wall time, the five worst layers and the simulator speed on the largest layers.

    python benchmarks/vta_deepbench.py [--config vta_8x8x8] [--limit N] [--ids 0,5,27]
                                       [--check] [--csv PATH] [--jobs N]

``--check`` compares each layer with ``layers.reference_execute`` (numpy; slow for the largest
layers). Figures are information for issue notes, never assertions.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from tvm_accel.deepbench import geomean, load_rows, make_layer, map_rows, parse_args, typical_recipe


def main(argv=None) -> int:
    args = parse_args(__doc__, "vta_1x16x16", argv)

    from tvm_vta_cp.hw_config import load_config
    from tvm_vta_cp.numerics import requant_recipe
    from tvm_vta_cp.runtime import execute_program
    from tvm_vta_cp.strategy import plan

    cfg = load_config(args.config)
    rows = load_rows(args.csv, args.ids, args.limit)

    hdr = (f"{'id':>3} {'shape':<42} {'MACs':>12} {'cycles':>12} {'util':>6} {'pad':>6} "
           f"{'insns':>7} {'compile':>8} {'sim':>7}  knobs")
    print(f"# VTA static strategy on DeepBench, config {cfg.name} "
          f"({cfg.macs_per_cycle} MACs/cycle)")
    print(hdr)

    def measure(row: dict) -> dict:
        graph, inputs = make_layer(row, int(row["id"]), typical_recipe(requant_recipe))
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
        return dict(id=int(row["id"]), shape=ly.shape, macs=ly.macs, cycles=st.cycles,
                    util=util, pad=pad, compile=t1 - t0, sim=t2 - t1, n_insns=ly.n_insns,
                    knobs=kn, status=status, ok=status != " MISMATCH")

    results, t_all = [], time.perf_counter()
    for r in map_rows(measure, rows, args.jobs):
        print(f"{r['id']:>3} {r['shape']:<42} {r['macs']:>12,} {r['cycles']:>12,} "
              f"{r['util']:>6.1%} {r['pad']:>6.1%} {r['n_insns']:>7} {r['compile']:>7.2f}s "
              f"{r['sim']:>6.2f}s  {r['knobs']}{r['status']}", flush=True)
        results.append(r)
    wall = time.perf_counter() - t_all
    if not results:
        return 0
    geo = geomean([r["util"] for r in results])
    print(f"\nsummary: {len(results)} layers, geomean GEMM utilization {geo:.1%}, "
          f"total compile {sum(r['compile'] for r in results):.1f}s, "
          f"total simulate {sum(r['sim'] for r in results):.1f}s, wall {wall:.1f}s "
          f"({args.jobs} processes)"
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
