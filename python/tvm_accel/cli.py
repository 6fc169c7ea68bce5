"""``tvmc``: compile, run and inspect models for the accelerator targets.

Follows upstream tvmc's flags: ``--target "vta, llvm"`` (accelerators first, host last),
``--target-<kind>-<option>``, ``-o``, ``--dump-offloads``, ``--inputs``, ``--outputs``,
``--fill-mode``, ``--print-time``, ``--profile``.

Errors: every error a user can cause (model, config, precision file, knobs, package, inputs,
flags) prints one line on stderr, ``tvmc <verb>: error: <what, where, how to fix>``, and exits
with 2, whether it was raised here, inside a TVM pass or inside the VM (the project's
exceptions cross TVM's FFI as themselves, see :mod:`tvm_accel.errors`). Anything else is a bug:
one ``internal error`` line and exit 1. ``-v/--verbose`` adds the traceback for a bug report.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from dataclasses import asdict

import numpy as np

from tvm_accel.errors import AccelError, BlobError, MappingError

ACCEL_TARGETS = ("vta", "dpu", "marsellus")
HOSTS = ("llvm", "c")


def parse_target(text: str) -> tuple[str | None, str]:
    """``"vta, llvm"`` -> ``("vta", "llvm")``; the host must come last and may be a full TVM
    target string (``"vta, llvm -mcpu=skylake"``, ``"dpu, c"``)."""
    kinds: list[str] = []
    for piece in (t.strip() for t in text.split(",")):  # "-mattr=+avx2,+fma" keeps its comma
        last = kinds[-1].split()[-1] if kinds else ""
        if last.startswith("-") and "=" in last and piece and " " not in piece:
            kinds[-1] += "," + piece
        elif piece:
            kinds.append(piece)
    if not kinds:
        raise AccelError("--target is empty; use e.g. --target \"vta, llvm\"")
    host = kinds[-1]
    if host.split()[0] not in HOSTS:
        raise AccelError(f"--target: the last target must be the host ({', '.join(HOSTS)}, "
                         f"with options such as 'llvm -mcpu=skylake'), got '{host}'")
    _check_host(host)
    accels = kinds[:-1]
    for k in accels:
        if k not in ACCEL_TARGETS:
            raise AccelError(f"--target: unknown accelerator '{k}' (available: "
                             f"{', '.join(ACCEL_TARGETS)})")
    if len(accels) > 1:
        raise AccelError("--target: give at most one accelerator before the host")
    return (accels[0] if accels else None), host


def _check_host(host: str) -> None:
    """A host target string TVM accepts (``llvm -mcpu=...`` with a CPU LLVM knows)."""
    from tvm_accel.pipeline import host_target

    try:
        host_target(host)
    except Exception as e:
        why = _one_line(str(e))
        m = re.search(r"Attribute '([^']+)' is not available", why)
        why = why.split(". Target creation")[0]
        raise AccelError(f"--target: host '{host}' is not a valid TVM target: "
                         + (f"{host.split()[0]} has no option -{m[1]}" if m else why)) from None


#: ``name:[1,3,224,224]`` of ``--input-shapes`` (upstream tvmc's syntax)
_SHAPE_ITEM = re.compile(r"\s*([^\s:][^:]*?)\s*:\s*\[([^\]]*)\]\s*")


def parse_input_shapes(text: str | None) -> dict[str, list[int]] | None:
    """``--input-shapes "input:[1,3,224,224] mask:[1,128]"`` -> ``{name: shape}``; each
    dimension a positive integer."""
    if not text:
        return None
    out, pos = {}, 0
    while pos < len(text):
        m = _SHAPE_ITEM.match(text, pos)
        if m is None:
            raise AccelError(f"--input-shapes: cannot read '{text[pos:].strip()}'; give "
                             "name:[d0,d1,...] per input, space-separated, e.g. "
                             "\"input:[1,3,224,224]\"")
        dims = [d.strip() for d in m[2].split(",") if d.strip()]
        if not dims or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise AccelError(f"--input-shapes: {m[1]}: dimensions must be positive integers, "
                             f"got [{m[2]}]")
        out[m[1]] = [int(d) for d in dims]
        pos = m.end()
    return out


def _onnx_signature(path: str, shapes: dict[str, list[int]] | None = None):
    """``(inputs, outputs, quantized)``: the graph's input and output specs (dynamic input
    dimensions from ``shapes``), and whether it holds any Q/DQ (or other quantized) operator."""
    import onnx

    from tvm_accel.package import TensorSpec
    from tvm_accel.quantize import is_quantized

    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def spec(vi):
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        return TensorSpec(vi.name, shape, dtype)

    inputs = [spec(v) for v in model.graph.input if v.name not in inits]
    for t in inputs:
        if shapes and t.name in shapes:
            t.shape = list(shapes[t.name])
    return inputs, [spec(v) for v in model.graph.output], is_quantized(model)


def _not_quantized(accel: str) -> str:
    """Reason of a layer of a float model: the targets offload quantized layers only."""
    return (f"model not quantized (no Q/DQ; the {accel} runs quantized layers): "
            "run 'tvmc quantize'")


def cmd_compile(args) -> int:
    from tvm_accel.frontend import load_onnx
    from tvm_accel.lower import compile_progress
    from tvm_accel.package import PackageMetadata, save_package
    from tvm_accel.pipeline import compile_reference
    from tvm_accel.quantize import default_output
    from tvm_accel.report import format_table
    from tvm_accel.target import get_target

    accel, host = parse_target(args.target)
    _check_output_path(args.output)
    if args.dump_offloads not in (None, "-", "all") and (
            os.path.isdir(args.dump_offloads)
            or not os.path.isdir(os.path.dirname(os.path.abspath(args.dump_offloads)))):
        raise AccelError(f"--dump-offloads {args.dump_offloads}: not a file in an existing "
                         "directory")
    precision = None
    if getattr(args, "precision_config", None):
        from tvm_accel.precision import load_precision

        precision = load_precision(args.precision_config)
    shapes = parse_input_shapes(args.input_shapes)
    mod, info = load_onnx(args.model, shapes=shapes)
    inputs, outputs, quantized = _onnx_signature(args.model, shapes)
    t0 = time.perf_counter()
    if accel is None:
        ex = compile_reference(mod, None, host, precision=precision)
        report, config, cfg, knobs = None, "", None, None
    else:
        target = get_target(accel)
        given = getattr(args, f"target_{accel}_config", None)
        cfg = target.load_config(given)
        knobs = _target_knobs(accel, args)
        records = getattr(args, "tuning_records", None)
        try:
            with compile_progress(_ProgressLines(t0)):
                ex, report = _compile(mod, target, cfg, knobs, host, precision, records)
        except MappingError as e:  # not one layer (those fall back): the whole config
            raise AccelError(f"{given or cfg.name}: {e} (the model does not fit this {accel} "
                             f"config: use one with more memory, or --target-{accel}-config "
                             "of another instance)") from e
        config = cfg.name
    seconds = time.perf_counter() - t0
    offloads = [asdict(r) for r in report.nodes] if report else []
    float_model = accel is not None and not quantized
    reasons = {}  # layer -> reason shown (a float model: "not quantized" for the CPU layers)
    for r in offloads:
        if float_model and r["placement"] == "cpu" and \
                r["reason"].startswith(f"no {accel} pattern for"):
            r["reason"] = reasons[r["layer"]] = _not_quantized(accel)
    blobs = {f.name: f.blob for f in report.functions} if report else {}
    save_package(args.output, ex, PackageMetadata(
        accel or "", host, config, inputs, outputs, offloads,
        host_functions=list(report.host_functions) if report else [], tool=_version_line(),
        config_fields=cfg.to_json() if cfg is not None else {}, knobs=knobs or {}), blobs)
    layers = [r for r in offloads if r["kind"] == "layer"]
    n_acc = sum(1 for r in layers if r["placement"] != "cpu")
    print(f"compiled {args.model} for {args.target} in {seconds:.1f} s: {n_acc} layer(s) on "
          f"{accel or 'cpu'}, {len(layers) - n_acc} on the cpu -> {args.output}")
    if float_model and n_acc == 0:
        print(f"note: {args.model} is not quantized (no QuantizeLinear/DequantizeLinear), so "
              f"nothing runs on the {accel}; quantize it first: tvmc quantize {args.model} "
              f"-o {default_output(args.model)}"
              f"{' --scheme power-of-two' if accel == 'dpu' else ''}")
    if accel:
        print(f"config {config}; knobs {json.dumps(knobs or {}, sort_keys=True)}; "
              f"{_version_line()}")
    if args.dump_offloads and report:
        err = {r.onnx_name: r for r in report.numerics} if report.numerics else {}
        rows = []
        for r in report.nodes:
            if r.kind in ("qdq", "const") and args.dump_offloads != "all":
                continue
            e = err.get(r.layer) if r.kind == "layer" else None
            bits = (e.detail.get("bits") or {}) if e is not None else {}
            wio = "/".join("-" if bits.get(k) is None else str(bits[k]) for k in "wio")
            rows.append((r.layer, r.op, r.shape, r.placement,
                         f"{e.max_rel_error:.2e}" if e is not None else "-",
                         wio if bits else "-", reasons.get(r.layer, r.reason)))
        heads = ["layer", "op", "shape", "placement", "scale err", "W/I/O", "reason"]
        if getattr(args, "tuning_records", None):
            tuned = {ly: cfg_ for f in report.functions for ly, cfg_ in f.tuned.items()}
            rows = [(*r[:-1], "record" if r[0] in tuned else "-" if r[3] == "cpu" else
                     "default", r[-1]) for r in rows]
            heads = [*heads[:-1], "knobs", "reason"]
        if report.layouts:  # the VTA CP strategy: the embedding chosen per layer
            lay = {d.layer: d.summary() for d in report.layouts}
            rows = [(*r[:-1], lay.get(r[0], "-"), r[-1]) for r in rows]
            heads = [*heads[:-1], "embedding", "reason"]
        table = format_table(heads, rows)
        if args.dump_offloads in ("-", "all"):
            print(table)
        else:
            try:
                with open(args.dump_offloads, "w") as f:
                    f.write(table + "\n")
            except OSError as e:
                raise AccelError(f"--dump-offloads {args.dump_offloads}: cannot write it "
                                 f"({e.strerror})") from None
            print(f"offloads -> {args.dump_offloads}")
    return 0


def _compile(mod, target, cfg, knobs, host: str, precision, records: str | None):
    """:func:`tvm_accel.pipeline.compile_model`, with the tuning records applied if given."""
    from tvm_accel.pipeline import compile_model

    if not records:
        return compile_model(mod, target, cfg, knobs, host, precision=precision)
    from tvm_accel.tuning.records import ApplyHistoryBest

    with ApplyHistoryBest(records):
        return compile_model(mod, target, cfg, knobs, host, precision=precision)


class _ProgressLines:
    """Progress of a long compile on stderr: one line per step (offloaded function, VTA
    embedding search) once the compile has run for :attr:`AFTER` seconds (short compiles stay
    quiet)."""

    AFTER = 3.0

    def __init__(self, t0: float):
        self.t0 = t0

    def __call__(self, stage: str, index: int, count: int, name: str, seconds: float) -> None:
        elapsed = time.perf_counter() - self.t0
        if elapsed >= self.AFTER:
            of = f"/{count}" if count else ""
            print(f"  [{stage} {index}{of}] {name}: {seconds:.1f} s (total {elapsed:.0f} s)",
                  file=sys.stderr, flush=True)


def _version_line() -> str:
    """``tvmc --version``: this package's version and the TVM it runs on."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = version("tvm-accel")
    except PackageNotFoundError:
        mine = "unknown"
    try:
        tvm_v = version("apache-tvm")
    except PackageNotFoundError:
        tvm_v = "not installed"
    return f"tvmc (tvm-accel) {mine}, Apache TVM {tvm_v}"


def _check_output_path(path: str, example: str = "module.tar", what: str = "package") -> None:
    """Refuse an ``-o`` the package (or ``what``) cannot be written to before spending time
    compiling."""
    if os.path.isdir(path):
        raise AccelError(f"-o {path}: is a directory; give the {what} file name, e.g. "
                         f"{os.path.join(path, example)}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise AccelError(f"-o {path}: directory {parent} does not exist")


def _target_knobs(accel: str, args) -> dict | None:
    """Compile-time options of a target beyond its config (VTA: strategy; MARSELLUS: operating
    point)."""
    if accel == "vta":
        from tvm_vta_cp import strategy_knobs

        weights = None
        if args.target_vta_embedding_weights is not None:
            try:
                weights = [float(v) for v in args.target_vta_embedding_weights.split(",")]
            except ValueError:
                raise AccelError("--target-vta-embedding-weights: expected two numbers "
                                 f"'MAC,DATA', got {args.target_vta_embedding_weights!r}"
                                 ) from None
        return strategy_knobs(None, args.target_vta_strategy, weights, args.target_vta_top_k)
    if accel != "marsellus":
        return None
    vdd, freq, abb = args.target_marsellus_vdd, args.target_marsellus_freq, \
        args.target_marsellus_abb
    knobs = {}
    if args.target_marsellus_objective is not None:
        knobs["objective"] = args.target_marsellus_objective
    if vdd is None and freq is None and not abb:
        return knobs or None
    from tvm_marsellus import OP_KNOB, operating_point_of

    op = operating_point_of({"vdd": 0.8 if vdd is None else vdd, "freq_mhz": freq, "abb": abb})
    return {**knobs, OP_KNOB: {"vdd": op.vdd, "freq_mhz": op.freq_mhz, "abb": op.abb}}


def _check_input(path: str, arr: np.ndarray, spec) -> np.ndarray:
    """``arr`` as the model input ``spec`` describes: same shape, real numbers, finite."""
    if arr.dtype.kind not in "biuf":
        raise AccelError(f"{path}: input '{spec.name}' has dtype {arr.dtype}, the model expects "
                         f"{spec.dtype} numbers")
    if list(arr.shape) != list(spec.shape):
        raise AccelError(f"{path}: input '{spec.name}' has shape {list(arr.shape)}, the model "
                         f"expects {spec.shape}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise AccelError(f"{path}: input '{spec.name}' contains NaN or infinity")
    return arr.astype(spec.dtype)


def _make_inputs(meta, args) -> list[np.ndarray]:
    from tvm_accel.frontend import read_npz

    data = read_npz(args.inputs, args.inputs, "inputs") if args.inputs else {}
    rng = np.random.default_rng(0)
    out = []
    for spec in meta.inputs:
        if spec.name in data:
            out.append(_check_input(args.inputs, np.asarray(data[spec.name]), spec))
            continue
        if args.inputs and args.fill_mode is None:
            raise AccelError(f"{args.inputs}: no array named '{spec.name}' (have: "
                             f"{', '.join(data.keys()) or 'none'}); or pass --fill-mode")
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

    if args.repeat < 1:
        raise AccelError(f"--repeat {args.repeat}: give at least 1 run to time")
    if args.max_cycles is not None and not 0 < args.max_cycles <= simlib.MAX_MAX_CYCLES:
        raise AccelError(f"--max-cycles {args.max_cycles}: give a positive number of cycles "
                         "(at most 2^62)")
    pkg = load_package(args.package)
    inputs = [tvm.runtime.tensor(a) for a in _make_inputs(pkg.meta, args)]
    outs = _run_checked(pkg, inputs, args)
    names = [o.name for o in pkg.meta.outputs]
    names += [f"output_{i}" for i in range(len(names), len(outs))]
    if args.outputs:
        np.savez(args.outputs, **dict(zip(names, outs, strict=False)))
        print(f"outputs written to {args.outputs}")
    else:
        for n, o in zip(names, outs, strict=False):
            flat = o.reshape(-1)
            print(f"{n}: shape {list(o.shape)} {o.dtype}  first values {flat[:8].tolist()}")
    return 0


def _run_checked(pkg, inputs: list, args) -> list[np.ndarray]:
    """:func:`_execute` under the ``--max-cycles`` budget, its user errors as one line."""
    from tvm_accel import simlib

    try:
        with simlib.cycle_budget(args.max_cycles):
            return _execute(pkg, inputs, args)
    except simlib.CycleBudgetError as e:
        msg = _one_line(str(e)).removesuffix("; raise max_cycles if the program is legitimate")
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
    _check_output_path(png, "timeline.png", "picture")
    args.trace = args.trace or os.path.splitext(png)[0] + ".json"
    _check_output_path(args.trace, "timeline.json", "trace")
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


def _execute(pkg, inputs: list, args) -> list[np.ndarray]:
    """Run ``main`` once (profiled and traced when asked), then time it for --print-time."""
    import tvm

    from tvm_accel.package import outputs_to_numpy
    from tvm_accel.profiler import profiling, time_host_functions

    vm = pkg.vm()
    if args.profile or args.trace or args.profile_csv:
        with profiling(args.trace) as prof:
            timed = pkg.vm()
            time_host_functions(timed, pkg.meta.host_functions, prof)
            result = timed["main"](*inputs)
        if args.profile:
            print(prof.table())
            print("summary: " + json.dumps(prof.summary(), sort_keys=True))
        if args.profile_csv:
            prof.write_csv(args.profile_csv)
            print(f"per-layer profile written to {args.profile_csv}")
        if args.trace and args.verb == "run":  # tvmc timeline names both of its files
            print(f"timeline written to {args.trace}")
    else:
        result = vm["main"](*inputs)
    outs = outputs_to_numpy(result)
    if args.print_time:
        t = vm.time_evaluator("main", tvm.cpu(), number=1, repeat=args.repeat)(*inputs)
        print(f"wall time per run (host + simulator): mean {t.mean * 1e3:.2f} ms, "
              f"std {t.std * 1e3:.2f} ms over {args.repeat} runs")
    return outs


#: how the VM reports an argument of ``main`` that does not match the compiled signature
_VM_ARG_MISMATCH = re.compile(r"ErrorContext\(fn=main, loc=param\[\d+\], param=([^,]+), "
                              r"annotation=(.*?)\)\s\s")


def _run_error(package: str, exc: Exception) -> AccelError | None:
    """The user error behind a failed VM call, or None for a bug. The project's own errors (a
    blob or the simulator refusing the program) get the package named; the VM refusing inputs
    that match metadata.json means metadata.json and mod.so disagree."""
    if isinstance(exc, AccelError):
        msg = _one_line(str(exc))
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
    _check_output_path(out, os.path.basename(default_output(args.model)), "model")
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
            print(f"tvmc quantize: warning: {_one_line(str(w.message))}", file=sys.stderr)
    save_model(q, out)
    nodes = quantized_nodes(q)
    ops = ", ".join(f"{op} {n}" for op, n in sorted(nodes.items(), key=lambda t: (-t[1], t[0])))
    how = json.loads(next(p.value for p in q.metadata_props if p.key == PROVENANCE_KEY))
    source = (f"{how['samples']} sample(s) of {args.calibration}" if args.calibration else
              f"{how['samples']} random sample(s) (seed {args.seed})")
    print(f"quantized {args.model}: {sum(nodes.values())} node(s) ({ops}), scheme {args.scheme},"
          f" {args.activation_type} activations, calibrated on {source} -> {out}")
    return 0


#: zoo models ``tvmc zoo`` writes (whole networks; the single-layer builders are for tests)
ZOO_NETWORKS = ("tiny_cnn", "resnet20", "resnet18", "resnet50", "mobilenet_tiny", "vgg16",
                "googlenet", "yolov3_tiny", "encoder_decoder")


def cmd_zoo(args) -> int:
    """``tvmc zoo``: list the model zoo, or write one of its float networks as ONNX (seeded
    weights, no download), optionally with seeded random calibration samples."""
    import inspect

    from tvm_accel import zoo

    if not args.model:
        for name in ZOO_NETWORKS:
            doc = " ".join((inspect.getdoc(zoo.MODELS[name]) or "").split("\n\n")[0].split())
            first = doc.split(". ")[0].rstrip(".")
            print(f"{name:16s} {first if len(first) <= 90 else first[:87] + '...'}")
        return 0
    if args.model not in ZOO_NETWORKS:
        import difflib

        near = difflib.get_close_matches(args.model, ZOO_NETWORKS, n=1)
        raise AccelError(f"zoo: no model '{args.model}'"
                         + (f" (did you mean {near[0]}?)" if near else "")
                         + f"; available: {', '.join(ZOO_NETWORKS)}")
    out = args.output or f"{args.model}_fp32.onnx"
    _check_output_path(out, f"{args.model}_fp32.onnx", "model")
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
        _check_output_path(args.calibration_out, "inputs.npz", "calibration file")
        samples = zoo.random_calibration(model, seed=args.seed, n=args.samples)
        stacked = {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}
        np.savez(args.calibration_out, **stacked)
        print(f"wrote {args.samples} seeded random calibration sample(s) -> "
              f"{args.calibration_out} (use your own data for representative scales)")
    return 0


def cmd_disassemble(args) -> int:
    from tvm_accel.blob import unpack_blob
    from tvm_accel.package import read_blobs
    from tvm_accel.target import get_target

    blobs = read_blobs(args.package)
    if not blobs:
        print("no offloaded functions in this package")
    for name, data in blobs.items():
        target = get_target(unpack_blob(data).target)
        print(f"; function {name} ({target.name}, {len(data)} bytes)")
        print(target.disassemble(data, layer=args.layer, limit=args.limit))
    return 0


def add_target_options(c: argparse.ArgumentParser) -> None:
    """The ``--target-<kind>-<option>`` flags (shared by compile and tune)."""
    c.add_argument("--target-vta-config", metavar="FILE",
                   help="VTA hardware config JSON or bundled name (vta_1x16x16, vta_8x8x8)")
    c.add_argument("--target-vta-strategy", choices=["static", "cp", "auto"],
                   help="VTA strategy: TVM's static template, the CP embedding with layout "
                   "rewrites, or the best of both by simulated combined time (default auto)")
    c.add_argument("--target-vta-embedding-weights", metavar="MAC,DATA",
                   help="weights of the MAC and data-movement overheads when ranking CP "
                   "embeddings (default 1,1)")
    c.add_argument("--target-vta-top-k", type=int, metavar="K",
                   help="CP candidates measured per layer (default 5)")
    c.add_argument("--target-dpu-config", metavar="FILE",
                   help="DPU hardware config JSON or bundled name (dpu_default, dpu_8pe)")
    c.add_argument("--target-marsellus-config", metavar="FILE",
                   help="MARSELLUS hardware config JSON or bundled name (marsellus_default)")
    c.add_argument("--target-marsellus-vdd", type=float, metavar="V",
                   help="MARSELLUS supply voltage for the energy report (0.5..0.8, default 0.8)")
    c.add_argument("--target-marsellus-freq", type=float, metavar="MHZ",
                   help="MARSELLUS clock (default: the maximum at the voltage)")
    c.add_argument("--target-marsellus-abb", action="store_true",
                   help="MARSELLUS adaptive body biasing on")
    c.add_argument("--target-marsellus-objective", choices=["energy", "latency"],
                   help="what the MARSELLUS engine choices minimise (default energy: residual "
                   "adds on the RBE, no marshaling; latency: on the cores, faster)")


def add_input_shapes_option(p: argparse.ArgumentParser) -> None:
    """``--input-shapes`` (compile, tune): static shapes for a model with dynamic inputs."""
    p.add_argument("--input-shapes", metavar="SHAPES",
                   help='shapes of inputs with dynamic dimensions, e.g. '
                   '"input:[1,3,224,224] mask:[1,128]"')


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error convention: one line, exit 2 (no usage block)."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tvmc", description="Compile and run quantized models on accelerator "
                "simulators through Apache TVM.")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="on an error, also print the traceback (for a bug report)")
    p.add_argument("--version", action="version", version=_version_line())
    sub = p.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("compile", help="compile an ONNX model into a package (.tar)")
    c.add_argument("model", help="ONNX model (float or QDQ-quantized)")
    c.add_argument("--target", required=True, help='targets, host last, e.g. "vta, llvm"')
    add_target_options(c)
    c.add_argument("-o", "--output", default="module.tar", help="output package (.tar)")
    add_input_shapes_option(c)
    c.add_argument("--precision-config", metavar="FILE",
                   help='per-layer W/I/O bits (JSON: {"layers": {"<onnx node>": {"w": 4, '
                   '"i": 8, "o": 4}}, "default": {...}}), see tvm_accel.precision')
    c.add_argument("--dump-offloads", nargs="?", const="-", metavar="FILE",
                   help="list every layer, where it runs and why (to FILE, or stdout: '-' "
                   "or no value; 'all': stdout, with the folded Q/DQ and constant nodes)")
    c.add_argument("--tuning-records", metavar="FILE",
                   help="apply the best configuration per workload from 'tvmc tune' records")
    c.set_defaults(func=cmd_compile)
    from tvm_accel.tuning.autotuner import add_tune_parser

    add_tune_parser(sub, add_target_options)
    r = sub.add_parser("run", help="run a compiled package on the simulator")
    r.add_argument("package")
    r.add_argument("--inputs", metavar="NPZ", help="input arrays by name (.npz)")
    r.add_argument("--outputs", metavar="NPZ", help="write outputs to this .npz")
    r.add_argument("--fill-mode", choices=["zeros", "ones", "random"],
                   help="fill inputs missing from --inputs (default random)")
    r.add_argument("--print-time", action="store_true", help="print host wall time per run")
    r.add_argument("--repeat", type=int, default=3, help="runs timed by --print-time")
    r.add_argument("--profile", action="store_true",
                   help="per-layer table: cycles, utilization, bytes moved")
    r.add_argument("--profile-csv", metavar="FILE",
                   help="write the per-layer profile as CSV (one row per layer)")
    r.add_argument("--trace", metavar="JSON", help="write a Chrome-trace timeline of the run")
    r.add_argument("--max-cycles", type=int, metavar="N",
                   help="cycle budget of each simulator run (one per accelerator layer, "
                   "default 2^34); a run that exceeds it stops with an error")
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
                    help="fill inputs missing from --inputs (default random)")
    tl.add_argument("--max-cycles", type=int, metavar="N",
                    help="cycle budget of each simulator run (default 2^34)")
    tl.add_argument("--title", help="title of the picture")
    tl.set_defaults(func=cmd_timeline)
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
    d = sub.add_parser("disassemble", help="print the accelerator programs of a package or blob")
    d.add_argument("package", help="compiled package (.tar) or a raw program blob")
    d.add_argument("--layer", help="only this layer")
    d.add_argument("--limit", type=int, default=0, help="at most N instructions per layer")
    d.set_defaults(func=cmd_disassemble)
    for verb in sub.choices.values():  # -v also after the verb, as users type it
        verb.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                          help=argparse.SUPPRESS)
    return p


def describe_error(exc: BaseException) -> tuple[int, str]:
    """Exit code and the one stderr line (after ``tvmc <verb>: ``) for an exception: 2 and the
    message for a user error, 1 and ``internal error`` for anything else (a bug)."""
    if isinstance(exc, AccelError):
        return 2, f"error: {_one_line(str(exc))}"
    if isinstance(exc, OSError) and exc.filename is not None:
        why = "no such file" if isinstance(exc, FileNotFoundError) else exc.strerror
        return 2, f"error: {exc.filename}: {why}"
    return 1, (f"internal error: {type(exc).__name__}: {_one_line(str(exc))} (a bug; rerun "
               "with -v and report the traceback)")


def _one_line(text: str) -> str:
    return "; ".join(t.strip() for t in text.strip().splitlines() if t.strip())


def main(argv: list[str] | None = None) -> int:
    """Run ``tvmc``; returns the exit code (0 ok, 2 user error, 1 internal error, 130 Ctrl-C:
    also in the middle of a simulation, see :func:`tvm_accel.simlib.call`)."""
    args = build_parser().parse_args(argv)
    try:
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


if __name__ == "__main__":
    sys.exit(main())
