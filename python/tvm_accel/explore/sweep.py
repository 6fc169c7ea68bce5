"""``tvmc sweep``: models x a grid of hardware points of one target, one CSV row per point and
model, resumable, in parallel processes, with the Pareto front marked.

The spec (JSON, or YAML when PyYAML is installed)::

    {"target": "vta", "base": "vta_1x16x16",          # base: a bundled name or a config file
     "options": {"strategy": "cp"},                    # optional: fixed --target-<kind>-* options
     "precision": {"default": {"w": 8}},               # optional: a fixed precision config
     "axes": {"LOG_BATCH": [0, 1],                     # a config field
              "block": [{"LOG_BLOCK_IN": 3, "LOG_BLOCK_OUT": 3},   # several keys at once
                        {"LOG_BLOCK_IN": 4, "LOG_BLOCK_OUT": 4}],
              "vdd": [0.8, 0.6],                       # an option of the target
              "precision": [{"default": {"w": 8}}, {"default": {"w": 4}}]}}

An axis key (or a key of a dict value) is ``precision`` (a precision config,
:mod:`tvm_accel.precision`), one of the target's options (``--target-<kind>-<name>`` without the
prefix), or a field of the base config; anything else is refused before the sweep starts. The
grid is the product of the axes, the first axis varying slowest.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tvm_accel.errors import AccelError
from tvm_accel.explore.measure import COLUMNS, INVALID, OK, measure, model_for, model_name

_SPEC_KEYS = ("target", "base", "options", "precision", "axes")


@dataclass
class Point:
    """One hardware point of the grid: the axes' values and what they set."""

    index: int
    labels: dict[str, str]
    fields: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    precision: Any = None


@dataclass
class SweepSpec:
    """A parsed sweep file: the target, its base config and the grid's points."""

    target: Any
    base: Any
    axes: list[str]
    points: list[Point]


def _read_spec_file(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        raise AccelError(f"{path}: not a text file; give a JSON or YAML sweep spec") from None
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise AccelError(f"{path}: reading YAML needs PyYAML (pip install pyyaml); or "
                             "write the spec as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise AccelError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise AccelError(f"{path}: not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(data, dict):
        raise AccelError(f"{path}: expected an object with {', '.join(_SPEC_KEYS)}")
    return data


def _label(value: Any, prefix: str = "") -> str:
    """An axis value as the CSV and the table show it: ``vdd=0.5 abb=true``, nested keys
    joined by dots (``default.w=4``)."""
    if isinstance(value, dict):
        return " ".join(_label(v, f"{prefix}{k}.") if isinstance(v, dict)
                        else f"{prefix}{k}={_label(v)}" for k, v in value.items())
    return value if isinstance(value, str) else json.dumps(value)


def load_spec(path: str) -> SweepSpec:
    """Parse and check a sweep file (see the module docstring); every mistake is one
    :class:`AccelError` naming the file and the key."""
    from tvm_accel.target import get_target

    data = _read_spec_file(path)
    unknown = sorted(set(data) - set(_SPEC_KEYS))
    if unknown:
        raise AccelError(f"{path}: unknown key '{unknown[0]}' (known: {', '.join(_SPEC_KEYS)})")
    if not isinstance(data.get("target"), str):
        raise AccelError(f"{path}: give \"target\": one of the accelerator kinds")
    target = get_target(data["target"])
    base = target.load_config(data.get("base"))
    fields = set(base.to_json())
    options = {o.name for o in target.options()} - {"config"}
    axes = data.get("axes")
    if not isinstance(axes, dict) or not axes or not all(
            isinstance(v, list) and v for v in axes.values()):
        raise AccelError(f"{path}: give \"axes\": an object of non-empty lists, e.g. "
                         "{\"LOG_BATCH\": [0, 1]}")
    clash = [a for a in axes if a in ("point", "model", *COLUMNS)]
    if clash:
        raise AccelError(f"{path}: axis '{clash[0]}' has the name of a CSV column; rename it")
    fixed_options = data.get("options") or {}
    if not isinstance(fixed_options, dict):
        raise AccelError(f"{path}: \"options\" must be an object of option -> value")

    def assign(point: Point, key: str, value: Any, where: str) -> None:
        if key == "precision":
            point.precision = value
        elif key in options:
            point.options[key] = value
        elif key in fields:
            point.fields[key] = value
        else:
            raise AccelError(f"{path}: {where} '{key}' is neither a field of {base.name} "
                             f"({len(fields)} fields, e.g. {', '.join(sorted(fields)[:3])}), nor "
                             f"an option of {target.name} ({', '.join(sorted(options)) or 'none'}"
                             "), nor 'precision'")

    for k in fixed_options:
        if k not in options:
            raise AccelError(f"{path}: options: '{k}' is not an option of {target.name} "
                             f"({', '.join(sorted(options)) or 'none'})")
    points = []
    for i, combo in enumerate(itertools.product(*axes.values())):
        p = Point(i, {a: _label(v) for a, v in zip(axes, combo, strict=True)},
                  options=dict(fixed_options), precision=data.get("precision"))
        for axis, value in zip(axes, combo, strict=True):
            if isinstance(value, dict) and axis != "precision":
                for k, v in value.items():
                    assign(p, k, v, f"axis {axis}: key")
            else:
                assign(p, axis, value, "axis")
        points.append(p)
    return SweepSpec(target, base, list(axes), points)


@dataclass
class SweepResult:
    """The CSV's rows in grid order, which rows are on their model's Pareto front and the
    objective the front trades latency against."""

    rows: list[dict[str, str]]
    axes: list[str]
    pareto: set[tuple[str, str]]
    objective: dict[str, str]
    measured: int = 0
    skipped: int = 0

    def format(self) -> str:
        """The summary table (one row per point and model) and a line per model naming its
        Pareto points."""
        from tvm_accel.report import format_table

        energy = any(r["energy_uj"] for r in self.rows)
        header = ["point", *self.axes, "model", "status", "latency (us)",
                  *(["energy (uJ)"] if energy else []), "on-chip (KiB)", "moved (KiB)",
                  "offloaded", "bit-exact", "pareto", "note"]
        table = []
        for r in self.rows:
            ok = r["status"] == OK
            table.append((r["point"], *(r[a] for a in self.axes), r["model"], r["status"],
                          _num(r["latency_us"], "{:,.1f}"),
                          *([_num(r["energy_uj"], "{:,.2f}")] if energy else []),
                          _num(r["on_chip_bytes"], "{:,.0f}", 1024),
                          _num(r["bytes_moved"], "{:,.0f}", 1024),
                          f"{r['layers_offloaded']}/{r['layers']}" if ok else "",
                          {"true": "yes", "false": "NO"}.get(r["bit_exact"], ""),
                          "*" if _key(r) in self.pareto else "",
                          _short(r["reason"] if not ok else r["top_fallback"])))
        align = "r" + "l" * (len(self.axes) + 2) + "r" * (4 + energy) + "lll"
        lines = [format_table(header, table, align)]
        for m, obj in self.objective.items():
            front = [r["point"] for r in self.rows if r["model"] == m and _key(r) in self.pareto]
            lines.append(f"{m}: Pareto front of latency vs {obj}: point(s) "
                         f"{', '.join(front) or 'none'}")
        lines.append(f"{self.measured} point(s) measured, {self.skipped} already in the CSV")
        return "\n".join(lines)


def _num(text: str, fmt: str, div: float = 1) -> str:
    return fmt.format(float(text) / div) if text else ""


def _short(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _key(row: dict[str, str]) -> tuple[str, str]:
    return row["point"], row["model"]


def csv_header(axes: Sequence[str]) -> list[str]:
    """The sweep CSV's columns: the point's index and axes, the model, the measurements."""
    return ["point", *axes, "model", *COLUMNS]


def _read_done(path: str, header: list[str]) -> list[dict[str, str]]:
    """The rows of an earlier run of the same sweep in ``path`` that need no rerun (measured,
    or rejected by the hardware rules); a failed point is measured again."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != header:
            raise AccelError(f"-o {path}: holds another sweep's results (its columns differ); "
                             "give another file or delete it")
        return [r for r in reader if r["status"] in (OK, INVALID)]


def _measure_task(task: tuple) -> dict[str, str]:
    """One grid point on one model (run in a worker process with ``--jobs``)."""
    import onnx

    from tvm_accel.target import get_target

    kind, model_path, config_path, options, precision, seed = task
    m = measure(onnx.load(model_path), get_target(kind), config_path, options, precision, seed)
    m.reason = m.reason.replace(f"{config_path}: ", "")  # a temporary file: the axes say it
    return m.row()


def run_sweep(spec: SweepSpec, models: Sequence[str], out_csv: str, jobs: int = 1,
              calibration: Any = None, seed: int = 0,
              progress: Callable[[dict[str, str]], None] | None = None) -> SweepResult:
    """Measure every point of ``spec`` on every model (ONNX paths; a float model is quantized
    once for the target, :func:`~tvm_accel.explore.measure.model_for`) into ``out_csv``:
    rows already there (same sweep) are kept and skipped, new rows are appended as they are
    measured (``progress`` is called with each), and the file is rewritten in grid order at
    the end. ``jobs`` > 1 measures in that many processes; results keep the grid order."""
    names = [model_name(m) for m in models]
    if len(set(names)) != len(names):
        raise AccelError("sweep: two models share a file name; rename one")
    header = csv_header(spec.axes)
    labels = {str(p.index): p.labels for p in spec.points}
    earlier = _read_done(out_csv, header)
    others = [r for r in earlier if r["model"] not in names]  # kept, after this sweep's rows
    kept = [r for r in earlier  # a row of an edited axis is measured again
            if r["model"] in names and labels.get(r["point"]) == {a: r[a] for a in spec.axes}]
    done = {_key(r) for r in kept}
    with tempfile.TemporaryDirectory(prefix="tvmc_sweep_") as work:
        todo, rows_of = _tasks(spec, models, names, done, work, calibration, seed)
        new = []
        fresh = not os.path.exists(out_csv) or os.path.getsize(out_csv) == 0
        with open(out_csv, "w" if fresh else "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=header)
            if fresh:
                w.writeheader()
            for ident, row in zip(rows_of, _map(_measure_task, todo, jobs), strict=True):
                full = {**ident, **row}
                w.writerow(full)
                f.flush()
                new.append(full)
                if progress is not None:
                    progress(full)
    order = {(str(p.index), n): i for i, (p, n) in
             enumerate(itertools.product(spec.points, names))}
    rows = sorted(kept + new, key=lambda r: order[_key(r)])
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(rows + others)
    pareto, objective = pareto_front(rows)
    return SweepResult(rows, spec.axes, pareto, objective, len(new), len(kept))


def _tasks(spec: SweepSpec, models: Sequence[str], names: list[str], done: set, work: str,
           calibration: Any, seed: int) -> tuple[list[tuple], list[dict[str, str]]]:
    """The measurements still to do, in grid order, and the identifying columns of their rows;
    each model is quantized once for the target and each point's config written, under
    ``work``."""
    import onnx

    todo, rows_of = [], []
    paths: dict[str, str] = {}
    for p in spec.points:
        for path, name in zip(models, names, strict=True):
            if (str(p.index), name) in done:
                continue
            if name not in paths:
                paths[name] = os.path.join(work, f"{name}.onnx")
                onnx.save(model_for(path, spec.target, calibration), paths[name])
            cfg = os.path.join(work, f"p{p.index}.json")
            with open(cfg, "w") as f:
                json.dump({**spec.base.to_json(), **p.fields}, f)
            todo.append((spec.target.name, paths[name], cfg, p.options, p.precision, seed))
            rows_of.append({"point": str(p.index), **p.labels, "model": name})
    return todo, rows_of


def _map(fn, tasks: list, jobs: int):
    """``map(fn, tasks)`` in order, in ``jobs`` fresh processes when ``jobs`` > 1."""
    if jobs <= 1 or len(tasks) <= 1:
        yield from map(fn, tasks)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from pool.map(fn, tasks)


def pareto_front(rows: list[dict[str, str]]) -> tuple[set[tuple[str, str]], dict[str, str]]:
    """The measured rows no other row of the same model beats in both latency and the second
    objective (energy when every measured point has one, else on-chip bytes), and that
    objective per model."""
    front: set[tuple[str, str]] = set()
    objective: dict[str, str] = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        ok = [r for r in rows if r["model"] == model and r["status"] == OK]
        if not ok:
            continue
        col = "energy_uj" if all(r["energy_uj"] for r in ok) else "on_chip_bytes"
        objective[model] = "energy" if col == "energy_uj" else "on-chip bytes"
        pts = [(float(r["latency_us"]), float(r[col] or "inf"), r) for r in ok]
        for lat, cost, r in pts:
            if not any(lo <= lat and co <= cost and (lo, co) != (lat, cost)
                       for lo, co, _ in pts):
                front.add(_key(r))
    return front, objective
