"""Per-layer profiling of accelerator calls (``tvmc run --profile``).

Target runtimes call :func:`record` for every layer they simulate while a :func:`profiling`
context is active; the context collects the records and, if asked, merges the simulator's
Chrome-trace events of all calls into one timeline file.
"""

from __future__ import annotations

import json
import os
import tempfile
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


@dataclass
class Profiler:
    trace_path: str | None = None
    records: list[LayerRecord] = field(default_factory=list)
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
        ``extra["energy_uj"]`` at the compile-time operating point, named below the table)."""
        energy = any("energy_uj" in r.extra for r in self.records)
        rows = [(r.layer, r.op, r.engine, r.shape, r.macs, r.cycles, f"{100 * r.utilization:.1f}%",
                 r.bytes_moved, r.time_us,
                 *([f"{r.extra['energy_uj']:.3f}" if "energy_uj" in r.extra else ""]
                   if energy else [])) for r in self.records]
        tot_macs = sum(r.macs for r in self.records)
        tot_cyc = sum(r.cycles for r in self.records)
        rows.append(("TOTAL", "", "", "", tot_macs, tot_cyc, "",
                     sum(r.bytes_moved for r in self.records),
                     sum(r.time_us for r in self.records),
                     *([f"{sum(r.extra.get('energy_uj', 0.0) for r in self.records):.3f}"]
                       if energy else [])))
        text = format_table(["layer", "op", "engine", "shape", "MACs", "cycles", "util",
                             "bytes moved", "time (us)", *(["energy (uJ)"] if energy else [])],
                            rows, align="llllrrrrr" + ("r" if energy else ""))
        points = {(r.extra["vdd"], r.extra["freq_mhz"], r.extra.get("abb", False))
                  for r in self.records if "energy_uj" in r.extra and "vdd" in r.extra}
        for vdd, mhz, abb in sorted(points):
            text += f"\nenergy at {vdd} V, {mhz:.0f} MHz{' with ABB' if abb else ''}"
        return text

    def write_trace(self) -> None:
        if self.trace_path is None:
            return
        with open(self.trace_path, "w") as f:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ns"}, f)


_ACTIVE: list[Profiler] = []


def active() -> Profiler | None:
    return _ACTIVE[-1] if _ACTIVE else None


def record(rec: LayerRecord) -> None:
    p = active()
    if p is not None:
        p.records.append(rec)
        p.time_us += rec.time_us


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
