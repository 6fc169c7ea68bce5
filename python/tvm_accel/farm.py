"""A farm of simulator machines behind TVM's RPC tracker (the engine AutoTVM measured with).

Servers are TVM RPC servers that import this package (``python -m tvm_accel.rpc_server
--tracker HOST:PORT --key KEY``, :mod:`tvm_accel.rpc_server`) and so offer two remote
functions: one tuning measurement, and a run of a compiled package on a few batches of samples.
A client asks the tracker (``python -m tvm.exec.rpc_tracker``) for a server of the key, opens
one session per piece of work and closes it when done, so the tracker hands every server to one
client at a time and spreads the work over all of them.

Failures: a measurement or a run whose session ends with an error that is not the remote
function's own (the server died or was killed, the connection broke) is retried once on
another server; a second failure is recorded (a tuning measurement as ``UNKNOWN_ERROR``) or,
for samples, raised as :class:`FarmError`. A session that outlives its timeout is ended by the
server (TVM's ``session_timeout``): a tuning measurement then counts as ``RUN_TIMEOUT``.
"""

from __future__ import annotations

import io
import pickle
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tvm_accel.errors import AccelError

#: the remote functions a farm server registers (:mod:`tvm_accel.rpc_server`)
MEASURE_FUNC = "tvm_accel.farm.measure"
RUN_FUNC = "tvm_accel.farm.run_batches"
#: the key servers register under unless told otherwise
DEFAULT_KEY = "accel-sim"
#: seconds a session may take beyond the measurement's timeout (connecting, loading the task)
LOAD_ALLOWANCE = 30.0


class FarmError(AccelError):
    """The tracker cannot be reached, has no server of the key, or work failed twice."""


def parse_tracker(text: str, flag: str = "--rpc-tracker") -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FarmError(f"{flag} {text!r}: give HOST:PORT, e.g. 127.0.0.1:9190")
    return host, int(port)


class Farm:
    """The servers of ``key`` registered with the tracker at ``tracker`` (host, port)."""

    def __init__(self, tracker: tuple[str, int], key: str = DEFAULT_KEY):
        from tvm import rpc

        self.tracker, self.key = tracker, key
        where = f"{tracker[0]}:{tracker[1]}"
        try:
            socket.create_connection(tracker, timeout=5).close()  # TVM retries for 60 s
            summary = rpc.connect_tracker(*tracker).summary()
        except Exception as e:
            raise FarmError(f"--rpc-tracker {where}: cannot reach the tracker "
                            f"({_first_line(e)}); start one with 'python -m "
                            "tvm.exec.rpc_tracker'") from None
        #: servers of the key registered with the tracker (busy ones included)
        self.servers = sum(1 for s in summary.get("server_info", [])
                           if s.get("key") == f"server:{key}")
        if not self.servers:
            raise FarmError(f"--rpc-key {key}: no server of that key is registered with the "
                            f"tracker at {where}; start one with 'python -m "
                            f"tvm_accel.rpc_server --tracker {where} --key {key}'")
        self._local = threading.local()

    def _client(self):
        """This thread's connection to the tracker (one socket per thread)."""
        from tvm import rpc

        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = rpc.connect_tracker(*self.tracker)
        return client

    def call(self, func: str, args: Sequence[Any], session_timeout: float) -> Any:
        """``func(*args)`` on a server of the key, in a session of its own (retried once on
        another server when the session, not the function, fails); the session is closed
        before returning so the server goes back to the tracker."""
        last: Exception | None = None
        for _attempt in range(2):
            try:
                sess = self._client().request(self.key, session_timeout=session_timeout,
                                              max_retry=3)
            except Exception as e:
                raise FarmError(f"--rpc-key {self.key}: no server answered "
                                f"({_first_line(e)})") from None
            try:
                return sess.get_function(func)(*args)
            except Exception as e:  # our functions answer their own failures: the session's
                last = e
            finally:
                del sess
        raise _SessionLost(_first_line(last)) from None


class _SessionLost(FarmError):
    """A session ended twice without the remote function's answer (server died, timeout)."""


def _first_line(e: BaseException | None) -> str:
    text = str(e).strip().splitlines() if e is not None else []
    return next((ln.strip() for ln in text if ln.strip()), type(e).__name__)


def _timed_out(e: Exception) -> bool:
    return "RPCSessionTimeoutError" in str(e) or "session has expired" in str(e)


# --- tuning measurements -----------------------------------------------------------------------
class RPCMeasurer:
    """The :class:`~tvm_accel.tuning.measure.Measurer` interface over a farm: ``run(inputs)``
    measures on up to ``n_parallel`` servers at once (default: the servers registered),
    results in input order, failures as error classes."""

    def __init__(self, farm: Farm, timeout: float = 30.0, n_parallel: int | None = None,
                 load_allowance: float = LOAD_ALLOWANCE):
        self.farm, self.timeout = farm, float(timeout)
        self.load_allowance = load_allowance
        self.n_parallel = n_parallel or farm.servers
        self._blobs: dict[int, tuple[Any, bytes]] = {}

    def __enter__(self) -> RPCMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._blobs.clear()

    def _payload(self, task) -> bytes:
        entry = self._blobs.get(id(task))
        if entry is None:
            entry = (task, pickle.dumps((task.measure, task.context)))
            self._blobs[id(task)] = entry
        return entry[1]

    def run(self, inputs: Sequence) -> list:
        from tvm_accel.tuning.measure import _describe, _failure
        from tvm_accel.tuning.task import MeasureError

        def one(inp):
            try:
                config = inp.task.space.validate(inp.config)
            except ValueError as exc:
                return _failure(MeasureError.INSTANTIATION_ERROR, str(exc))
            try:
                blob = self._payload(inp.task)
            except Exception as exc:
                return _failure(MeasureError.UNKNOWN_ERROR, f"task {inp.task.name} cannot be "
                                f"sent to a server: {_describe(exc)}")
            return self._measure(blob, config)

        with ThreadPoolExecutor(max(1, self.n_parallel)) as pool:
            return list(pool.map(one, inputs))

    def _measure(self, blob: bytes, config: dict):
        from tvm_accel.tuning.measure import _failure
        from tvm_accel.tuning.task import MeasureError, MeasureResult

        t0 = time.monotonic()
        try:
            reply = self.farm.call(MEASURE_FUNC, [bytearray(blob), bytearray(pickle.dumps(config)),
                                                  self.timeout],
                                   self.timeout + self.load_allowance)
        except _SessionLost as e:
            error = MeasureError.RUN_TIMEOUT if _timed_out(e) else MeasureError.UNKNOWN_ERROR
            return _failure(error, f"measurement on the farm failed twice: {e}",
                            time.monotonic() - t0)
        error, cycles, seconds, energy, message = pickle.loads(bytes(reply))
        return MeasureResult(costs=(seconds,), error=MeasureError(error), cycles=cycles,
                             energy_uj=energy, message=message,
                             all_cost=time.monotonic() - t0, timestamp=time.time())


# --- samples -----------------------------------------------------------------------------------
def run_batches(farm: Farm, package_path: str, batches: list[list[np.ndarray]],
                max_cycles: int | None, jobs: int | None = None,
                progress: Callable[[int, int], None] | None = None,
                per_session: int | None = None) -> list[list[np.ndarray]]:
    """The package's outputs for every batch, computed on the farm: batches go in groups of
    ``per_session`` (default: four groups per server, at least 8 batches each, so loading the
    package in a session is paid rarely and a slow server still gets its share) to up to
    ``jobs`` servers at once (default: all registered); results in input order. A simulator
    or package error on a server is raised here as the user error it is; a group whose
    server fails twice raises :class:`FarmError`."""
    with open(package_path, "rb") as f:
        package = bytearray(f.read())
    servers = max(1, min(jobs or farm.servers, farm.servers))
    size = per_session or max(8, -(-len(batches) // (4 * servers)))
    groups = [batches[i:i + size] for i in range(0, len(batches), size)]
    done = [0]
    lock = threading.Lock()

    def one(group: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        buf = io.BytesIO()
        pickle.dump(group, buf)
        try:
            reply = farm.call(RUN_FUNC, [package, bytearray(buf.getvalue()),
                                         -1 if max_cycles is None else int(max_cycles)], 0)
        except _SessionLost as e:
            raise FarmError(f"{len(group)} batch(es) failed twice on the farm: {e}") from None
        ok, value = pickle.loads(bytes(reply))
        if not ok:
            raise value
        with lock:
            done[0] += len(group)
            if progress:
                progress(done[0], len(batches))
        return value

    out: list[list[np.ndarray]] = []
    with ThreadPoolExecutor(max(1, min(servers, len(groups)))) as pool:
        for part in pool.map(one, groups):
            out.extend(part)
    return out
