"""``tvmc``: compile, run and inspect models for the accelerator targets.

Follows upstream tvmc's flags: ``--target "vta, llvm"`` (accelerators first, host last),
``--target-<kind>-<option>``, ``-o``, ``--dump-offloads``, ``--inputs``, ``--outputs``,
``--fill-mode``, ``--print-time``, ``--profile``. User errors print one line, no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict

import numpy as np

from tvm_accel.errors import AccelError

ACCEL_TARGETS = ("vta", "dpu", "marsellus")
HOSTS = ("llvm",)


def parse_target(text: str) -> tuple[str | None, str]:
    """``"vta, llvm"`` -> ``("vta", "llvm")``; the host must come last."""
    kinds = [t.strip() for t in text.split(",") if t.strip()]
    if not kinds:
        raise AccelError("--target is empty; use e.g. --target \"vta, llvm\"")
    host = kinds[-1]
    if host not in HOSTS:
        raise AccelError(f"--target: the last target must be the host ({', '.join(HOSTS)}), "
                         f"got '{host}'")
    accels = kinds[:-1]
    for k in accels:
        if k not in ACCEL_TARGETS:
            raise AccelError(f"--target: unknown accelerator '{k}' (available: "
                             f"{', '.join(ACCEL_TARGETS)})")
    if len(accels) > 1:
        raise AccelError("--target: give at most one accelerator before the host")
    return (accels[0] if accels else None), host


def _onnx_signature(path: str):
    import onnx

    from tvm_accel.package import TensorSpec

    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def spec(vi):
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        return TensorSpec(vi.name, shape, dtype)

    return ([spec(v) for v in model.graph.input if v.name not in inits],
            [spec(v) for v in model.graph.output])


def cmd_compile(args) -> int:
    from tvm_accel.frontend import load_onnx
    from tvm_accel.package import PackageMetadata, save_package
    from tvm_accel.pipeline import compile_model, compile_reference
    from tvm_accel.report import format_table
    from tvm_accel.target import get_target

    accel, host = parse_target(args.target)
    precision = None
    if getattr(args, "precision_config", None):
        from tvm_accel.precision import load_precision

        precision = load_precision(args.precision_config)
    mod, _ = load_onnx(args.model)
    inputs, outputs = _onnx_signature(args.model)
    t0 = time.perf_counter()
    if accel is None:
        ex = compile_reference(mod, None, host, precision=precision)
        report, config = None, ""
    else:
        target = get_target(accel)
        cfg = target.load_config(getattr(args, f"target_{accel}_config", None))
        records = getattr(args, "tuning_records", None)
        if records:
            from tvm_accel.tuning.records import ApplyHistoryBest

            with ApplyHistoryBest(records):
                ex, report = compile_model(mod, target, cfg, _target_knobs(accel, args), host,
                                           precision=precision)
        else:
            ex, report = compile_model(mod, target, cfg, _target_knobs(accel, args), host,
                                       precision=precision)
        config = cfg.name
    seconds = time.perf_counter() - t0
    offloads = [asdict(r) for r in report.offloads] if report else []
    blobs = {f.name: f.blob for f in report.functions} if report else {}
    save_package(args.output, ex, PackageMetadata(
        accel or "", host, config, inputs, outputs, offloads,
        host_functions=list(report.host_functions) if report else []), blobs)
    n_acc = sum(1 for r in offloads if r["placement"] != "cpu")
    print(f"compiled {args.model} for {args.target} in {seconds:.1f} s: {n_acc} layer(s) on "
          f"{accel or 'cpu'}, {len(offloads) - n_acc} on the cpu -> {args.output}")
    if args.dump_offloads and report:
        err = {r.layer: r for r in report.numerics} if report.numerics else {}
        rows = []
        for r in report.offloads:
            e = err.get(r.layer)
            bits = (e.detail.get("bits") or {}) if e is not None else {}
            wio = "/".join("-" if bits.get(k) is None else str(bits[k]) for k in "wio")
            rows.append((r.layer, r.op, r.shape, r.placement,
                         f"{e.max_rel_error:.2e}" if e is not None else "-",
                         wio if bits else "-", r.reason))
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
        print(format_table(heads, rows))
    return 0


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
    if vdd is None and freq is None and not abb:
        return None
    from tvm_marsellus import OP_KNOB, operating_point_of

    op = operating_point_of({"vdd": 0.8 if vdd is None else vdd, "freq_mhz": freq, "abb": abb})
    return {OP_KNOB: {"vdd": op.vdd, "freq_mhz": op.freq_mhz, "abb": op.abb}}


def _make_inputs(meta, args) -> list[np.ndarray]:
    if args.inputs:
        try:
            data = np.load(args.inputs)
        except (OSError, ValueError) as e:
            raise AccelError(f"{args.inputs}: cannot read inputs (.npz expected): {e}") from None
    else:
        data = {}
    rng = np.random.default_rng(0)
    out = []
    for spec in meta.inputs:
        if spec.name in data:
            arr = np.asarray(data[spec.name])
            if list(arr.shape) != list(spec.shape):
                raise AccelError(f"{args.inputs}: input '{spec.name}' has shape "
                                 f"{list(arr.shape)}, the model expects {spec.shape}")
            out.append(arr.astype(spec.dtype))
            continue
        if args.inputs and args.fill_mode is None:
            raise AccelError(f"{args.inputs}: no array named '{spec.name}' (have: "
                             f"{', '.join(data.keys())}); or pass --fill-mode")
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

    from tvm_accel.package import load_package, outputs_to_numpy
    from tvm_accel.profiler import profiling, time_host_functions

    pkg = load_package(args.package)
    vm = pkg.vm()
    inputs = [tvm.runtime.tensor(a) for a in _make_inputs(pkg.meta, args)]
    if args.profile or args.trace:
        with profiling(args.trace) as prof:
            timed = pkg.vm()
            time_host_functions(timed, pkg.meta.host_functions, prof)
            result = timed["main"](*inputs)
        if args.profile:
            print(prof.table())
        if args.trace:
            print(f"timeline written to {args.trace}")
    else:
        result = vm["main"](*inputs)
    outs = outputs_to_numpy(result)
    if args.print_time:
        t = vm.time_evaluator("main", tvm.cpu(), number=1, repeat=args.repeat)(*inputs)
        print(f"wall time per run (host + simulator): mean {t.mean * 1e3:.2f} ms, "
              f"std {t.std * 1e3:.2f} ms over {args.repeat} runs")
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tvmc", description="Compile and run quantized models on "
                                "accelerator simulators through Apache TVM.")
    sub = p.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("compile", help="compile an ONNX model into a package (.tar)")
    c.add_argument("model", help="ONNX model (float or QDQ-quantized)")
    c.add_argument("--target", required=True, help='targets, host last, e.g. "vta, llvm"')
    add_target_options(c)
    c.add_argument("-o", "--output", default="module.tar", help="output package (.tar)")
    c.add_argument("--precision-config", metavar="FILE",
                   help='per-layer W/I/O bits (JSON: {"layers": {"<onnx node>": {"w": 4, '
                   '"i": 8, "o": 4}}, "default": {...}}), see tvm_accel.precision')
    c.add_argument("--dump-offloads", action="store_true",
                   help="list every layer, where it runs and why")
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
    r.add_argument("--trace", metavar="JSON", help="write a Chrome-trace timeline of the run")
    r.set_defaults(func=cmd_run)
    d = sub.add_parser("disassemble", help="print the accelerator programs of a package or blob")
    d.add_argument("package", help="compiled package (.tar) or a raw program blob")
    d.add_argument("--layer", help="only this layer")
    d.add_argument("--limit", type=int, default=0, help="at most N instructions per layer")
    d.set_defaults(func=cmd_disassemble)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except AccelError as e:
        print(f"tvmc {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"tvmc {args.verb}: error: {e.filename}: no such file", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly, like other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
