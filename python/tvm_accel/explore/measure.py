"""One model on one hardware point: quantize for the target, compile, check bit-exactness against
the CPU reference on one input, run on the simulator and sum the profiler's records.

A point whose config or options the target's rules reject is :data:`INVALID` with the rule's
message; a point that fails for another reason is :data:`FAILED` with the error, so a sweep goes
on past it.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from tvm_accel.errors import AccelError, ConfigError

#: :attr:`Measurement.status` values
OK, INVALID, FAILED = "ok", "invalid", "error"


@dataclass
class LayerCost:
    """One layer of a compiled model: where it runs and, on the accelerator, what it costs
    (the sum of the profiler's records of that layer)."""

    layer: str
    op: str
    placement: str
    cycles: int = 0
    time_us: float = 0.0
    utilization: float = 0.0
    energy_uj: float | None = None
    #: the first layer of the fused group this layer's cost is counted in ("": its own)
    counted_in: str = ""


@dataclass
class Measurement:
    """What one model costs on one hardware point (``status`` :data:`OK`), or why it was not
    measured (:data:`INVALID`, :data:`FAILED`, ``reason``)."""

    status: str = OK
    reason: str = ""
    bit_exact: bool | None = None
    cycles: int = 0
    #: accelerator time at the target's clock plus the modelled host passes around its calls
    latency_us: float = 0.0
    #: time-weighted mean of the layers' utilization (MACs / (cycles x the engine's peak))
    utilization: float = 0.0
    energy_uj: float | None = None
    on_chip_bytes: int | None = None
    #: bytes the layers move to and from the memory the target's profiler counts (VTA and DPU:
    #: DRAM; MARSELLUS: L2)
    bytes_moved: int = 0
    layers: int = 0
    offloaded: int = 0
    top_fallback: str = ""
    #: largest difference of the model outputs from onnxruntime's, in output steps
    max_lsb: float | None = None
    clock_mhz: float | None = None
    per_layer: list[LayerCost] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The sweep CSV's measurement columns (:data:`COLUMNS`; empty when not measured)."""
        out = dict.fromkeys(COLUMNS, "")
        out.update(status=self.status, reason=self.reason)
        if self.status != OK:
            return out
        out.update(bit_exact="" if self.bit_exact is None else str(self.bit_exact).lower(),
                   cycles=str(self.cycles), latency_us=f"{self.latency_us:.3f}",
                   utilization=f"{self.utilization:.4f}",
                   energy_uj="" if self.energy_uj is None else f"{self.energy_uj:.4f}",
                   on_chip_bytes="" if self.on_chip_bytes is None else str(self.on_chip_bytes),
                   bytes_moved=str(self.bytes_moved), layers_offloaded=str(self.offloaded),
                   layers=str(self.layers), top_fallback=self.top_fallback,
                   max_lsb_vs_onnxruntime="" if self.max_lsb is None else f"{self.max_lsb:g}")
        return out


#: measurement columns of a sweep CSV, in order
COLUMNS = ("status", "bit_exact", "cycles", "latency_us", "utilization", "energy_uj",
           "on_chip_bytes", "bytes_moved", "layers_offloaded", "layers",
           "max_lsb_vs_onnxruntime", "top_fallback", "reason")


def model_for(model: str | onnx.ModelProto, target, calibration: Any = None) -> onnx.ModelProto:
    """``model`` as ``target`` takes it: a QDQ model as it is; a float model quantized with the
    target's scheme and activation type (:attr:`~tvm_accel.target.AccelTarget.quantize_scheme`,
    the ``tvmc quantize`` code) on ``calibration`` (None: seeded random samples, whose
    :class:`~tvm_accel.quantize.CalibrationWarning` is the caller's to show)."""
    from tvm_accel.quantize import is_quantized, quantize_model

    m = read_model(model)
    if is_quantized(m):
        return m
    return quantize_model(m, calibration, scheme=target.quantize_scheme,
                          activation_type=target.activation_type)


def read_model(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    """A model file (or ModelProto) read and checked (:class:`~tvm_accel.errors.ModelError`
    naming the file otherwise)."""
    from tvm_accel.frontend import _check, _read_model

    m, where = _read_model(os.fspath(model) if isinstance(model, os.PathLike) else model)
    _check(m, where)
    return m


#: reference outputs by (model digest, target, precision, guard limit): the canonical integer
#: graph does not depend on the hardware config, so a sweep computes it once per process
_REFERENCES: dict[tuple, list[np.ndarray]] = {}


def _digest(model: onnx.ModelProto) -> str:
    return hashlib.sha256(model.SerializeToString()).hexdigest()[:16]


def _reference(model, target, precision, max_requant_error, seed, feed, info
               ) -> list[np.ndarray]:
    import tvm
    from tvm import relax

    from tvm_accel.frontend import load_onnx
    from tvm_accel.package import outputs_to_numpy
    from tvm_accel.pipeline import compile_reference

    key = (_digest(model), target.name, json.dumps(precision, sort_keys=True, default=str),
           max_requant_error, seed)
    if key not in _REFERENCES:
        mod, _ = load_onnx(model)
        ex = compile_reference(mod, target, precision=precision,
                               max_requant_error=max_requant_error)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        _REFERENCES[key] = outputs_to_numpy(
            vm["main"](*[tvm.runtime.tensor(feed[k]) for k in info.inputs]))
    return _REFERENCES[key]


def measure(model: onnx.ModelProto, target, config: Any = None, options: dict | None = None,
            precision: Any = None, seed: int = 0, reference: bool = True,
            max_requant_error: float | None = None) -> Measurement:
    """Compile the QDQ ``model`` for ``target`` (an :class:`~tvm_accel.target.AccelTarget`)
    with ``config`` (a path, bundled name or config object) and the target's command-line
    ``options`` (name -> value, as ``--target-<kind>-<name>``), run it once on a seeded random
    input under the profiler and compare its outputs with the CPU reference (``reference``)
    and onnxruntime."""
    from tvm_accel.numerics import DEFAULT_MAX_REQUANT_ERROR

    limit = DEFAULT_MAX_REQUANT_ERROR if max_requant_error is None else max_requant_error
    try:
        cfg = target.load_config(config)
        knobs = target.knobs_from_options({"config": None, **(options or {})})
    except ConfigError as e:
        return Measurement(INVALID, reason=_one_line(e))
    try:
        return _measure(model, target, cfg, knobs, precision, seed, reference, limit)
    except AccelError as e:
        return Measurement(FAILED, reason=_one_line(e))
    except Exception as e:  # a bug: recorded, so a long sweep goes on past the point
        return Measurement(FAILED, reason=f"internal error: {type(e).__name__}: "
                           f"{_one_line(e)}")


def _one_line(e: BaseException) -> str:
    return "; ".join(t.strip() for t in str(e).strip().splitlines() if t.strip())


def _measure(model, target, cfg, knobs, precision, seed, reference, limit) -> Measurement:
    import tvm
    from tvm import relax

    from tvm_accel.compare import ort_session, output_lsb
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_accel.package import outputs_to_numpy
    from tvm_accel.partition import common_fallback
    from tvm_accel.pipeline import compile_model
    from tvm_accel.profiler import profiling, time_host_functions

    mod, info = load_onnx(model)
    feed = random_inputs(info, seed)
    with warnings.catch_warnings():  # the precision / guard warnings belong to tvmc compile
        warnings.simplefilter("ignore")
        ex, report = compile_model(mod, target, cfg, knobs, precision=precision,
                                   max_requant_error=limit)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(feed[k]) for k in info.inputs]
    with profiling() as prof:
        time_host_functions(vm, report.host_functions, prof)
        ours = outputs_to_numpy(vm["main"](*args))
    m = Measurement(on_chip_bytes=cfg.on_chip_bytes)
    if reference:
        ref = _reference(model, target, precision, limit, seed, feed, info)
        m.bit_exact = all(np.array_equal(a, b) for a, b in zip(ours, ref, strict=True))
    theirs = ort_session(model).run(None, feed)
    steps = [d for d in output_lsb(model, ours, theirs) if d is not None]
    m.max_lsb = max(steps) if steps else None
    recs = prof.records
    m.cycles = sum(r.cycles for r in recs) + round(sum(h.model_cycles for h in prof.host))
    acc_us = sum(r.time_us for r in recs)
    m.latency_us = acc_us + sum(h.model_us for h in prof.host)
    m.clock_mhz = sum(r.cycles for r in recs) / acc_us if acc_us else None
    busy = sum(r.cycles for r in recs)
    m.utilization = sum(r.utilization * r.cycles for r in recs) / busy if busy else 0.0
    if any("energy_uj" in r.extra for r in recs):
        m.energy_uj = sum(r.extra.get("energy_uj", 0.0) for r in recs)
    m.bytes_moved = sum(r.bytes_moved for r in recs)
    m.layers = len(report.offloads)
    cpu = [r for r in report.offloads if r.placement == "cpu"]
    m.offloaded = m.layers - len(cpu)
    top = common_fallback([r.reason for r in cpu if r.reason])
    m.top_fallback = f"{len(top)} of {len(cpu)}: {top[0]}" if top else ""
    m.per_layer = _per_layer(report.offloads, recs)
    return m


def _per_layer(offloads, records) -> list[LayerCost]:
    """A :class:`LayerCost` per layer of the compile report, the records of a layer summed; a
    fused group's record (``a+b``) counts for its first layer, the others say where."""
    by_layer: dict[str, list] = {}
    counted_in: dict[str, str] = {}
    for r in records:
        first, *rest = r.layer.split("+")
        by_layer.setdefault(first, []).append(r)
        counted_in.update(dict.fromkeys(rest, first))
    out = []
    for row in offloads:
        recs = by_layer.get(row.layer, [])
        cycles = sum(r.cycles for r in recs)
        energy = [r.extra["energy_uj"] for r in recs if "energy_uj" in r.extra]
        out.append(LayerCost(row.layer, row.op, row.placement, cycles,
                             sum(r.time_us for r in recs),
                             sum(r.utilization * r.cycles for r in recs) / cycles if cycles
                             else 0.0, sum(energy) if energy else None,
                             counted_in.get(row.layer, "")))
    return out


def model_name(path: str | os.PathLike) -> str:
    """The name a model goes by in tables: its file name without ``.onnx``."""
    return os.path.splitext(os.path.basename(os.fspath(path)))[0]
