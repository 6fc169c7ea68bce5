"""A farm server: a TVM RPC server that registers with a tracker and runs our simulators.

``python -m tvm_accel.rpc_server --tracker HOST:PORT --key accel-sim`` (as VTA shipped
``vta.exec.rpc_server``) starts TVM's RPC server with two remote functions
(:data:`tvm_accel.farm.MEASURE_FUNC`, :data:`tvm_accel.farm.RUN_FUNC`) and every installed
target imported, so each session (TVM forks one process per session) starts warm. Every answer
is a pickled reply: a failure of the work itself comes back as its error, never as a broken
session, so the client retries only what the server could not answer.
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import sys
import tempfile

from tvm_accel.farm import DEFAULT_KEY, MEASURE_FUNC, RUN_FUNC, parse_tracker


def _measure(blob: bytes, config: bytes) -> bytes:
    """One tuning measurement: the task's pickled (measure, context) and the config."""
    from tvm_accel.tuning.measure import _describe, measure_once
    from tvm_accel.tuning.task import MeasureError

    try:
        measure, context = pickle.loads(bytes(blob))
        cfg = pickle.loads(bytes(config))
    except Exception as exc:
        return pickle.dumps((int(MeasureError.UNKNOWN_ERROR), 0, 1e9, None,
                             f"server cannot load the task: {_describe(exc)}"))
    return pickle.dumps(measure_once(measure, context, cfg))


def _run_batches(package: bytes, group: bytes, max_cycles: int) -> bytes:
    """A package run on pickled batches: ``(True, outputs per batch)`` or ``(False, error)``."""
    import tvm

    from tvm_accel import simlib
    from tvm_accel.package import load_package, outputs_to_numpy

    try:
        batches = pickle.load(io.BytesIO(bytes(group)))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.tar")
            with open(path, "wb") as f:
                f.write(bytes(package))
            vm = load_package(path).vm()
            with simlib.cycle_budget(None if max_cycles < 0 else max_cycles):
                outs = [outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(x) for x in batch]))
                        for batch in batches]
        return pickle.dumps((True, outs))
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
    p.add_argument("--port-end", type=int, default=9199, help="last port to try")
    args = p.parse_args(argv)
    try:
        tracker = parse_tracker(args.tracker, "--tracker")
    except Exception as e:
        print(f"tvm_accel.rpc_server: error: {e}", file=sys.stderr)
        return 2
    from tvm import rpc

    server = rpc.Server(host=args.host, port=args.port, port_end=args.port_end, key=args.key,
                        tracker_addr=tracker, server_init_callback=register)
    print(f"serving key {args.key} on {args.host}:{server.port}, registered with "
          f"{args.tracker}", flush=True)
    try:
        server.proc.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
