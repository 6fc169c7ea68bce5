"""``tvmc sweep``: models x a grid of hardware configs of one target
(:mod:`tvm_accel.explore.sweep`): a CSV row per point and model, a summary table, a PNG of
latency against energy or on-chip bytes with the Pareto front marked."""

from __future__ import annotations

import os
import sys

from tvm_accel.cli.common import check_output_path, user_warnings
from tvm_accel.errors import AccelError


def cmd_sweep(args) -> int:
    from tvm_accel.explore.plots import sweep_png
    from tvm_accel.explore.sweep import load_spec, run_sweep
    from tvm_accel.frontend import read_npz
    from tvm_accel.quantize import CalibrationWarning

    if args.jobs < 1:
        raise AccelError(f"--jobs {args.jobs}: give at least 1 process")
    csv_path = args.output or os.path.splitext(os.path.basename(args.spec))[0] + ".csv"
    check_output_path(csv_path, "sweep.csv", "CSV")
    png = args.png or os.path.splitext(csv_path)[0] + ".png"
    check_output_path(png, "sweep.png", "picture", "--png")
    for m in args.models:
        if not os.path.isfile(m):
            raise AccelError(f"{m}: no such model file")
    spec = load_spec(args.spec)
    calibration = read_npz(args.calibration, args.calibration, "calibration") \
        if args.calibration else None
    total = len(spec.points) * len(args.models)

    def progress(row: dict) -> None:
        print(f"[{row['point']}/{len(spec.points) - 1}] {row['model']}: {row['status']}"
              + (f" {float(row['latency_us']):,.1f} us" if row["latency_us"] else "")
              + (f" ({row['reason'][:80]})" if row["reason"] else ""), file=sys.stderr)

    with user_warnings("sweep", CalibrationWarning):
        result = run_sweep(spec, args.models, csv_path, jobs=args.jobs,
                           calibration=calibration, seed=args.seed,
                           progress=None if args.quiet else progress)
    print(result.format())
    sweep_png(result, png, f"{spec.target.name} sweep over {', '.join(spec.axes)} "
              f"(base {spec.base.name}, {total} runs)")
    print(f"results written to {csv_path}, picture to {png}")
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser(
        "sweep", help="run models over a grid of hardware configs of one target (CSV, summary, "
        "Pareto picture; resumable)",
        description="Compile, check (bit-exact against the CPU reference on one input) and run "
        "each model on each point of a grid of hardware configs. The spec (JSON, or YAML with "
        "PyYAML): {\"target\": KIND, \"base\": CONFIG, \"options\": {...}, \"precision\": "
        "{...}, \"axes\": {KEY: [VALUES]}}, each KEY a field of the base config, an option of "
        "the target (as --target-<kind>-<option>) or 'precision'; a value may be an object "
        "setting several keys at once. Rerunning with the same -o skips the points already "
        "measured.")
    s.add_argument("spec", help="sweep spec, JSON (or YAML)")
    s.add_argument("models", nargs="+", metavar="MODEL",
                   help="ONNX models: QDQ as they are, float ones quantized for the target")
    s.add_argument("-o", "--output", metavar="CSV",
                   help="results, one row per point and model (default: <spec>.csv); "
                   "an existing file of the same sweep is resumed")
    s.add_argument("--png", metavar="PNG", help="picture (default: beside the CSV)")
    s.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="measure N points at a time in separate processes (default 1)")
    s.add_argument("--calibration", metavar="NPZ",
                   help="calibration inputs for float models, as for 'tvmc quantize'")
    s.add_argument("--seed", type=int, default=0, help="seed of the random input (default 0)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress line per point")
    s.set_defaults(func=cmd_sweep)
