"""``tvmc zoo``: list the model zoo or write one of its float networks as ONNX."""

from __future__ import annotations

import numpy as np

from tvm_accel import quantize
from tvm_accel.cli.common import check_output_path
from tvm_accel.errors import AccelError


def cmd_zoo(args) -> int:
    """``tvmc zoo``: list the model zoo, or write one of its float networks as ONNX (seeded
    weights, no download), optionally with seeded random calibration samples."""
    import inspect

    from tvm_accel import zoo

    if not args.model:
        for name in zoo.MODELS:
            doc = " ".join((inspect.getdoc(zoo.MODELS[name]) or "").split("\n\n")[0].split())
            first = doc.split(". ")[0].rstrip(".")
            print(f"{name:16s} {first if len(first) <= 90 else first[:87] + '...'}")
        return 0
    if args.model not in zoo.MODELS:
        import difflib

        near = difflib.get_close_matches(args.model, zoo.MODELS, n=1)
        raise AccelError(f"zoo: no model '{args.model}'"
                         + (f" (did you mean {near[0]}?)" if near else "")
                         + f"; available: {', '.join(zoo.MODELS)}")
    out = args.output or f"{args.model}_fp32.onnx"
    check_output_path(out, f"{args.model}_fp32.onnx", "model")
    builder = zoo.MODELS[args.model]
    kw = {"seed": args.seed, "batch": args.batch}
    if args.hw is not None:
        if "hw" not in inspect.signature(builder).parameters:
            raise AccelError(f"zoo: {args.model} has a fixed input size; drop --hw")
        kw["hw"] = args.hw
    if args.batch < 1 or (args.hw is not None and args.hw < 8):
        raise AccelError("zoo: --batch must be >= 1 and --hw >= 8")
    model = builder(**kw)
    import onnx

    onnx.save(model, out)
    shape = zoo.input_shape(model)
    print(f"wrote {args.model} (float, input {list(shape)}) -> {out}")
    if args.calibration_out:
        check_output_path(args.calibration_out, "inputs.npz", "calibration file")
        samples = quantize.random_calibration(model, seed=args.seed, n=args.samples)
        stacked = {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}
        np.savez(args.calibration_out, **stacked)  # type: ignore[arg-type]
        print(f"wrote {args.samples} seeded random calibration sample(s) -> "
              f"{args.calibration_out} (use your own data for representative scales)")
    return 0


def add_parser(sub) -> None:
    z = sub.add_parser("zoo", help="list the model zoo, or write one of its float networks "
                       "as ONNX (seeded weights, nothing downloaded)")
    z.add_argument("model", nargs="?", help="network to write (no name: list them)")
    z.add_argument("-o", "--output", metavar="ONNX",
                   help="model file to write (default: <model>_fp32.onnx)")
    z.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    z.add_argument("--hw", type=int, help="input height = width, for the models that take it")
    z.add_argument("--seed", type=int, default=0, help="weight (and sample) seed")
    z.add_argument("--calibration-out", metavar="NPZ",
                   help="also write seeded random calibration samples for 'tvmc quantize "
                   "--calibration'")
    z.add_argument("--samples", type=int, default=8, help="samples in --calibration-out")
    z.set_defaults(func=cmd_zoo)
