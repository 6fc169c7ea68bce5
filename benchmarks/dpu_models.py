"""Whole-model figures on the DPU target (fusion search + tiling + software pipelining).

For each model (batch = number of PEs, one image per PE, power-of-two QDQ quantization): total
cycles, latency at the configured clock for the batch, HW efficiency (useful MACs / (cycles x
peak MACs/cycle)), fused vs unfused speedup (the same compiler with the fusion search and the
parallel pool/conv streams off: layer by layer, pipelined, the layers' streams overlapped in one
stream; DNNVM's figures beside), number of fused groups and parallel pairs, software-pipelining
speedup (layer by layer, pipelined in one stream vs serial back-to-back streams), CPU
fallbacks, compile time (incl. the fusion search), simulator wall time, bit-exactness vs the CPU
reference. DDR bandwidth: the config's (dpu_default: 64 bytes/cycle).
Each model runs in its own process. Usage:
    python benchmarks/dpu_models.py [--models resnet50,vgg16,...] [--config dpu_default]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from tvm_accel import quantize

# name -> zoo builder kwargs (full-size inputs unless noted)
MODELS = {
    "resnet18": {},
    "resnet50": {},
    "vgg16": {},
    "googlenet": {},
    "yolov3_tiny": {},
    "encoder_decoder": {"hw": 64},
}


# DNNVM's fused vs unfused speedups (Fig. 11 / section 6)
DNNVM_FUSION = {"vgg16": "1.03x", "resnet50": "1.17x", "googlenet": "1.26x"}


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
    model = quantize.ort_quantize(zoo.MODELS[name](batch=cfg.NUM_PE, **MODELS[name]),
                                  power_of_two=True)
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
    off = {"@fusion": {"enabled": False}}

    def cycles_with(knobs: dict) -> int:
        ex_k, _ = compile_model(mod, tvm_dpu.TARGET, cfg, knobs)
        with profiling() as p:
            _run(ex_k, inputs)
        return sum(r.cycles for r in p.records)
    unfused = cycles_with(off)
    # serial: no software pipelining inside a layer and no overlap across layers' streams
    serial = cycles_with({"@fusion": {"enabled": False, "overlap": False},
                          **{layer: {"pipeline": False} for layer in dpu_layers}})
    macs = sum(r.macs for r in prof.records)
    cycles = sum(r.cycles for r in prof.records)
    return {
        "model": name, "batch": cfg.NUM_PE, "cycles": cycles,
        "latency_ms": cycles / cfg.CLOCK_MHZ / 1e3,
        "efficiency": macs / (cycles * cfg.peak_macs_per_cycle) if cycles else 0.0,
        "fusion_speedup": unfused / cycles if cycles else 0.0,
        "fused_groups": sum(1 for r in prof.records if "+" in r.layer or "||" in r.layer),
        "pipeline_speedup": serial / unfused if unfused else 0.0,
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
            rows.append((name, *["-"] * 12, f"failed: {err}"))
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append((r["model"], r["batch"], r["cycles"], f"{r['latency_ms']:.2f}",
                     f"{100 * r['efficiency']:.1f}%", f"{r['fusion_speedup']:.2f}x",
                     DNNVM_FUSION.get(name, "-"), r["fused_groups"],
                     f"{r['pipeline_speedup']:.2f}x",
                     r["dpu_layers"], r["cpu_fallbacks"], f"{r['compile_s']:.1f}",
                     f"{r['sim_s']:.1f}", "yes" if r["bit_exact"] else "NO"))
    print(format_table(["model", "batch", "cycles", "latency ms", "HW eff", "fusion",
                        "DNNVM", "groups", "pipelining", "dpu layers", "cpu fallbacks",
                        "compile s", "run s", "bit-exact"], rows, align="lrrrrrrrrrrrrl"))
    print("HW eff goal (DPUV3INT8): >= 80% on ResNet-50; fusion = unfused / fused cycles")


if __name__ == "__main__":
    main()
