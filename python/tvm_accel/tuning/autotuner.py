"""The job behind ``tvmc tune`` (:mod:`tvm_accel.cli.tuner`): extract a model's tasks for one
target, tune each on the simulator, append every measurement to a records file (AutoTVM's 0.2
JSON lines).

Resuming: points already in ``-o`` (an interrupted job) or in ``--tuning-records`` for the same
workload and hardware config are not measured again; they seed the tuner. Transfer learning:
the XGBoost tuner of each task also learns from the measurements of the tasks tuned before it
in the same job (their features include the loop structure, so a model carries over).

Each task's outcome holds its trials, default and tuned cycles, and for a target that reports
energy (MARSELLUS) the energy in uJ of the default and the tuned config.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from tvm_accel.errors import AccelError
from tvm_accel.tuning.task import MeasureInput, MeasureResult, Task

__all__ = ["TUNERS", "TaskOutcome", "TuneOptions", "make_tuner", "tune_model"]

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


def _check_flags(args: TuneOptions) -> None:
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


@dataclass
class TuneOptions:
    """How ``tvmc tune`` searches: tuner kind, trials per task, early stopping, measurement
    workers and timeout, seed."""

    tuner: str = "xgb"
    trials: int = 64
    early_stopping: int | None = None
    parallel: int | None = None
    timeout: float = 30.0
    seed: int = 0
    #: a :class:`tvm_accel.farm.Farm` to measure on instead of local worker processes
    farm: Any = None


def tune_model(mod, target, cfg, knobs: dict | None, host: str, output: str,
               options: TuneOptions, records: str | None = None, precision=None,
               model_name: str = "the model") -> list[TaskOutcome]:
    """The work of ``tvmc tune``: extract the tasks of ``mod`` (a Relax module from
    :func:`~tvm_accel.frontend.load_onnx`) for ``target`` under ``cfg`` and ``knobs``, tune
    each, append every measurement to ``output`` (resuming from it and from ``records``);
    prints the header and the progress lines, returns one outcome per task (empty when the
    model has no tunable layer)."""
    from tvm_accel.tuning.extract import extract_tasks
    from tvm_accel.tuning.measure import Measurer, measure_option
    from tvm_accel.tuning.records import load_records, log_to_file, measured_pairs

    _check_flags(options)
    known = load_records(records) if records else []
    if os.path.exists(output):
        known += load_records(output)
    tasks = extract_tasks(mod, target, cfg, knobs, host, precision)
    if not tasks:
        print(f"no tunable layers for {target.name} in {model_name}")
        return []
    where = "" if options.farm is None else \
        f" on {options.parallel or options.farm.servers} farm server(s)"
    print(f"tuning {len(tasks)} task(s) for {target.name} ({cfg.name}) with {options.tuner}, "
          f"{options.trials} trials each{where} -> {output}")
    outcomes: list[TaskOutcome] = []
    earlier: list[tuple[MeasureInput, MeasureResult]] = []
    option = measure_option(timeout=options.timeout, n_parallel=options.parallel)
    if options.farm is not None:
        from tvm_accel.farm import RPCMeasurer

        measurer_cm: Any = RPCMeasurer(options.farm, options.timeout, options.parallel)
    else:
        measurer_cm = Measurer(option)
    with measurer_cm as measurer:
        for i, task in enumerate(tasks, 1):
            n_trial = min(options.trials, task.space.size)
            progress = Progress(i, len(tasks), task, n_trial)
            tuner = make_tuner(options.tuner, task, options.seed, n_trial)
            resumed = measured_pairs(known, task)
            progress.see([p[0] for p in resumed], [p[1] for p in resumed])
            tuner.load_history(earlier + resumed)
            if progress.done < n_trial:
                tuner.tune(n_trial=n_trial - progress.done,
                           early_stopping=options.early_stopping, measure_option=option,
                           callbacks=(log_to_file(output), progress), measurer=measurer)
            progress.line(end="\n")
            earlier += tuner.history  # this task's points, the resumed ones included
            outcomes.append(TaskOutcome(task, progress.done, progress.errors, progress.default,
                                        progress.best, progress.default_energy,
                                        progress.best_energy,
                                        time.perf_counter() - progress.t0))
    return outcomes
