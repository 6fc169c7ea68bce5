"""The compile flow as one Relax pipeline per target (docs/architecture.md section 2).

``tvm.compile(mod, target="llvm", relax_pipeline="vta")`` runs: canonicalize
(QDQ -> integer, target recipe) -> partition -> lower offloads to blobs -> TVM's default
pipeline for the host ops. :func:`compile_model` is the same walk with a report for the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax

from tvm_accel.canonicalize.guard import CPU_LAYERS_ATTR, DEFAULT_MAX_REQUANT_ERROR
from tvm_accel.errors import AccelError
from tvm_accel.lower import LoweredFunction, UnmappableLayers, lower_offloads, lowered_layers
from tvm_accel.partition import OffloadRecord, explain, partition
from tvm_accel.target import AccelTarget


@dataclass
class CompileReport:
    """Everything a user may want to know about one compile."""

    target: str
    config_name: str = ""
    #: the model's layers (an offloaded layer, or an operator on the CPU) with placement
    offloads: list[OffloadRecord] = field(default_factory=list)
    #: every ONNX node in model order: the layers, plus nodes fused into a layer, folded
    #: away at import, and the Q/DQ nodes (``OffloadRecord.kind``; ``--dump-offloads``)
    nodes: list[OffloadRecord] = field(default_factory=list)
    numerics: list = field(default_factory=list)
    functions: list[LoweredFunction] = field(default_factory=list)
    #: per-layer layout decisions of the target (objects with ``layer`` and ``summary()``)
    layouts: list = field(default_factory=list)
    #: host functions the target put around its calls (dicts: symbol, layer, op, read,
    #: written, cycles), timed by ``tvmc run --profile``
    host_functions: list = field(default_factory=list)


def canonicalize_for(mod: tvm.IRModule, target: AccelTarget | None, report: CompileReport | None
                     = None, precision: Any = None,
                     max_requant_error: float = DEFAULT_MAX_REQUANT_ERROR) -> tvm.IRModule:
    """QDQ canonicalization with the target's requantize recipe (weights stay quantized), the
    optional precision config (:func:`tvm_accel.precision.load_precision`) and the requantize
    guard's limit in output LSBs (:mod:`tvm_accel.canonicalize.guard`)."""
    from tvm_accel.canonicalize import canonicalize

    mod, records = canonicalize(mod, target, precision_config=precision,
                                max_requant_error=max_requant_error)
    if report is not None:
        report.numerics = list(records)
    return mod


def _check_knob_names(mod: tvm.IRModule, target: AccelTarget, patterns: list,
                      knobs: dict | None) -> None:
    """Every knob key names a layer of the model (a fused group ``a+b``: each of its layers)
    or is one of the target's global options; an unknown name is an error naming the nearest
    layers, not a knob silently ignored."""
    keys = [k for k in (knobs or {}) if k not in target.global_knobs]
    if not keys:
        return
    import difflib

    names = {r.layer for r in explain(mod, patterns, target.name)}
    for key in keys:
        missing = [part for part in str(key).split("+") if part not in names]
        if missing:
            near = difflib.get_close_matches(missing[0], sorted(names), n=3)
            raise AccelError(f"knobs: no layer named {missing[0]!r} in the model"
                             + (f" (nearest: {', '.join(near)})" if near else "")
                             + f"; global options of {target.name}: "
                             + (", ".join(sorted(target.global_knobs)) or "none"))


def offload(mod: tvm.IRModule, target: AccelTarget, config: Any, knobs: dict | None = None,
            report: CompileReport | None = None) -> tvm.IRModule:
    """Partition a canonical module and lower the offloaded functions (host ops untouched)."""
    patterns = target.pattern_table()
    _check_knob_names(mod, target, patterns, knobs)
    canonical = mod
    mod = target.prepare_offload(mod, config, knobs, report)
    # layers the target could not map -> reason (CPU fallback), first those of the guard
    attrs = mod.attrs if mod.attrs is not None else {}
    excluded: dict[str, str] = ({str(k): str(v) for k, v in attrs[CPU_LAYERS_ATTR].items()}
                                if CPU_LAYERS_ATTR in attrs else {})
    while True:
        parted = partition(mod, patterns, excluded)
        functions: list[LoweredFunction] = []
        try:
            lowered = lower_offloads(parted, target, config, knobs, functions)
            break
        except UnmappableLayers as e:
            if not set(e.reasons) - set(excluded):  # no progress: not a layer we can drop
                raise
            excluded.update(e.reasons)
    if report is not None:
        report.nodes = explain(mod, patterns, target.name, parted, report.numerics, excluded,
                               lowered_layers(functions))
        if mod is not canonical:  # a target's layout rewrite: each layer's own shape (0.1 s)
            own = {r.layer: r.shape for r in explain(canonical, patterns, target.name)}
            for r in report.nodes:
                r.shape = own.get(r.layer, r.shape)
        report.offloads = [r for r in report.nodes if r.kind == "layer"]
        report.functions += functions
    return target.finish_offload(lowered, config, report)


def target_pipeline(target: AccelTarget, config: Any = None, knobs: dict | None = None,
                    report: CompileReport | None = None, precision: Any = None,
                    max_requant_error: float = DEFAULT_MAX_REQUANT_ERROR
                    ) -> tvm.transform.Pass:
    """The full pipeline for ``target`` as a module pass usable as ``relax_pipeline=``."""
    cfg = target.load_config(config)
    prec = _load_precision(precision)

    @tvm.transform.module_pass(opt_level=0, name=f"{target.name}_pipeline")
    def _pipeline(mod: tvm.IRModule, ctx) -> tvm.IRModule:
        mod = canonicalize_for(mod, target, report, prec, max_requant_error)
        mod = offload(mod, target, cfg, knobs, report)
        return host_pipeline()(mod)

    return _pipeline


def host_target(host: str | dict | tvm.target.Target) -> tvm.target.Target:
    """The host as a TVM target. Besides what TVM 0.27 takes (a kind, a JSON dict), it reads
    the command-line form upstream tvmc users type, ``llvm -mcpu=skylake -mattr=+avx2,+fma``
    (TVM 0.27 no longer parses it): ``-key=value`` options, comma lists for ``-mattr``/
    ``-keys``/``-libs``, integers and ``true``/``false`` as such. Raises ``ValueError`` for
    what TVM refuses."""
    if not isinstance(host, str) or " " not in host.strip():
        return tvm.target.Target(host.strip() if isinstance(host, str) else host)
    kind, *opts = host.split()
    spec: dict[str, Any] = {"kind": kind}
    for opt in opts:
        key, eq, value = opt.lstrip("-").partition("=")
        if not opt.startswith("-") or not key:
            raise ValueError(f"option '{opt}' is not -key=value")
        if not eq:
            spec[key] = True
        elif key in ("mattr", "keys", "libs", "cl-opt"):
            spec[key] = [v for v in value.split(",") if v]
        elif value.lstrip("-").isdigit():
            spec[key] = int(value)
        elif value in ("true", "false"):
            spec[key] = value == "true"
        else:
            spec[key] = value
    return tvm.target.Target(spec)


def host_pipeline() -> tvm.transform.Pass:
    """TVM's default Relax pipeline for the current host target; a ``c`` host (C source, built
    by the system compiler when the package is exported) takes the generic CPU one, which TVM
    does not pick for it."""
    host = tvm.target.Target.current()
    if host is None:
        return relax.get_pipeline("default")
    if host.kind.name == "c":
        from tvm.relax.backend import cpu_generic

        return cpu_generic.get_default_pipeline(host)
    return relax.get_default_pipeline(host)


def _load_precision(precision: Any):
    """Parse a precision config up front (a bad file fails before compiling)."""
    if precision is None:
        return None
    from tvm_accel.precision import load_precision

    return load_precision(precision)


def reference_pipeline(target: AccelTarget | None, precision: Any = None,
                       max_requant_error: float = DEFAULT_MAX_REQUANT_ERROR
                       ) -> tvm.transform.Pass:
    """The numerics-contract reference: the canonical integer graph, all on the CPU."""
    prec = _load_precision(precision)

    @tvm.transform.module_pass(opt_level=0, name="reference_pipeline")
    def _pipeline(mod: tvm.IRModule, ctx) -> tvm.IRModule:
        mod = canonicalize_for(mod, target, precision=prec,
                               max_requant_error=max_requant_error)
        return host_pipeline()(mod)

    return _pipeline


def register_target_pipeline(target: AccelTarget) -> None:
    """Register ``relax_pipeline="<target name>"`` (default config); safe on re-import."""
    from tvm.relax.pipeline import PIPELINE_MAP

    if target.name not in PIPELINE_MAP:
        relax.register_pipeline(target.name)(lambda: target_pipeline(target))


def compile_model(mod: tvm.IRModule, target: AccelTarget, config: Any = None,
                  knobs: dict | None = None, host: str = "llvm", *, precision: Any = None,
                  max_requant_error: float = DEFAULT_MAX_REQUANT_ERROR):
    """Compile for ``target`` and return ``(executable, report)``; ``precision`` is a
    precision config (path, JSON text, dict or PrecisionConfig, see
    :mod:`tvm_accel.precision`) applied to the canonical graph; ``max_requant_error`` the
    requantize guard's limit in output LSBs (``inf``: no guard)."""
    cfg = target.load_config(config)
    report = CompileReport(target=target.name, config_name=getattr(cfg, "name", ""))
    ex = tvm.compile(mod, target=host_target(host),
                     relax_pipeline=target_pipeline(target, cfg, knobs, report, precision,
                                                    max_requant_error))
    return ex, report


def compile_reference(mod: tvm.IRModule, target: AccelTarget | None, host: str = "llvm", *,
                      precision: Any = None,
                      max_requant_error: float = DEFAULT_MAX_REQUANT_ERROR):
    """Compile the CPU reference of ``mod`` for ``target``'s numerics (with the same
    ``precision`` config and ``max_requant_error`` as :func:`compile_model`, it is what the
    accelerator must match)."""
    return tvm.compile(mod, target=host_target(host),
                       relax_pipeline=reference_pipeline(target, precision, max_requant_error))
