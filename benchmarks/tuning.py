"""Tuner efficiency and tuned-vs-default cycles on one target's tasks (AutoTVM's comparison).

For each of the first ``--tasks`` tasks of a zoo model, every tuner (``--tuners``) runs
``--trials`` trials for each of ``--seeds`` seeds on one shared pool of measurement workers.
Printed per task: space size, default cycles, best cycles found by any run (speedup over the
default), and for each tuner the number of trials it needed to reach 95% (``--goal``) of that
best (the median over seeds; ``>T`` when it never did); then the medians over tasks and the
XGBoost / random ratio. With ``--transfer`` the XGBoost tuner of each task also learns from
the points measured for the tasks before it (one extra column).

    python benchmarks/tuning.py [--target vta] [--config vta_1x16x16] [--model resnet20]
                                [--tasks 10] [--trials 48] [--seeds 3] [--parallel 2]

Figures are information for issue notes, never assertions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def trials_to_reach(curve: list[int], goal: float) -> int | None:
    """1-based trial at which the best-so-far cycles first reach ``goal`` (None: never)."""
    best = None
    for i, c in enumerate(curve, 1):
        if c and (best is None or c < best):
            best = c
        if best is not None and best <= goal:
            return i
    return None


def run(task, kind: str, seed: int, trials: int, measurer, option, history=()
        ) -> tuple[list[int], list]:
    """Cycles per trial in measurement order (0 for a failed one) and the tuner's history."""
    from tvm_accel.tuning.autotuner import make_tuner

    curve: list[int] = []
    tuner = make_tuner(kind, task, seed, min(trials, task.space.size))
    if history:
        tuner.load_history(list(history))

    def record(_tuner, inputs, results):
        curve.extend(r.cycles if r.ok else 0 for r in results)

    tuner.tune(n_trial=min(trials, task.space.size), measure_option=option,
               callbacks=(record,), measurer=measurer)
    return curve, list(tuner.history)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="vta")
    ap.add_argument("--config", default=None)
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--trials", type=int, default=48)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tuners", default="xgb,ga,random")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--transfer", action="store_true")
    ap.add_argument("--goal", type=float, default=0.95,
                    help="fraction of the best speed a tuner must reach (default 0.95)")
    args = ap.parse_args(argv)

    from tvm_accel import zoo
    from tvm_accel.frontend import load_onnx
    from tvm_accel.report import format_table
    from tvm_accel.target import get_target
    from tvm_accel.tuning.extract import extract_tasks
    from tvm_accel.tuning.measure import Measurer, measure_option

    t0 = time.perf_counter()
    target = get_target(args.target)
    model = zoo.quantized(args.model, power_of_two=args.target == "dpu")
    mod, _ = load_onnx(model)
    tasks = [t for t in extract_tasks(mod, target, args.config) if t.space.size > 8]
    tasks = tasks[:args.tasks]
    kinds = args.tuners.split(",")
    option = measure_option(timeout=120.0, n_parallel=args.parallel)
    rows, need = [], {k: [] for k in kinds + (["xgb+transfer"] if args.transfer else [])}
    earlier: list = []
    with Measurer(option) as measurer:
        for task in tasks:
            runs = {k: [run(task, k, s, args.trials, measurer, option)
                        for s in range(args.seeds)] for k in kinds}
            if args.transfer:
                runs["xgb+transfer"] = [run(task, "xgb", s, args.trials, measurer, option,
                                            earlier) for s in range(args.seeds)]
            earlier += runs[kinds[0]][0][1]
            curves = {k: [c for c, _ in v] for k, v in runs.items()}
            default = next((c[0] for cs in curves.values() for c in cs if c and c[0]), 0)
            best = min(x for cs in curves.values() for c in cs for x in c if x)
            row = [task.layers[0], task.space.size, f"{default:,}", f"{best:,}",
                   f"{default / best:.2f}x" if default else "-"]
            for k in need:
                hits = [trials_to_reach(c, best / args.goal) or args.trials + 1 for c in curves[k]]
                med = statistics.median(hits)
                need[k].append(med)
                row.append(f">{args.trials}" if med > args.trials else f"{med:g}")
            rows.append(row)
            print(f"  {task.layers[0]}: done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    print(f"\n== {args.target} tasks of {args.model} ({len(tasks)} tasks, {args.trials} trials, "
          f"{args.seeds} seeds): trials to reach {args.goal:.0%} of the best found by any tuner")
    print(format_table(["task", "space", "default cycles", "best cycles", "speedup",
                        *need], rows))
    med = {k: statistics.median(v) for k, v in need.items()}
    print("median over tasks: " + ", ".join(f"{k} {v:g}" for k, v in med.items()))
    if "xgb" in med and "random" in med:
        print(f"xgb / random trials: {med['xgb'] / med['random']:.2f}")
    print(f"total wall {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
