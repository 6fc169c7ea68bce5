"""The networks people deploy today on every target (issue 24): offloaded / compute layers,
bit-exactness and agreement with onnxruntime.

For each zoo network (MobileNetV2, EfficientNet-B0, SqueezeNet 1.1, U-Net, DeepLabv3 ASPP, the
Conv-BN net; reduced width, 64x64 input, seeded random weights) and each target (VTA 1x16x16 and
8x8x8, DPU, MARSELLUS), as a new user would: the float model is quantized with the target's
``tvmc quantize`` scheme (per-channel int8 for VTA, power-of-two for the DPU, per-channel uint8
for MARSELLUS; 8 seeded random calibration samples, as ``tvmc zoo --calibration-out`` writes),
compiled with the default strategy, run on the simulator and compared with the CPU reference
(bit-exact) and with onnxruntime running the same QDQ model (largest output difference in
LSBs of the output's scale). Layers are the rows of the placement report
(:func:`tvm_accel.partition.explain`) that run somewhere: convs, pools, adds, concats and the
float operators left between Q/DQ nodes; Q/DQ nodes and ReLUs fused into a layer are not
counted. The last column lists, per operator, what stays on the CPU (``-`` when nothing does).
A quantize or compile failure is a row with its one-line message. Each (network, target) runs
in its own process. Usage:
    python benchmarks/modern_networks.py [--models mobilenet_v2,unet] [--targets vta,dpu]
        [--layers]   # also each layer's own worst LSB vs onnxruntime (tvmc compare; slower)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter

#: the networks and their builder arguments (the zoo's defaults: reduced width, 64x64)
MODELS: dict[str, dict] = {
    "mobilenet_v2": {}, "efficientnet_b0": {}, "squeezenet1_1": {}, "unet": {},
    "deeplab_aspp": {}, "conv_bn_net": {},
}
#: column label -> (target kind, hardware config)
TARGETS = {"vta": ("vta", "vta_1x16x16"), "vta_8x8x8": ("vta", "vta_8x8x8"),
           "dpu": ("dpu", None), "marsellus": ("marsellus", None)}


def measure(name: str, column: str, layers: bool) -> dict:
    import numpy as np

    from tvm_accel import quantize, zoo
    from tvm_accel.compare import compare_layers, ort_session, output_lsb
    from tvm_accel.datasets.accuracy import SCHEMES
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_accel.pipeline import compile_model, compile_reference
    from tvm_accel.target import get_target

    kind, config = TARGETS[column]
    scheme, act = SCHEMES[kind]
    row: dict = {"model": name, "target": column}
    float_model = zoo.MODELS[name](**MODELS[name])
    try:
        q = quantize.quantize_model(float_model, quantize.random_calibration(float_model, 0, 8),
                                    scheme=scheme, activation_type=act)
    except Exception as e:  # the row reports it
        return {**row, "failed": f"quantize fails: {str(e).splitlines()[0]}"}
    mod, info = load_onnx(q)
    feed = random_inputs(info, seed=0)
    target = get_target(kind)
    t0 = time.perf_counter()
    try:
        ex, report = compile_model(mod, target, config)
    except Exception as e:
        return {**row, "failed": f"compile crash: {type(e).__name__}: {str(e).splitlines()[0]}"}
    row["compile_s"] = time.perf_counter() - t0
    import tvm
    from tvm import relax

    from tvm_accel.package import outputs_to_numpy

    def run(executable):
        vm = relax.VirtualMachine(executable, tvm.cpu())
        return outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(x) for x in feed.values()]))

    ours = run(ex)
    ref = run(compile_reference(mod, target))
    row["bit_exact"] = all(np.array_equal(a, b) for a, b in zip(ours, ref, strict=True))
    theirs = ort_session(q).run(None, feed)
    lsb = [v for v in output_lsb(q, ours, theirs) if v is not None]
    row["max_lsb"] = max(lsb) if lsb else None
    rows = [r for r in report.offloads if r.kind == "layer"]
    row["offloaded"] = sum(1 for r in rows if r.placement == kind)
    row["layers"] = len(rows)
    cpu = Counter(r.op for r in rows if r.placement != kind)
    row["cpu"] = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in cpu.most_common())
    row["reasons"] = sorted({f"{r.op}: {r.reason}" for r in rows if r.placement != kind})
    if layers:
        cmp = compare_layers(q, target, feed, config=config)
        row["local_lsb"] = cmp.local_max_lsb
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--layers", action="store_true",
                   help="also each layer's own worst LSB vs onnxruntime (tvmc compare)")
    p.add_argument("--reasons", action="store_true", help="print the CPU reasons per row")
    p.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.layers)))
        return
    from tvm_accel.report import format_table

    columns = args.targets.split(",")
    unknown = [c for c in columns if c not in TARGETS]
    if unknown:
        p.error(f"unknown target {unknown[0]} ({', '.join(TARGETS)})")
    results: dict[tuple[str, str], dict] = {}
    for name in args.models.split(","):
        for col in columns:
            proc = subprocess.run([sys.executable, __file__, "--one", name, col]
                                  + (["--layers"] if args.layers else []),
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                err = (proc.stderr.strip().splitlines() or ["?"])[-1]
                results[name, col] = {"failed": f"crash: {err}"}
            else:
                results[name, col] = json.loads(proc.stdout.strip().splitlines()[-1])
            r = results[name, col]
            print(f"{name} on {col}: " + ("failed: " + r["failed"] if "failed" in r else
                  f"{r['offloaded']}/{r['layers']} layers, bit-exact {r['bit_exact']}, "
                  f"max {r['max_lsb']} LSB, compile {r['compile_s']:.1f} s"),
                  file=sys.stderr, flush=True)

    def cell(r: dict) -> str:
        if "failed" in r:
            return "FAILED"
        return f"{r['offloaded']}/{r['layers']}"

    def stays(name: str) -> str:
        parts = []
        for col in columns:
            r = results[name, col]
            parts.append(f"{col}: " + (r["failed"] if "failed" in r else r["cpu"] or "-"))
        return "; ".join(parts)

    print(format_table(["network", *columns, "what stays on the CPU"],
                       [(name, *[cell(results[name, c]) for c in columns], stays(name))
                        for name in args.models.split(",")]))
    detail = []
    for (name, col), r in results.items():
        if "failed" in r:
            detail.append((name, col, "-", "-", "-", "-", "-"))
            continue
        detail.append((name, col, "yes" if r["bit_exact"] else "NO",
                       "-" if r["max_lsb"] is None else f"{r['max_lsb']:.0f}",
                       str(r.get("local_lsb", "-")), f"{r['compile_s']:.1f}",
                       f"{100 * r['offloaded'] / max(r['layers'], 1):.0f}%"))
    print()
    print(format_table(["network", "target", "bit-exact", "max LSB vs ort", "local LSB",
                        "compile s", "offloaded"], detail, align="llllrrr"))
    if args.reasons:
        for (name, col), r in results.items():
            for reason in r.get("reasons", []):
                print(f"{name} / {col}: {reason}")


if __name__ == "__main__":
    main()
