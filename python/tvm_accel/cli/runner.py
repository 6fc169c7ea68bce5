"""``tvmc run`` and ``tvmc timeline``: a package on the simulator, its inputs checked against
the compiled signature, profiled, traced and timed on request; the VM's and simulator's
failures turned into one-line user errors. ``tvmc run`` on N stacked samples evaluates a
dataset (:mod:`tvm_accel.evaluate`: accuracy, agreement with onnxruntime)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from tvm_accel.cli.common import add_rpc_options, check_output_path, one_line, open_farm
from tvm_accel.errors import AccelError, BlobError

_T = TypeVar("_T")


def _check_input(path: str, arr: np.ndarray, spec, verb: str = "run") -> np.ndarray:
    """``arr`` as the model input ``spec`` describes: same shape, real numbers, finite; cast to
    the input's dtype, with a warning when the cast changes values (float64 rounded, int64
    wrapped)."""
    if arr.dtype.kind not in "biuf":
        raise AccelError(f"{path}: input '{spec.name}' has dtype {arr.dtype}, the model expects "
                         f"{spec.dtype} numbers")
    if list(arr.shape) != list(spec.shape):
        raise AccelError(f"{path}: input '{spec.name}' has shape {list(arr.shape)}, the model "
                         f"expects {spec.shape}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise AccelError(f"{path}: input '{spec.name}' contains NaN or infinity")
    cast = arr.astype(spec.dtype)
    if arr.dtype != cast.dtype:
        changed = cast.astype(arr.dtype) != arr
        if changed.any():
            worst = np.max(np.abs(cast.astype(np.float64) - arr.astype(np.float64)))
            print(f"tvmc {verb}: warning: {path}: input '{spec.name}' is {arr.dtype}, the model "
                  f"expects {spec.dtype}: the cast changes {np.count_nonzero(changed)} of "
                  f"{arr.size} values (by up to {worst:.3g}); save it as {spec.dtype}",
                  file=sys.stderr)
    return cast


def _check_names(path: str, data: dict, meta) -> None:
    """Every array of ``--inputs`` names a model input (or holds the labels): an unknown name
    is a typo, never silently ignored."""
    from tvm_accel.evaluate import LABELS_KEY

    names = [s.name for s in meta.inputs]
    unknown = [k for k in data if k not in names and k != LABELS_KEY]
    if unknown:
        raise AccelError(f"{path}: array '{unknown[0]}' is not an input of the model (its "
                         f"inputs: {', '.join(repr(n) for n in names)}; '{LABELS_KEY}' holds "
                         "labels)")


def _check_outputs(package: str, meta, outs: list[np.ndarray]) -> None:
    """The outputs ``mod.so`` returned against ``metadata.json``, as inputs are checked: a
    mismatch means the package was edited after compile."""
    from tvm_accel.errors import PackageError

    for spec, o in zip(meta.outputs, outs, strict=False):
        shape_ok = len(spec.shape) == o.ndim and all(
            d < 0 or d == n for d, n in zip(spec.shape, o.shape, strict=True))
        if not shape_ok or (spec.dtype and np.dtype(spec.dtype) != o.dtype):
            raise PackageError(f"{package}: mod.so returns output '{spec.name}' as "
                               f"{list(o.shape)} {o.dtype}, metadata.json says {spec.shape} "
                               f"{spec.dtype} (the package was edited after compile); "
                               "recompile the model with 'tvmc compile'")
    if len(outs) != len(meta.outputs) and meta.outputs:
        raise PackageError(f"{package}: mod.so returns {len(outs)} outputs, metadata.json "
                           f"lists {len(meta.outputs)}; recompile the model with 'tvmc compile'")


def _make_inputs(meta, args) -> list[np.ndarray]:
    from tvm_accel.frontend import read_npz

    data = read_npz(args.inputs, args.inputs, "inputs") if args.inputs else {}
    _check_names(args.inputs, data, meta)
    rng = np.random.default_rng(0)
    out = []
    for spec in meta.inputs:
        if spec.name in data:
            out.append(_check_input(args.inputs, np.asarray(data[spec.name]), spec, args.verb))
            continue
        if args.inputs and args.fill_mode is None:
            raise AccelError(f"{args.inputs}: no array named '{spec.name}' (have: "
                             f"{', '.join(data.keys()) or 'none'}); add it, or pass --fill-mode "
                             "to fill the inputs the file lacks")
        mode = args.fill_mode or "random"
        if mode == "zeros":
            out.append(np.zeros(spec.shape, spec.dtype))
        elif mode == "ones":
            out.append(np.ones(spec.shape, spec.dtype))
        else:
            out.append(rng.uniform(-1, 1, spec.shape).astype(spec.dtype))
    return out


def cmd_run(args) -> int:
    import tvm

    from tvm_accel import simlib
    from tvm_accel.package import load_package

    for flag in ("number", "repeat", "print_top", "jobs"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise AccelError(f"--{flag.replace('_', '-')} {value}: give at least 1")
    if args.max_cycles is not None and not 0 < args.max_cycles <= simlib.MAX_MAX_CYCLES:
        raise AccelError(f"--max-cycles {args.max_cycles}: give a positive number of cycles "
                         "(at most 2^62)")
    for flag, path, example in (("--outputs", args.outputs, "outputs.npz"),
                                ("--profile-csv", args.profile_csv, "profile.csv"),
                                ("--trace", args.trace, "trace.json")):
        if path:
            check_output_path(path, example, flag.lstrip("-").replace("-", " ") + " file", flag)
    pkg = load_package(args.package)
    if args.inputs:
        from tvm_accel.frontend import read_npz

        _check_names(args.inputs, read_npz(args.inputs, args.inputs, "inputs"), pkg.meta)
    if _dataset_mode(pkg.meta, args):
        return _run_dataset(args, pkg.meta)
    if args.rpc_tracker or args.rpc_key:
        raise AccelError("--rpc-tracker runs the samples of a dataset on a farm; give --inputs "
                         "with more samples than one batch of the model")
    if args.number is not None or args.repeat is not None:
        args.print_time = True
    inputs = [tvm.runtime.tensor(a) for a in _make_inputs(pkg.meta, args)]
    outs, summary = _run_checked(pkg, inputs, args)
    _check_outputs(args.package, pkg.meta, outs)
    names = [o.name for o in pkg.meta.outputs]
    names += [f"output_{i}" for i in range(len(names), len(outs))]
    if args.outputs:
        np.savez(args.outputs, **dict(zip(names, outs, strict=False)))  # type: ignore[arg-type]
        print(f"outputs written to {args.outputs}")
    else:
        for n, o in zip(names, outs, strict=False):
            flat = o.reshape(-1)
            print(f"{n}: shape {list(o.shape)} {o.dtype}  first values {flat[:8].tolist()}")
    if args.print_top:
        print(top_classes(names[0], outs[0], args.print_top))
    if summary:  # last, for scripts reading the last line
        print(summary)
    return 0


def _dataset_mode(meta, args) -> bool:
    """Whether ``tvmc run`` evaluates a dataset: ``--labels`` or ``--reference`` given, or an
    ``--inputs`` array holding more samples than one batch of the model, or labels."""
    if args.labels or args.reference:
        if not args.inputs:
            raise AccelError("--labels / --reference score the samples of --inputs; give "
                             "--inputs data.npz")
        return True
    if not args.inputs:
        return False
    from tvm_accel.evaluate import LABELS_KEY
    from tvm_accel.frontend import read_npz

    data = read_npz(args.inputs, args.inputs, "inputs")
    if LABELS_KEY in data and LABELS_KEY not in {s.name for s in meta.inputs}:
        return True
    return any(s.name in data and np.ndim(data[s.name]) == len(s.shape) and
               np.shape(data[s.name])[0] != s.shape[0] for s in meta.inputs)


def _run_dataset(args, meta) -> int:
    """``tvmc run`` on N stacked samples (:func:`tvm_accel.evaluate.evaluate`): a progress bar
    on stderr, top-1 / top-5 with labels, disagreement with onnxruntime with a reference."""
    from tvm_accel.evaluate import ProgressBar, evaluate

    for flag in ("profile", "profile_csv", "trace", "print_time", "number", "repeat"):
        if getattr(args, flag):
            verb = "times" if flag in ("print_time", "number", "repeat") else "profiles"
            raise AccelError(f"--{flag.replace('_', '-')} {verb} one run; give --inputs with a "
                             "single sample (and no --labels / --reference)")
    farm = open_farm(args)
    jobs = args.jobs
    res = _guarded(args, lambda: evaluate(
        args.package, args.inputs, args.labels, args.reference, progress=ProgressBar(),
        jobs=jobs, farm=farm))
    names = [o.name for o in meta.outputs]
    names += [f"output_{i}" for i in range(len(names), len(res.outputs))]
    if args.outputs:
        np.savez(args.outputs, **dict(zip(names, res.outputs, strict=False)))
        print(f"outputs of {res.n} samples written to {args.outputs}")
    if args.print_top:
        print(top_classes(names[0], res.outputs[0], args.print_top))
    print(res.format(f"onnxruntime ({os.path.basename(args.reference)})" if args.reference
                     else "onnxruntime"))
    return 0


def _run_checked(pkg, inputs: list, args) -> tuple[list[np.ndarray], str | None]:
    """:func:`_execute` under the ``--max-cycles`` budget, its user errors as one line."""
    return _guarded(args, lambda: _execute(pkg, inputs, args))


def _guarded(args, run: Callable[[], _T]) -> _T:
    """``run()`` under the ``--max-cycles`` budget, its user errors as one line."""
    from tvm_accel import simlib

    try:
        with simlib.cycle_budget(args.max_cycles):
            return run()
    except simlib.CycleBudgetError as e:
        msg = one_line(str(e)).removesuffix("; raise max_cycles if the program is legitimate")
        budget = args.max_cycles or f"default 2^34 = {simlib.DEFAULT_MAX_CYCLES}"
        raise AccelError(f"{args.package}: {msg}; raise --max-cycles (now {budget} cycles per "
                         "simulator run) if the program is legitimate") from e
    except Exception as e:
        translated = _run_error(args.package, e)
        if translated is None:
            raise
        raise translated from e


def cmd_timeline(args) -> int:
    """``tvmc timeline``: run a package of any target once, traced, and draw the trace (one
    lane per unit, one bar per instruction; :func:`tvm_accel.timeline.trace_to_png`)."""
    import tvm

    from tvm_accel.package import load_package
    from tvm_accel.timeline import trace_to_png

    png = args.output or os.path.splitext(os.path.basename(args.package))[0] + "_timeline.png"
    check_output_path(png, "timeline.png", "picture")
    args.trace = args.trace or os.path.splitext(png)[0] + ".json"
    check_output_path(args.trace, "timeline.json", "trace")
    args.profile = args.print_time = False
    args.profile_csv = None
    pkg = load_package(args.package)
    if not pkg.meta.target:
        raise AccelError(f"{args.package}: compiled for the CPU only; there is no accelerator "
                         "program to draw")
    inputs = [tvm.runtime.tensor(a) for a in _make_inputs(pkg.meta, args)]
    _run_checked(pkg, inputs, args)
    trace_to_png(args.trace, png, title=args.title or
                 f"{os.path.basename(args.package)} on {pkg.meta.target} ({pkg.meta.config})")
    print(f"timeline written to {png} (trace {args.trace})")
    return 0


def _execute(pkg, inputs: list, args) -> tuple[list[np.ndarray], str | None]:
    """Run ``main`` once (profiled and traced when asked), then time it for --print-time;
    returns the outputs and, with --profile, the JSON summary line (printed last)."""
    import tvm

    from tvm_accel.package import outputs_to_numpy
    from tvm_accel.profiler import profiling, time_host_functions

    vm = pkg.vm()
    summary = None
    if args.profile or args.trace or args.profile_csv:
        with profiling(args.trace) as prof:
            timed = pkg.vm()
            time_host_functions(timed, pkg.meta.host_functions, prof)
            result = timed["main"](*inputs)
        if args.profile:
            print(prof.table())
            summary = "summary: " + json.dumps(prof.summary(), sort_keys=True)
        if args.profile_csv:
            prof.write_csv(args.profile_csv)
            print(f"per-layer profile written to {args.profile_csv}")
        if args.trace and args.verb == "run":  # tvmc timeline names both of its files
            print(f"timeline written to {args.trace}")
    else:
        result = vm["main"](*inputs)
    outs = outputs_to_numpy(result)
    if args.print_time:
        number, repeat = args.number or 1, args.repeat or 3
        t = vm.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat)(*inputs)
        print(time_table(list(t.results), number))
    return outs, summary


def time_table(results: list[float], number: int) -> str:
    """``--print-time``: wall time per run (host + simulator) in ms over ``len(results)``
    measurements (``--repeat``), each the mean of ``number`` runs (``--number``), as upstream
    tvmc prints it. Simulated cycles do not depend on it: each run simulates the same program."""
    from tvm_accel.report import format_table

    ms = np.asarray(results) * 1e3
    table = format_table(["mean (ms)", "median (ms)", "max (ms)", "min (ms)", "std (ms)"],
                         [tuple(f"{v:.2f}" for v in (ms.mean(), np.median(ms), ms.max(),
                                                     ms.min(), ms.std()))], "rrrrr")
    return (f"wall time per run (host + simulator), {len(ms)} measurement(s) of {number} "
            f"run(s):\n{table}")


def top_classes(name: str, output: np.ndarray, n: int) -> str:
    """``--print-top N``: the N highest-scoring classes of each sample of ``output`` (samples
    along the leading axis, classes the rest flattened), best first, ties to the lower
    index, with their scores."""
    scores = output.reshape(output.shape[0] if output.ndim > 1 else 1, -1)
    n = min(n, scores.shape[1])
    lines = [f"top-{n} classes of output '{name}' (class: score):"]
    for i, row in enumerate(scores):
        best = np.argsort(-row.astype(np.float64), kind="stable")[:n]
        lines.append(f"  sample {i}: " + ", ".join(f"{c}: {row[c]:.4g}" for c in best))
    return "\n".join(lines)


#: how the VM reports an argument of ``main`` that does not match the compiled signature
_VM_ARG_MISMATCH = re.compile(r"ErrorContext\(fn=main, loc=param\[\d+\], param=([^,]+), "
                              r"annotation=(.*?)\)\s\s")


def _run_error(package: str, exc: Exception) -> AccelError | None:
    """The user error behind a failed VM call, or None for a bug. The project's own errors (a
    blob or the simulator refusing the program) get the package named; the VM refusing inputs
    that match metadata.json means metadata.json and mod.so disagree."""
    from tvm_accel.evaluate import DatasetError

    if isinstance(exc, DatasetError):  # names its own file (samples, labels, reference)
        return None
    if isinstance(exc, AccelError):
        msg = one_line(str(exc))
        if isinstance(exc, BlobError) and "recompile" not in msg:
            msg += "; recompile the model with 'tvmc compile'"
        return AccelError(f"{package}: {msg}")
    m = _VM_ARG_MISMATCH.search(str(exc))
    if m:
        from tvm_accel.errors import PackageError

        return PackageError(f"{package}: mod.so expects input '{m[1]}' as {m[2]}, not as "
                            "metadata.json describes it (the package was edited after compile);"
                            " recompile the model with 'tvmc compile'")
    return None


def add_parsers(sub) -> None:
    """``run`` and ``timeline``."""
    r = sub.add_parser("run", help="run a compiled package on the simulator")
    r.add_argument("package")
    r.add_argument("--inputs", metavar="NPZ", help="input arrays by name (.npz); N samples "
                   "stacked along the first axis ([N, 3, 32, 32] for a [1, 3, 32, 32] input) "
                   "run one after the other")
    r.add_argument("--outputs", metavar="NPZ", help="write outputs to this .npz (stacked for "
                   "N samples)")
    r.add_argument("--labels", metavar="NPY", help="class index per sample (.npy; or an array "
                   "'labels' in --inputs): print top-1 and top-5 accuracy")
    r.add_argument("--reference", metavar="ONNX", help="the QDQ model the package was compiled "
                   "from: count the samples whose top-1 class differs from onnxruntime's")
    r.add_argument("--fill-mode", choices=["zeros", "ones", "random"],
                   help="fill the inputs absent from --inputs (without it, every input must be "
                   "in the file); without --inputs, every input is filled (default random)")
    r.add_argument("--print-top", type=int, metavar="N",
                   help="print the N highest-scoring classes of each sample of the first output")
    r.add_argument("--print-time", action="store_true",
                   help="print host wall time per run (mean, median, max, min, std)")
    r.add_argument("--number", type=int, metavar="N", help="runs averaged into one "
                   "measurement of --print-time (default 1; implies --print-time)")
    r.add_argument("--repeat", type=int, metavar="N", help="measurements of --print-time "
                   "(default 3; implies --print-time)")
    r.add_argument("--profile", action="store_true",
                   help="per-layer table: cycles, utilization, bytes moved")
    r.add_argument("--profile-csv", metavar="FILE",
                   help="write the per-layer profile as CSV (one row per layer)")
    r.add_argument("--trace", metavar="JSON", help="write a Chrome-trace timeline of the run")
    r.add_argument("--max-cycles", type=int, metavar="N",
                   help="cycle budget of each simulator run (one per accelerator layer, "
                   "default 2^34); a run that exceeds it stops with an error")
    r.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="processes the samples of a dataset run are spread over (default: "
                   "this machine's cores when the run would take more than a few seconds, "
                   "else 1, which runs them in this process; with --rpc-tracker: servers "
                   "used at once, default all); results are the same and in input order")
    add_rpc_options(r, "run a dataset's samples on the servers")
    r.set_defaults(func=cmd_run)
    tl = sub.add_parser("timeline", help="run a package once, traced, and draw its timeline "
                        "(PNG: one lane per unit, one bar per instruction)")
    tl.add_argument("package")
    tl.add_argument("-o", "--output", metavar="PNG",
                    help="picture to write (default: <package>_timeline.png)")
    tl.add_argument("--trace", metavar="JSON",
                    help="also keep the Chrome trace here (default: beside the picture)")
    tl.add_argument("--inputs", metavar="NPZ", help="input arrays by name (.npz)")
    tl.add_argument("--fill-mode", choices=["zeros", "ones", "random"],
                    help="fill the inputs absent from --inputs (without it, every input must "
                    "be in the file); without --inputs, every input is filled (default random)")
    tl.add_argument("--max-cycles", type=int, metavar="N",
                    help="cycle budget of each simulator run (default 2^34)")
    tl.add_argument("--title", help="title of the picture")
    tl.set_defaults(func=cmd_timeline)
