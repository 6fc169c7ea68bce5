"""Tuning on the simulators (issue 9's figures), one of three modes (``--mode``):

- ``efficiency`` (default), AutoTVM's tuner comparison: for each of the first ``--tasks`` tasks
  of a zoo model, every tuner (``--tuners``) runs ``--trials`` trials for each of ``--seeds``
  seeds on one shared pool of measurement workers. Printed per task: space size, default
  cycles, best cycles found by any run (speedup over the default), and for each tuner the number
  of trials it needed to reach 95% (``--goal``) of that best (the median over seeds; ``>T`` when
  it never did); then the medians over tasks and the XGBoost / random ratio. With
  ``--transfer`` the XGBoost tuner of each task also learns from the points measured for the
  tasks before it (one extra column).
- ``tuned``, tuned vs heuristic default: every task of the model (or, with ``--deepbench
  [CSV]`` on VTA, every DeepBench inference-server conv as its own one-layer graph; ``--limit
  N``: the first N) gets the XGBoost tuner for ``--trials`` trials. The tuners measure the
  default configuration first, so tuning never ends slower than the default; the table says
  for how many tasks the first measurement was the default. Printed per task: default and
  tuned cycles, speedup, trials, errors (and for a target with an energy model, MARSELLUS, the
  energy of both configs); then the geomean and the worst speedup and the model's cycles
  weighted by how often it uses each task.
- ``model``, whole-model tuning as a user runs it: ``tvmc tune``'s own code path
  (:func:`tvm_accel.cli.tuner.tune_from_args`) on a zoo model, records to a temporary file.
  Printed per task: wall time and its share, trials, errors, default and tuned cycles; then the
  number of tasks and trials, the total wall time (task extraction included) and the model's
  default vs tuned cycles, each task weighted by its number of uses.

    python benchmarks/tuning.py [--mode efficiency|tuned|model] [--target vta]
                                [--config vta_1x16x16] [--model resnet20] [--trials T]
                                [--parallel 2] [--seed 0]
        efficiency: [--tasks 10] [--seeds 3] [--tuners xgb,ga,random] [--transfer] [--goal 0.95]
        tuned:      [--deepbench [CSV]] [--limit N]

``--trials`` defaults to 48 (efficiency), 32 (tuned) and 64 (model). Figures are information
for issue notes, never assertions.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from tvm_accel import quantize

TRIALS = {"efficiency": 48, "tuned": 32, "model": 64}


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


def geomean(xs: list[float]) -> float:
    """Geometric mean of positive numbers (nan for none)."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def _energy(uj: float | None) -> str:
    return "-" if uj is None else f"{uj:.3f}"


def _head(task) -> str:
    """A task's first layer, with the count of the others."""
    more = len(task.layers) - 1
    return task.layers[0] + (f" +{more}" if more else "")


def model_tasks(args) -> list:
    """The tasks of ``--model`` (a zoo model, power-of-two scales for the DPU) for ``--target``
    and ``--config``."""
    from tvm_accel.frontend import load_onnx
    from tvm_accel.target import get_target
    from tvm_accel.tuning.extract import extract_tasks

    model = quantize.quantized(args.model, power_of_two=args.target == "dpu")
    mod, _ = load_onnx(model)
    return extract_tasks(mod, get_target(args.target), args.config)


def deepbench_tasks(args) -> list:
    """One VTA task per DeepBench conv (the first ``--limit``), each built as its own one-layer
    graph the way ``benchmarks/vta_deepbench.py`` builds it."""
    from tvm_accel.deepbench import load_rows, make_layer, typical_recipe
    from tvm_accel.target import get_target

    target = get_target(args.target)
    recipe = typical_recipe(target.requant_recipe)

    cfg = target.load_config(args.config)
    tasks = []
    for row in load_rows(args.deepbench, limit=args.limit):
        graph, _ = make_layer(row, int(row["id"]), recipe)
        found = target.tuning_tasks(graph, cfg)
        if not found:
            print(f"  conv{row['id']}: no tunable task, skipped", file=sys.stderr)
        tasks += found
    return tasks


# --- efficiency ----------------------------------------------------------------------------------
def efficiency(args) -> int:
    from tvm_accel.report import format_table
    from tvm_accel.tuning.measure import Measurer, measure_option

    t0 = time.perf_counter()
    tasks = [t for t in model_tasks(args) if t.space.size > 8][:args.tasks]
    kinds = args.tuners.split(",")
    option = measure_option(timeout=args.timeout, n_parallel=args.parallel)
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


# --- tuned vs default ----------------------------------------------------------------------------
@dataclass
class Tuned:
    """One task tuned by the XGBoost tuner: what its default and its best measured."""

    task: object
    trials: int
    errors: int
    default_first: bool              # the first measurement was the default configuration
    default_cycles: int | None       # None: the default failed or is infeasible
    best_cycles: int | None          # None: nothing measured succeeded
    default_energy: float | None
    best_energy: float | None
    seconds: float

    @property
    def speedup(self) -> float | None:
        if self.default_cycles and self.best_cycles:
            return self.default_cycles / self.best_cycles
        return None


def tune_one(task, trials: int, seed: int, measurer, option) -> Tuned:
    """Run the XGBoost tuner on ``task`` for ``trials`` trials (at most the space size)."""
    from tvm_accel.tuning.autotuner import make_tuner

    t0 = time.perf_counter()
    n_trial = min(trials, task.space.size)
    tuner = make_tuner("xgb", task, seed, n_trial)
    tuner.tune(n_trial=n_trial, measure_option=option, measurer=measurer)
    default = task.space.default()
    measured = list(tuner.history)
    first = measured[0][0].config == default if measured else False
    d = next((res for inp, res in measured if inp.config == default), None)
    d = d if d is not None and d.ok else None
    best = tuner.best_result
    return Tuned(task, tuner.trials, sum(not r.ok for _, r in measured), first,
                 d.cycles if d else None, best.cycles if best else None,
                 d.energy_uj if d else None, best.energy_uj if best else None,
                 time.perf_counter() - t0)


def tuned(args) -> int:
    from tvm_accel.report import format_table
    from tvm_accel.tuning.measure import Measurer, measure_option

    t0 = time.perf_counter()
    if args.deepbench:
        tasks = deepbench_tasks(args)
        source = f"DeepBench ({os.path.basename(args.deepbench)}, {len(tasks)} layers)"
    else:
        tasks = model_tasks(args)
        source = f"{args.model} ({len(tasks)} tasks)"
    t_extract = time.perf_counter() - t0
    option = measure_option(timeout=args.timeout, n_parallel=args.parallel)
    out: list[Tuned] = []
    with Measurer(option) as measurer:
        for i, task in enumerate(tasks, 1):
            r = tune_one(task, args.trials, args.seed, measurer, option)
            out.append(r)
            print(f"  [{i}/{len(tasks)}] {_head(task)}: {r.trials} trials, "
                  f"{'-' if r.speedup is None else f'{r.speedup:.2f}x'}, {r.seconds:.1f} s "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    energy = any(r.default_energy is not None or r.best_energy is not None for r in out)
    rows = []
    for r in out:
        row = [_head(r.task), r.task.weight, r.task.space.size, r.trials, r.errors,
               "yes" if r.default_first else "no",
               f"{r.default_cycles:,}" if r.default_cycles else "-",
               f"{r.best_cycles:,}" if r.best_cycles else "-",
               "-" if r.speedup is None else f"{r.speedup:.3f}x"]
        if energy:
            row += [_energy(r.default_energy), _energy(r.best_energy)]
        rows.append(row + [f"{r.seconds:.1f}"])
    cfg_name = tasks[0].config_name if tasks else args.config
    print(f"\n== {args.target} ({cfg_name}) on {source}: XGBoost tuner, {args.trials} trials "
          f"per task (at most the space size), seed {args.seed}, {args.parallel} workers")
    print(format_table(["task", "uses", "space", "trials", "errors", "default first",
                        "default cycles", "tuned cycles", "speedup",
                        *(["default uJ", "tuned uJ"] if energy else []), "wall s"], rows))
    sp = [(r.speedup, r) for r in out if r.speedup is not None]
    if sp:
        worst = min(sp, key=lambda p: p[0])
        best = max(sp, key=lambda p: p[0])
        print(f"geomean speedup {geomean([s for s, _ in sp]):.3f}x over {len(sp)} tasks; "
              f"worst {worst[0]:.3f}x ({_head(worst[1].task)}); "
              f"best {best[0]:.3f}x ({_head(best[1].task)}); "
              f"{sum(s > 1.0 for s, _ in sp)} tasks improved")
    print(f"default measured first: {sum(r.default_first for r in out)}/{len(out)} tasks; "
          f"no speedup (default failed or infeasible): {len(out) - len(sp)}")
    both = [r for r in out if r.speedup is not None]
    wd = sum(r.task.weight * r.default_cycles for r in both)
    wt = sum(r.task.weight * r.best_cycles for r in both)
    if wd:
        print(f"weighted cycles (each task x its uses): default {wd:,}, tuned {wt:,} "
              f"({wd / wt:.3f}x)")
    if energy:
        e = [r for r in both if r.default_energy is not None and r.best_energy is not None]
        ed = sum(r.task.weight * r.default_energy for r in e)
        et = sum(r.task.weight * r.best_energy for r in e)
        print(f"weighted energy: default {ed:.3f} uJ, tuned {et:.3f} uJ "
              f"(tuned / default {et / ed:.3f}; the tuner minimises time, not energy)")
    print(f"total wall {time.perf_counter() - t0:.0f} s (task extraction {t_extract:.0f} s, "
          f"measured trials {sum(r.trials for r in out)})")
    return 0


# --- whole-model tuning --------------------------------------------------------------------------
def model(args) -> int:
    import onnx

    from tvm_accel.cli import build_parser
    from tvm_accel.cli.tuner import tune_from_args
    from tvm_accel.report import format_table

    with tempfile.TemporaryDirectory(prefix="tune_bench_") as tmp:
        path = os.path.join(tmp, f"{args.model}.onnx")
        onnx.save(quantize.quantized(args.model, power_of_two=args.target == "dpu"), path)
        records = os.path.join(tmp, "records.json")
        argv = ["tune", path, "--target", f"{args.target}, llvm", "-o", records,
                "--tuner", "xgb", "--trials", str(args.trials), "--parallel",
                str(args.parallel), "--timeout", str(args.timeout), "--seed", str(args.seed)]
        if args.config:
            argv += [f"--target-{args.target}-config", args.config]
        print("tvmc " + " ".join(argv), flush=True)
        t0 = time.perf_counter()
        outcomes = tune_from_args(build_parser().parse_args(argv))
        total = time.perf_counter() - t0
        n_lines = sum(1 for _ in open(records)) if os.path.exists(records) else 0
        size = os.path.getsize(records) if os.path.exists(records) else 0
    tuning = sum(o.seconds for o in outcomes)
    rows = []
    for o in outcomes:
        d, b = o.default_cycles, o.best_cycles
        rows.append([o.task.name, _head(o.task), o.task.weight, o.task.space.size, o.trials,
                     o.errors, f"{d:,}" if d else "-", f"{b:,}" if b else "-",
                     f"{d / b:.2f}x" if d and b else "-", f"{o.seconds:.1f}",
                     f"{o.seconds / total:.1%}"])
    print(f"\n== tvmc tune {args.model} for {args.target} "
          f"({outcomes[0].task.config_name if outcomes else args.config}): xgb, "
          f"{args.trials} trials per task, {args.parallel} workers")
    print(format_table(["task", "layers", "uses", "space", "trials", "errors",
                        "default cycles", "tuned cycles", "speedup", "wall s", "share"], rows))
    both = [o for o in outcomes if o.default_cycles and o.best_cycles]
    wd = sum(o.task.weight * o.default_cycles for o in both)
    wt = sum(o.task.weight * o.best_cycles for o in both)
    print(f"{len(outcomes)} tasks ({sum(o.task.weight for o in outcomes)} layers), "
          f"{sum(o.trials for o in outcomes)} trials, {n_lines} records ({size / 1024:.0f} KiB)")
    slowest = max((o.seconds for o in outcomes), default=0.0)
    print(f"wall: total {total:.0f} s ({total / 60:.1f} min) = tasks {tuning:.0f} s + extraction "
          f"and start-up {total - tuning:.0f} s; slowest task {slowest:.0f} s")
    if wd:
        print(f"model cycles (tasks x uses): default {wd:,}, tuned {wt:,} ({wd / wt:.3f}x)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("efficiency", "tuned", "model"), default="efficiency")
    ap.add_argument("--target", default="vta")
    ap.add_argument("--config", default=None)
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--trials", type=int, default=None,
                    help="trials per task (default: efficiency 48, tuned 32, model 64)")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds per measurement (default 120)")
    ap.add_argument("--seed", type=int, default=0, help="tuner seed (tuned, model)")
    ap.add_argument("--tasks", type=int, default=10, help="efficiency: tasks to compare")
    ap.add_argument("--seeds", type=int, default=3, help="efficiency: seeds per tuner")
    ap.add_argument("--tuners", default="xgb,ga,random", help="efficiency: tuners to compare")
    ap.add_argument("--transfer", action="store_true",
                    help="efficiency: also XGBoost with transfer from the earlier tasks")
    ap.add_argument("--goal", type=float, default=0.95,
                    help="efficiency: fraction of the best speed a tuner must reach")
    ap.add_argument("--deepbench", nargs="?", metavar="CSV", default=None, const="",
                    help="tuned, VTA: the DeepBench convs instead of --model (default CSV: "
                    "benchmarks/data/deepbench_conv_inference_server.csv)")
    ap.add_argument("--limit", type=int, default=0, help="tuned --deepbench: the first N layers")
    args = ap.parse_args(argv)
    if args.trials is None:
        args.trials = TRIALS[args.mode]
    if args.trials < 1:
        ap.error(f"--trials must be >= 1, got {args.trials}")
    if args.deepbench is not None:
        if args.mode != "tuned" or args.target != "vta":
            ap.error("--deepbench is for --mode tuned --target vta")
        if not args.deepbench:
            from tvm_accel.deepbench import DEFAULT_CSV

            args.deepbench = str(DEFAULT_CSV)
    return {"efficiency": efficiency, "tuned": tuned, "model": model}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
