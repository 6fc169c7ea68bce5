"""``tvmc tune``: the model's offloaded layers tuned on the simulator
(:func:`tvm_accel.tuning.autotuner.tune_model`), then one table row per task.

As upstream tvmc: ``tvmc tune model.onnx --target "vta, llvm" -o records.json [--tuner
xgb|ga|random|gridsearch] [--trials N] [--early-stopping N] [--parallel N] [--timeout S]
[--tuning-records previous.json]`` plus the target's ``--target-<kind>-*`` options.
"""

from __future__ import annotations

import argparse

from tvm_accel.cli.common import (
    add_input_shapes_option,
    add_pass_context_options,
    add_rpc_options,
    add_target_options,
    check_output_path,
    open_farm,
    parse_input_shapes,
    parse_target,
    pass_context,
    target_knobs,
    target_options,
    user_warnings,
)
from tvm_accel.errors import AccelError
from tvm_accel.tuning.autotuner import TUNERS, TaskOutcome, TuneOptions, tune_model


def add_parser(sub) -> None:
    t = sub.add_parser("tune", help="tune the offloaded layers' knobs on the simulator")
    t.add_argument("model", help="ONNX model (float or QDQ-quantized)")
    t.add_argument("--target", required=True, help='targets, host last, e.g. "vta, llvm"')
    add_target_options(t)
    add_input_shapes_option(t)
    t.add_argument("-o", "--output", required=True,
                   help="tuning records (JSON lines, appended; an existing file resumes)")
    t.add_argument("--tuner", default="xgb", help=f"search ({', '.join(TUNERS)}; default xgb)")
    t.add_argument("--trials", type=int, default=64, help="trials per task (default 64)")
    t.add_argument("--early-stopping", type=int, metavar="N",
                   help="stop a task after N trials without improvement")
    t.add_argument("--parallel", type=int, metavar="N",
                   help="measurement worker processes (default: all cores)")
    t.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="seconds per measurement before it counts as an error (default 30)")
    t.add_argument("--tuning-records", metavar="FILE",
                   help="earlier records: their points are not measured again")
    t.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    t.add_argument("--precision-config", metavar="FILE", help="as for tvmc compile")
    add_pass_context_options(t)  # the compile that finds the tasks runs in them, as compile's
    add_rpc_options(t, "measure on the servers")
    t.set_defaults(func=cmd_tune)



def tune_from_args(args: argparse.Namespace) -> list[TaskOutcome]:
    """:func:`~tvm_accel.tuning.autotuner.tune_model` for parsed ``tvmc tune`` arguments."""
    from tvm_accel.frontend import load_onnx
    from tvm_accel.target import get_target

    options = TuneOptions(args.tuner, args.trials, args.early_stopping, args.parallel,
                          args.timeout, args.seed, open_farm(args))
    accel, host = parse_target(args.target)
    if accel is None:
        raise AccelError('--target: tune needs an accelerator before the host, e.g. '
                         '"vta, llvm"')
    check_output_path(args.output, "records.json", "tuning records")
    precision = None
    if args.precision_config:
        from tvm_accel.precision import load_precision

        precision = load_precision(args.precision_config)
    target = get_target(accel)
    cfg = target.load_config(target_options(accel, args)["config"])
    mod, _ = load_onnx(args.model, shapes=parse_input_shapes(args.input_shapes))
    return tune_model(mod, target, cfg, target_knobs(accel, args), host, args.output, options,
                      args.tuning_records, precision, args.model)


def cmd_tune(args: argparse.Namespace) -> int:
    """``tvmc tune``: :func:`tune_model`, then its table (energy columns only when a task
    reported energy)."""
    from tvm_accel.precision import PrecisionWarning
    from tvm_accel.report import format_table
    from tvm_accel.tuning.records import RecordWarning

    with user_warnings("tune", PrecisionWarning, RecordWarning), pass_context(args):
        outcomes = tune_from_args(args)
    if not outcomes:
        _explain_no_tasks(args)
        return 0
    energy = any(o.default_energy_uj is not None or o.best_energy_uj is not None
                 for o in outcomes)
    rows = []
    for o in outcomes:
        row: list = [o.task.layers[0], o.task.name, o.task.shape or "-", o.trials]
        if o.best_cycles is None:
            row += ["-", "-", "-"] + (["-", "-"] if energy else []) + [
                f"no valid configuration ({o.errors} errors)"]
        else:
            d = o.default_cycles
            row += [f"{d:,}" if d else "-", f"{o.best_cycles:,}",
                    f"{d / o.best_cycles:.2f}x" if d else "-"]
            row += [_energy(o.default_energy_uj), _energy(o.best_energy_uj)] if energy else []
            row.append("")
        if len(o.task.layers) > 1:  # layers of one workload share the task and its result
            row[-1] = "; ".join(filter(None, [row[-1], "also " + ", ".join(o.task.layers[1:])]))
        rows.append(row)
    heads = ["layer", "task", "shape", "trials", "default cycles", "tuned cycles", "speedup",
             *(["default uJ", "tuned uJ"] if energy else []), "note"]
    print(format_table(heads, rows))
    print(DEFAULT_NOTE)
    return 0


#: why a layer's cycles here differ from ``tvmc run --profile``'s (measured on ResNet-20, VTA:
#: layer2.0.conv2 15,870 here vs 15,562 profiled = the strategy's knobs; layer3.0.add 4,719 vs
#: 4,911 with the same knobs = the halo border its output is stored with for the next conv)
DEFAULT_NOTE = ("cycles: each layer alone (plain inputs, no halo around its output), default = "
                "its knob space's default;\n`tvmc run --profile` shows it in the model, where "
                "the compile's strategy may pick other knobs\nand its neighbours' layouts add "
                "loads or stores (e.g. the halo border a next conv reads)")


def _explain_no_tasks(args: argparse.Namespace) -> None:
    """After "no tunable layers": a float model is the usual cause; say how to quantize it."""
    import onnx

    from tvm_accel.quantize import default_output, is_quantized

    if is_quantized(onnx.load(args.model, load_external_data=False)):
        return
    accel, _ = parse_target(args.target)
    print(f"note: {args.model} is not quantized (no QuantizeLinear/DequantizeLinear), and only "
          f"quantized layers run on the {accel}; quantize it first: tvmc quantize {args.model} "
          f"-o {default_output(args.model)}{' --scheme power-of-two' if accel == 'dpu' else ''}")


def _energy(uj: float | None) -> str:
    return "-" if uj is None else f"{uj:.3f}"
