"""Simulator speed against onnxruntime (issue 25): wall time of one inference per model and
target, side by side with onnxruntime (one thread) on the same QDQ model.

Ours is the whole ``vm["main"]`` call (host operators + C simulator); onnxruntime runs the QDQ
model with its default graph optimizations (its fused int8 kernels) on one intra-op thread.
Each figure is the median of ``--repeat`` runs after one warm-up, ours and onnxruntime's calls
in alternating rounds so both see the same machine (:func:`timed`), as wall time and as the
process's CPU time (the steadier figure when other jobs share the machine). The table also
prints the simulated cycles (from a separate profiled run) and a digest of the outputs, so a
change to the simulator's functional core can be checked to leave both unchanged. Each row
runs in its own process. Usage:
    python benchmarks/sim_speed.py [--rows resnet18-vta,resnet50-dpu,resnet20-marsellus]
                                   [--hw50 224] [--repeat 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time

#: row -> (zoo model, target kind, hardware config, quantization scheme)
ROWS: dict[str, tuple[str, str, str | None, dict]] = {
    "resnet18-vta": ("resnet18", "vta", "vta_1x16x16", {"per_channel": True}),
    "resnet50-dpu": ("resnet50", "dpu", None, {"power_of_two": True}),
    "resnet20-marsellus": ("resnet20", "marsellus", None,
                           {"activation_type": "uint8", "per_channel": True}),
}


def timed(fns: list, repeat: int, blocks: int = 5) -> list[tuple[float, float]]:
    """Median wall and CPU seconds of ``repeat`` calls of each of ``fns`` after one warm-up
    call each. The calls run in ``blocks`` rounds of ``repeat / blocks`` consecutive calls per
    function (a, a, ..., b, b, ..., a, a, ...): consecutive, so each keeps its caches warm (one
    call each in turn would let the simulator's working set evict onnxruntime's), and in
    rounds, so both see the same drift of a shared machine's speed. The CPU time is this
    process's, steadier than the wall time."""
    for fn in fns:
        fn()
    wall: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    per = max(1, repeat // blocks)
    for _ in range(max(1, min(blocks, repeat))):
        for i, fn in enumerate(fns):
            for _ in range(per):
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                wall[i].append(time.perf_counter() - t0)
                cpu[i].append(time.process_time() - c0)
    return [(statistics.median(w), statistics.median(c)) for w, c in zip(wall, cpu, strict=True)]


def measure(row: str, repeat: int, hw50: int) -> dict:
    import numpy as np
    import onnxruntime as ort
    import tvm
    from tvm import relax

    from tvm_accel import quantize
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_accel.package import outputs_to_numpy
    from tvm_accel.pipeline import compile_model
    from tvm_accel.profiler import profiling
    from tvm_accel.target import get_target

    name, kind, config, scheme = ROWS[row]
    kwargs = {"hw": hw50} if name == "resnet50" else {}
    q = quantize.quantized(name, **scheme, **kwargs)
    mod, info = load_onnx(q)
    feed = random_inputs(info, seed=0)
    ex, _ = compile_model(mod, get_target(kind), config)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(x) for x in feed.values()]
    with profiling() as prof:
        out = outputs_to_numpy(vm["main"](*args))
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for o in out))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(q.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ours, theirs = timed([lambda: vm["main"](*args), lambda: sess.run(None, feed)], repeat)
    shape = "x".join(str(d) for d in next(iter(info.inputs.values()))[0][2:])
    return {"row": row, "input": shape, "ours_ms": ours[0] * 1e3, "ort_ms": theirs[0] * 1e3,
            "ours_cpu_ms": ours[1] * 1e3, "ort_cpu_ms": theirs[1] * 1e3,
            "cycles": sum(r.cycles for r in prof.records),
            "digest": digest.hexdigest()[:12]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--hw50", type=int, default=224, help="ResNet-50 input size (multiple of 32)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.repeat, args.hw50)))
        return
    from tvm_accel.report import format_table

    rows = []
    for row in args.rows.split(","):
        if row not in ROWS:
            p.error(f"unknown row {row} ({', '.join(ROWS)})")
        proc = subprocess.run([sys.executable, __file__, "--one", row, "--repeat",
                               str(args.repeat), "--hw50", str(args.hw50)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            err = (proc.stderr.strip().splitlines() or ["?"])[-1]
            rows.append((row, "", "FAILED", "", "", "", "", "", "", err))
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append((r["row"], r["input"], round(r["ort_ms"], 2), round(r["ours_ms"], 1),
                     f"{r['ours_ms'] / r['ort_ms']:.1f}x", round(r["ort_cpu_ms"], 2),
                     round(r["ours_cpu_ms"], 1), f"{r['ours_cpu_ms'] / r['ort_cpu_ms']:.1f}x",
                     r["cycles"], r["digest"]))
        print(f"{row}: {rows[-1]}", file=sys.stderr, flush=True)
    print(format_table(("model-target", "input", "ort wall ms", "ours wall ms", "ratio",
                        "ort cpu ms", "ours cpu ms", "ratio", "cycles", "outputs sha256"), rows))


if __name__ == "__main__":
    main()
