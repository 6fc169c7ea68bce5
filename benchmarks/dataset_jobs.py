"""A dataset run spread over processes and over a farm (issue 25, items 2 and 3).

Compiles one zoo model for one target (default: ResNet-20 on VTA, 1,000 samples; the issue's
goal is ``--jobs 2`` at least 1.8x faster than ``--jobs 1``), makes N seeded random samples and
runs :func:`tvm_accel.evaluate.evaluate` on them with each ``--jobs`` value, then on a tracker
and S farm servers started on this machine for each S in ``--farm``. Prints wall time, samples
per second, speed-up over one process, and whether the outputs equal the one-process run's
(they must). On one machine the farm shows the protocol's overhead, not more cores. Usage:
    python benchmarks/dataset_jobs.py [--model resnet20] [--target vta] [--samples 1000]
                                      [--jobs 1,2] [--farm 1,2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from pathlib import Path

import numpy as np

SCHEMES = {"vta": {"per_channel": True}, "dpu": {"power_of_two": True},
           "marsellus": {"activation_type": "uint8", "per_channel": True}}


@contextlib.contextmanager
def local_farm(servers: int, key: str):
    """A tracker and ``servers`` farm servers on localhost; yields (host, port)."""
    from tvm import rpc
    from tvm.rpc.tracker import Tracker

    from tvm_accel.farm import Farm
    from tvm_accel.rpc_server import register

    tracker = Tracker(host="127.0.0.1", port=9190, port_end=9290, silent=True)
    procs = [rpc.Server(host="127.0.0.1", port=9300, port_end=9400, key=key, silent=True,
                        tracker_addr=("127.0.0.1", tracker.port), server_init_callback=register)
             for _ in range(servers)]
    try:
        for _ in range(300):
            with contextlib.suppress(Exception):
                if Farm(("127.0.0.1", tracker.port), key).servers == servers:
                    break
            time.sleep(0.1)
        yield ("127.0.0.1", tracker.port)
    finally:
        for p in procs:
            p.terminate()
        tracker.terminate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--target", default="vta", choices=sorted(SCHEMES))
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--jobs", default="1,2", help="comma-separated process counts")
    ap.add_argument("--farm", default="", help="comma-separated farm sizes to start on this "
                    "machine, e.g. 1,2 (default: none)")
    args = ap.parse_args()

    import onnx

    from tvm_accel import quantize
    from tvm_accel.cli import main as tvmc
    from tvm_accel.evaluate import evaluate
    from tvm_accel.farm import Farm
    from tvm_accel.package import load_package

    model = quantize.quantized(args.model, **SCHEMES[args.target])
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "model.tar"
        onnx.save(model, Path(tmp) / "model.onnx")
        if tvmc(["compile", str(Path(tmp) / "model.onnx"), "--target",
                 f"{args.target}, llvm", "-o", str(pkg)]) != 0:
            raise SystemExit("compile failed")
        info = load_package(str(pkg)).meta
        spec = info.inputs[0]
        x = np.random.default_rng(0).standard_normal(
            (args.samples * spec.shape[0], *spec.shape[1:])).astype(np.float32)
        data = {spec.name: x}
        rows, base, ref = [], None, None
        for jobs in [int(j) for j in args.jobs.split(",")]:
            res = evaluate(pkg, data, jobs=jobs)
            base = base or res.seconds
            ref = ref if ref is not None else res.outputs[0]
            rows.append((f"{jobs} process(es)", res.seconds, np.array_equal(res.outputs[0], ref)))
        for size in [int(n) for n in args.farm.split(",") if n]:
            with local_farm(size, "bench") as addr:
                res = evaluate(pkg, data, jobs=size, farm=Farm(addr, "bench"))
                rows.append((f"farm, {size} local server(s)", res.seconds,
                             np.array_equal(res.outputs[0], ref)))
    print(f"{args.model} on {args.target}: {args.samples} samples, {os.cpu_count()} CPUs")
    print(f"{'run':<26} {'wall s':>8} {'samples/s':>10} {'speed-up':>9} {'same outputs':>13}")
    for name, sec, same in rows:
        print(f"{name:<26} {sec:>8.2f} {args.samples / sec:>10.1f} {base / sec:>8.2f}x "
              f"{'yes' if same else 'NO':>13}")


if __name__ == "__main__":
    main()
