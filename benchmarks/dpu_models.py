"""Whole-model figures on the DPU target (the compiler as it stands: layer by layer, pipelined).

For each model (batch = number of PEs, one image per PE, power-of-two QDQ quantization): total
cycles, latency at the configured clock for the batch, HW efficiency (useful MACs / (cycles x
peak MACs/cycle)), cycles with software pipelining switched off (speedup of the DPON/DPBY
pipeline), CPU fallbacks, compile time, simulator wall time, bit-exactness vs the CPU reference.
Each model runs in its own process. Usage:
    python benchmarks/dpu_models.py [--models resnet50,vgg16,...] [--config dpu_default]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

# name -> zoo builder kwargs (full-size inputs unless noted)
MODELS = {
    "resnet18": {},
    "resnet50": {},
    "vgg16": {},
    "googlenet": {},
    "yolov3_tiny": {},
    "encoder_decoder": {"hw": 64},
}


def _run(ex, inputs):
    import tvm
    from tvm import relax

    from tvm_accel.package import outputs_to_numpy

    return outputs_to_numpy(relax.VirtualMachine(ex, tvm.cpu())["main"](*inputs))


def measure(name: str, config: str) -> dict:
    import numpy as np
    import tvm

    import tvm_dpu
    from tvm_accel import zoo
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_accel.pipeline import compile_model, compile_reference
    from tvm_accel.profiler import profiling

    cfg = tvm_dpu.load_config(config)
    model = zoo.quantize(zoo.MODELS[name](batch=cfg.NUM_PE, **MODELS[name]), power_of_two=True)
    mod, info = load_onnx(model)
    t0 = time.perf_counter()
    ex, report = compile_model(mod, tvm_dpu.TARGET, cfg)
    t_compile = time.perf_counter() - t0
    inputs = [tvm.runtime.tensor(x) for x in random_inputs(info, seed=0).values()]
    t0 = time.perf_counter()
    with profiling() as prof:
        outs = _run(ex, inputs)
    t_run = time.perf_counter() - t0
    ref = _run(compile_reference(mod, tvm_dpu.TARGET), inputs)
    exact = all(np.array_equal(a, b) for a, b in zip(outs, ref, strict=True))
    dpu_layers = [r.layer for r in report.offloads if r.placement == "dpu"]
    serial_knobs = {layer: {"pipeline": False} for layer in dpu_layers}
    ex_serial, _ = compile_model(mod, tvm_dpu.TARGET, cfg, serial_knobs)
    with profiling() as prof_serial:
        _run(ex_serial, inputs)
    macs = sum(r.macs for r in prof.records)
    cycles = sum(r.cycles for r in prof.records)
    serial = sum(r.cycles for r in prof_serial.records)
    return {
        "model": name, "batch": cfg.NUM_PE, "cycles": cycles,
        "latency_ms": cycles / cfg.CLOCK_MHZ / 1e3,
        "efficiency": macs / (cycles * cfg.peak_macs_per_cycle) if cycles else 0.0,
        "pipeline_speedup": serial / cycles if cycles else 0.0,
        "dpu_layers": len(dpu_layers),
        "cpu_fallbacks": sum(1 for r in report.offloads
                             if r.placement == "cpu" and r.op not in ("quantize", "dequantize")),
        "compile_s": t_compile, "sim_s": t_run, "bit_exact": exact,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--config", default="dpu_default")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.config)))
        return
    from tvm_accel.report import format_table

    rows = []
    for name in args.models.split(","):
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--config", args.config],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            err = (proc.stderr.strip().splitlines() or ["?"])[-1]
            rows.append((name, "-", "-", "-", "-", "-", "-", "-", "-", "-", f"failed: {err}"))
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append((r["model"], r["batch"], r["cycles"], f"{r['latency_ms']:.2f}",
                     f"{100 * r['efficiency']:.1f}%", f"{r['pipeline_speedup']:.2f}x",
                     r["dpu_layers"], r["cpu_fallbacks"], f"{r['compile_s']:.1f}",
                     f"{r['sim_s']:.1f}", "yes" if r["bit_exact"] else "NO"))
    print(format_table(["model", "batch", "cycles", "latency ms", "HW eff", "pipelining",
                        "dpu layers", "cpu fallbacks", "compile s", "run s", "bit-exact"], rows,
                       align="lrrrrrrrrrl"))


if __name__ == "__main__":
    main()
