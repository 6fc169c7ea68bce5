"""``tvmc compare``: each layer's integer output against onnxruntime's on the same inputs
(:func:`tvm_accel.compare.compare_layers`), worst layer first; ``--max-lsb`` makes it a check."""

from __future__ import annotations

import sys

from tvm_accel.cli.common import (
    add_input_shapes_option,
    add_requant_error_option,
    add_target_options,
    add_tuning_records_option,
    parse_input_shapes,
    parse_target,
    target_knobs,
    target_options,
    tuning_records,
)
from tvm_accel.errors import AccelError


def cmd_compare(args) -> int:
    from tvm_accel.compare import compare_layers
    from tvm_accel.frontend import read_npz
    from tvm_accel.target import get_target

    if args.max_lsb is not None and args.max_lsb < 0:
        raise AccelError(f"--max-lsb {args.max_lsb}: give a number of LSBs >= 0")
    if args.top is not None and args.top < 1:
        raise AccelError(f"--top {args.top}: give at least 1 layer to show")
    accel, host = parse_target(args.target)
    config = knobs = None
    if accel is not None:
        config = get_target(accel).load_config(target_options(accel, args)["config"])
        knobs = target_knobs(accel, args)
    precision = None
    if args.precision_config:
        from tvm_accel.precision import load_precision

        precision = load_precision(args.precision_config)
    inputs = read_npz(args.inputs, args.inputs, "inputs") if args.inputs else None
    with tuning_records(args.tuning_records):
        report = compare_layers(args.model, accel, inputs, config=config, knobs=knobs,
                                precision=precision, seed=args.seed, host=host,
                                shapes=parse_input_shapes(args.input_shapes),
                                max_requant_error=args.max_requant_error)
    print(report.format(args.top))
    if args.max_lsb is not None and report.max_lsb > args.max_lsb:
        worst = report.worst()
        assert worst is not None
        sys.stdout.flush()
        print(f"tvmc compare: {worst.layer} differs from onnxruntime by {worst.max_lsb} LSB, "
              f"more than --max-lsb {args.max_lsb}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("compare", help="compare every layer's integer output with onnxruntime "
                       "(max LSB difference, share of elements that differ)")
    c.add_argument("model", help="QDQ-quantized ONNX model")
    c.add_argument("--target", required=True,
                   help='targets, host last, e.g. "vta, llvm" ("llvm": the CPU reference)')
    add_target_options(c)
    add_input_shapes_option(c)
    c.add_argument("--precision-config", metavar="FILE",
                   help="per-layer W/I/O bits, as for 'tvmc compile' (onnxruntime runs the "
                   "model as it is)")
    add_requant_error_option(c)
    add_tuning_records_option(c)
    c.add_argument("--inputs", metavar="NPZ",
                   help="input arrays by name (.npz); default: seeded random inputs")
    c.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    c.add_argument("--max-lsb", type=int, metavar="N",
                   help="exit with 1 if a layer differs by more than N LSB")
    c.add_argument("--top", type=int, metavar="K", help="show the worst K layers only")
    c.set_defaults(func=cmd_compare)
