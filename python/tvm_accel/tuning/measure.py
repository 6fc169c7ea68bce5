"""Measuring configurations in worker processes, with a timeout per measurement.

A measurement builds a task's program for one configuration and runs it on the simulator. Either
step can fail, hang or crash the process (a C simulator fault), so every measurement runs in a
worker process that the parent can kill and replace; a bad configuration never takes the tuning
job down. Workers are started with ``spawn`` (or ``forkserver``) so they do not inherit the
parent's TVM state, and they are kept across batches by a :class:`Measurer` because starting one
costs far more than a typical measurement.

Outcome -> :class:`MeasureError`:

* the space's ``validate`` rejects the configuration (checked in the parent, before sending) or
  ``measure`` raises ``ValueError``: ``INSTANTIATION_ERROR``;
* :class:`tvm_accel.errors.SimulatorError`: ``RUNTIME_DEVICE``; any other ``AccelError`` or a
  ``RuntimeError``: ``COMPILE_DEVICE``;
* the measurement runs longer than ``timeout``: ``RUN_TIMEOUT`` (the worker is killed);
* the worker dies (``os._exit``, a segfault) or anything else goes wrong: ``UNKNOWN_ERROR``.

A failed measurement reports ``costs == (FAILED_COST,)``, as AutoTVM's records do.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import pickle
import signal
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from tvm_accel.tuning.task import MeasureError, MeasureInput, MeasureResult, Task

__all__ = ["FAILED_COST", "MeasureOption", "Measurer", "measure_batch", "measure_option"]

FAILED_COST = 1e9
"""The cost recorded for a failed measurement (AutoTVM's convention)."""

_MAX_START_FAILURES = 3


@dataclass(frozen=True)
class MeasureOption:
    """How to measure: ``timeout`` seconds per measurement (from the moment the worker has the
    task loaded), ``n_parallel`` worker processes, the multiprocessing start method, and how long
    a worker may take to start or to load a task (importing the target's modules)."""

    timeout: float = 30.0
    n_parallel: int = 1
    start_method: str = "spawn"
    startup_timeout: float = 120.0

    def __post_init__(self):
        if not self.timeout > 0:
            raise ValueError(f"measure timeout must be positive, got {self.timeout}")
        if self.n_parallel < 1:
            raise ValueError(f"n_parallel must be at least 1, got {self.n_parallel}")
        if self.start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start method {self.start_method!r}: use 'spawn' or 'forkserver' "
                             "(a forked worker would inherit the parent's TVM state)")


def measure_option(timeout: float = 30.0, n_parallel: int | None = None) -> MeasureOption:
    """Measurement options; ``n_parallel`` defaults to the number of CPUs."""
    return MeasureOption(timeout=float(timeout), n_parallel=n_parallel or os.cpu_count() or 1)


def measure_batch(inputs: Sequence[MeasureInput],
                  option: MeasureOption | None = None) -> list[MeasureResult]:
    """Measure ``inputs`` with a pool started for this call only (use a :class:`Measurer` to
    keep the workers across batches)."""
    with Measurer(option) as measurer:
        return measurer.run(inputs)


def _failure(error: MeasureError, message: str, wall: float = 0.0) -> MeasureResult:
    return MeasureResult(costs=(FAILED_COST,), error=error, message=message, all_cost=wall,
                         timestamp=time.time())


# --- worker side ---------------------------------------------------------------------------------
def _classify(exc: BaseException) -> MeasureError:
    from tvm_accel.errors import AccelError, SimulatorError

    if isinstance(exc, ValueError):
        return MeasureError.INSTANTIATION_ERROR
    if isinstance(exc, SimulatorError):
        return MeasureError.RUNTIME_DEVICE
    if isinstance(exc, (AccelError, RuntimeError)):
        return MeasureError.COMPILE_DEVICE
    return MeasureError.UNKNOWN_ERROR


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _worker_main(conn: Connection) -> None:
    """Serve measurement jobs until told to stop or the parent goes away.

    Messages in: ``("run", job, token, task_blob | None, config)`` and ``("stop",)``. Messages
    out: ``("ready",)``, ``("loaded", job)`` once a new task blob is unpickled, and
    ``("result", job, token, error, cycles, seconds, energy, message)``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    loaded_token, context = None, None
    measure: Any = None  # the task's measure function once a task blob is loaded
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] != "run":
            return
        _, job, token, blob, config = msg
        if blob is not None:
            loaded_token, measure, context = None, None, None
            try:
                measure, context = pickle.loads(blob)
            except Exception as exc:  # reported, the worker stays usable
                conn.send(("result", job, None, int(MeasureError.UNKNOWN_ERROR), 0, FAILED_COST,
                           None, f"worker cannot load the task: {_describe(exc)}"))
                continue
            loaded_token = token
            conn.send(("loaded", job))
        conn.send(("result", job, loaded_token, *measure_once(measure, context, config)))


def measure_once(measure: Any, context: Any, config: dict
                 ) -> tuple[int, int, float, float | None, str]:
    """One measurement, as a worker (or a farm server) runs it: ``(error, cycles, seconds,
    energy, message)``, every failure an error class."""
    try:
        cycles, seconds, energy = measure(context, config)
        cycles, seconds = int(cycles), float(seconds)
        energy = None if energy is None else float(energy)
        if not (math.isfinite(seconds) and seconds > 0):
            raise ArithmeticError(f"measure returned a non-positive time {seconds!r}")
        return int(MeasureError.NO_ERROR), cycles, seconds, energy, ""
    except Exception as exc:  # every failure becomes an error class
        return int(_classify(exc)), 0, FAILED_COST, None, _describe(exc)


# --- parent side ---------------------------------------------------------------------------------
@dataclass
class _Job:
    slot: int             # position in the batch
    token: int            # which task
    config: dict
    sent: float = 0.0     # wall time when sent
    deadline: float = 0.0


class _Worker:
    def __init__(self, ctx: Any, startup_timeout: float):
        parent_end, child_end = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child_end,), daemon=True,
                                name="tvm_accel-measure")
        self.proc.start()
        child_end.close()
        self.conn = parent_end
        self.ready = False
        self.deadline = time.monotonic() + startup_timeout  # for start-up, then for the job
        self.job: _Job | None = None
        self.token: int | None = None   # the task the worker has loaded

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # the worker may already be gone
            self.conn.send(("stop",))
        self.proc.join(timeout=1)
        self.kill()

    def exit_reason(self) -> str:
        self.proc.join(timeout=1)
        code = self.proc.exitcode
        if code is not None and code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"


class Measurer:
    """A reusable pool of measurement workers: ``with Measurer(option) as m: m.run(inputs)``.

    Workers start on first use and stay up across :meth:`run` calls; a worker that times out or
    dies is replaced on demand. Each worker keeps the last task it loaded, so a batch of one
    task sends the task's ``measure`` and ``context`` once per worker, not once per config.
    """

    def __init__(self, option: MeasureOption | None = None):
        self.option = option or measure_option()
        self._ctx = multiprocessing.get_context(self.option.start_method)
        self._workers: list[_Worker] = []
        self._blobs: dict[int, tuple[Task, int, bytes]] = {}  # id(task) -> (task, token, blob)
        self._start_failures = 0
        self._closed = False

    @property
    def n_parallel(self) -> int:
        return self.option.n_parallel

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):  # interpreter shutdown
                self.close()

    def close(self) -> None:
        """Stop every worker."""
        self._closed = True
        for w in self._workers:
            w.stop()
        self._workers.clear()

    def _payload(self, task: Task) -> tuple[int, bytes]:
        entry = self._blobs.get(id(task))
        if entry is None:
            entry = (task, len(self._blobs), pickle.dumps((task.measure, task.context)))
            self._blobs[id(task)] = entry  # keeps the task alive, so its id stays unique
        return entry[1], entry[2]

    def run(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        """Measure every input; results come back in input order, failures as error classes."""
        if self._closed:
            raise RuntimeError("this Measurer is closed")
        results: list[MeasureResult | None] = [None] * len(inputs)
        queue: deque[_Job] = deque()
        for slot, inp in enumerate(inputs):
            try:
                config = inp.task.space.validate(inp.config)
            except ValueError as exc:
                results[slot] = _failure(MeasureError.INSTANTIATION_ERROR, str(exc))
                continue
            try:
                token, _ = self._payload(inp.task)
            except Exception as exc:  # any pickling failure
                results[slot] = _failure(MeasureError.UNKNOWN_ERROR,
                                         f"task {inp.task.name} cannot be sent to a worker "
                                         f"(measure and context must be picklable): "
                                         f"{_describe(exc)}")
                continue
            queue.append(_Job(slot, token, config))
        try:
            self._drive(queue, results)
        except BaseException:
            for w in [w for w in self._workers if w.job is not None or not w.ready]:
                self._retire(w)
            raise
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            raise RuntimeError(f"measurement lost the results of inputs {missing}")
        return results  # type: ignore[return-value]

    # --- scheduling ------------------------------------------------------------------------------
    def _drive(self, queue: deque[_Job], results: list[MeasureResult | None]) -> None:
        tasks = {token: task for task, token, _ in self._blobs.values()}
        while queue or any(w.job is not None for w in self._workers):
            busy = sum(w.job is not None for w in self._workers)
            while len(self._workers) < min(self.n_parallel, busy + len(queue)):
                self._workers.append(_Worker(self._ctx, self.option.startup_timeout))
            for w in list(self._workers):
                if queue and w.ready and w.job is None:
                    self._send(w, queue, tasks)
            deadline = min((w.deadline for w in self._workers), default=math.inf)
            wait_for = None if deadline == math.inf else max(0.0, deadline - time.monotonic())
            handles = [w.conn for w in self._workers] + [w.proc.sentinel for w in self._workers]
            ready = set(wait(handles, timeout=wait_for))
            for w in list(self._workers):
                if w.conn in ready:
                    self._receive(w, results)
                elif w.proc.sentinel in ready:
                    self._died(w, results)
            now = time.monotonic()
            for w in list(self._workers):
                if w in self._workers and w.deadline <= now:
                    self._expired(w, results)

    def _send(self, w: _Worker, queue: deque[_Job], tasks: dict[int, Task]) -> None:
        job = queue.popleft()
        blob = None if w.token == job.token else self._payload(tasks[job.token])[1]
        job.sent = time.monotonic()
        # until the worker confirms it loaded a new task, allow for importing its modules
        job.deadline = job.sent + (self.option.timeout if blob is None
                                   else max(self.option.timeout, self.option.startup_timeout))
        w.job, w.deadline = job, job.deadline
        w.token = job.token if blob is None else None
        try:
            w.conn.send(("run", job.slot, job.token, blob, job.config))
        except OSError:  # the worker died while idle: give the job to another one
            w.job = None
            queue.appendleft(job)
            self._retire(w)

    def _receive(self, w: _Worker, results: list[MeasureResult | None]) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            self._died(w, results)
            return
        if msg[0] == "ready":
            w.ready, w.deadline = True, math.inf
            self._start_failures = 0
        elif msg[0] == "loaded" and w.job is not None:
            w.job.deadline = w.deadline = time.monotonic() + self.option.timeout
        elif msg[0] == "result" and w.job is not None:
            _, _, token, error, cycles, seconds, energy, message = msg
            job, w.job, w.token, w.deadline = w.job, None, token, math.inf
            wall = time.monotonic() - job.sent
            results[job.slot] = MeasureResult(costs=(seconds,), error=MeasureError(error),
                                          cycles=cycles, energy_uj=energy, message=message,
                                          all_cost=wall, timestamp=time.time())

    def _died(self, w: _Worker, results: list[MeasureResult | None]) -> None:
        reason = w.exit_reason()
        if w.job is not None:
            results[w.job.slot] = _failure(MeasureError.UNKNOWN_ERROR,
                                           f"measurement worker died ({reason})",
                                           time.monotonic() - w.job.sent)
        elif not w.ready:
            self._start_failed(f"a measurement worker died while starting ({reason})")
        self._retire(w)

    def _expired(self, w: _Worker, results: list[MeasureResult | None]) -> None:
        if w.job is not None:
            results[w.job.slot] = _failure(MeasureError.RUN_TIMEOUT,
                                           f"measurement exceeded the timeout of "
                                           f"{self.option.timeout:g} s",
                                           time.monotonic() - w.job.sent)
        elif not w.ready:
            self._start_failed(f"a measurement worker did not start within "
                               f"{self.option.startup_timeout:g} s")
        self._retire(w)

    def _start_failed(self, why: str) -> None:
        self._start_failures += 1
        if self._start_failures >= _MAX_START_FAILURES:
            raise RuntimeError(f"{why}; giving up after {self._start_failures} attempts")

    def _retire(self, w: _Worker) -> None:
        w.kill()
        if w in self._workers:
            self._workers.remove(w)
