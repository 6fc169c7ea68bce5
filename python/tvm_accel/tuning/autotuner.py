"""``tvmc tune``: extract a model's tasks for one target, tune each on the simulator, append
every measurement to a records file (AutoTVM's 0.2 JSON lines).

As upstream tvmc: ``tvmc tune model.onnx --target "vta, llvm" -o records.json [--tuner
xgb|ga|random|gridsearch] [--trials N] [--early-stopping N] [--parallel N] [--timeout S]
[--tuning-records previous.json]`` plus the target's ``--target-<kind>-*`` options.

Resuming: points already in ``-o`` (an interrupted job) or in ``--tuning-records`` for the same
workload and hardware config are not measured again; they seed the tuner. Transfer learning:
the XGBoost tuner of each task also learns from the measurements of the tasks tuned before it
in the same job (their features include the loop structure, so a model carries over).

The final table has one row per task: trials, default and tuned cycles, speedup, and for a
target that reports energy (MARSELLUS) the energy in uJ of the default and the tuned config.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from tvm_accel.errors import AccelError
from tvm_accel.tuning.task import Task

__all__ = ["TUNERS", "TaskOutcome", "add_tune_parser", "cmd_tune", "make_tuner", "tune_model"]

TUNERS = ("xgb", "ga", "random", "gridsearch")


def make_tuner(kind: str, task: Task, seed: int = 0, n_trial: int | None = None):
    """A tuner by its tvmc name. The XGBoost tuner retrains every ``plan_size`` measurements:
    AutoTVM's 64 for long jobs, a quarter of ``n_trial`` (at least 8) for short ones, so a
    64-trial task gets a model after 16 points instead of staying random."""
    from tvm_accel.tuning.tuners import GATuner, GridSearchTuner, RandomTuner
    from tvm_accel.tuning.xgb import XGBTuner

    classes = {"xgb": XGBTuner, "ga": GATuner, "random": RandomTuner,
               "gridsearch": GridSearchTuner}
    if kind not in classes:
        raise AccelError(f"--tuner: unknown tuner {kind!r} (choose from {', '.join(TUNERS)})")
    if kind == "gridsearch":
        return classes[kind](task)
    if kind == "xgb" and n_trial is not None:
        return classes[kind](task, seed=seed, plan_size=max(8, min(64, n_trial // 4)))
    return classes[kind](task, seed=seed)


class Progress:
    """Per-task progress line on stderr: trials done, best cycles so far, errors, time. Also
    keeps the default's and the best's energy (uJ) for targets that report it."""

    def __init__(self, index: int, total: int, task: Task, n_trial: int, stream=None):
        self.index, self.total, self.task, self.n_trial = index, total, task, n_trial
        self.stream = stream or sys.stderr
        self.done = self.errors = 0
        self.best: int | None = None
        self.default: int | None = None
        self.best_energy: float | None = None
        self.default_energy: float | None = None
        self.t0 = time.perf_counter()
        self.default_config = task.space.default()

    def see(self, inputs, results) -> None:
        for inp, res in zip(inputs, results, strict=True):
            self.done += 1
            if not res.ok:
                self.errors += 1
                continue
            if self.best is None or res.cycles < self.best:
                self.best, self.best_energy = res.cycles, res.energy_uj
            if self.default is None and inp.config == self.default_config:
                self.default, self.default_energy = res.cycles, res.energy_uj

    def __call__(self, tuner, inputs, results) -> None:
        self.see(inputs, results)
        self.line()

    def line(self, end: str = "") -> None:
        """Redraw the line in place on a terminal; elsewhere (logs, CI) print it once, at the
        end of the task."""
        tty = getattr(self.stream, "isatty", lambda: False)()
        if not end and not tty:
            return
        best = f"{self.best:,}" if self.best is not None else "-"
        head = self.task.layers[0] + (f" +{len(self.task.layers) - 1}"
                                      if len(self.task.layers) > 1 else "")
        print(f"{chr(13) if tty else ''}[{self.index:>3}/{self.total}] {self.task.name} {head}: "
              f"{self.done}/{self.n_trial} trials, best {best} cycles, {self.errors} errors, "
              f"{time.perf_counter() - self.t0:.1f} s", end=end, file=self.stream, flush=True)


def add_tune_parser(sub, add_target_options) -> None:
    t = sub.add_parser("tune", help="tune the offloaded layers' knobs on the simulator")
    t.add_argument("model", help="ONNX model (float or QDQ-quantized)")
    t.add_argument("--target", required=True, help='targets, host last, e.g. "vta, llvm"')
    add_target_options(t)
    from tvm_accel.cli import add_input_shapes_option

    add_input_shapes_option(t)
    t.add_argument("-o", "--output", required=True,
                   help="tuning records (JSON lines, appended; an existing file resumes)")
    t.add_argument("--tuner", default="xgb", help=f"search ({', '.join(TUNERS)}; default xgb)")
    t.add_argument("--trials", type=int, default=64, help="trials per task (default 64)")
    t.add_argument("--early-stopping", type=int, metavar="N",
                   help="stop a task after N trials without improvement")
    t.add_argument("--parallel", type=int, metavar="N",
                   help="measurement worker processes (default: all cores)")
    t.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="seconds per measurement before it counts as an error (default 30)")
    t.add_argument("--tuning-records", metavar="FILE",
                   help="earlier records: their points are not measured again")
    t.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    t.add_argument("--precision-config", metavar="FILE", help="as for tvmc compile")
    t.set_defaults(func=cmd_tune)


def _check_flags(args) -> None:
    if args.trials < 1:
        raise AccelError(f"--trials must be >= 1, got {args.trials}")
    if args.early_stopping is not None and args.early_stopping < 1:
        raise AccelError(f"--early-stopping must be >= 1, got {args.early_stopping}")
    if args.parallel is not None and args.parallel < 1:
        raise AccelError(f"--parallel must be >= 1, got {args.parallel}")
    if not args.timeout > 0:
        raise AccelError(f"--timeout must be > 0, got {args.timeout}")
    if args.tuner not in TUNERS:
        raise AccelError(f"--tuner: unknown tuner {args.tuner!r} (choose from "
                         f"{', '.join(TUNERS)})")


@dataclass
class TaskOutcome:
    """What tuning one task gave (a row of ``tvmc tune``'s table): trials and errors counted
    (resumed points included), the default's and the best's cycles and energy (uJ, None for a
    target without an energy model or when not measured) and the wall time the task took."""

    task: Task
    trials: int
    errors: int
    default_cycles: int | None
    best_cycles: int | None
    default_energy_uj: float | None
    best_energy_uj: float | None
    seconds: float


def tune_model(args: argparse.Namespace) -> list[TaskOutcome]:
    """The work of ``tvmc tune`` for parsed arguments: extract the tasks, tune each, append
    the records; prints the header and the progress lines, returns one outcome per task
    (empty when the model has no tunable layer)."""
    from tvm_accel.cli import _target_knobs, parse_input_shapes, parse_target
    from tvm_accel.frontend import load_onnx
    from tvm_accel.target import get_target
    from tvm_accel.tuning.extract import extract_tasks
    from tvm_accel.tuning.measure import Measurer, measure_option
    from tvm_accel.tuning.records import load_records, log_to_file, measured_pairs

    _check_flags(args)
    accel, host = parse_target(args.target)
    if accel is None:
        raise AccelError('--target: tune needs an accelerator before the host, e.g. '
                         '"vta, llvm"')
    precision = None
    if args.precision_config:
        from tvm_accel.precision import load_precision

        precision = load_precision(args.precision_config)
    target = get_target(accel)
    cfg = target.load_config(getattr(args, f"target_{accel}_config", None))
    known = load_records(args.tuning_records) if args.tuning_records else []
    if os.path.exists(args.output):
        known += load_records(args.output)
    mod, _ = load_onnx(args.model, shapes=parse_input_shapes(args.input_shapes))
    tasks = extract_tasks(mod, target, cfg, _target_knobs(accel, args), host, precision)
    if not tasks:
        print(f"no tunable layers for {accel} in {args.model}")
        return []
    print(f"tuning {len(tasks)} task(s) for {accel} ({cfg.name}) with {args.tuner}, "
          f"{args.trials} trials each -> {args.output}")
    outcomes, earlier = [], []
    option = measure_option(timeout=args.timeout, n_parallel=args.parallel)
    with Measurer(option) as measurer:
        for i, task in enumerate(tasks, 1):
            n_trial = min(args.trials, task.space.size)
            progress = Progress(i, len(tasks), task, n_trial)
            tuner = make_tuner(args.tuner, task, args.seed, n_trial)
            resumed = measured_pairs(known, task)
            progress.see([p[0] for p in resumed], [p[1] for p in resumed])
            tuner.load_history(earlier + resumed)
            if progress.done < n_trial:
                tuner.tune(n_trial=n_trial - progress.done,
                           early_stopping=args.early_stopping, measure_option=option,
                           callbacks=(log_to_file(args.output), progress), measurer=measurer)
            progress.line(end="\n")
            earlier += tuner.history  # this task's points, the resumed ones included
            outcomes.append(TaskOutcome(task, progress.done, progress.errors, progress.default,
                                        progress.best, progress.default_energy,
                                        progress.best_energy,
                                        time.perf_counter() - progress.t0))
    return outcomes


def cmd_tune(args: argparse.Namespace) -> int:
    """``tvmc tune``: :func:`tune_model`, then its table (energy columns only when a task
    reported energy)."""
    from tvm_accel.report import format_table

    outcomes = tune_model(args)
    if not outcomes:
        return 0
    energy = any(o.default_energy_uj is not None or o.best_energy_uj is not None
                 for o in outcomes)
    rows = []
    for o in outcomes:
        row = [o.task.name, ", ".join(o.task.layers), o.trials]
        if o.best_cycles is None:
            row += ["-", "-", "-"] + (["-", "-"] if energy else []) + [
                f"no valid configuration ({o.errors} errors)"]
        else:
            d = o.default_cycles
            row += [f"{d:,}" if d else "-", f"{o.best_cycles:,}",
                    f"{d / o.best_cycles:.2f}x" if d else "-"]
            row += [_energy(o.default_energy_uj), _energy(o.best_energy_uj)] if energy else []
            row.append("")
        rows.append(row)
    heads = ["task", "layers", "trials", "default cycles", "tuned cycles", "speedup",
             *(["default uJ", "tuned uJ"] if energy else []), "note"]
    print(format_table(heads, rows))
    return 0


def _energy(uj: float | None) -> str:
    return "-" if uj is None else f"{uj:.3f}"
