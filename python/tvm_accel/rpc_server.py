"""A farm server: a TVM RPC server that registers with a tracker and runs our simulators.

``python -m tvm_accel.rpc_server --tracker HOST:PORT --key accel-sim`` (as VTA shipped
``vta.exec.rpc_server``) starts TVM's RPC server with two remote functions
(:data:`tvm_accel.farm.MEASURE_FUNC`, :data:`tvm_accel.farm.RUN_FUNC`) and every installed
target imported, so each session (TVM forks one process per session) starts warm. Every answer
is a pickled reply: a failure of the work itself (an exception, a crash or a timeout of the
forked process that does it) comes back as its error, never as a broken session, so the server
keeps serving and the client retries only what a server could not answer (it died, the
network broke).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from tvm_accel.farm import DEFAULT_KEY, MEASURE_FUNC, RUN_FUNC, parse_tracker


def _isolated(fn: Callable[[], Any], timeout: float | None) -> tuple[str, Any]:
    """``fn()`` in a forked child of the session: ``("ok", value)``, ``("died", reason)`` or
    ``("timeout", None)``. A session process that exits abnormally stops TVM's server loop
    for good, so whatever the work does (a segfault, ``os._exit``), the session returns."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send(("ok", fn()))
        except BaseException as exc:  # an answer, not a crash
            try:
                send.send(("raised", exc))
            except Exception:  # an exception that does not pickle
                send.send(("raised", RuntimeError(str(exc))))

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    send.close()
    if not recv.poll(timeout):
        proc.kill()
        proc.join()
        return "timeout", None
    try:
        status, value = recv.recv()
    except (EOFError, OSError):
        proc.join()
        return "died", f"exit code {proc.exitcode}"
    proc.join()
    if status == "raised":
        raise value
    return status, value


def _measure(blob: bytes, config: bytes, timeout: float) -> bytes:
    """One tuning measurement of the task's pickled (measure, context) at ``config``:
    ``(error, cycles, seconds, energy, message)`` pickled."""
    from tvm_accel.tuning.measure import FAILED_COST, _describe, measure_once
    from tvm_accel.tuning.task import MeasureError

    try:
        measure, context = pickle.loads(bytes(blob))
        cfg = pickle.loads(bytes(config))
    except Exception as exc:
        return pickle.dumps((int(MeasureError.UNKNOWN_ERROR), 0, FAILED_COST, None,
                             f"server cannot load the task: {_describe(exc)}"))
    status, value = _isolated(lambda: measure_once(measure, context, cfg), timeout)
    if status == "timeout":
        value = (int(MeasureError.RUN_TIMEOUT), 0, FAILED_COST, None,
                 f"measurement exceeded the timeout of {timeout:g} s")
    elif status == "died":
        value = (int(MeasureError.UNKNOWN_ERROR), 0, FAILED_COST, None,
                 f"measurement process died ({value})")
    return pickle.dumps(value)


def _run_batches(package: bytes, group: bytes, max_cycles: int) -> bytes:
    """A package run on pickled batches: ``(True, outputs per batch)`` or ``(False, error)``."""

    def run() -> list:
        import tvm

        from tvm_accel import simlib
        from tvm_accel.package import load_package, outputs_to_numpy

        batches = pickle.load(io.BytesIO(bytes(group)))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.tar")
            with open(path, "wb") as f:
                f.write(bytes(package))
            vm = load_package(path).vm()
            with simlib.cycle_budget(None if max_cycles < 0 else max_cycles):
                return [outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(x) for x in batch]))
                        for batch in batches]

    try:
        status, value = _isolated(run, None)
        if status == "died":
            raise RuntimeError(f"the simulator process on the farm server died ({value})")
        return pickle.dumps((True, value))
    except Exception as exc:
        try:
            return pickle.dumps((False, exc))
        except Exception:
            return pickle.dumps((False, RuntimeError(str(exc))))


def register() -> None:
    """Register the farm's remote functions and import every target (TVM calls this in the
    server process before it listens)."""
    import tvm

    from tvm_accel.target import available_targets, get_target

    for name in available_targets():
        get_target(name)
    tvm.register_global_func(MEASURE_FUNC, _measure, override=True)
    tvm.register_global_func(RUN_FUNC, _run_batches, override=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tvm_accel.rpc_server",
                                description="a farm server for tvmc tune / tvmc run "
                                "--rpc-tracker")
    p.add_argument("--tracker", required=True, metavar="HOST:PORT",
                   help="the RPC tracker to register with (python -m tvm.exec.rpc_tracker)")
    p.add_argument("--key", default=DEFAULT_KEY, help=f"device key (default {DEFAULT_KEY})")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    p.add_argument("--port", type=int, default=9090, help="first port to try (default 9090)")
    p.add_argument("--port-end", type=int, help="end of the ports tried (default --port + 100)")
    args = p.parse_args(argv)
    from tvm import rpc

    try:
        tracker = parse_tracker(args.tracker, "--tracker")
        server = rpc.Server(host=args.host, port=args.port, key=args.key,
                            port_end=args.port_end or args.port + 100, tracker_addr=tracker,
                            server_init_callback=register)
    except Exception as e:  # a bad address, no free port: one line, as tvmc's errors
        msg = next((ln for ln in reversed(str(e).strip().splitlines()) if ln.strip()), str(e))
        print(f"tvm_accel.rpc_server: error: {msg.strip()}", file=sys.stderr)
        return 2
    print(f"serving key {args.key} on {args.host}:{server.port}, registered with "
          f"{args.tracker}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the server
        server.proc.join()
    server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
