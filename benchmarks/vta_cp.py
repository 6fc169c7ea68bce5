"""The VTA CP strategy against TVM's static padded template (the CP paper, sections 5-7).

Sections (``--sections``, default all):

- ``table3``: the paper's Table 3 layers on ``vta_1x16x16``; ``table5``: its Table 5 layers on
  ``vta_8x8x8``. Per layer the ``auto`` choice (:func:`tvm_vta_cp.embedding.choose`: the static
  template and the top-5 CP candidates measured on the simulator, best combined time wins),
  then relative to the static template: operator speed-up (accelerator cycles), transformation
  speed-up (modelled host cycles of the layout rewrite plus the runtime's padding + blocking,
  ``tvm_vta_cp.host_cost``: copies and gathers at their own rates), combined speed-up, and
  DRAM footprint of data, weights and both; the paper's own columns beside ours; then the same
  against the paper's own baseline, the ``tvm-reference`` strategy (dilation by zero-inflated
  kernels). ``--tune N`` gives ``auto`` a tuning budget (its top 5 candidates' tile knobs tuned
  with N simulator measurements each); the baselines keep their default knobs.
- ``deepbench``: every layer of ``deepbench_conv_inference_server.csv`` on both configs: GEMM
  utilization (useful MACs / (accelerator cycles x MACs per cycle)) of ``static`` and ``auto``,
  combined speed-up, the embedding chosen; geomeans.
- ``search``: candidate-search effort per DeepBench layer (all constraint variants of
  :func:`tvm_vta_cp.embedding.candidates`, one process per layer, one core each): seconds and
  search nodes, median and max.
- ``fig8``: the paper's Fig. 8 study: search nodes to the first embedding vs channel size
  (16..512) for the instance-set orders NCHW / NHWC / HWNC, with and without the portfolio
  ("A") and domain bounding ("B"), for the strict model and for the relaxed model without a
  fixed origin (where the search, not the propagation, does the work).

    python benchmarks/vta_cp.py [--sections table3,table5,deepbench,search,fig8]
                                [--configs vta_1x16x16,vta_8x8x8] [--ids 0,5] [--limit N]
                                [--jobs N] [--tune N]

Figures are information for issue notes, never assertions.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from tvm_accel.deepbench import DEFAULT_CSV, load_rows, typical_recipe
from tvm_accel.layers import ConvLayer

# (N, C, H, W, K, KH, KW, pad, stride, dilation); pad and stride symmetric unless a pair
TABLE3 = [
    ((1, 1, 161, 700), 32, (5, 20), (0, 0), (2, 2), 1),
    ((2, 1, 161, 700), 32, (5, 20), (0, 0), (2, 2), 1),
    ((4, 1, 161, 700), 32, (5, 20), (0, 0), (2, 2), 1),
    ((1, 1, 48, 480), 16, (3, 3), (1, 1), (1, 1), 1),
    ((1, 3, 108, 108), 64, (3, 3), (1, 1), (2, 2), 1),
    ((1, 3, 224, 224), 64, (3, 3), (1, 1), (1, 1), 1),
    ((2, 3, 224, 224), 64, (3, 3), (1, 1), (1, 1), 1),
    ((1, 3, 224, 224), 64, (7, 7), (3, 3), (2, 2), 1),
    ((2, 3, 224, 224), 64, (7, 7), (3, 3), (2, 2), 1),
    ((1, 1, 40, 151), 32, (5, 20), (0, 8), (2, 2), 1),
    ((1, 1, 161, 700), 64, (5, 5), (1, 1), (2, 2), 1),
    ((2, 1, 161, 700), 64, (5, 5), (1, 1), (2, 2), 1),
    ((1, 304, 18, 18), 448, (3, 3), (0, 0), (1, 1), 2),
    ((1, 208, 72, 72), 304, (3, 3), (0, 0), (1, 1), 4),
]
#: the paper's Table 3 (operator, transformation, combined speed-up; weight memory)
PAPER3 = {
    "op": [117.697, 104.199, 170.802, 1.139, 1.485, 1.023, 1.193, 10.793, 3.310, 13.599,
           11.338, 11.355, 2.550, 23.770],
    "transf": [0.095, 0.070, 0.020, 0.038, 0.053, 0.037, 0.013, 0.053, 0.046, 0.463, 0.089,
               0.066, 0.139, 0.486],
    "combined": [48.089, 35.411, 27.686, 0.272, 0.618, 0.466, 0.244, 1.137, 0.876, 6.973,
                 3.380, 2.737, 1.829, 18.369],
    "weights": [0.100, 0.100, 0.100, 0.111, 0.444, 0.444, 0.444, 0.327, 0.327, 0.100, 0.160,
                0.160, 0.360, 0.074],
}
TABLE5 = [
    ((1, 32, 8, 8), 64, (3, 3), (1, 1), (1, 1), 1),
    ((1, 32, 16, 16), 64, (3, 3), (1, 1), (1, 1), 1),
    ((1, 32, 32, 32), 64, (3, 3), (1, 1), (1, 1), 1),
    ((1, 256, 8, 8), 256, (3, 3), (1, 1), (1, 1), 1),
    ((1, 128, 16, 16), 256, (3, 3), (1, 1), (1, 1), 1),
    ((1, 128, 32, 32), 256, (3, 3), (1, 1), (1, 1), 1),
    ((1, 72, 56, 56), 96, (1, 1), (0, 0), (1, 1), 1),
    ((1, 256, 7, 7), 512, (1, 1), (0, 0), (1, 1), 1),
    ((1, 8, 224, 224), 24, (3, 3), (1, 1), (2, 2), 1),
    ((1, 72, 56, 56), 96, (3, 3), (1, 1), (2, 2), 1),
]
PAPER5 = {
    "op": [1.60, 6.64, 12.65, 3.85, 12.00, 8.04, 5.62, 4.60, 10.27, 6.95],
    "transf": [0.89, 3.31, 6.20, 1.47, 4.42, 11.93, 9.10, 4.12, 6.39, 5.14],
    "combined": [1.13, 4.27, 7.71, 2.47, 8.22, 9.47, 8.44, 4.32, 6.73, 5.46],
    "data": [0.60, 0.19, 0.16, 0.60, 0.19, 0.16, 0.14, 0.22, 0.13, 0.16],
    "weights": [1.00] * 10,
}


def make_conv(name: str, shape, k: int, kernel, pad, stride, dil: int, seed: int = 0
              ) -> ConvLayer:
    """An int8 conv with seeded random weights and a valid VTA requantize recipe."""
    from tvm_vta_cp.numerics import requant_recipe

    rng = np.random.default_rng(seed)
    c = shape[1]
    weight = rng.integers(-128, 128, size=(k, c, *kernel), dtype=np.int64)
    bias = rng.integers(-(1 << 12), 1 << 12, size=k, dtype=np.int64)
    ph, pw = pad
    return ConvLayer(name, "x", "y", weight, bias, 0, tuple(stride), (ph, pw, ph, pw),
                     typical_recipe(requant_recipe)(weight, bias), dilation=(dil, dil))


def deepbench_specs(path: str) -> list[tuple]:
    specs = []
    for r in load_rows(path):
        g = {k: int(v) for k, v in r.items()}
        specs.append((g["id"], ((g["n"], g["c"], g["h"], g["w"]), g["k"],
                                (g["filter_h"], g["filter_w"]), (g["pad_h"], g["pad_w"]),
                                (g["stride_h"], g["stride_w"]), 1)))
    return specs


def evaluate(job: tuple) -> dict:
    """One layer on one config: the auto decision and its figures against static."""
    from tvm_vta_cp.embedding import footprint
    from tvm_vta_cp.hw_config import load_config

    cfg_name, lid, spec, tune = job
    cfg = load_config(cfg_name)
    shape, k, kernel, pad, stride, dil = spec
    layer = make_conv(f"conv{lid}", shape, k, kernel, pad, stride, dil, seed=int(lid) + 1)
    t0 = time.perf_counter()
    from tvm_vta_cp.embedding import IDENTITY, choose, measure
    from tvm_vta_cp.strategy.reference import zero_inflated

    dec = choose(layer, shape, "int8", "int8", cfg, "auto", tune=tune)
    wall = time.perf_counter() - t0
    static = next(c for c in dec.options if c.rewrite == IDENTITY)
    if static.knobs is not None:  # the baselines run with their default knobs
        static = choose(layer, shape, "int8", "int8", cfg, "static").chosen
        static.cycles = measure(layer, shape, "int8", "int8", cfg)
    best = dec.chosen
    ref_layer = zero_inflated(layer)  # the paper's TVM baseline (tvm-reference)
    ref_cycles = (static.cycles if ref_layer is layer
                  else measure(ref_layer, shape, "int8", "int8", cfg))
    ref_combined = ref_cycles + static.host_cycles(cfg)
    fr = footprint(ref_layer, shape, IDENTITY, cfg)
    fs, fb = footprint(layer, shape, IDENTITY, cfg), footprint(layer, shape, best.rewrite, cfg)
    macs = int(np.prod(shape[:1])) * k * int(np.prod(kernel)) * shape[1]
    from tvm_accel.layers import conv_output_shape

    _, _, ho, wo = conv_output_shape(layer, shape)
    macs *= ho * wo
    peak = cfg.batch * cfg.block_in * cfg.block_out
    return {
        "id": lid, "config": cfg_name, "shape": f"{shape}->{k} {kernel[0]}x{kernel[1]} "
        f"p{pad[0]},{pad[1]} s{stride[0]}" + (f" d{dil}" if dil > 1 else ""),
        "macs": macs, "choice": best.name, "embedding": (best.embedding.describe() if
                                                          best.embedding else "static"),
        "static_cycles": static.cycles, "cycles": best.cycles,
        "static_host": static.host_cycles(cfg), "host": best.host_cycles(cfg),
        "op": static.cycles / best.cycles,
        "transf": static.host_cycles(cfg) / best.host_cycles(cfg),
        "combined": static.combined(cfg) / best.combined(cfg),
        "data": fb.data_bytes / fs.data_bytes, "weights": fb.weight_bytes / fs.weight_bytes,
        "total": (fb.data_bytes + fb.weight_bytes) / (fs.data_bytes + fs.weight_bytes),
        "util_static": macs / (static.cycles * peak), "util": macs / (best.cycles * peak),
        "op_ref": ref_cycles / best.cycles, "combined_ref": ref_combined / best.combined(cfg),
        "weights_ref": fb.weight_bytes / fr.weight_bytes,
        "total_ref": (fb.data_bytes + fb.weight_bytes) / (fr.data_bytes + fr.weight_bytes),
        "util_ref": macs / (ref_cycles * peak), "tuned": best.knobs is not None,
        "solve": dec.solve_seconds, "nodes": dec.nodes, "wall": wall,
        "n_options": len(dec.options),
    }


def search_effort(job: tuple) -> dict:
    from tvm_vta_cp.embedding import candidates
    from tvm_vta_cp.hw_config import load_config

    cfg_name, lid, spec = job
    shape, k, kernel, pad, stride, dil = spec
    layer = make_conv(f"conv{lid}", shape, k, kernel, pad, stride, dil)
    cs = candidates(layer, shape, load_config(cfg_name))
    return {"id": lid, "config": cfg_name, "seconds": cs.seconds, "nodes": cs.nodes,
            "n": len(cs.candidates), "embeddings": len(cs.embeddings)}


def geomean(xs) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def table(heads: list[str], rows: list[list]) -> str:
    cells = [[h for h in heads]] + [[c if isinstance(c, str) else f"{c:.3f}" if isinstance(
        c, float) else str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(heads))]
    out = ["  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(r))
           for r in cells]
    out.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(out)


def run_pool(fn, jobs: list, n: int) -> list:
    if n <= 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(n) as ex:
        return list(ex.map(fn, jobs, chunksize=1))


def paper_table(title: str, cfg: str, specs, paper: dict, args) -> None:
    idx = [i for i in range(len(specs)) if not args.ids or i in args.ids]
    res = run_pool(evaluate, [(cfg, i, specs[i], args.tune) for i in idx], args.jobs)
    rows = []
    for i, r in zip(idx, res, strict=True):
        rows.append([str(i), r["shape"], r["choice"], r["op"], paper["op"][i], r["transf"],
                     paper["transf"][i], r["combined"], paper["combined"][i], r["data"],
                     r["weights"], paper["weights"][i], r["total"]])
    g = [geomean([r[j] for r in rows]) for j in range(3, 13)]
    rows.append(["geo", "", "", *g])
    print(f"\n== {title} ({cfg}): auto vs static padded template (x = speed-up / size ratio)")
    print(table(["#", "layer (N,C,H,W)->K kernel pad stride", "auto choice", "op", "paper",
                 "transf", "paper", "combined", "paper", "data", "weights", "paper", "total"],
                rows))
    if paper.get("data"):
        print(f"paper data memory geomean {geomean([paper['data'][i] for i in idx]):.3f}")
    slower = [r["id"] for r in res if r["combined"] < 1 - 1e-9]
    print(f"layers slower than static under auto: {slower or 'none'}")
    rows = []
    for i, r in zip(idx, res, strict=True):
        rows.append([str(i), r["shape"], r["choice"], r["op_ref"], paper["op"][i], r["transf"],
                     paper["transf"][i], r["combined_ref"], paper["combined"][i],
                     r["weights_ref"], paper["weights"][i], r["total_ref"]])
    g = [geomean([r[j] for r in rows]) for j in range(3, 12)]
    rows.append(["geo", "", "", *g])
    print(f"\n== {title} ({cfg}): auto vs the paper's TVM baseline (tvm-reference: dilation by "
          f"zero-inflated kernels; transformation as the static template's)")
    print(table(["#", "layer (N,C,H,W)->K kernel pad stride", "auto choice", "op", "paper",
                 "transf", "paper", "combined", "paper", "weights", "paper", "total"], rows))
    print(f"auto tuned ({args.tune} measurements per candidate): "
          f"{sum(r['tuned'] for r in res)} of {len(res)} choices run tuned knobs"
          if args.tune else "auto with default knobs (--tune 0)")


def deepbench(args) -> None:
    specs = deepbench_specs(args.csv)
    if args.ids:
        specs = [s for s in specs if s[0] in args.ids]
    if args.limit:
        specs = specs[:args.limit]
    for cfg in args.configs:
        t0 = time.perf_counter()
        res = run_pool(evaluate, [(cfg, i, s, args.tune) for i, s in specs], args.jobs)
        rows = [[str(r["id"]), r["shape"], r["choice"], r["util_static"], r["util"],
                 r["op"], r["combined"], r["solve"]] for r in res]
        print(f"\n== DeepBench {len(res)} layers on {cfg}")
        print(table(["id", "layer", "auto choice", "util static", "util auto", "op x",
                     "combined x", "solve s"], rows))
        kinds: dict[str, int] = {}
        for r in res:
            kind = r["choice"].split("(")[0].split("+")[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        print(f"geomean utilization: static {geomean([r['util_static'] for r in res]):.1%}, "
              f"auto {geomean([r['util'] for r in res]):.1%}; geomean speed-up auto/static: "
              f"operator {geomean([r['op'] for r in res]):.3f}x, combined "
              f"{geomean([r['combined'] for r in res]):.3f}x; slower than static: "
              f"{sum(r['combined'] < 1 - 1e-9 for r in res)}; choices {kinds}; "
              f"wall {time.perf_counter() - t0:.0f} s")


def search(args) -> None:
    specs = deepbench_specs(args.csv)
    if args.ids:
        specs = [s for s in specs if s[0] in args.ids]
    if args.limit:
        specs = specs[:args.limit]
    for cfg in args.configs:
        res = run_pool(search_effort, [(cfg, i, s) for i, s in specs], args.jobs)
        secs = [r["seconds"] for r in res]
        nodes = [r["nodes"] for r in res]
        worst = max(res, key=lambda r: r["seconds"])
        none = [r["id"] for r in res if r["n"] == 0]
        print(f"\n== search effort, {len(res)} DeepBench layers on {cfg} (all constraint "
              f"variants): solve s median {statistics.median(secs):.2f} max {max(secs):.2f} "
              f"(layer {worst['id']}); nodes median {statistics.median(nodes):.0f} max "
              f"{max(nodes)}; embeddings median "
              f"{statistics.median(r['embeddings'] for r in res):.0f}; layers without a "
              f"candidate: {none or 'none'}")


def fig8_point(job: tuple) -> tuple:
    from tvm_accel.cp import Options, conv2d_op
    from tvm_accel.cp.embedding import find_embedding
    from tvm_accel.cp.intrinsic import gemm_intrinsic

    model, cfg_shape, ch, layout, a, b = job
    op = conv2d_op(cfg_shape[0], ch, 14, 14, ch, 3, 3, (1, 1), (1, 1, 1, 1), layout=layout)
    extra = {} if model == "strict" else dict(dense=False, linear_access=False,
                                              fixed_origin=False)
    r = find_embedding(op, gemm_intrinsic(*cfg_shape), Options(
        portfolio=a, bound=b, time_limit=20.0, max_nodes=20_000, **extra))
    return job, r.nodes, r.status


def fig8(args) -> None:
    chans = (16, 32, 64, 128, 256, 512)
    variants = [("", False, False), ("+A", True, False), ("+B", False, True),
                ("+AB", True, True)]
    for model in ("strict", "relaxed, no fixed origin"):
        jobs = [(model.split(",")[0], (8, 8, 8), ch, lay, a, b) for lay in ("NCHW", "NHWC", "HWNC")
                for _, a, b in variants for ch in chans]
        res = {(j[3], j[4], j[5], j[2]): (n, s) for j, n, s in run_pool(fig8_point, jobs,
                                                                          args.jobs)}
        rows = []
        for lay in ("NCHW", "NHWC", "HWNC"):
            for tag, a, b in variants:
                rows.append([lay + tag] + [f"{res[lay, a, b, c][0]}" + (
                    "+" if res[lay, a, b, c][1] == "limit" else "") for c in chans])
        print(f"\n== Fig. 8: search nodes to the first embedding, conv2d 3x3 14x14 batch 8, "
              f"ic = oc = channels, 8x8x8 GEMM, {model} model ('+': 20,000-node limit hit)")
        print(table(["order", *map(str, chans)], rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default="table3,table5,deepbench,search,fig8")
    ap.add_argument("--configs", default="vta_1x16x16,vta_8x8x8")
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--ids", default="", help="comma-separated layer indices")
    ap.add_argument("--limit", type=int, default=0, help="only the first N DeepBench layers")
    ap.add_argument("--jobs", type=int, default=0, help="worker processes (default: cores)")
    ap.add_argument("--tune", type=int, default=0,
                    help="auto's tuning budget: measurements per tuned candidate (top 5)")
    args = ap.parse_args(argv)
    import os

    args.jobs = args.jobs or os.cpu_count() or 1
    args.ids = {int(v) for v in args.ids.split(",") if v}
    args.configs = [c for c in args.configs.split(",") if c]
    sections = set(args.sections.split(","))
    t0 = time.perf_counter()
    if "table3" in sections:
        paper_table("Table 3", "vta_1x16x16", TABLE3, PAPER3, args)
    if "table5" in sections:
        paper_table("Table 5", "vta_8x8x8", TABLE5, PAPER5, args)
    if "deepbench" in sections:
        deepbench(args)
    if "search" in sections:
        search(args)
    if "fig8" in sections:
        fig8(args)
    print(f"\ntotal wall {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
