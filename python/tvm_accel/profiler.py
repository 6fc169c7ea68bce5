"""Per-layer profiling of accelerator calls (``tvmc run --profile``).

Target runtimes call :func:`record` for every layer they simulate while a :func:`profiling`
context is active; the context collects the records and, if asked, merges the simulator's
Chrome-trace events of all calls into one timeline file.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tvm_accel.report import format_table


@dataclass
class LayerRecord:
    """Simulated cost of one layer of one accelerator call."""

    function: str
    layer: str
    op: str
    shape: str
    engine: str
    macs: int
    cycles: int
    utilization: float
    bytes_moved: int
    time_us: float
    extra: dict = field(default_factory=dict)
    bound: str = ""  # what limits the layer (:func:`bound_label`), "" when not modelled


def bound_label(busy: dict[str, float]) -> str:
    """What bounds a layer, the paper's Fig. 18 labels: ``busy`` maps ``"off-chip"`` (the DMA
    to external memory), ``"on-chip"`` (the DMA between on-chip memories) and ``"compute"``
    (the engines) to their busy cycles (the larger of the units of a class); the label is the
    class that is busy longest (ties go to compute: the memory work hides behind it)."""
    order = {"compute": 0, "on-chip": 1, "off-chip": 2}
    kind = max(busy.items(), key=lambda kv: (kv[1], -order.get(kv[0], 3)))[0] if busy else ""
    return f"{kind} bound" if kind else ""


@dataclass
class HostRecord:
    """One host pass a target runs around its calls (VTA: a layout rewrite function, or the
    runtime's blocking of a tensor): the bytes and cycles of the target's host model (in the
    accelerator's cycles; ``model_us`` at its clock) beside the wall time measured here."""

    symbol: str
    layer: str
    op: str
    bytes_moved: int
    model_cycles: float
    time_us: float
    kind: str = ""        # the host model's class of the pass (VTA: copy or gather)
    model_us: float = 0.0


@dataclass
class Profiler:
    trace_path: str | None = None
    records: list[LayerRecord] = field(default_factory=list)
    host: list[HostRecord] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    time_us: float = 0.0

    def trace_file(self) -> str | None:
        """A fresh temporary path for one simulator call's trace (None when not tracing)."""
        if self.trace_path is None:
            return None
        fd, path = tempfile.mkstemp(suffix=".json", prefix="accel_trace_")
        os.close(fd)
        return path

    def absorb_trace(self, path: str | None, offset_us: float = 0.0) -> None:
        """Append the events of a simulator trace file, shifted by ``offset_us``, and delete it."""
        if not path:
            return
        try:
            with open(path) as f:
                text = f.read()
            if text.strip():
                data = json.loads(text)
                evs = data["traceEvents"] if isinstance(data, dict) else data
                for ev in evs:
                    if "ts" in ev:
                        ev["ts"] = ev["ts"] + offset_us
                self.events.extend(evs)
        finally:
            os.unlink(path)

    def table(self) -> str:
        """Per-layer table; with an energy column when a target reports energy (MARSELLUS:
        ``extra["energy_uj"]`` at the compile-time operating point, named below the table),
        an engine column only when the layers ran on more than one engine (the legend names
        each engine's clock), ``bound`` without its word "bound"."""
        energy = any("energy_uj" in r.extra for r in self.records)
        bound = any(r.bound for r in self.records)
        engine = len({r.engine for r in self.records}) > 1
        rows = [(r.layer, r.op, *([r.engine] if engine else []), r.shape, r.macs, r.cycles,
                 f"{100 * r.utilization:.1f}%", r.bytes_moved, r.time_us,
                 *([f"{r.extra['energy_uj']:.3f}" if "energy_uj" in r.extra else ""]
                   if energy else []), *([r.bound.removesuffix(" bound")] if bound else []))
                for r in self.records]
        tot_macs = sum(r.macs for r in self.records)
        tot_cyc = sum(r.cycles for r in self.records)
        tot_us = sum(r.time_us for r in self.records)
        tail = ([""] if energy else []) + ([""] if bound else [])
        blank = [""] * (3 if engine else 2)  # op, engine, shape
        if self.host:  # the TOTAL is accelerator plus modelled host passes
            host_cyc = sum(h.model_cycles for h in self.host)
            host_us = sum(h.model_us for h in self.host)
            rows.append(("accelerator", *blank, tot_macs, tot_cyc, "",
                         sum(r.bytes_moved for r in self.records), tot_us, *tail))
            rows.append(("host (model)", *(["", "host", ""] if engine else ["", ""]), "",
                         round(host_cyc), "", sum(h.bytes_moved for h in self.host), host_us,
                         *tail))
            tot_cyc, tot_us = tot_cyc + round(host_cyc), tot_us + host_us
        rows.append(("TOTAL", *blank, tot_macs, tot_cyc, "",
                     sum(r.bytes_moved for r in self.records)
                     + sum(h.bytes_moved for h in self.host), tot_us,
                     *([f"{sum(r.extra.get('energy_uj', 0.0) for r in self.records):.3f}"]
                       if energy else []), *([""] if bound else [])))
        text = format_table(["layer", "op", *(["engine"] if engine else []), "shape", "MACs",
                             "cycles", "util", "bytes", "us", *(["energy (uJ)"] if energy else []),
                             *(["bound"] if bound else [])],
                            rows, align="ll" + ("l" if engine else "") + "lrrrrr"
                            + ("r" if energy else "") + ("l" if bound else ""),
                            optional=("us",))  # cycles at the clock the legend names
        points = {(r.extra["vdd"], r.extra["freq_mhz"], r.extra.get("abb", False))
                  for r in self.records if "energy_uj" in r.extra and "vdd" in r.extra}
        for vdd, mhz, abb in sorted(points):
            text += f"\nenergy at {vdd} V, {mhz:.0f} MHz{' with ABB' if abb else ''}"
        if self.records:
            text += "\n" + self.legend(bound)
        if self.host:
            rows = [(h.layer, h.op, h.kind, h.bytes_moved, f"{h.model_cycles:,.0f}",
                     f"{h.time_us:.1f}") for h in self.host]
            rows.append(("TOTAL", "", "", sum(h.bytes_moved for h in self.host),
                         f"{sum(h.model_cycles for h in self.host):,.0f}",
                         f"{sum(h.time_us for h in self.host):.1f}"))
            text += "\n\nhost passes (layout rewrites and blocking; cycles modelled on the " \
                    "target's host, time measured here):\n" + format_table(
                        ["layer", "op", "kind", "bytes", "model cycles", "measured (us)"], rows,
                        align="lllrrr")
        return text

    def legend(self, bound: bool) -> str:
        """What the table's columns mean: ``util``'s peak, the clock that turns cycles into
        microseconds (per engine, from the records), ``bound``'s classes."""
        clocks: dict[str, list[str]] = {}
        for r in self.records:
            if r.time_us > 0 and r.engine not in sum(clocks.values(), []):
                clocks.setdefault(f"{r.cycles / r.time_us:.0f} MHz", []).append(r.engine)
        at = "; ".join(f"{', '.join(e)} at {mhz}" for mhz, e in clocks.items())
        text = ("util: MACs / (cycles x the engine's peak MACs per cycle); bytes: moved\n"
                f"us: time, cycles at the engine's clock ({at or 'none'})")
        if bound:
            text += ("\nbound: the units busy longest (compute engines, on-chip or off-chip "
                     "data movement)")
        return text

    def write_csv(self, path: str) -> None:
        """One row per layer record (the ``--profile`` table's columns, unformatted, plus the
        target's extra counters as JSON) for spreadsheets and scripts."""
        import csv

        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["function", "layer", "op", "engine", "shape", "macs", "cycles",
                        "utilization", "bytes_moved", "time_us", "energy_uj", "bound", "extra"])
            for r in self.records:
                w.writerow([r.function, r.layer, r.op, r.engine, r.shape, r.macs, r.cycles,
                            f"{r.utilization:.6f}", r.bytes_moved, f"{r.time_us:.3f}",
                            r.extra.get("energy_uj", ""), r.bound,
                            json.dumps(r.extra, default=str, sort_keys=True)])

    def summary(self) -> dict:
        """Totals of the run: layers, MACs, cycles, time, bytes, energy (when modelled), the
        layers by bound and the host rewrites' modelled cycles."""
        cycles = sum(r.cycles for r in self.records)
        out: dict[str, int | float | dict[str, int]] = {
               "layers": len(self.records), "macs": sum(r.macs for r in self.records),
               "cycles": cycles,
               "time_us": round(sum(r.time_us for r in self.records), 3),
               "bytes_moved": sum(r.bytes_moved for r in self.records)}
        if any("energy_uj" in r.extra for r in self.records):
            out["energy_uj"] = round(sum(r.extra.get("energy_uj", 0.0) for r in self.records),
                                     6)
        bounds: dict[str, int] = {}
        for r in self.records:
            if r.bound:
                bounds[r.bound] = bounds.get(r.bound, 0) + 1
        if bounds:
            out["bound"] = bounds
        if self.host:
            host = round(sum(h.model_cycles for h in self.host), 1)
            out["host_model_cycles"] = host
            out["total_cycles"] = round(cycles + host, 1)
        return out

    def write_trace(self) -> None:
        if self.trace_path is None:
            return
        with open(self.trace_path, "w") as f:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ns"}, f)


_ACTIVE: list[Profiler] = []


def active() -> Profiler | None:
    return _ACTIVE[-1] if _ACTIVE else None


#: trace category and process id of the layer spans (one "layers" track; ``tvmc timeline``
#: draws them as the layer boundaries)
LAYER_CATEGORY = "layer"
LAYER_PID = 1 << 20


def record(rec: LayerRecord) -> None:
    """Record a layer a target's runtime simulated; when tracing, also its span on the
    timeline (the runtimes record a call's layers in order, after its trace, so the span
    starts where the previous layer's ends)."""
    p = active()
    if p is not None:
        if p.trace_path is not None:
            if not p.records:
                p.events.append({"name": "process_name", "ph": "M", "pid": LAYER_PID,
                                 "args": {"name": "layers"}})
            p.events.append({"name": rec.layer, "cat": LAYER_CATEGORY, "ph": "X",
                             "pid": LAYER_PID, "tid": 0, "ts": p.time_us, "dur": rec.time_us,
                             "args": {"op": rec.op, "cycles": rec.cycles}})
        p.records.append(rec)
        p.time_us += rec.time_us


def record_host(rec: HostRecord) -> None:
    """Record a host pass a target's runtime did itself (e.g. blocking a call's input)."""
    p = active()
    if p is not None:
        p.host.append(rec)


def time_host_functions(vm, functions: list[dict], prof: Profiler) -> None:
    """Time the calls of the host functions ``functions`` (``symbol``, ``layer``, ``op``,
    ``read``, ``written``, ``cycles`` and optionally ``kind``, ``model_us`` as in the package
    metadata) on ``vm`` into ``prof``."""
    known = {f["symbol"]: f for f in functions}
    if not known:
        return
    started: dict[str, float] = {}

    def instrument(func, symbol, before, ret, *args) -> int:
        f = known.get(symbol)
        if f is not None:
            now = time.perf_counter()
            if before:
                started[symbol] = now
            else:
                prof.host.append(HostRecord(symbol, f["layer"], f["op"],
                                            int(f["read"]) + int(f["written"]),
                                            float(f["cycles"]),
                                            (now - started.pop(symbol, now)) * 1e6,
                                            str(f.get("kind", "")),
                                            float(f.get("model_us", 0.0))))
        return 0

    vm.set_instrument(instrument)


@contextmanager
def profiling(trace_path: str | None = None) -> Iterator[Profiler]:
    """Collect per-layer records (and a merged trace) of every accelerator call inside."""
    p = Profiler(trace_path=trace_path)
    _ACTIVE.append(p)
    try:
        yield p
    finally:
        _ACTIVE.pop()
        p.write_trace()
