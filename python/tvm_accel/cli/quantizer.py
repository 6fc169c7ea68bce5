"""``tvmc quantize``: a float ONNX model -> a QDQ model (:mod:`tvm_accel.quantize`)."""

from __future__ import annotations

import os
import sys

from tvm_accel.cli.common import check_output_path, one_line
from tvm_accel.errors import AccelError


def cmd_quantize(args) -> int:
    """``tvmc quantize``: dispatch to :func:`tvm_accel.quantize.quantize_model`, write the
    model, print its warnings (random calibration) and one summary line."""
    import json
    import warnings

    from tvm_accel.quantize import (
        PROVENANCE_KEY,
        CalibrationWarning,
        default_output,
        quantize_model,
        quantized_nodes,
        save_model,
    )

    out = args.output or default_output(args.model)
    check_output_path(out, os.path.basename(default_output(args.model)), "model")
    if os.path.isfile(out) and os.path.isfile(args.model) and os.path.samefile(out, args.model):
        raise AccelError(f"-o {out}: is the input model; give another file name, e.g. "
                         f"{default_output(args.model)}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CalibrationWarning)
        q = quantize_model(args.model, args.calibration, scheme=args.scheme,
                           activation_type=args.activation_type, samples=args.samples,
                           seed=args.seed)
    for w in caught:
        if issubclass(w.category, CalibrationWarning):
            print(f"tvmc quantize: warning: {one_line(str(w.message))}", file=sys.stderr)
    save_model(q, out)
    nodes = quantized_nodes(q)
    ops = ", ".join(f"{op} {n}" for op, n in sorted(nodes.items(), key=lambda t: (-t[1], t[0])))
    how = json.loads(next(p.value for p in q.metadata_props if p.key == PROVENANCE_KEY))
    source = (f"{how['samples']} sample(s) of {args.calibration}" if args.calibration else
              f"{how['samples']} random sample(s) (seed {args.seed})")
    print(f"quantized {args.model}: {sum(nodes.values())} node(s) ({ops}), scheme {args.scheme},"
          f" {args.activation_type} activations, calibrated on {source} -> {out}")
    return 0


def add_parser(sub) -> None:
    from tvm_accel.quantize import ACTIVATION_TYPES, DEFAULT_SAMPLES, SCHEMES

    q = sub.add_parser(
        "quantize", help="quantize a float ONNX model into a QDQ model (onnxruntime's static "
        "quantizer)", description="Quantize a float ONNX model into a QDQ model with "
        "onnxruntime's static quantizer (MinMax calibration, int8 weights).")
    q.add_argument("model", help="float ONNX model")
    q.add_argument("-o", "--output", metavar="ONNX",
                   help="quantized model to write (default: <model>_q.onnx beside the model)")
    q.add_argument("--calibration", metavar="NPZ",
                   help="calibration inputs: a .npz with one array per model input, named "
                   "after it, samples stacked along the first axis (an input of shape "
                   "[B, ...] takes [N*B, ...] for N samples, e.g. [N, 3, 224, 224] for a "
                   "batch-1 image model); default: random data (a warning: the scales are "
                   "then not representative)")
    q.add_argument("--scheme", default="per-channel", choices=SCHEMES,
                   help="weight scales: per output channel (default), per tensor, or "
                   "power-of-two (symmetric int8, every scale a power of two: for the dpu "
                   "target, which requantizes by shifting)")
    q.add_argument("--activation-type", default="int8", choices=ACTIVATION_TYPES,
                   help="activation type (default int8; power-of-two needs int8)")
    q.add_argument("--samples", type=int, metavar="N",
                   help="calibration samples: the first N of --calibration (default all), or "
                   f"N random ones (default {DEFAULT_SAMPLES})")
    q.add_argument("--seed", type=int, default=0, help="seed of the random calibration data")
    q.set_defaults(func=cmd_quantize)
