"""DNNVM's two fusion case studies on the DPU target, fused vs unfused (layer by layer).

1. conv + max pool (DNNVM section 4.3, GoogLeNet-like): a 28x28x32 input, a 5x5 conv to 256
   channels (stride 1, pad 2) and a 3x3 max pool (stride 1, pad 1). Paper (ZU2): fusion cuts
   the data transfer by 64% and gives 1.67x.
2. conv + element-wise add (ResNet-50 res2a): the branch-2c 1x1 conv (64 -> 256 on 56x56) and
   the projection shortcut 1x1 conv (64 -> 256) followed by the add. DNNVM fuses the add with
   ONE of the two convs (its SAVE 1 and LOAD 3 skipped); the other conv runs alone. Paper:
   0.467 + 0.463 ms for the convs and 0.833 ms for the add serially, 1.039 ms fused in total,
   i.e. 2.2x for the fused conv + add against that conv and the add alone ((0.463 + 0.833) /
   (1.039 - 0.467)), and 36.4% less data transfer than the serial implementation.

Also the DPUV3INT8 paper's two deconvolution forms (Figs. 14/15, simulated 0.130 ms vs 0.086 ms):
a 4x4 stride-2 transpose conv, 64 -> 64 channels on 32x64, as upsample + conv and as the
sub-kernel convolution series + shuffle.

All run at batch = number of PEs (one image per PE) with seeded int8 data, bit-exact against
the integer reference; the fusion search picks the strategy from simulated cycles. DDR transfer
counts every byte LOAD and SAVE move (parameters included). Usage:
    python benchmarks/dpu_fusion_cases.py [--config dpu_default]
"""

from __future__ import annotations

import argparse

import numpy as np

from tvm_accel.layers import (
    AddLayer,
    ConvLayer,
    DeconvLayer,
    LayerGraph,
    PoolLayer,
    Requant,
    Tensor,
    reference_execute,
)
from tvm_accel.report import format_table
from tvm_dpu.hw_config import load_config
from tvm_dpu.runtime import execute_program
from tvm_dpu.strategy import plan


def _rq(k: int, shift: int, lo: int = -128) -> Requant:
    return Requant(0, np.ones(k, dtype=np.int64), np.full(k, (1 << shift) >> 1, dtype=np.int64),
                   shift, 0, lo, 127)


def _conv(rng, name, x, y, c, k, ksz, pad, shift, relu=True) -> ConvLayer:
    return ConvLayer(name=name, input=x, output=y,
                     weight=rng.integers(-128, 128, size=(k, c, ksz, ksz)),
                     bias=rng.integers(-2000, 2000, size=k), input_zero_point=0, strides=(1, 1),
                     padding=(pad,) * 4, requant=_rq(k, shift, 0 if relu else -128))


def conv_pool(n: int) -> LayerGraph:
    rng = np.random.default_rng(0)
    conv = _conv(rng, "conv5x5", "x", "t", 32, 256, 5, 2, 13)
    pool = PoolLayer("maxpool3x3", "t", "y", "max", (3, 3), (1, 1), (1,) * 4, 0, None)
    shapes = {"x": (n, 32, 28, 28), "t": (n, 256, 28, 28), "y": (n, 256, 28, 28)}
    return LayerGraph({k: Tensor(k, s, "int8") for k, s in shapes.items()}, [conv, pool],
                      ["x"], ["y"])


def conv_add(n: int) -> LayerGraph:
    rng = np.random.default_rng(1)
    branch = _conv(rng, "res2a_branch2c", "b", "t2c", 64, 256, 1, 0, 9, relu=False)
    short = _conv(rng, "res2a_branch1", "x", "t1", 64, 256, 1, 0, 9, relu=False)
    add = AddLayer("res2a", ("t2c", "t1"), "y", 0, 0, 1, 1, _rq(1, 1, lo=0))
    s64, s256 = (n, 64, 56, 56), (n, 256, 56, 56)
    shapes = {"b": s64, "x": s64, "t2c": s256, "t1": s256, "y": s256}
    return LayerGraph({k: Tensor(k, s, "int8") for k, s in shapes.items()},
                      [branch, short, add], ["b", "x"], ["y"])


def deconv(n: int) -> LayerGraph:
    rng = np.random.default_rng(3)
    ly = DeconvLayer("deconv4x4", "x", "y", rng.integers(-128, 128, size=(64, 64, 4, 4)),
                     rng.integers(-2000, 2000, size=64), 0, (2, 2), (1,) * 4, (0, 0),
                     _rq(64, 12))
    shapes = {"x": (n, 64, 32, 64), "y": (n, 64, 64, 128)}
    return LayerGraph({k: Tensor(k, s, "int8") for k, s in shapes.items()}, [ly], ["x"], ["y"])


def run(graph: LayerGraph, cfg, knobs: dict | None) -> tuple[int, int, dict[str, int]]:
    """Cycles, DDR bytes moved and the cycles of every stream (layer or fused group)."""
    rng = np.random.default_rng(2)
    feed = {k: rng.integers(-128, 128, size=graph.tensors[k].shape).astype(np.int8)
            for k in graph.inputs}
    prog = plan(graph, cfg, knobs)
    out, stats = execute_program(prog, feed, cfg)
    ref = reference_execute(graph, feed)
    for k in graph.outputs:
        if not np.array_equal(out[k], ref[k]):
            raise SystemExit(f"{k}: not bit-exact")
    cycles = sum(s.cycles for _, s in stats)
    moved = sum(s.ddr_read_bytes + s.ddr_write_bytes for _, s in stats)
    return cycles, moved, {name: s.cycles for name, s in stats}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="dpu_default")
    args = p.parse_args()
    cfg = load_config(args.config)
    rows = []
    for name, build, paper in (("conv5x5 + maxpool3x3", conv_pool, ("1.67x", "-64%")),
                               ("conv1x1 + eltwise add", conv_add, ("2.2x", "-36.4%"))):
        g = build(cfg.NUM_PE)
        c_u, b_u, per_u = run(g, cfg, {"@fusion": {"enabled": False}})
        c_s, _, per_s = run(g, cfg, {"@fusion": {"enabled": False, "overlap": False}})
        c_f, b_f, streams = run(g, cfg, None)
        # DNNVM's figure: the fused group against its layers alone (the res2a case fuses one
        # conv with the add; the other conv runs alone either way)
        fused = [n for n in streams if "+" in n]
        pair_u = sum(per_u[x] for n in fused for x in n.split("+"))
        pair_s = sum(per_s[x] for n in fused for x in n.split("+"))
        pair_f = sum(streams[n] for n in fused)
        rows.append((name, f"{c_u:,}", f"{c_f:,}", f"{c_u / c_f:.2f}x", f"{c_s / c_f:.2f}x",
                     f"{pair_u / pair_f:.2f}x" if pair_f else "-",
                     f"{pair_s / pair_f:.2f}x" if pair_f else "-", paper[0],
                     f"{b_u / 2**20:.2f}", f"{b_f / 2**20:.2f}", f"{100 * (b_f / b_u - 1):+.1f}%",
                     paper[1], " | ".join(streams)))
    g = deconv(cfg.NUM_PE)
    c_up, b_up, _ = run(g, cfg, {"deconv4x4": {"form": "upsample"}})
    c_sub, b_sub, _ = run(g, cfg, {"deconv4x4": {"form": "subconv"}})
    dec = [("upsample + conv", f"{c_up:,}", f"{c_up / cfg.CLOCK_MHZ / 1e3:.3f}",
            f"{b_up / 2**20:.2f}", "0.130 ms"),
           ("sub-kernel convs + shuffle", f"{c_sub:,}", f"{c_sub / cfg.CLOCK_MHZ / 1e3:.3f}",
            f"{b_sub / 2**20:.2f}", "0.086 ms"),
           ("ratio", f"{c_up / c_sub:.2f}x", "", "", "1.51x")]
    print(f"config {cfg.name}: {cfg.NUM_PE} PEs, batch {cfg.NUM_PE}, {cfg.CLOCK_MHZ:.0f} MHz, "
          f"DDR {cfg.DDR_BYTES_PER_CYCLE:.0f} B/cycle; all runs bit-exact")
    print(format_table(["case", "unfused cycles", "fused cycles", "speedup", "vs b2b",
                        "group", "group b2b", "DNNVM", "unfused MiB", "fused MiB", "transfer",
                        "DNNVM", "fused streams"], rows, align="lrrrrrrrrrrrl"))
    print("unfused: layer by layer, the layers' streams overlapped in one stream (as fused);\n"
          "b2b: layer by layer as back-to-back streams (DNNVM's serial implementation); group:\n"
          "the fused group against its own layers alone (DNNVM's 2.2x: (conv + add) / (conv+add\n"
          "fused) = (0.463 + 0.833) / (1.039 - 0.467) ms in its section 4.3)")
    print("\ndeconvolution 4x4/2, 64 -> 64 channels, 32x64 -> 64x128 (DPUV3INT8 Figs. 14/15)")
    print(format_table(["form", "cycles", "ms", "DDR MiB", "paper (simulated)"], dec,
                       align="lrrrr"))


if __name__ == "__main__":
    main()
