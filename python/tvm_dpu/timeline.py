"""Timeline of a zoo model on the DPU: ``python -m tvm_dpu.timeline resnet50 -o prefix``
compiles it (power-of-two QDQ, batch = PEs), runs it traced and draws the picture with the
core's :func:`tvm_accel.timeline.trace_to_png` (``tvmc timeline`` does the same for any
compiled package of any target)."""

from __future__ import annotations

from pathlib import Path

from tvm_accel import quantize
from tvm_accel.errors import AccelError
from tvm_accel.timeline import trace_to_png

__all__ = ["main", "model_timeline", "trace_to_png"]


def model_timeline(model: str, out_prefix: str | Path, config: str | None = None,
                   batch: int | None = None, hw: int | None = None) -> tuple[Path, Path]:
    """Compile a zoo model for the DPU (power-of-two QDQ, batch = number of PEs), run it once on
    the simulator with tracing and write ``<prefix>.json`` (Chrome trace) and ``<prefix>.png``."""
    import tvm
    from tvm import relax

    import tvm_dpu
    from tvm_accel import zoo
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_accel.pipeline import compile_model
    from tvm_accel.profiler import profiling

    if model not in zoo.MODELS:
        raise AccelError(f"unknown model {model} (zoo: {', '.join(sorted(zoo.MODELS))})")
    cfg = tvm_dpu.load_config(config)
    kw = {"hw": hw} if hw else {}
    onnx_model = quantize.ort_quantize(zoo.MODELS[model](batch=batch or cfg.NUM_PE, **kw),
                              power_of_two=True)
    mod, info = load_onnx(onnx_model)
    ex, _ = compile_model(mod, tvm_dpu.TARGET, cfg)
    inputs = [tvm.runtime.tensor(x) for x in random_inputs(info, seed=0).values()]
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    trace = prefix.with_suffix(".json")
    with profiling(str(trace)):
        relax.VirtualMachine(ex, tvm.cpu())["main"](*inputs)
    png = trace_to_png(trace, prefix.with_suffix(".png"),
                       title=f"{model} on {cfg.name}, batch {batch or cfg.NUM_PE}")
    return trace, png


def main(argv: list[str] | None = None) -> int:
    """``python -m tvm_dpu.timeline resnet50 -o resnet50_dpu``: trace JSON + PNG of a model."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tvm_dpu.timeline",
                                description="Trace JSON and timeline PNG of a zoo model run on "
                                            "the DPU simulator")
    p.add_argument("model", help="zoo model name, e.g. resnet50")
    p.add_argument("-o", "--output", default=None, help="output prefix (default: <model>_dpu)")
    p.add_argument("--config", default=None, help="DPU config name or JSON path")
    p.add_argument("--hw", type=int, default=None, help="input height/width (default: full)")
    args = p.parse_args(argv)
    try:
        trace, png = model_timeline(args.model, args.output or f"{args.model}_dpu", args.config,
                                    hw=args.hw)
    except AccelError as e:
        print(f"error: {e}")
        return 1
    print(f"trace written to {trace}\ntimeline written to {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
