"""Whole-model figures on VTA: compile time, simulated cycles and latency, GEMM utilization,
simulator wall time and peak memory (max RSS) per model, and the total with the host passes:
accelerator cycles plus the modelled host cycles of the layout rewrites and blockings
(``tvm_vta_cp.host_cost``), as ``tvmc run --profile`` reports them.

Each model runs in its own process so its max RSS is its own. Usage:
    python benchmarks/vta_models.py [--models resnet20,resnet18] [--config vta_1x16x16]
                                    [--strategy auto] [--layout-choice joint]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from tvm_accel import quantize


def measure(name: str, config: str, strategy: str = "auto",
            layout_choice: str = "joint") -> dict:
    import numpy as np
    import tvm
    from tvm import relax

    import tvm_vta_cp
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_accel.pipeline import compile_model, compile_reference
    from tvm_accel.profiler import profiling, time_host_functions

    model = quantize.quantized(name)
    t0 = time.perf_counter()
    mod, info = load_onnx(model)
    ex, report = compile_model(mod, tvm_vta_cp.TARGET, config,
                               tvm_vta_cp.strategy_knobs(None, strategy,
                                                         layout_choice=layout_choice))
    t_compile = time.perf_counter() - t0
    inputs = [tvm.runtime.tensor(x) for x in random_inputs(info, seed=0).values()]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    t0 = time.perf_counter()
    with profiling() as prof:
        time_host_functions(vm, report.host_functions, prof)
        out = vm["main"](*inputs)
    t_run = time.perf_counter() - t0
    ref = relax.VirtualMachine(compile_reference(mod, tvm_vta_cp.TARGET), tvm.cpu())
    exact = np.array_equal(out.numpy(), ref["main"](*inputs).numpy())
    cfg = tvm_vta_cp.load_config(config)
    recs = prof.records
    macs = sum(r.macs for r in recs if r.op != "add")
    cycles = sum(r.cycles for r in recs)
    host = sum(h.model_cycles for h in prof.host)
    return {
        "model": name, "config": config, "compile_s": t_compile, "run_s": t_run,
        "layers_vta": sum(1 for r in report.offloads if r.placement == "vta"),
        "layers_cpu": sum(1 for r in report.offloads if r.placement == "cpu"),
        "macs": macs, "cycles": cycles, "host_cycles": host, "total_cycles": cycles + host,
        "host_passes": len(prof.host), "latency_ms": (cycles + host) / cfg.CLOCK_MHZ / 1e3,
        "utilization": macs / (cycles * cfg.macs_per_cycle) if cycles else 0.0,
        "sim_macs_per_s": macs / t_run if t_run else 0.0, "bit_exact": exact,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet20,resnet18")
    p.add_argument("--config", default="vta_1x16x16")
    p.add_argument("--strategy", default="auto", choices=("static", "cp", "auto"))
    p.add_argument("--layout-choice", default="joint", choices=("joint", "per-layer"),
                   help="cp/auto: re-pick the measured layouts for the network (joint) or "
                   "keep each layer's own best (per-layer)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.config, args.strategy, args.layout_choice)))
        return
    from tvm_accel.report import format_table

    rows = []
    for name in args.models.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", name, "--config", args.config,
                              "--strategy", args.strategy, "--layout-choice",
                              args.layout_choice],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append((r["model"], r["config"], r["layers_vta"], r["layers_cpu"], r["macs"],
                     r["cycles"], round(r["host_cycles"]), r["host_passes"],
                     round(r["total_cycles"]), f"{r['latency_ms']:.2f}",
                     f"{100 * r['utilization']:.1f}%",
                     f"{r['compile_s']:.1f}", f"{r['run_s']:.2f}",
                     f"{r['sim_macs_per_s'] / 1e9:.2f}", f"{r['max_rss_mib']:.0f}",
                     "yes" if r["bit_exact"] else "NO"))
    print(format_table(["model", "config", "vta layers", "cpu layers", "MACs",
                        "accelerator cycles", "host cycles", "host passes", "total cycles",
                        "latency ms", "GEMM util", "compile s", "run s", "GMAC/s (wall)",
                        "max RSS MiB", "bit-exact"], rows, align="llrrrrrrrrrrrrrl"))


if __name__ == "__main__":
    main()
