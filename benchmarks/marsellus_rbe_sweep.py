"""Fig. 13 / Fig. 15-style sweep of the RBE cycle model: single hand-built jobs on the simulator.

For each mode (3x3, 1x1) and W, I (O = 8) the Fig. 13 layer (Kin = Kout = 64, 3x3 output) is run
as one RBE job; the table gives ops/cycle in COMPUTE, in the LOAD-COMPUTE loop (Fig. 13's
metric) and over the whole job, the loop Gop/s and 1x1-bit Gop/s at 420 MHz, and the paper's
figures where it states one. A second table puts the whole jobs of Fig. 15's two RBE points
(W = I = 2 and 8; O = 2, the energy model's reference, and O = W) beside Fig. 15: Gop/s, the
energy model's CLUSTER power and Top/s/W at 0.8 V / 420 MHz and 0.5 V / 100 MHz, with the
deviation from the paper. Not run by the tests::

    python benchmarks/marsellus_rbe_sweep.py [--config marsellus_default] [--bits 2,4,8]
"""

from __future__ import annotations

import argparse

import numpy as np

from tvm_marsellus import codegen as cg
from tvm_marsellus import layout
from tvm_marsellus.energy import LOW_05, NOMINAL, rbe_power_mw
from tvm_marsellus.hw_config import load_config
from tvm_marsellus.simulator import simulate

#: paper figures: (mode, W, I) -> (what, value)
PAPER = {
    ("3x3", 2, 2): "COMPUTE peak 1610 ops/cycle",
    ("3x3", 2, 4): "COMPUTE peak 1610 ops/cycle; loop 571 Gop/s",
    ("3x3", 8, 4): "~7100 1x1-bit Gop/s (highest)",
    ("3x3", 8, 8): "91 Gop/s (Fig. 15, full kernel)",
}
#: Fig. 13 figures the loop must match: (mode, W, I) -> (loop Gop/s or None, 1-bit Gop/s or None)
FIG13 = {("3x3", 2, 4): (571.0, None), ("3x3", 8, 4): (None, 7100.0)}
#: Fig. 15 RBE points: W = I bits -> {operating point: (Gop/s, Top/s/W)}
FIG15 = {2: {"0.8 V": (569.0, 5.37), "0.5 V": (136.0, 12.36)},
         8: {"0.8 V": (91.0, 0.740), "0.5 V": (22.0, 1.64)}}


def _dev(ours: float, paper: float) -> str:
    return f"{100 * (ours / paper - 1):+.1f}%"


def fig15_table(cfg) -> None:
    """Whole jobs of Fig. 15's two RBE points beside the paper, at both voltages."""
    print("\nFig. 15 points: whole 3x3 jobs (setup hidden), energy model power (full CLUSTER)")
    print(f"{'W=I':>3} {'O':>2} | {'point':<5} {'Gop/s':>7} {'paper':>6} {'dev':>7} | "
          f"{'mW':>6} {'paper':>6} | {'Top/s/W':>7} {'paper':>6} {'dev':>7}")
    for bits, pts in FIG15.items():
        for ob in sorted({2, bits}):
            job, st = run_job(cfg, "3x3", bits, bits, ob)
            cyc = st.rbe_load + st.rbe_compute + st.rbe_normquant + st.rbe_streamout
            ops = 2 * job.macs
            for label, op in (("0.8 V", NOMINAL), ("0.5 V", LOW_05)):
                gops = ops / cyc * op.freq_mhz / 1e3
                mw = rbe_power_mw(op, ops * bits * bits / cyc)
                pg, pe = pts[label]
                print(f"{bits:>3} {ob:>2} | {label:<5} {gops:>7.1f} {pg:>6.0f} "
                      f"{_dev(gops, pg):>7} | {mw:>6.1f} {pg / pe:>6.1f} | "
                      f"{gops / mw:>7.2f} {pe:>6.2f} {_dev(gops / mw, pe):>7}")
    print("mW: rbe_power_mw at the job's 1-bit rate; paper mW = Gop/s / (Top/s/W). Fig. 15 does "
          "not state its layer or O")


def run_job(cfg, mode: str, wb: int, ib: int, ob: int = 8, seed: int = 0):
    """One RBE job of the Fig. 13 layer with random data; returns (job, stats)."""
    k = 3 if mode == "3x3" else 1
    hin = 3 + k - 1
    rng = np.random.default_rng(seed)
    l1 = np.zeros(cfg.L1_BYTES, np.uint8)
    x = layout.pack_activations(rng.integers(0, 1 << ib, (hin, hin, 64)), ib)
    w = layout.pack_weights(rng.integers(-(1 << (wb - 1)), 1 << (wb - 1), (64, 64, k, k)), wb)
    nq = layout.pack_normquant(rng.integers(0, 1 << 16, 64), np.zeros(64))
    xa, wa = 0, (x.size + 3) // 4 * 4
    nqa = (wa + w.size + 3) // 4 * 4
    ya = (nqa + nq.size + 3) // 4 * 4
    l1[xa:xa + x.size], l1[wa:wa + w.size], l1[nqa:nqa + nq.size] = x, w, nq
    job = cg.RbeJob(x_ptr=xa, w_ptr=wa, nq_ptr=nqa, y_ptr=ya, h_in=hin, w_in=hin, h_out=3,
                    w_out=3, k_in=64, k_out=64, in_bits=ib, w_bits=wb, out_bits=ob, kernel=k,
                    shift=16)
    return job, simulate(cfg, cg.encode_stream([job]), l1=l1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None)
    ap.add_argument("--bits", default="2,3,4,5,8", help="W and I values to sweep")
    ap.add_argument("--freq", type=float, default=420.0, help="clock for Gop/s (MHz)")
    args = ap.parse_args()
    cfg = load_config(args.config)
    bits = [int(b) for b in args.bits.split(",")]
    f = args.freq / 1e3
    print(f"RBE sweep, config {cfg.name}, Kin = Kout = 64, 3x3 output, O = 8, {args.freq} MHz")
    print(f"{'mode':<5} {'W':>2} {'I':>2} | {'LOAD':>5} {'COMP':>5} {'NQ':>4} {'SOUT':>4} "
          f"{'SETUP':>5} | {'ops/c COMP':>10} {'ops/c loop':>10} {'ops/c job':>9} | "
          f"{'Gop/s loop':>10} {'1b Gop/s':>9} {'Gop/s job':>9} | paper")
    checks = []
    for mode in ("3x3", "1x1"):
        for wb in bits:
            for ib in bits:
                job, st = run_job(cfg, mode, wb, ib)
                ops = 2 * job.macs
                loop = st.rbe_load + st.rbe_compute
                job_c = loop + st.rbe_normquant + st.rbe_streamout
                print(f"{mode:<5} {wb:>2} {ib:>2} | {st.rbe_load:>5} {st.rbe_compute:>5} "
                      f"{st.rbe_normquant:>4} {st.rbe_streamout:>4} {st.rbe_setup:>5} | "
                      f"{ops / st.rbe_compute:>10.1f} {ops / loop:>10.1f} {ops / job_c:>9.1f} | "
                      f"{ops / loop * f:>10.1f} {ops * wb * ib / loop * f:>9.0f} "
                      f"{ops / job_c * f:>9.1f} | {PAPER.get((mode, wb, ib), '')}")
                fig13 = FIG13.get((mode, wb, ib))
                if fig13:
                    checks.append((mode, wb, ib, ops / loop * f, ops * wb * ib / loop * f, fig13))
    print("loop = LOAD + COMPUTE (Fig. 13's metric); job = loop + NORMQUANT + STREAMOUT "
          "(setup hidden by the 2-job queue in a stream of jobs)")
    for mode, wb, ib, gops, bgops, (pg, pb) in checks:
        what = (f"loop {gops:.1f} Gop/s vs {pg:.0f} ({_dev(gops, pg)})" if pg else
                f"1-bit {bgops:.0f} Gop/s vs {pb:.0f} ({_dev(bgops, pb)})")
        print(f"Fig. 13 {mode} W={wb} I={ib}: {what}")
    fig15_table(cfg)


if __name__ == "__main__":
    main()
