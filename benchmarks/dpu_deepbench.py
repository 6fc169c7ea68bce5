"""DeepBench conv layers on the DPU (int8, power-of-two quantization, batch = number of PEs: one
image per PE): does every layer map, which engine runs it, cycles, HW efficiency and what bounds
it.

Each layer of ``deepbench_conv_inference_server.csv`` becomes a one-conv layer graph (the CSV's
batch replaced by ``NUM_PE``) with seeded random int8 weights and a power-of-two requantize recipe
(one right shift, as the DPU's CONV applies), goes through the same geometric checks as the
pattern table (kernel fields, with the W space-to-depth view for kernels wider than 15; stride;
padding; channels), is planned by the DPU strategy and run on the simulator; ``--check`` also
compares the output with ``reference_execute``. A layer that does not map is counted on the CPU
with its reason. HW efficiency = useful MACs / (cycles x the peak MACs per cycle of all PEs).

    python benchmarks/dpu_deepbench.py [--config dpu_default] [--limit N] [--ids 0,5] [--check]
                                       [--jobs N]

Figures are information for issue notes, never assertions.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from tvm_accel.deepbench import LayerRuns, geomean, load_rows, make_layer, map_rows, parse_args
from tvm_accel.layers import Requant


def dpu_recipe(weight: np.ndarray, bias: np.ndarray) -> Requant:
    """A power-of-two recipe (one right shift for all channels) spreading the typical
    accumulator over int8."""
    from tvm_dpu.numerics import requant_recipe

    k = weight.shape[0]
    bound = np.abs(weight.astype(np.int64)).reshape(k, -1).sum(1) * 128 + np.abs(bias)
    shift = int(np.clip(math.ceil(math.log2((0.05 * float(bound.max()) + 1) / 127)), 0, 31))
    return requant_recipe(np.full(k, 2.0 ** -shift), bound, 0, -128, 127)


def cpu_reason(layer, in_shape) -> str:
    """The pattern table's reason to keep a conv on the CPU, or "" when it may be offloaded."""
    from tvm_dpu.patterns import MAX_CHANNELS, MAX_PAD
    from tvm_dpu.strategy.space_to_depth import w_space_to_depth_factor

    (kh, kw), (sh, sw), (pt, pl, pb, pr) = layer.kernel, layer.strides, layer.padding
    if (kh > 15 or kw > 15) and w_space_to_depth_factor(
            (kh, kw), sw, in_shape[3], pl, pr, layer.groups) is None:
        return "kernel larger than 15 (4-bit kernel fields) and no W space-to-depth brings it " \
               "within"
    if not (1 <= sh <= 7 and 1 <= sw <= 7):
        return "stride larger than 7 (3-bit stride fields)"
    if max(pt, pl, pb, pr) > MAX_PAD:
        return "padding larger than 15 (4-bit pad fields)"
    if max(layer.weight.shape[:2]) > MAX_CHANNELS or in_shape[1] > MAX_CHANNELS:
        return "more than 4095 input or output channels (12-bit channel fields)"
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, "dpu_default", argv)

    from tvm_accel.errors import MappingError
    from tvm_accel.profiler import bound_label
    from tvm_accel.report import format_table
    from tvm_dpu.hw_config import load_config
    from tvm_dpu.runtime import execute_program
    from tvm_dpu.strategy import plan

    cfg = load_config(args.config)
    rows = load_rows(args.csv, args.ids, args.limit)
    runs = LayerRuns(lambda g: plan(g, cfg), lambda p, x: execute_program(p, x, cfg),
                     MappingError, args.check)

    def measure(row: dict) -> dict:
        graph, inputs = make_layer({**row, "n": str(cfg.NUM_PE)}, int(row["id"]), dpu_recipe)
        layer = graph.layers[0]
        x = graph.tensors["x"].shape
        shape = (f"{x[1]}x{x[2]}x{x[3]}->{layer.weight.shape[0]} "
                 f"{layer.kernel[0]}x{layer.kernel[1]} s{layer.strides[0]}")
        out = runs.run(graph, inputs, cpu_reason(layer, x))
        if isinstance(out, str):
            return dict(failed=out, row=(row["id"], shape, "cpu", "-", "-", "-", "-", out[:60]))
        st = out.stats[0][1]
        for _, more in out.stats[1:]:
            st = st + more
        macs = sum(ly.macs for ly in out.program.layers)
        eff = macs / (st.cycles * cfg.peak_macs_per_cycle) if st.cycles else 0.0
        bound = bound_label({"off-chip": max(st.load_busy, st.save_busy),
                             "compute": max(st.conv_busy, st.misc_busy)})
        kn = out.program.layers[0].knobs
        tiles = ",".join(f"{k.replace('tile_', '')}={v}" for k, v in kn.items()
                         if k in ("oc_tile", "tile_h", "tile_w", "format") and v is not False)
        return dict(eff=eff, t_plan=out.t_plan, t_sim=out.t_sim, exact=out.exact,
                    row=(row["id"], shape, "DPU", f"{st.cycles:,}", f"{100 * eff:.1f}%", bound,
                         f"{out.t_plan:.2f}", tiles))

    res = list(map_rows(measure, rows, args.jobs))
    failed = [(r["row"][0], r["failed"]) for r in res if "failed" in r]
    ran = [r for r in res if "failed" not in r]
    print(f"config {cfg.name}: {cfg.NUM_PE} PEs (batch {cfg.NUM_PE}, one image per PE), "
          f"{cfg.peak_macs_per_cycle} MACs/cycle, DDR {cfg.DDR_BYTES_PER_CYCLE:.0f} B/cycle")
    print(format_table(["id", "layer (CxHxW -> K)", "engine", "cycles", "HW eff", "bound",
                        "compile s", "knobs / reason"], [r["row"] for r in res],
                       align="lllrrlrl"))
    geo = geomean([r["eff"] for r in ran])
    exact = all(r["exact"] is not False for r in ran)
    print(f"\nlayers on the DPU: {len(ran)} / {len(rows)}; geomean HW efficiency "
          f"{100 * geo:.1f}%; compile {sum(r['t_plan'] for r in ran):.1f} s, simulation "
          f"{sum(r['t_sim'] for r in ran):.1f} s ({args.jobs} processes)"
          + (f"; bit-exact: {exact}" if args.check else ""))
    for lid, why in failed:
        print(f"  on the CPU: layer {lid}: {why}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
