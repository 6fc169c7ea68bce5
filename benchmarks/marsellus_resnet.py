"""ResNets on MARSELLUS (paper Sec. IV, Table II, Figs. 16-18) at the paper's operating points.

- ResNet-20 (CIFAR-10), Fig. 17 style: per layer (``--layers``) engine, cycles, MACs per
  cycle, the RBE's job phases, the cores' busy cycles, the fill / drain no engine computes,
  and energy at 8 bits and mixed precision at 0.8 V / 420 MHz, 0.65 V / 400 MHz with ABB and
  0.5 V / 100 MHz; where the mixed network's cycles go by layer group; totals beside the
  paper's at the same point (Sec. IV: ~28 uJ, ~21 uJ, 12 uJ; mixed 68 % below 8-bit;
  Table II: 1.05 ms and 6.38 Top/s/W, the 0.5 V figures, see :data:`PAPER_R20`), and the
  mixed totals under the other ``--objective``.
- ResNet-18 (ImageNet, 224x224, ``quantize.resnet18_mixed``: HAWQ-V3's W4A4, the paper's RBE
  4x4b network) at 0.5 V / 100 MHz, the point of Table II's 48 ms and 5.83 Top/s/W
  (:data:`PAPER_R18`), and at 0.8 V for reference; per layer what bounds it (Fig. 18:
  off-chip = the I/O DMA to L3, on-chip = L2 <-> L1, compute); its tensors and weights live
  in L3.
- Beside both, the energy floor of this power model (:func:`energy_floor_uj`): every conv and FC
  on the RBE at its peak rate for its W x I bits, nothing else; what no mapping of the same bit
  assignment can beat. And the compute floor of our mapping (:func:`compute_floor_cycles`):
  each RBE conv's COMPUTE phase as one whole-layer job of its own geometry (a 16-channel layer
  fills half of each 32-channel BinConv), the cores' layers as run, nothing else.

Why the paper's latencies and efficiencies are 0.5 V figures (docs/marsellus.md, "Paper
figures at their operating points"): 12 uJ over 1.05 ms is 11.4 mW, the RBE-active CLUSTER
power at 0.5 V (Fig. 15: 11.0-13.4 mW), while 28 uJ over 1.05 ms (26.7 mW) is far below the
106-123 mW the busy RBE draws at 0.8 V. 1.05 ms at 100 MHz is 105k cycles: 0.25 ms at 420 MHz,
0.26 ms at 400 MHz. ResNet-18: 3.63 Gop at 5.83 Top/s/W is 0.62 mJ, over 48 ms 13 mW: 0.5 V.

Every network goes through the whole flow (ONNX QDQ -> canonicalize -> partition -> strategy):
the 8-bit ResNet-20 is the zoo's QDQ model, the mixed one ``quantize.resnet20_mixed()`` (HAWQ-style:
weights 2/3/4/6/8 bits, activations 4/8 bits, int4/uint4 and clipped-range QDQ). Each offloaded
function is run on the simulator and checked bit-exact against ``reference_execute`` before it
is timed. Not run by the tests::

    python benchmarks/marsellus_resnet.py [--networks resnet20,resnet18] [--layers]
        [--objective energy|latency]

``--objective`` is the strategy's global knob (``tvm_marsellus.pipeline(knobs={"objective":
"latency"})`` in a compile): what the engine choice of the residual adds minimises.
"""

from __future__ import annotations

import argparse

import numpy as np

from tvm_accel import quantize
from tvm_accel.layers import AddLayer, LayerGraph, reference_execute
from tvm_accel.profiler import bound_label
from tvm_accel.report import format_table
from tvm_marsellus import codegen as cg
from tvm_marsellus import strategy
from tvm_marsellus.energy import ABB_065, LOW_05, NOMINAL, energy_coefficients, energy_uj
from tvm_marsellus.hw_config import load_config
from tvm_marsellus.runtime import execute_program
from tvm_marsellus.simulator import rbe_job_phases
from tvm_marsellus.strategy.engines import OBJECTIVES

POINTS = (("0.8 V 420 MHz", NOMINAL), ("0.65 V 400 MHz ABB", ABB_065),
          ("0.5 V 100 MHz", LOW_05))
#: the paper's ResNet-20 (mixed, HAWQ): energy per point (Sec. IV), the 8-bit saving (Sec. IV:
#: 68 %), and Table II's latency and efficiency, measured at 0.5 V / 100 MHz
PAPER_R20 = {"uj": {"0.8 V 420 MHz": 28.0, "0.65 V 400 MHz ABB": 21.0, "0.5 V 100 MHz": 12.0},
             "saving": 0.68, "ms": 1.05, "tops_w": 6.38, "op": LOW_05}
#: the paper's ResNet-18 / ImageNet (HAWQ 4-bit on the RBE 4x4b, Table II): 0.5 V / 100 MHz
PAPER_R18 = {"ms": 48.0, "tops_w": 5.83, "op": LOW_05}


def paper_latency_ms(paper: dict, op) -> float:
    """The paper's latency carried to ``op``: its cycles (latency x clock at the measured point,
    e.g. 1.05 ms x 100 MHz = 105k for ResNet-20) at the clock of ``op``."""
    return paper["ms"] * paper["op"].freq_mhz / op.freq_mhz


def resnet_graphs(model) -> list[LayerGraph]:
    """Layer graphs of the offloaded functions of a QDQ model compiled for MARSELLUS."""
    import tvm_marsellus
    from tvm_accel.frontend import load_onnx
    from tvm_accel.pipeline import compile_model

    mod, _ = load_onnx(model)
    _, report = compile_model(mod, tvm_marsellus.TARGET)
    return [f.graph for f in report.functions]


def _inputs(graph: LayerGraph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for n in graph.inputs:
        t = graph.tensors[n]
        lo, hi = ((-(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1) if t.dtype == "int8"
                  else (0, (1 << t.bits) - 1))
        out[n] = rng.integers(lo, hi + 1, t.shape).astype(t.dtype)
    return out


def run(graphs: list[LayerGraph], cfg, knobs: dict | None = None) -> tuple[list[tuple], bool]:
    """Per-layer rows ``(layer, engine, W/I/O, stats, MACs)`` of all functions and
    bit-exactness; MACs are the layer's own (conv / dense), not the identity-weight MACs an
    add runs on the RBE."""
    rows, exact = [], True
    for g in graphs:
        x = _inputs(g)
        prog = strategy.plan(g, cfg, knobs)
        outs, stats = execute_program(prog, x, cfg)
        ref = reference_execute(g, x)
        exact &= all(np.array_equal(outs[n], ref[n]) for n in g.outputs)
        by = {ly.name: ly for ly in g.layers}
        for lp, (name, st) in zip(prog.layers, stats, strict=True):
            ly = by[name]
            tin = g.tensors[ly.inputs[0] if isinstance(ly, AddLayer) else ly.input]
            wb = getattr(ly, "weight_bits", "-")
            rows.append((name, "RBE" if lp.engine == "rbe" else "cluster",
                         f"{wb}/{tin.bits}/{g.tensors[ly.output].bits}", st, lp.macs))
    return rows, exact


def rbe_peak_job(cfg, w_bits: int, i_bits: int):
    """The RBE's fastest job at W x I bits in the simulator's cycle model: one large job
    (30 x 30 outputs, 256 -> 64 channels, O = 2), the faster of the 3x3 and 1x1 modes per MAC;
    returns its MACs per cycle."""
    best = 0.0
    for k in (3, 1):
        job = cg.RbeJob(h_in=29 + k, w_in=29 + k, h_out=30, w_out=30, k_in=256, k_out=64,
                        in_bits=i_bits, w_bits=w_bits, out_bits=2, kernel=k)
        best = max(best, 30 * 30 * 256 * 64 * k * k / sum(rbe_job_phases(cfg, job).values()))
    return best


def energy_floor_uj(rows: list[tuple], cfg, op) -> float:
    """The least energy any mapping of the network's convs and FCs (at their bit assignment)
    can take under the energy model: every one on the RBE at its W x I bits, at the RBE's peak
    rate (:func:`rbe_peak_job`), charged idle + leakage + the RBE's job power for that time and
    its 1-bit products; no residual adds, pools, marshaling, DMA, tiling overhead or idle gaps."""
    coef = energy_coefficients(op)
    pj = 0.0
    for _, _, prec, _, macs in rows:
        if not macs:
            continue
        w, i = (int(b) for b in prec.split("/")[:2])
        cycles = macs / rbe_peak_job(cfg, w, i)
        pj += (coef["static"] + coef["rbe"]) * cycles + 2 * macs * w * i * coef["rbe_binop"]
    return pj * 1e-6


def compute_floor_cycles(graphs: list[LayerGraph], rows: list[tuple], cfg) -> int:
    """A latency no tiling of this mapping can beat: per RBE conv the COMPUTE phase alone of
    one whole-layer job of its geometry and bits (:func:`rbe_job_phases`; a layer with fewer
    than 32 input channels still fills a Kin tile, Fig. 4's 32-channel BinConv), per layer on
    the cores their busy cycles as run; no LOAD, NORMQUANT, STREAMOUT, residual adds, pools,
    DMA, marshaling or fill."""
    from tvm_accel.layers import ConvLayer

    by = {ly.name: (g, ly) for g in graphs for ly in g.layers}
    total = 0
    for name, eng, _, st, macs in rows:
        g, ly = by[name]
        if not macs:
            continue
        if eng != "RBE" or not isinstance(ly, ConvLayer):
            total += st.cluster_busy
            continue
        k_out, k_in, kh, _ = ly.weight.shape
        _, _, ho, wo = g.tensors[ly.output].shape
        job = cg.RbeJob(h_in=(ho - 1) * ly.strides[0] + kh, w_in=(wo - 1) * ly.strides[1] + kh,
                        h_out=ho, w_out=wo, k_in=k_in, k_out=k_out,
                        in_bits=g.tensors[ly.input].bits, w_bits=ly.weight_bits,
                        out_bits=g.tensors[ly.output].bits, kernel=kh, stride=ly.strides[0])
        total += rbe_job_phases(cfg, job)["compute"]
    return total


def _bound(st) -> str:
    return bound_label({"off-chip": st.iodma_busy, "on-chip": max(st.dma_in_busy,
                                                                   st.dma_out_busy),
                        "compute": max(st.rbe_busy, st.cluster_busy)})


def _category(name: str, engine: str, macs: int) -> str:
    """The group a ResNet layer's cycles are counted in (:func:`cycle_breakdown`)."""
    if name.endswith("add"):
        return f"residual adds ({engine})"
    if "." not in name:
        return "stem, pool, FC" if macs else "pools"
    return f"stage {name[5]} convs ({engine})" if name.startswith("layer") else name


def cycle_breakdown(rows: list[tuple]) -> list[tuple]:
    """Where the cycles go: per group of layers (:func:`_category`) its cycles, share, MACs per
    cycle, the RBE's job phases and the cycles no engine was computing (a layer's fill and
    drain: the first tile's loads, the last tile's store)."""
    total = sum(r[3].cycles for r in rows)
    groups: dict[str, list] = {}
    for name, eng, _, st, macs in rows:
        groups.setdefault(_category(name, eng, macs), []).append((st, macs))
    out = []
    for cat, items in groups.items():
        cyc = sum(st.cycles for st, _ in items)
        macs = sum(m for _, m in items)
        ph = [sum(getattr(st, f"rbe_{p}") for st, _ in items)
              for p in ("load", "compute", "normquant", "streamout")]
        exposed = sum(st.cycles - max(st.rbe_busy, st.cluster_busy) for st, _ in items)
        out.append((cat, len(items), cyc, f"{100 * cyc / total:.1f}%",
                    f"{macs / cyc:.1f}" if macs else "-", *ph, exposed))
    return out


def _layer_table(rows: list[tuple]) -> str:
    """Per layer: engine, precision, cycles, MACs per cycle, the RBE's job phases, the cores'
    busy cycles, the cycles no engine computed (fill / drain), energy at the three points and
    what bounds it."""
    table = []
    for name, eng, prec, st, macs in rows:
        table.append((name, eng, prec, st.cycles, f"{macs / st.cycles:.1f}" if macs else "-",
                      st.rbe_load, st.rbe_compute, st.rbe_normquant, st.rbe_streamout,
                      st.cluster_busy, st.cycles - max(st.rbe_busy, st.cluster_busy),
                      *[f"{energy_uj(st, op):.3f}" for _, op in POINTS], _bound(st)))
    return format_table(["layer", "engine", "W/I/O", "cycles", "MAC/cycle", "RBE LOAD",
                         "COMPUTE", "NORMQUANT", "STREAMOUT", "cores busy", "fill/drain",
                         *[f"uJ @{p}" for p, _ in POINTS], "bound"], table)


def resnet20(cfg, layers: bool, knobs: dict | None = None) -> None:
    knobs = dict(knobs or {})
    base = resnet_graphs(quantize.quantized("resnet20"))
    mixed, how = resnet_graphs(quantize.resnet20_mixed()), "quantize.resnet20_mixed"
    objective = knobs.get("objective", "energy")
    other = next(o for o in OBJECTIVES if o != objective)
    totals = {}
    for label, graphs, kn in (("8-bit", base, knobs), ("mixed", mixed, knobs),
                              (f"mixed, objective {other}", mixed,
                               {**knobs, "objective": other})):
        rows, exact = run(graphs, cfg, kn)
        cyc = sum(r[3].cycles for r in rows)
        tot = {p: sum(energy_uj(r[3], op) for r in rows) for p, op in POINTS}
        floor = {p: energy_floor_uj(rows, cfg, op) for p, op in POINTS}
        totals[label] = (cyc, tot, exact, floor)
        if label == "mixed":
            compute_floor = compute_floor_cycles(graphs, rows, cfg)
            ops = 2 * sum(r[4] for r in rows)
            macs = sum(r[4] for r in rows)
            print(f"\nResNet-20 mixed ({how}, objective {objective}): where the cycles go "
                  f"(0.8 V / 420 MHz; {cyc} cycles, {macs / cyc:.1f} MAC/cycle)")
            print(format_table(["layers", "n", "cycles", "share", "MAC/cycle", "RBE LOAD",
                                "COMPUTE", "NORMQUANT", "STREAMOUT", "fill/drain"],
                               cycle_breakdown(rows)))
        if layers and "objective" not in label:
            print(f"\nResNet-20 {label} ({how if label == 'mixed' else 'zoo QDQ int8'}, "
                  f"objective {objective}), bit-exact vs reference: {exact}")
            print(_layer_table(rows))
    print(f"\nResNet-20 / CIFAR-10 on MARSELLUS (mixed: {how}; knobs {knobs}), "
          "each row beside the paper at the same operating point")
    out = []
    c8, e8, _, _ = totals["8-bit"]
    cm, em, _, fm = totals["mixed"]
    co, eo, _, _ = totals[f"mixed, objective {other}"]
    for p, op in POINTS:
        p_ms = paper_latency_ms(PAPER_R20, op)
        p_uj = PAPER_R20["uj"][p]
        out.append((p, f"{c8 / op.freq_mhz / 1e3:.2f}", f"{e8[p]:.1f}",
                    f"{cm / op.freq_mhz / 1e3:.3f}", f"{p_ms:.3f}", f"{em[p]:.1f}",
                    f"{p_uj:.0f}", f"{fm[p]:.1f}", f"{ops / (em[p] * 1e-6) / 1e12:.2f}",
                    f"{PAPER_R20['tops_w']:.2f}" if op is PAPER_R20["op"] else "",
                    f"{e8[p] / em[p]:.2f}x",
                    f"{co / op.freq_mhz / 1e3:.3f} / {eo[p]:.1f}"))
    print(format_table(["operating point", "8-bit ms", "8-bit uJ", "mixed ms",
                        "paper ms", "mixed uJ", "paper uJ", "floor uJ", "mixed Top/s/W",
                        "paper Top/s/W", "8-bit / mixed", f"mixed ms / uJ, {other}"], out))
    print(f"paper: {PAPER_R20['ms']} ms and {PAPER_R20['tops_w']} Top/s/W at 0.5 V / 100 MHz "
          f"(Table II), i.e. {PAPER_R20['ms'] * PAPER_R20['op'].freq_mhz:.0f}k cycles, carried "
          "to each clock; energies Sec. IV; 8-bit / mixed = 1 / (1 - "
          f"{PAPER_R20['saving']}) = {1 / (1 - PAPER_R20['saving']):.2f}x")
    print(f"mixed: {ops / 1e6:.1f} Mop (2 x MACs of the convs and FC), {cm} cycles "
          f"(objective {other}: {co} cycles)")
    print("floor: the convs and FC alone, each on the RBE at its peak rate for its W x I bits, "
          "charged as the energy model charges RBE jobs, for that time only (energy_floor_uj)")
    print(f"compute floor of this mapping (compute_floor_cycles): {compute_floor} cycles = "
          + ", ".join(f"{compute_floor / op.freq_mhz / 1e3:.3f} ms at {p}" for p, op in POINTS))
    print(f"bit-exact vs reference_execute: 8-bit {totals['8-bit'][2]}, "
          f"mixed {totals['mixed'][2]}, objective {other} "
          f"{totals[f'mixed, objective {other}'][2]}")


def resnet18(cfg, layers: bool, knobs: dict | None = None) -> None:
    graphs = resnet_graphs(quantize.resnet18_mixed())
    op = PAPER_R18["op"]
    # planned and run at each point's clock: its weights and tensors live in L3, whose link
    # keeps its bandwidth in time (MarsellusConfig.at_clock)
    runs = {pt: run(graphs, cfg.at_clock(pt.freq_mhz), knobs) for pt in (LOW_05, NOMINAL)}
    rows, exact = runs[op]
    if layers:
        print(f"\nResNet-18 / ImageNet 4-bit (quantize.resnet18_mixed) at 0.5 V / 100 MHz, "
              f"bit-exact: {exact}")
        print(format_table(["layer", "engine", "W/I/O", "cycles", "us", "uJ", "bound"],
                           [(name, eng, prec, st.cycles, f"{st.cycles / op.freq_mhz:.1f}",
                             f"{energy_uj(st, op):.2f}", _bound(st))
                            for name, eng, prec, st, _ in rows]))
    ops = 2 * sum(r[4] for r in rows)
    compute_floor = compute_floor_cycles(graphs, rows, cfg.at_clock(op.freq_mhz))
    table, cycles = [], {}
    for label, pt in (("0.5 V 100 MHz", LOW_05), ("0.8 V 420 MHz", NOMINAL)):
        pt_rows, pt_exact = runs[pt]
        cycles[label] = cyc = sum(r[3].cycles for r in pt_rows)
        uj = sum(energy_uj(r[3], pt) for r in pt_rows)
        floor = energy_floor_uj(pt_rows, cfg, pt)
        table.append((f"ours {label}", f"{cyc / pt.freq_mhz / 1e3:.1f}", f"{uj / 1e3:.3f}",
                      f"{ops / (uj * 1e-6) / 1e12:.2f}", f"{floor / 1e3:.3f}",
                      f"{ops / (floor * 1e-6) / 1e12:.2f}", str(pt_exact)))
        table.append((f"paper {label}", f"{paper_latency_ms(PAPER_R18, pt):.1f}",
                      *((f"{ops / (PAPER_R18['tops_w'] * 1e12) * 1e3:.3f}",
                         f"{PAPER_R18['tops_w']:.2f}") if pt is op else ("", "")), "", "", ""))
    bounds = {}
    for r in rows:
        b = _bound(r[3])
        bounds[b] = bounds.get(b, 0) + 1
    print(f"\nResNet-18 / ImageNet 224x224, 4-bit (quantize.resnet18_mixed), {ops / 1e9:.2f} Gop, "
          + ", ".join(f"{c} cycles at {label}" for label, c in cycles.items()))
    print(format_table(["", "latency ms", "energy mJ", "Top/s/W", "floor mJ", "floor Top/s/W",
                        "bit-exact"], table))
    print(f"paper: {PAPER_R18['ms']:.0f} ms and {PAPER_R18['tops_w']} Top/s/W at 0.5 V (Table II): "
          f"{PAPER_R18['ms'] * PAPER_R18['op'].freq_mhz / 1e3:.1f}M cycles carried to 420 MHz; "
          "its energy = our Gop / 5.83 Top/s/W")
    print(f"compute floor of this mapping (compute_floor_cycles): {compute_floor} cycles = "
          f"{compute_floor / op.freq_mhz / 1e3:.1f} ms at 0.5 V")
    print("layers by bound at 0.5 V: " + ", ".join(f"{k} {v}" for k, v in sorted(bounds.items())))
    print(f"layers on the RBE: {sum(r[1] == 'RBE' for r in rows)} of {len(rows)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="MARSELLUS config (default bundled)")
    ap.add_argument("--networks", default="resnet20,resnet18")
    ap.add_argument("--layers", action="store_true", help="print the per-layer tables")
    ap.add_argument("--objective", choices=OBJECTIVES, default="energy",
                    help="what the residual adds' engine choice minimises")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    knobs = {"objective": args.objective}
    for net in args.networks.split(","):
        {"resnet20": resnet20, "resnet18": resnet18}[net](cfg, args.layers, knobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
