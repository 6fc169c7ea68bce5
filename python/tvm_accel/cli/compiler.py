"""``tvmc compile``: an ONNX model -> a package (.tar) for one target and host, with the
``--dump-offloads`` table (a row per operator: placement, reason, scale error, bits, knobs,
embedding)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Any

from tvm_accel.cli.common import (
    add_input_shapes_option,
    add_pass_context_options,
    add_requant_error_option,
    add_target_options,
    add_tuning_records_option,
    check_output_path,
    parse_input_shapes,
    parse_target,
    pass_context,
    target_knobs,
    target_options,
    tuning_records,
    user_warnings,
    version_line,
)
from tvm_accel.errors import AccelError, MappingError


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


def _static_output_shapes(mod, outputs: list) -> None:
    """Set ``outputs``' shapes to those Relax's ``main`` returns where static: an ONNX graph
    whose batch --input-shapes fixes may still declare its old output shape, and
    ``metadata.json`` describes what ``mod.so`` returns (``tvmc run`` checks it)."""
    ret = mod["main"].ret_ty
    rets = list(getattr(ret, "fields", None) or [ret])
    if len(rets) != len(outputs):
        return
    for spec, r in zip(outputs, rets, strict=True):
        try:
            spec.shape = [int(d) for d in r.shape]
        except (AttributeError, TypeError, ValueError):  # not a tensor, or a symbolic dim
            continue


def placement_summary(rows: list[dict], accel: str | None) -> str:
    """The compile summary of the report's ``rows`` (``OffloadRecord`` dicts): layers (every
    operator that computes, float ones included) by placement, then the Q/DQ nodes, folded
    into the integer graph or left to convert to or from float on the CPU."""
    if accel is None:
        return "all on the cpu"
    layers = [r for r in rows if r["kind"] == "layer"]
    n_acc = sum(1 for r in layers if r["placement"] != "cpu")
    text = f"{n_acc} of {len(layers)} layers on {accel}; {len(layers) - n_acc} on the cpu"
    qdq = [r for r in rows if r["kind"] in ("qdq", "const")]
    on_cpu = sum(1 for r in qdq if r["placement"] == "cpu")
    if qdq:
        text += f"; {len(qdq) - on_cpu} Q/DQ nodes folded"
        text += f", {on_cpu} convert to or from float on the cpu" if on_cpu else ""
    return text


def fallback_note(rows: list[dict]) -> str | None:
    """``note: ...`` naming the most common reason (numbers aside) of the layers that fell back
    to the CPU, with that reason's fix, or None when every layer is offloaded."""
    from tvm_accel.partition import common_fallback

    cpu = [r for r in rows if r["kind"] == "layer" and r["placement"] == "cpu" and r["reason"]]
    if not cpu:
        return None
    top = common_fallback([r["reason"] for r in cpu])
    return (f"note: {len(top)} of the {len(cpu)} layer(s) on the cpu: {top[0]}"
            + ("" if len(top) == len(cpu) else " (see --dump-offloads for the others)"))


#: what the --dump-offloads columns measure (printed above the table)
_DUMP_LEGEND = (
    "scale err: largest relative error of a layer's integer requantize scale (multiplier / "
    "2^shift) vs its float scale\n"
    "LSB err: worst-case deviation in output steps (what --max-requant-error limits); "
    "W/I/O: weight, input and output bits")


def _not_quantized(accel: str) -> str:
    """Reason of a layer of a float model: the targets offload quantized layers only."""
    return (f"model not quantized (no Q/DQ; the {accel} runs quantized layers): "
            "run 'tvmc quantize'")


def cmd_compile(args) -> int:
    from tvm_accel.frontend import load_onnx
    from tvm_accel.lower import compile_progress
    from tvm_accel.package import PackageMetadata, check_linker, save_package
    from tvm_accel.pipeline import compile_reference
    from tvm_accel.quantize import default_output
    from tvm_accel.report import format_table
    from tvm_accel.target import get_target

    accel, host = parse_target(args.target)
    check_output_path(args.output)
    check_linker()
    if args.dump_offloads not in (None, "-", "all"):
        check_output_path(args.dump_offloads, "offloads.txt", "table", "--dump-offloads")
    precision = None
    keep_scale = getattr(args, "precision_keep_scale", False)
    if keep_scale and not getattr(args, "precision_config", None):
        raise AccelError("--precision-keep-scale: applies to a --precision-config; give one")
    if getattr(args, "precision_config", None):
        from tvm_accel.precision import load_precision

        precision = load_precision(args.precision_config, keep_scale=keep_scale or None)
    shapes = parse_input_shapes(args.input_shapes)
    passes = pass_context(args)  # before loading the model: a bad key fails at once
    mod, info = load_onnx(args.model, shapes=shapes)
    inputs, outputs, quantized = _onnx_signature(args.model, shapes)
    _static_output_shapes(mod, outputs)
    t0 = time.perf_counter()
    from tvm_accel.precision import PrecisionWarning
    from tvm_accel.tuning.records import RecordWarning

    with user_warnings("compile", PrecisionWarning, RecordWarning), passes:
        if accel is None:
            ex = compile_reference(mod, None, host, precision=precision)
            report, config, cfg, knobs = None, "", None, None
        else:
            target = get_target(accel)
            given = target_options(accel, args)["config"]
            cfg = target.load_config(given)
            knobs = target_knobs(accel, args)
            records = getattr(args, "tuning_records", None)
            try:
                with compile_progress(_ProgressLines(t0)):
                    ex, report = _compile(mod, target, cfg, knobs, host, precision,
                                          records, args.max_requant_error)
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
        if float_model and accel is not None and r["placement"] == "cpu" and \
                r["kind"] == "layer":
            r["reason"] = reasons[r["layer"]] = _not_quantized(accel)
    blobs = {f.name: f.blob for f in report.functions} if report else {}
    save_package(args.output, ex, PackageMetadata(
        accel or "", host, config, inputs, outputs, offloads,
        host_functions=list(report.host_functions) if report else [], tool=version_line(),
        config_fields=cfg.to_json() if cfg is not None else {}, knobs=knobs or {}), blobs)
    n_acc = sum(1 for r in offloads if r["kind"] == "layer" and r["placement"] != "cpu")
    print(f"compiled {args.model} for {args.target} in {seconds:.1f} s: "
          f"{placement_summary(offloads, accel)} -> {args.output}")
    if float_model and n_acc == 0:
        print(f"note: {args.model} is not quantized (no QuantizeLinear/DequantizeLinear), so "
              f"nothing runs on the {accel}; quantize it first: tvmc quantize {args.model} "
              f"-o {default_output(args.model)}"
              f"{' --scheme power-of-two' if accel == 'dpu' else ''}")
    elif accel:
        note = fallback_note(offloads)
        if note:
            print(note)
    if accel:
        applied = ""
        if getattr(args, "tuning_records", None) and report is not None:
            n = len({ly for f in report.functions for ly in f.tuned})
            applied = f"tuning records: {n} layer(s) from {args.tuning_records}; "
        shown = f"knobs {json.dumps(knobs or {}, sort_keys=True)}; " if knobs or not applied else ""
        print(f"config {config}; {shown}{applied}{version_line()}")
    if args.dump_offloads and report:
        err = {r.onnx_name: r for r in report.numerics} if report.numerics else {}
        rows: list[tuple[Any, ...]] = []
        for r in report.nodes:
            if r.kind in ("qdq", "const") and args.dump_offloads != "all":
                continue
            rec = err.get(r.layer) if r.kind == "layer" else None
            rec = rec if rec is not None and rec.integer else None  # float: no recipe error
            bits: dict[str, Any] = (rec.detail.get("bits") or {}) if rec is not None else {}
            wio = "/".join("-" if bits.get(k) is None else str(bits[k]) for k in "wio")
            rows.append((r.layer, r.op, r.shape, r.placement,
                         f"{rec.max_rel_error:.2e}" if rec is not None else "-",
                         f"{rec.max_lsb_error:.3g}" if rec is not None else "-",
                         wio if bits else "-", reasons.get(r.layer, r.reason)))
        heads = ["layer", "op", "shape", "placement", "scale err", "LSB err", "W/I/O",
                 "reason"]
        if getattr(args, "tuning_records", None) and report is not None:
            tuned = {ly: cfg_ for f in report.functions for ly, cfg_ in f.tuned.items()}
            rows = [(*r[:-1], "record" if r[0] in tuned else "-" if r[3] == "cpu" else
                     "default", r[-1]) for r in rows]
            heads = [*heads[:-1], "knobs", "reason"]
        if report.layouts:  # the VTA CP strategy: the embedding chosen per layer
            lay = {d.layer: d.summary() for d in report.layouts}
            rows = [(*r[:-1], lay.get(r[0], "-"), r[-1]) for r in rows]
            heads = [*heads[:-1], "embedding", "reason"]
        # the terminal gets the table in 120 columns (unless --wide), a file gets it whole
        table = format_table(heads, rows, width=-1 if args.dump_offloads in ("-", "all")
                             else None)
        print(_DUMP_LEGEND)
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


def _compile(mod, target, cfg, knobs, host: str, precision, records: str | None,
             max_requant_error: float):
    """:func:`tvm_accel.pipeline.compile_model`, with the tuning records applied if given."""
    from tvm_accel.pipeline import compile_model

    with tuning_records(records):
        return compile_model(mod, target, cfg, knobs, host, precision=precision,
                             max_requant_error=max_requant_error)


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


def add_parser(sub) -> None:
    c = sub.add_parser("compile", help="compile an ONNX model into a package (.tar)")
    c.add_argument("model", help="ONNX model (float or QDQ-quantized)")
    c.add_argument("--target", required=True, help='targets, host last, e.g. "vta, llvm"')
    add_target_options(c)
    c.add_argument("-o", "--output", default="module.tar", help="output package (.tar)")
    add_input_shapes_option(c)
    c.add_argument("--precision-config", metavar="FILE",
                   help='per-layer W/I/O bits (JSON: {"layers": {"<onnx node>": {"w": 4, '
                   '"i": 8, "o": 4}}, "default": {...}}), see tvm_accel.precision')
    add_requant_error_option(c)
    c.add_argument("--precision-keep-scale", action="store_true",
                   help="narrowed activations of --precision-config keep their scale and are "
                   "clipped, with a warning (default: the scale widens to keep the calibrated "
                   'range); an entry\'s own "keep_scale" wins')
    c.add_argument("--dump-offloads", nargs="?", const="-", metavar="FILE",
                   help="list every layer, where it runs and why (to FILE, or stdout: '-' "
                   "or no value; 'all': stdout, with the folded Q/DQ and constant nodes)")
    add_tuning_records_option(c)
    add_pass_context_options(c)
    c.set_defaults(func=cmd_compile)
