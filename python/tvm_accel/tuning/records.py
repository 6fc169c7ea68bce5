"""Tuning records: AutoTVM's 0.2 JSON-lines log, one line per measurement.

Each line is one JSON object, in AutoTVM's key order::

    {"input": [target, task_name, args, {"compiler": "<tvm-accel version>"}],
     "config": {"index": i, "code_hash": null, "entity": [[knob, "ot", value], ...]},
     "result": [[costs...], error_no, all_cost, timestamp],
     "version": 0.2, "tvm_version": "<tvm.__version__>",
     "measure": {"cycles": n, "energy_uj": x | null[, "message": "..."]}}

* ``target`` names the accelerator and its hardware config, e.g.
  ``"vta -model=vta_1x16x16 -fingerprint=<32 hex digits>"``; records apply only to the config
  with that fingerprint (the ``-model`` name is informational).
* ``args`` is the task's workload as JSON (tuples become lists), ``kwargs`` holds the version of
  the compiler that wrote the record.
* ``entity`` lists every knob of the task's space (a partial config is completed with the
  defaults first), each of kind ``"ot"`` (AutoTVM's "other" knob); a value is the option as JSON,
  and reading it with the task's :class:`~tvm_accel.knobs.KnobSpace` gives back the option itself
  (tuples, bools, floats exactly).
* ``costs`` are seconds of simulated time; a failed measurement records ``[1e9]`` as AutoTVM
  does (so does a non-finite cost). ``error_no`` is :class:`~tvm_accel.tuning.task.MeasureError`.
  A result without a timestamp gets the time it was written.
* ``measure`` is our addition (AutoTVM's reader ignores unknown keys): the counted cycles, the
  energy and, for a failure, the first line of its message, so resumed results keep them.
  It is optional when reading.

Appending opens, writes one or more whole lines, flushes and closes, so an interrupted job loses
at most the line being written. When reading, an unterminated last line that does not parse
(a job killed mid-write) is skipped with a warning, and the next append removes it first; any
other line that is not a record is an :class:`AccelError` naming the file and line.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tvm_accel.errors import AccelError
from tvm_accel.knobs import Knob, KnobSpace
from tvm_accel.tuning.task import MeasureError, MeasureInput, MeasureResult, Task

__all__ = ["LOG_VERSION", "AppliedRecord", "ApplyHistoryBest", "Ignored", "RecordEntry",
           "RecordError", "RecordWarning", "WorkloadKey", "append_record", "compiler_version",
           "current", "decode", "encode", "load_records", "log_to_file", "measured_pairs",
           "pick_best", "pick_best_file", "target_string"]

LOG_VERSION = 0.2
FAILED_COST = 1e9            # AutoTVM's cost of a failed measurement
DISTRIBUTION = "tvm-accel"   # pyproject.toml [project] name
_MESSAGE_LIMIT = 300


class RecordError(AccelError):
    """A tuning records file is unreadable, not JSON lines, or holds an invalid record."""


class RecordWarning(UserWarning):
    """A record was skipped (truncated last line) or not applied (another config or compiler)."""


@functools.cache
def compiler_version() -> str:
    """Version of the installed ``tvm-accel`` distribution (``"0+unknown"`` when not installed)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


@functools.cache
def _tvm_version() -> str:
    import tvm

    return str(tvm.__version__)


def _fail(where: str, msg: str) -> RecordError:
    return RecordError(f"{where}: {msg}" if where else msg)


# --- JSON values -----------------------------------------------------------------------------
def _jsonable(value: Any, what: str) -> Any:
    """``value`` as plain JSON data: tuples become lists, numpy scalars Python numbers."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RecordError(f"{what}: {value!r} cannot be written to a JSON record")
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, what) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, what) for k, v in value.items()}
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return _jsonable(item(), what)
    raise RecordError(f"{what}: {type(value).__name__} value {value!r} cannot be written to a "
                      "JSON record")


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _workload_args(task: Task) -> list:
    return json.loads(json.dumps(list(task.workload), default=str))


def _loose_equal(a: Any, b: Any) -> bool:
    """JSON equality where 2 == 2.0 but a bool only equals a bool."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_loose_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_loose_equal(a[k], b[k]) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


_MISSING = object()


class _Options:
    """Maps recorded JSON values back to a space's options (exact JSON match first)."""

    def __init__(self, space: KnobSpace):
        self.space = space
        self._exact: dict[str, dict[str, Any]] = {}
        self._json: dict[str, list[tuple[Any, Any]]] = {}
        for k in space.knobs:
            pairs = [(_jsonable(o, f"knob {k.name}"), o) for o in k.options]
            self._json[k.name] = pairs
            self._exact[k.name] = {}
            for j, o in pairs:
                self._exact[k.name].setdefault(_canon(j), o)

    def option(self, knob: Knob, value: Any) -> Any:
        found = self._exact[knob.name].get(_canon(value), _MISSING)
        if found is not _MISSING:
            return found
        for j, o in self._json[knob.name]:
            if _loose_equal(j, value):
                return o
        raise KeyError(knob.name)

    def config(self, entry: RecordEntry, task_name: str) -> dict:
        space = self.space
        out = {}
        for name, value in entry.config.items():
            if name not in space:
                raise _fail(entry.where, f"knob {name!r} is not in the space of task "
                            f"{task_name} (knobs: {', '.join(space.names)}); the record was "
                            "written for another version of the strategy: re-tune or drop it")
            try:
                out[name] = self.option(space[name], value)
            except KeyError:
                raise _fail(entry.where, f"knob {name}: recorded value {value!r} is not one of "
                            f"the options of task {task_name}; re-tune or drop the record"
                            ) from None
        missing = [n for n in space.names if n not in out]
        if missing:
            raise _fail(entry.where, f"the record has no value for knob {missing[0]!r} of task "
                        f"{task_name}; re-tune or drop the record")
        return {n: out[n] for n in space.names}


# --- target strings --------------------------------------------------------------------------
def target_string(task: Task) -> str:
    """``"<accel> -model=<config name> -fingerprint=<hex>"`` of a task (empty parts omitted)."""
    parts = [task.target]
    if task.config_name:
        parts.append(f"-model={'_'.join(str(task.config_name).split())}")
    if task.config_fingerprint:
        parts.append(f"-fingerprint={task.config_fingerprint}")
    return " ".join(parts)


@functools.lru_cache(maxsize=256)
def _parse_target(target: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Accelerator name and ``-key=value`` options of a target string."""
    tokens = target.split()
    opts = []
    for t in tokens[1:]:
        if t.startswith("-") and "=" in t:
            k, v = t.lstrip("-").split("=", 1)
            opts.append((k, v))
    return (tokens[0] if tokens else ""), tuple(opts)


def _target_option(target: str, name: str) -> str:
    return dict(_parse_target(target)[1]).get(name, "")


class WorkloadKey(NamedTuple):
    """What :func:`pick_best` keeps one record per (``args`` is canonical JSON text)."""

    accel: str
    model: str
    fingerprint: str
    task_name: str
    args: str


# --- records ---------------------------------------------------------------------------------
@dataclass
class RecordEntry:
    """One decoded record line. ``config`` maps knob names to recorded values (as JSON gives
    them unless decoded with the task's space); ``where`` is ``"file:line"`` when loaded from a
    file. ``cycles``, ``energy_uj`` and ``message`` come from the optional ``measure`` key."""

    target: str
    task_name: str
    args: list
    kwargs: dict
    index: int
    config: dict
    costs: tuple[float, ...]
    error: MeasureError
    all_cost: float
    timestamp: float
    version: float = LOG_VERSION
    tvm_version: str = ""
    cycles: int = 0
    energy_uj: float | None = None
    message: str = ""
    where: str = field(default="", compare=False)

    @property
    def accel(self) -> str:
        """Accelerator name (first word of the target string)."""
        return _parse_target(self.target)[0]

    @property
    def model(self) -> str:
        """Hardware config name (``-model=``)."""
        return _target_option(self.target, "model")

    @property
    def fingerprint(self) -> str:
        """Hex fingerprint of the hardware config (``-fingerprint=``)."""
        return _target_option(self.target, "fingerprint")

    @property
    def compiler(self) -> str:
        """Version of the compiler that wrote the record ("" when not recorded)."""
        return str(self.kwargs.get("compiler", ""))

    @property
    def ok(self) -> bool:
        return self.error == MeasureError.NO_ERROR

    @property
    def mean_cost(self) -> float:
        """Mean of the costs in seconds (infinite for a failure or no costs)."""
        if not self.ok or not self.costs:
            return math.inf
        return sum(self.costs) / len(self.costs)

    @functools.cached_property
    def args_key(self) -> str:
        """The args as canonical JSON text (workload comparison)."""
        return _canon(self.args)

    @property
    def workload_key(self) -> WorkloadKey:
        return WorkloadKey(self.accel, self.model, self.fingerprint, self.task_name,
                           self.args_key)

    def config_for(self, space: KnobSpace, task_name: str | None = None) -> dict:
        """The recorded config as options of ``space`` (every knob, in the space's order);
        :class:`RecordError` naming the file:line and the knob for an unknown knob, a value
        that is not an option, or a missing knob."""
        return _Options(space).config(self, task_name or self.task_name)

    def to_json(self) -> dict:
        """The record as the JSON object written on its line."""
        costs = [float(c) if math.isfinite(c) else FAILED_COST for c in self.costs]
        measure: dict[str, Any] = {"cycles": int(self.cycles), "energy_uj": self.energy_uj}
        if self.message:
            measure["message"] = self.message
        return {
            "input": [self.target, self.task_name, self.args, self.kwargs],
            "config": {"index": int(self.index), "code_hash": None,
                       "entity": [[k, "ot", _jsonable(v, f"knob {k}")]
                                  for k, v in self.config.items()]},
            "result": [costs, int(self.error), _finite(self.all_cost),
                       _finite(self.timestamp)],
            "version": self.version,
            "tvm_version": self.tvm_version,
            "measure": measure,
        }

    def to_line(self) -> str:
        """The record's JSON line (without the newline)."""
        return json.dumps(self.to_json(), allow_nan=False)


def _finite(x: float) -> float:
    x = float(x)
    return x if math.isfinite(x) else 0.0


def _entry(inp: MeasureInput, res: MeasureResult) -> RecordEntry:
    task = inp.task
    try:
        config = task.space.complete(inp.config)
    except ValueError as e:
        raise RecordError(f"task {task.name}: {e}") from None
    config = {k: _jsonable(v, f"task {task.name}: knob {k}") for k, v in config.items()}
    costs = tuple(float(c) for c in res.costs)
    if not res.ok or not all(math.isfinite(c) for c in costs):
        costs = (FAILED_COST,)
    message = res.message.strip().splitlines()[0][:_MESSAGE_LIMIT] if res.message.strip() else ""
    energy = res.energy_uj if res.energy_uj is not None and math.isfinite(res.energy_uj) else None
    return RecordEntry(
        target=target_string(task), task_name=task.name, args=_workload_args(task),
        kwargs={"compiler": compiler_version()}, index=int(inp.index), config=config,
        costs=costs, error=MeasureError(res.error), all_cost=float(res.all_cost),
        timestamp=float(res.timestamp) or time.time(), version=LOG_VERSION,
        tvm_version=_tvm_version(), cycles=int(res.cycles), energy_uj=energy,
        message="" if res.ok else message)


def encode(inp: MeasureInput, res: MeasureResult) -> str:
    """The record line (without the newline) of one measurement."""
    return _entry(inp, res).to_line()


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _row_to_entry(row: Any, where: str) -> RecordEntry:
    if not isinstance(row, dict):
        raise _fail(where, "not a tuning record (expected a JSON object per line, AutoTVM 0.2 "
                    "layout)")
    for key in ("input", "config", "result", "version", "tvm_version"):
        if key not in row:
            raise _fail(where, f"tuning record without the {key!r} field")
    inp, cfg, res = row["input"], row["config"], row["result"]
    if not (isinstance(inp, list) and len(inp) == 4 and isinstance(inp[0], str) and inp[0]
            and isinstance(inp[1], str) and isinstance(inp[2], list)
            and isinstance(inp[3], dict)):
        raise _fail(where, "field 'input' must be [target, task name, [args], {kwargs}]")
    if row["version"] != LOG_VERSION:
        raise _fail(where, f"record version {row['version']!r} is not supported (expected "
                    f"{LOG_VERSION})")
    if not isinstance(row["tvm_version"], str):
        raise _fail(where, "field 'tvm_version' must be a string")
    if not (isinstance(cfg, dict) and isinstance(cfg.get("index"), int)
            and not isinstance(cfg.get("index"), bool) and isinstance(cfg.get("entity"), list)):
        raise _fail(where, "field 'config' must be {\"index\": int, \"entity\": [...]}")
    config: dict[str, Any] = {}
    for item in cfg["entity"]:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)):
            raise _fail(where, f"config entity {item!r} is not [knob, kind, value]")
        if item[1] != "ot":
            raise _fail(where, f"knob {item[0]}: kind {item[1]!r} is not supported (only "
                        "'ot' knobs)")
        if item[0] in config:
            raise _fail(where, f"knob {item[0]} appears twice")
        config[item[0]] = item[2]
    if not (isinstance(res, list) and len(res) == 4 and isinstance(res[0], list)
            and all(_number(c) for c in res[0]) and isinstance(res[1], int)
            and not isinstance(res[1], bool) and _number(res[2]) and _number(res[3])):
        raise _fail(where, "field 'result' must be [[costs], error_no, all_cost, timestamp]")
    try:
        error = MeasureError(res[1])
    except ValueError:
        raise _fail(where, f"error number {res[1]} is not one of AutoTVM's 0..8") from None
    measure = row.get("measure") or {}
    if not isinstance(measure, dict):
        raise _fail(where, "field 'measure' must be a JSON object")
    cycles, energy = measure.get("cycles", 0), measure.get("energy_uj")
    if not isinstance(cycles, int) or isinstance(cycles, bool) or not (
            energy is None or _number(energy)):
        raise _fail(where, "field 'measure' must hold integer cycles and numeric energy_uj")
    return RecordEntry(
        target=inp[0], task_name=inp[1], args=inp[2], kwargs=inp[3], index=cfg["index"],
        config=config, costs=tuple(float(c) for c in res[0]), error=error,
        all_cost=float(res[2]), timestamp=float(res[3]), version=row["version"],
        tvm_version=row["tvm_version"], cycles=cycles,
        energy_uj=None if energy is None else float(energy),
        message=str(measure.get("message", "")), where=where)


def _parse_json(line: str, where: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise _fail(where, f"not a JSON tuning record ({e.msg} at column {e.colno}); expected "
                    "AutoTVM 0.2 JSON lines as written by 'tvmc tune'") from None


def decode(line: str, space: KnobSpace | None = None, where: str = "") -> RecordEntry:
    """A record line as a :class:`RecordEntry`; with ``space`` its config holds the space's
    options (tuples, not lists). :class:`RecordError` (prefixed with ``where``) when the line
    is not a record."""
    entry = _row_to_entry(_parse_json(line, where), where)
    if space is not None:
        entry.config = entry.config_for(space)
    return entry


def load_records(path: str | os.PathLike) -> list[RecordEntry]:
    """Every record of a JSON-lines file, in file order (blank lines skipped; a truncated
    unterminated last line skipped with a :class:`RecordWarning`)."""
    p = Path(path)
    if not p.is_file():
        raise RecordError(f"{p}: no such tuning records file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RecordError(f"{p}: not a tuning records file (not UTF-8 text)") from None
    except OSError as e:
        raise RecordError(f"{p}: cannot read tuning records: {e.strerror}") from None
    lines = text.split("\n")
    out = []
    for no, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        where = f"{p}:{no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if no == len(lines) and line.startswith("{"):
                warnings.warn(f"{where}: skipped a truncated last record (an interrupted job "
                              "left it half written)", RecordWarning, stacklevel=2)
                continue
            row = _parse_json(line, where)
        out.append(_row_to_entry(row, where))
    return out


def _repair_tail(f, end: int, path: Path) -> None:
    """Before appending to ``f`` (opened ``a+b``, not ending with a newline): terminate a last
    line that parses, or cut off a truncated record."""
    start, chunk = end, 4096
    while start > 0:
        lo = max(0, start - chunk)
        f.seek(lo)
        block = f.read(start - lo)
        nl = block.rfind(b"\n")
        if nl >= 0:
            start = lo + nl + 1
            break
        start = lo
    f.seek(start)
    tail = f.read(end - start)
    try:
        json.loads(tail.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        if not tail.lstrip().startswith(b"{"):
            raise RecordError(f"{path}: the last line is not a tuning record; refusing to "
                              "append to a file that is not JSON lines") from None
        f.truncate(start)
        warnings.warn(f"{path}: dropped a truncated last record (an interrupted job left it "
                      "half written) before appending", RecordWarning, stacklevel=4)
        return
    f.write(b"\n")


def _append_lines(path: str | os.PathLike, lines: Sequence[str]) -> None:
    if not lines:
        return
    p = Path(path)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    try:
        if p.parent != Path("."):
            p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a+b") as f:
            end = f.seek(0, os.SEEK_END)
            if end:
                f.seek(end - 1)
                if f.read(1) != b"\n":
                    _repair_tail(f, end, p)
            f.write(data)
            f.flush()
    except OSError as e:
        raise RecordError(f"{p}: cannot write tuning records: {e.strerror}") from None


def append_record(path: str | os.PathLike, inp: MeasureInput, res: MeasureResult) -> None:
    """Append one record line to ``path`` (open, write, flush, close)."""
    _append_lines(path, [encode(inp, res)])


def log_to_file(path: str | os.PathLike
                ) -> Callable[[Any, Sequence[MeasureInput], Sequence[MeasureResult]], None]:
    """A tuner callback ``cb(tuner, inputs, results)`` appending each batch's records to
    ``path`` as it completes."""

    def _callback(tuner: Any, inputs: Sequence[MeasureInput],
                  results: Sequence[MeasureResult]) -> None:
        _append_lines(path, [encode(i, r) for i, r in zip(inputs, results, strict=True)])

    return _callback


def _entries(records: str | os.PathLike | Iterable[RecordEntry]) -> list[RecordEntry]:
    if isinstance(records, (str, os.PathLike)):
        return load_records(records)
    return list(records)


def _is_task(entry: RecordEntry, task: Task, args_key: str) -> bool:
    return (entry.task_name == task.name and entry.accel == task.target
            and entry.fingerprint == task.config_fingerprint and entry.args_key == args_key)


def measured_pairs(records: str | os.PathLike | Iterable[RecordEntry], task: Task
                   ) -> list[tuple[MeasureInput, MeasureResult]]:
    """The measurements of ``task`` among ``records`` (same task name, workload, accelerator and
    config fingerprint), as (input, result) pairs with the space's options, for resuming a
    tuner. The input's index is recomputed from the config."""
    args_key = _canon(_workload_args(task))
    options = None
    out = []
    for e in _entries(records):
        if not _is_task(e, task, args_key):
            continue
        options = options or _Options(task.space)
        inp = MeasureInput(task, options.config(e, task.name))
        out.append((inp, MeasureResult(costs=e.costs, error=e.error, cycles=e.cycles,
                                       energy_uj=e.energy_uj, message=e.message,
                                       all_cost=e.all_cost, timestamp=e.timestamp)))
    return out


def _better(a: RecordEntry, b: RecordEntry | None) -> bool:
    return b is None or a.mean_cost < b.mean_cost


def pick_best(records: str | os.PathLike | Iterable[RecordEntry]
              ) -> dict[WorkloadKey, RecordEntry]:
    """The successful record of lowest mean cost per workload (accelerator, config name and
    fingerprint, task name, args); the earliest wins a tie. Failed records are ignored."""
    best: dict[WorkloadKey, RecordEntry] = {}
    for e in _entries(records):
        if not e.ok or not e.costs:
            continue
        key = e.workload_key
        if _better(e, best.get(key)):
            best[key] = e
    return best


def pick_best_file(in_path: str | os.PathLike, out_path: str | os.PathLike) -> int:
    """Write the best record per workload of ``in_path`` to ``out_path`` (in input order,
    replacing it atomically), like AutoTVM's ``record --mode pick``; returns how many."""
    entries = load_records(in_path)
    chosen = {id(e) for e in pick_best(entries).values()}
    lines = [e.to_line() for e in entries if id(e) in chosen]
    out = Path(out_path)
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:
        raise RecordError(f"{out}: cannot write tuning records: {e.strerror}") from None
    return len(lines)


# --- applying records ------------------------------------------------------------------------
@dataclass(frozen=True)
class Ignored:
    """Records not applied, for one reason (another hardware config or compiler version)."""

    reason: str
    count: int

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class AppliedRecord:
    """A task that got its configuration from a record: for reports (``--dump-offloads``)."""

    task_name: str
    layers: tuple[str, ...]
    config: dict
    mean_cost: float
    where: str


_STACK: list[ApplyHistoryBest] = []


def current() -> ApplyHistoryBest | None:
    """The innermost active :class:`ApplyHistoryBest` context, or None."""
    return _STACK[-1] if _STACK else None


class ApplyHistoryBest:
    """The best recorded configuration per task, from a records file or a list of entries.

    Use as a context manager (``with ApplyHistoryBest(path): compile...``; the compile flow
    finds it with :func:`current`) or as a plain object. Only records of the task's accelerator,
    hardware config fingerprint and this compiler version are applied; records of the same
    accelerator for another config or written by another compiler are reported once per
    distinct mismatch, as a :class:`RecordWarning` and in :attr:`ignored`. :attr:`used` maps
    each task key that got a record to an :class:`AppliedRecord`.
    """

    def __init__(self, records: str | os.PathLike | Iterable[RecordEntry],
                 compiler: str | None = None):
        self.source = (str(records) if isinstance(records, (str, os.PathLike))
                       else "tuning records")
        self.records = _entries(records)
        self.compiler = compiler or compiler_version()
        self.ignored: list[Ignored] = []
        self.used: dict[str, AppliedRecord] = {}
        self._index: dict[tuple[str, str], dict[tuple[str, str], RecordEntry]] = {}

    current = staticmethod(current)

    def __enter__(self) -> ApplyHistoryBest:
        _STACK.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for i in range(len(_STACK) - 1, -1, -1):
            if _STACK[i] is self:
                del _STACK[i]
                break

    def __repr__(self) -> str:
        return (f"ApplyHistoryBest({self.source}: {len(self.records)} records, "
                f"{len(self.used)} used, {sum(i.count for i in self.ignored)} ignored)")

    def _ignore(self, reason: str, count: int) -> None:
        if any(i.reason == reason for i in self.ignored):
            return
        self.ignored.append(Ignored(reason, count))
        warnings.warn(reason, RecordWarning, stacklevel=5)

    def _best_for(self, task: Task) -> dict[tuple[str, str], RecordEntry]:
        key = (task.target, task.config_fingerprint)
        if key in self._index:
            return self._index[key]
        best: dict[tuple[str, str], RecordEntry] = {}
        other_config: dict[tuple[str, str], int] = {}
        other_compiler: dict[str, int] = {}
        for e in self.records:
            if e.accel != task.target:
                continue
            if e.fingerprint != task.config_fingerprint:
                k = (e.model, e.fingerprint)
                other_config[k] = other_config.get(k, 0) + 1
            elif e.compiler != self.compiler:
                other_compiler[e.compiler] = other_compiler.get(e.compiler, 0) + 1
            elif e.ok and e.costs:
                wk = (e.task_name, e.args_key)
                if _better(e, best.get(wk)):
                    best[wk] = e
        here = f"{task.config_name or '?'} (fingerprint {task.config_fingerprint[:12] or '?'})"
        for (model, fp), n in other_config.items():
            self._ignore(f"{self.source}: {n} record(s) for {task.target} config {model or '?'} "
                         f"(fingerprint {fp[:12] or '?'}) not applied: this compile is for "
                         f"{here}; tune for this config", n)
        for version, n in other_compiler.items():
            self._ignore(f"{self.source}: {n} record(s) for {task.target} {here} written by "
                         f"compiler {version or 'of unknown version'} not applied: this is "
                         f"{self.compiler}; tune again with this version", n)
        self._index[key] = best
        return best

    def best(self, task: Task) -> RecordEntry | None:
        """The applicable record of lowest mean cost for ``task``, or None."""
        return self._best_for(task).get((task.name, _canon(_workload_args(task))))

    def query(self, task: Task) -> dict | None:
        """The best recorded config of ``task`` (every knob, as options of its space), or None
        when no applicable record matches its workload."""
        entry = self.best(task)
        if entry is None:
            return None
        config = entry.config_for(task.space, task.name)
        self.used[task.key] = AppliedRecord(task.name, tuple(task.layers), dict(config),
                                            entry.mean_cost, entry.where)
        return config
