"""``tvmc compare-targets``: one model on several targets side by side.

Each target gets the model as it needs it (a float model quantized once per distinct
:attr:`~tvm_accel.target.AccelTarget.quantize_scheme` / ``activation_type``, or the user's QDQ
model for that target), compiled and run once
(:func:`~tvm_accel.explore.measure.measure`): a table with a row per layer (placement, cycles,
utilization, energy per target) and a summary (latency at each target's clock, energy,
offloaded layers, bit-exactness against the CPU reference, agreement with onnxruntime).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tvm_accel.errors import AccelError
from tvm_accel.explore.measure import (
    INVALID,
    OK,
    Measurement,
    measure,
    model_for,
    read_model,
)


@dataclass
class TargetRun:
    """One target of the comparison: ``label`` as given (``vta:vta_8x8x8``), its config's
    name, how the model was quantized for it and what it measured."""

    label: str
    kind: str
    config: str
    quantized: str
    result: Measurement


@dataclass
class TargetComparison:
    model: str
    runs: list[TargetRun] = field(default_factory=list)

    def layer_table(self) -> str:
        """A row per layer (every target's layers, first target's order first): per target the
        placement (``cpu``, the target, or ``+<layer>``: fused into that layer, counted there),
        cycles, utilization and, where modelled, energy."""
        from tvm_accel.report import format_table

        names: dict[str, str] = {}
        for run in self.runs:
            for lc in run.result.per_layer:
                names.setdefault(lc.layer, lc.op)
        header, align = ["layer", "op"], "ll"
        cols = []
        for run in self.runs:
            energy = run.result.energy_uj is not None
            header += [f"{run.label}", "cycles", "util", *(["uJ"] if energy else [])]
            align += "lrr" + ("r" if energy else "")
            cols.append(({lc.layer: lc for lc in run.result.per_layer}, energy))
        rows = []
        for name, op in names.items():
            row = [name, op]
            for by, energy in cols:
                found = by.get(name)
                if found is None or found.placement == "cpu" or found.counted_in:
                    place = "-" if found is None else (f"+{found.counted_in}"
                                                       if found.counted_in else "cpu")
                    row += [place, "", "", *([""] if energy else [])]
                    continue
                lc = found
                row += [lc.placement, f"{lc.cycles:,}", f"{100 * lc.utilization:.1f}%",
                        *([f"{lc.energy_uj:.3f}" if lc.energy_uj is not None else ""]
                          if energy else [])]
            rows.append(row)
        return format_table(header, rows, align)

    def summary_table(self) -> str:
        """A row per target: clock, cycles, latency, energy, offloaded layers, bit-exactness
        against the CPU reference, largest output difference from onnxruntime."""
        from tvm_accel.report import format_table

        rows = []
        for run in self.runs:
            m = run.result
            if m.status != OK:
                rows.append((run.label, run.config, run.quantized, m.status, "", "", "", "",
                             "", "", m.reason))
                continue
            rows.append((run.label, run.config, run.quantized,
                         f"{m.clock_mhz:.0f}" if m.clock_mhz else "", f"{m.cycles:,}",
                         f"{m.latency_us:,.1f}",
                         f"{m.energy_uj:.2f}" if m.energy_uj is not None else "",
                         f"{m.offloaded}/{m.layers}",
                         {True: "yes", False: "NO", None: ""}[m.bit_exact],
                         "" if m.max_lsb is None else f"{m.max_lsb:g}", m.top_fallback))
        return format_table(["target", "config", "quantized", "clock (MHz)", "cycles",
                             "latency (us)", "energy (uJ)", "offloaded", "bit-exact",
                             "LSB vs ort", "top CPU fallback"], rows, "llllrrrrlrl")

    def format(self) -> str:
        return (f"{self.model}: per layer\n{self.layer_table()}\n\n{self.model}: summary "
                "(latency: accelerator layers at each target's clock plus modelled host passes;"
                " layers on the CPU are not timed)\n" + self.summary_table())

    def layer_series(self) -> tuple[list[str], dict[str, list[float]]]:
        """Layer names and each target's time per layer (us; 0 on the CPU) for the bar
        chart."""
        names = list(dict.fromkeys(lc.layer for r in self.runs for lc in r.result.per_layer))
        series = {}
        for run in self.runs:
            by = {lc.layer: lc.time_us for lc in run.result.per_layer}
            series[run.label] = [by.get(n, 0.0) for n in names]
        return names, series


def parse_targets(text: str) -> list[tuple[str, str, str | None]]:
    """``"vta,vta:vta_8x8x8,dpu"`` -> ``[(label, kind, config or None), ...]``."""
    from tvm_accel.target import available_targets

    out = []
    for label in (t.strip() for t in text.split(",")):
        if not label:
            continue
        kind, _, config = label.partition(":")
        if kind not in available_targets():
            raise AccelError(f"--targets: unknown accelerator '{kind}' (available: "
                             f"{', '.join(available_targets())})")
        out.append((label, kind, config or None))
    if not out:
        raise AccelError("--targets is empty; give e.g. vta,dpu,marsellus")
    if len({lb for lb, _, _ in out}) != len(out):
        raise AccelError("--targets: a target is given twice")
    return out


def compare_targets(model: str, targets: list[tuple[str, str, str | None]],
                    models_for: dict[str, str] | None = None, calibration: Any = None,
                    seed: int = 0) -> TargetComparison:
    """Run ``model`` (ONNX path) on each of ``targets`` (:func:`parse_targets`); a label or
    kind in ``models_for`` takes that QDQ model instead. A float model is quantized once per
    distinct scheme and activation type."""
    import os

    import onnx

    from tvm_accel.quantize import is_quantized
    from tvm_accel.target import get_target

    out = TargetComparison(os.path.basename(model))
    quantized: dict[tuple[str, str], onnx.ModelProto] = {}
    given_qdq = is_quantized(read_model(model))
    for label, kind, config in targets:
        target = get_target(kind)
        given = (models_for or {}).get(label) or (models_for or {}).get(kind)
        if given:
            qdq = read_model(given)
            if not is_quantized(qdq):
                raise AccelError(f"--model-for {kind}={given}: not a QDQ model; quantize it "
                                 "with 'tvmc quantize' or leave it out")
            how = os.path.basename(given)
        else:
            key = (target.quantize_scheme, target.activation_type)
            if key not in quantized:
                quantized[key] = model_for(model, target, calibration)
            qdq = quantized[key]
            how = "as given" if given_qdq else f"{target.quantize_scheme} " \
                f"{target.activation_type}"
        result = measure(qdq, target, config, seed=seed)
        if result.status == INVALID:
            raise AccelError(f"--targets {label}: {result.reason}")
        name = config or target.load_config(None).name
        out.runs.append(TargetRun(label, kind, name, how, result))
    return out
