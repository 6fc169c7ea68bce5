"""``tvmc compare-targets``: one model on several targets side by side
(:mod:`tvm_accel.explore.targets`): a per-layer table, a summary and a per-layer bar chart."""

from __future__ import annotations

import os

from tvm_accel.cli.common import check_output_path, user_warnings
from tvm_accel.errors import AccelError


def _models_for(items: list[str]) -> dict[str, str]:
    """``--model-for TARGET=ONNX`` -> ``{target: path}``."""
    out = {}
    for item in items:
        key, eq, path = item.partition("=")
        if not eq or not key or not path:
            raise AccelError(f"--model-for {item}: give TARGET=QDQ.onnx, e.g. "
                             "dpu=model_pow2.onnx")
        if not os.path.isfile(path):
            raise AccelError(f"--model-for {item}: {path}: no such file")
        out[key] = path
    return out


def cmd_compare_targets(args) -> int:
    from tvm_accel.explore.plots import layers_png
    from tvm_accel.explore.targets import compare_targets, parse_targets
    from tvm_accel.frontend import read_npz
    from tvm_accel.quantize import CalibrationWarning
    from tvm_accel.target import available_targets

    if not os.path.isfile(args.model):
        raise AccelError(f"{args.model}: no such model file")
    targets = parse_targets(args.targets or ",".join(available_targets()))
    models_for = _models_for(args.model_for or [])
    labels = {lb for lb, _, _ in targets} | {k for _, k, _ in targets}
    for key in models_for:
        if key not in labels:
            raise AccelError(f"--model-for {key}=...: '{key}' is not one of --targets")
    png = args.output or os.path.splitext(os.path.basename(args.model))[0] + "_targets.png"
    check_output_path(png, "targets.png", "picture")
    calibration = read_npz(args.calibration, args.calibration, "calibration") \
        if args.calibration else None
    with user_warnings("compare-targets", CalibrationWarning):
        result = compare_targets(args.model, targets, models_for, calibration, args.seed)
    print(result.format())
    names, series = result.layer_series()
    layers_png(names, series, png, "time per layer (us, log)",
               f"{result.model}: time per layer at each target's clock")
    print(f"picture written to {png}")
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser(
        "compare-targets", help="one model on several targets: per-layer table, summary, bar "
        "chart", description="Quantize the model once per target's needs (or take your QDQ "
        "model per target), compile and run it on each target; print a per-layer table "
        "(placement, cycles, utilization, energy) and a summary (latency at each target's "
        "clock, energy, offloaded layers, bit-exactness, LSB difference from onnxruntime), "
        "and draw the time per layer.")
    c.add_argument("model", help="ONNX model, float (quantized per target) or QDQ (used as is)")
    c.add_argument("--targets", metavar="LIST",
                   help="comma-separated KIND[:CONFIG], e.g. vta,vta:vta_8x8x8,dpu,marsellus "
                   "(default: every target at its default config)")
    c.add_argument("--model-for", action="append", metavar="TARGET=ONNX",
                   help="the QDQ model to run on TARGET (a KIND or a --targets entry) instead "
                   "of quantizing MODEL; repeatable")
    c.add_argument("--calibration", metavar="NPZ",
                   help="calibration inputs for a float model, as for 'tvmc quantize'")
    c.add_argument("--seed", type=int, default=0, help="seed of the random input (default 0)")
    c.add_argument("-o", "--output", metavar="PNG",
                   help="bar chart to write (default: <model>_targets.png)")
    c.set_defaults(func=cmd_compare_targets)
