"""Fig. 13-style sweep of the RBE cycle model: single hand-built jobs run on the simulator.

For each mode (3x3, 1x1) and W, I (O = 8) the Fig. 13 layer (Kin = Kout = 64, 3x3 output) is run
as one RBE job; the table gives ops/cycle in COMPUTE, in the LOAD-COMPUTE loop (Fig. 13's
metric) and over the whole job, the loop Gop/s and 1x1-bit Gop/s at 420 MHz, and the paper's
figures where it states one. Not run by the tests::

    python benchmarks/marsellus_rbe_sweep.py [--config marsellus_default] [--bits 2,4,8]
"""

from __future__ import annotations

import argparse

import numpy as np

from tvm_marsellus import codegen as cg
from tvm_marsellus import layout
from tvm_marsellus.hw_config import load_config
from tvm_marsellus.simulator import simulate

#: paper figures: (mode, W, I) -> (what, value)
PAPER = {
    ("3x3", 2, 2): "COMPUTE peak 1610 ops/cycle",
    ("3x3", 2, 4): "COMPUTE peak 1610 ops/cycle; loop 571 Gop/s",
    ("3x3", 8, 4): "~7100 1x1-bit Gop/s (highest)",
    ("3x3", 8, 8): "91 Gop/s (Fig. 15, full kernel)",
}


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
    print("loop = LOAD + COMPUTE (Fig. 13's metric); job = loop + NORMQUANT + STREAMOUT "
          "(setup hidden by the 2-job queue in a stream of jobs)")


if __name__ == "__main__":
    main()
