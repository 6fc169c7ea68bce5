"""``tvmc``: compile, run and inspect models for the accelerator targets.

Follows upstream tvmc's flags: ``--target "vta, llvm"`` (accelerators first, host last),
``--target-<kind>-<option>`` (declared by each target), ``-o``, ``--dump-offloads``,
``-O/--opt-level``, ``--pass-config``, ``--inputs``, ``--outputs``, ``--fill-mode``,
``--print-time`` (``--number``, ``--repeat``), ``--print-top``, ``--profile``.

One module per verb: :mod:`~tvm_accel.cli.compiler` (compile), :mod:`~tvm_accel.cli.runner`
(run, timeline), :mod:`~tvm_accel.cli.tuner` (tune), :mod:`~tvm_accel.cli.quantizer`
(quantize), :mod:`~tvm_accel.cli.zoo` (zoo), :mod:`~tvm_accel.cli.disassembler`
(disassemble), :mod:`~tvm_accel.cli.compare` (compare), :mod:`~tvm_accel.cli.sweep` (sweep),
:mod:`~tvm_accel.cli.compare_targets` (compare-targets); :mod:`~tvm_accel.cli.common` holds
what they share.

Errors: every error a user can cause (model, config, precision file, knobs, package, inputs,
flags) prints one line on stderr, ``tvmc <verb>: error: <what, where, how to fix>``, and exits
with 2, whether it was raised here, inside a TVM pass or inside the VM (the project's
exceptions cross TVM's FFI as themselves, see :mod:`tvm_accel.errors`). Anything else is a bug:
one ``internal error`` line and exit 1. ``-v/--verbose`` adds the traceback for a bug report.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from tvm_accel.cli import (
    compare,
    compare_targets,
    compiler,
    disassembler,
    quantizer,
    runner,
    sweep,
    tuner,
    zoo,
)
from tvm_accel.cli.common import Parser, one_line, parse_target, version_line
from tvm_accel.errors import AccelError
from tvm_accel.report import TABLE_WIDTH, table_width

__all__ = ["build_parser", "describe_error", "main", "parse_target"]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="tvmc", description="Compile and run quantized models on accelerator "
               "simulators through Apache TVM.")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="on an error, also print the traceback (for a bug report)")
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="verb")
    compiler.add_parser(sub)
    tuner.add_parser(sub)
    runner.add_parsers(sub)
    compare.add_parser(sub)
    compare_targets.add_parser(sub)
    sweep.add_parser(sub)
    quantizer.add_parser(sub)
    zoo.add_parser(sub)
    disassembler.add_parser(sub)
    for verb in sub.choices.values():  # -v also after the verb, as users type it
        verb.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                          help=argparse.SUPPRESS)
        verb.add_argument("--wide", action="store_true", help="print tables whole (default: "
                          f"they fit {TABLE_WIDTH} columns, long cells cut)")
    p.set_defaults(verbs=sub.choices)
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The parsed command line; a missing verb lists the verbs, and an unknown flag points to
    the verb's own ``--help`` (argparse names the top-level parser for both)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.verb is None:
        parser.error(f"give a verb: {', '.join(args.verbs)}")
    if extra:
        args.verbs[args.verb].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def describe_error(exc: BaseException) -> tuple[int, str]:
    """Exit code and the one stderr line (after ``tvmc <verb>: ``) for an exception: 2 and the
    message for a user error, 1 and ``internal error`` for anything else (a bug)."""
    if isinstance(exc, AccelError):
        return 2, f"error: {one_line(str(exc))}"
    if isinstance(exc, OSError) and exc.filename is not None:
        why = "no such file" if isinstance(exc, FileNotFoundError) else exc.strerror
        return 2, f"error: {exc.filename}: {why}"
    return 1, (f"internal error: {type(exc).__name__}: {one_line(str(exc))} (a bug; rerun "
               "with -v and report the traceback)")


def main(argv: list[str] | None = None) -> int:
    """Run ``tvmc``; returns the exit code (0 ok, 2 user error, 1 internal error, 130 Ctrl-C:
    also in the middle of a simulation, see :func:`tvm_accel.simlib.call`)."""
    args = parse_args(argv)
    try:
        with table_width(None if args.wide else TABLE_WIDTH):
            return args.func(args)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"tvmc {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly, like other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        code, line = describe_error(e)
        if args.verbose:
            traceback.print_exc()
        sys.stdout.flush()
        print(f"tvmc {args.verb}: {line}", file=sys.stderr)
        return code

