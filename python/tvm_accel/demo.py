"""The main job: compile the bundled quantized model for every finished target, run it on the
simulator, check it bit-exactly against the CPU reference and print per-layer costs.

Each target gets the bundled CNN quantized the way its hardware expects: per-channel int8 for
VTA and MARSELLUS, power-of-two (fix-point) scales at batch 4 (one image per PE) for the DPU.

Run with ``python -m tvm_accel.demo`` (``scripts/demo.sh`` sets up a fresh machine first).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from tvm_accel.errors import AccelError

_MODELS = Path(__file__).parent / "models"
BUNDLED_MODELS = {"vta": _MODELS / "tiny_cnn_int8.onnx", "dpu": _MODELS / "tiny_cnn_pow2.onnx",
                  "marsellus": _MODELS / "tiny_cnn_int8.onnx"}
FINISHED_TARGETS = ("vta", "dpu", "marsellus")


def _run(ex, inputs):
    from tvm_accel.package import outputs_to_numpy

    vm = relax.VirtualMachine(ex, tvm.cpu())
    return outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(x) for x in inputs]))


def ort_lsb_difference(model_path: Path, inputs: list[np.ndarray],
                       outputs: list[np.ndarray]) -> float | None:
    """Largest difference from onnxruntime (no graph optimizations) in output LSBs.

    The looser check of the numerics contract: onnxruntime computes the QDQ model in float, so a
    few LSB of difference are expected; ``None`` if onnxruntime is not installed.
    """
    try:
        import onnx
        import onnxruntime as ort
        from onnx import numpy_helper
    except ImportError:
        return None
    model = onnx.load(str(model_path))
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    feed = {i.name: x for i, x in zip(sess.get_inputs(), inputs, strict=True)}
    worst = 0.0
    for out, ours, theirs in zip(model.graph.output, outputs, sess.run(None, feed), strict=True):
        node = producers.get(out.name)
        scale = 1.0
        if node is not None and node.op_type == "DequantizeLinear" and node.input[1] in inits:
            scale = float(np.max(inits[node.input[1]]))
        worst = max(worst, float(np.abs(ours.astype(np.float64) - theirs).max()) / scale)
    return worst


def run_target(name: str, model_path: Path, config: str | None = None) -> bool:
    """Compile, run, check and report one target; returns whether the outputs are bit-exact."""
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_accel.pipeline import compile_model, compile_reference
    from tvm_accel.profiler import profiling
    from tvm_accel.report import format_table
    from tvm_accel.target import get_target

    target = get_target(name)
    mod, info = load_onnx(str(model_path))
    inputs = list(random_inputs(info, seed=0).values())
    t0 = time.perf_counter()
    ex, report = compile_model(mod, target, config)
    t_compile = time.perf_counter() - t0
    ref = compile_reference(mod, target)
    batch = inputs[0].shape[0] if inputs and inputs[0].ndim else 1
    print(f"\n=== target {name} (config {report.config_name}): {model_path.name}, batch "
          f"{batch} (input {list(inputs[0].shape) if inputs else []}), compiled in "
          f"{t_compile:.1f} s ===")
    rows = [(r.layer, r.op, r.shape, r.placement, r.reason) for r in report.offloads]
    print(format_table(["layer", "op", "shape", "placement", "reason"], rows))
    t0 = time.perf_counter()
    with profiling() as prof:
        outs = _run(ex, inputs)
    t_run = time.perf_counter() - t0
    ref_outs = _run(ref, inputs)
    print()
    print(prof.table())
    exact = all(np.array_equal(a, b) for a, b in zip(outs, ref_outs, strict=True))
    diff = max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(outs, ref_outs,
                                                                           strict=True))
    print(f"\nbit-exact vs the CPU reference: {'yes' if exact else 'NO'} (max |diff| {diff:g}); "
          f"run (host + simulator) {t_run:.2f} s")
    lsb = ort_lsb_difference(model_path, inputs, outs)
    if lsb is not None:
        print(f"vs onnxruntime (float QDQ, information only): max difference {lsb:.0f} LSB")
    return exact


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None,
                   help="ONNX model for every target (default: the bundled model per target)")
    p.add_argument("--targets", default=",".join(FINISHED_TARGETS))
    args = p.parse_args(argv)
    ok = True
    try:
        for name in [t.strip() for t in args.targets.split(",") if t.strip()]:
            ok &= run_target(name, args.model or BUNDLED_MODELS[name])
    except AccelError as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 2
    print("\nall targets bit-exact" if ok else "\nMISMATCH against the reference")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
