"""Binding of the DPU functional + timed simulator (``sim/dpu``).

:func:`simulate` runs one instruction stream (the bytes of ``codegen.encode_stream``) against a DDR
image (a ``uint8`` numpy array, modified in place) and returns :class:`DPUStats`. FM and PM start
zeroed in every run. The DDR regions (INPUT, OUTPUT, PARAM, INSN, SWAP) are byte ranges of that
array given by the region registers: ``regions={"INPUT": (base, size), ...}`` sets some of them,
the others keep the config's default layout (:meth:`DPUConfig.region_layout`). Any fault of the
program (bad field, out-of-range address, deadlock, unbalanced dependencies, cycle budget) raises
:class:`tvm_accel.errors.SimulatorError` with a one-line message naming the instruction and field.

Instruction semantics: ``docs/dpu.md`` (ISA); timing model: ``sim/dpu/dpu_sim.h``.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, fields

import numpy as np

from tvm_accel import simlib
from tvm_accel.errors import SimulatorError
from tvm_dpu.codegen import INSN_BYTES, UNITS
from tvm_dpu.hw_config import REGION_NAMES, DPUConfig

_NU = len(UNITS)
_NR = len(REGION_NAMES)


class _Config(ctypes.Structure):
    _fields_ = [
        ("num_pe", ctypes.c_int32), ("fm_memories", ctypes.c_int32), ("fm_banks", ctypes.c_int32),
        ("fm_bank_bytes", ctypes.c_int32), ("pm_bytes", ctypes.c_int32),
        ("conv_ic_par", ctypes.c_int32), ("conv_oc_par", ctypes.c_int32),
        ("conv_row_par", ctypes.c_int32), ("misc_ch_par", ctypes.c_int32),
        ("misc_row_par", ctypes.c_int32), ("format_max_channels", ctypes.c_int32),
        ("format_max_factor", ctypes.c_int32), ("load_latency_cycles", ctypes.c_int32),
        ("save_latency_cycles", ctypes.c_int32), ("conv_latency_cycles", ctypes.c_int32),
        ("misc_latency_cycles", ctypes.c_int32),
        ("clock_mhz", ctypes.c_double), ("ddr_bytes_per_cycle", ctypes.c_double),
        ("region_base", ctypes.c_uint64 * _NR), ("region_size", ctypes.c_uint64 * _NR),
        ("max_cycles", ctypes.c_uint64),
    ]


class _Stats(ctypes.Structure):
    _fields_ = [
        ("cycles", ctypes.c_uint64), ("busy", ctypes.c_uint64 * _NU),
        ("stall", ctypes.c_uint64 * _NU), ("insns", ctypes.c_uint64 * _NU),
        ("stall_on", (ctypes.c_uint64 * _NU) * _NU),
        ("macs", ctypes.c_uint64), ("padded_macs", ctypes.c_uint64),
        ("ddr_read_bytes", ctypes.c_uint64), ("ddr_write_bytes", ctypes.c_uint64),
        ("fm_read_bytes", ctypes.c_uint64), ("fm_write_bytes", ctypes.c_uint64),
        ("pm_read_bytes", ctypes.c_uint64), ("pm_write_bytes", ctypes.c_uint64),
        ("tokens", ctypes.c_uint64), ("head_cycles", ctypes.c_uint64),
        ("tail_cycles", ctypes.c_uint64),
    ]


def _stall_fields():
    return [f"{w.lower()}_stall_on_{p.lower()}" for w in UNITS for p in UNITS if w != p]


@dataclass
class DPUStats:
    """Counters of one run (or, summed with ``+``, of several).

    ``<unit>_busy`` / ``<unit>_stall`` / ``<unit>_insns`` per unit; ``<a>_stall_on_<b>`` is the
    part of unit a's stall spent waiting for a token from unit b (the token that arrived last).
    ``macs`` are useful MACs (taps on real input), ``padded_macs`` include padding taps; both
    count all PEs. Byte counters cover all PEs; ``pm_read_bytes`` counts each CONV's parameters
    once (the PM is shared). ``head_cycles`` / ``tail_cycles``: cycles before the first CONV /
    MISC instruction starts and after the last one ends (the part of a stream that the next or
    previous stream can overlap when they run as one stream).
    """

    cycles: int = 0
    load_busy: int = 0
    save_busy: int = 0
    conv_busy: int = 0
    misc_busy: int = 0
    load_stall: int = 0
    save_stall: int = 0
    conv_stall: int = 0
    misc_stall: int = 0
    load_insns: int = 0
    save_insns: int = 0
    conv_insns: int = 0
    misc_insns: int = 0
    macs: int = 0
    padded_macs: int = 0
    ddr_read_bytes: int = 0
    ddr_write_bytes: int = 0
    fm_read_bytes: int = 0
    fm_write_bytes: int = 0
    pm_read_bytes: int = 0
    pm_write_bytes: int = 0
    tokens: int = 0
    head_cycles: int = 0
    tail_cycles: int = 0
    load_stall_on_save: int = 0
    load_stall_on_conv: int = 0
    load_stall_on_misc: int = 0
    save_stall_on_load: int = 0
    save_stall_on_conv: int = 0
    save_stall_on_misc: int = 0
    conv_stall_on_load: int = 0
    conv_stall_on_save: int = 0
    conv_stall_on_misc: int = 0
    misc_stall_on_load: int = 0
    misc_stall_on_save: int = 0
    misc_stall_on_conv: int = 0

    def __add__(self, other: DPUStats) -> DPUStats:
        if not isinstance(other, DPUStats):
            return NotImplemented
        return DPUStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def time_us(self, cfg: DPUConfig) -> float:
        """Device time of the run at the config's clock."""
        return self.cycles / cfg.CLOCK_MHZ

    def utilization(self, cfg: DPUConfig) -> float:
        """Useful MACs over the peak of the whole run (cycles x all PEs' MACs/cycle)."""
        return self.macs / (self.cycles * cfg.peak_macs_per_cycle) if self.cycles else 0.0

    @classmethod
    def _from_c(cls, s: _Stats) -> DPUStats:
        kw = {"cycles": s.cycles, "macs": s.macs, "padded_macs": s.padded_macs,
              "tokens": s.tokens, "head_cycles": s.head_cycles, "tail_cycles": s.tail_cycles}
        for name in ("ddr_read_bytes", "ddr_write_bytes", "fm_read_bytes", "fm_write_bytes",
                     "pm_read_bytes", "pm_write_bytes"):
            kw[name] = getattr(s, name)
        for i, u in enumerate(UNITS):
            u = u.lower()
            kw[f"{u}_busy"], kw[f"{u}_stall"], kw[f"{u}_insns"] = (s.busy[i], s.stall[i],
                                                                   s.insns[i])
            for j, p in enumerate(UNITS):
                if i != j:
                    kw[f"{u}_stall_on_{p.lower()}"] = s.stall_on[i][j]
        return cls(**kw)


assert [f.name for f in fields(DPUStats)][-12:] == _stall_fields()

_fns: dict = {}


def _lib_fns():
    if not _fns:
        size = simlib.function("dpu_sim_config_size", ctypes.c_uint64, [])
        ssize = simlib.function("dpu_sim_stats_size", ctypes.c_uint64, [])
        if size() != ctypes.sizeof(_Config) or ssize() != ctypes.sizeof(_Stats):
            raise SimulatorError("simulator library struct layout does not match the binding; "
                                 "rebuild it with `python setup.py build_sim`")
        _fns["run"] = simlib.function("dpu_sim_run", ctypes.c_int, [
            ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_uint64, ctypes.c_void_p,
            ctypes.c_uint64, ctypes.POINTER(_Stats), ctypes.c_char_p, ctypes.c_double,
            ctypes.c_int32, ctypes.c_char_p, ctypes.c_uint64])
        _fns["ranges"] = simlib.function("dpu_sim_run_ranges", ctypes.c_int, [
            ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_uint64, ctypes.c_void_p,
            ctypes.c_uint64, ctypes.POINTER(_Stats), ctypes.POINTER(ctypes.c_uint64),
            ctypes.c_uint64, ctypes.POINTER(_Stats), ctypes.c_char_p, ctypes.c_double,
            ctypes.c_int32, ctypes.c_char_p, ctypes.c_uint64])
        _fns["decode"] = simlib.function("dpu_sim_decode_fields", ctypes.c_int, [
            ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_uint64,
            ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_uint64])
    return _fns


def _c_config(cfg: DPUConfig, max_cycles: int | None,
              regions: dict[str, tuple[int, int]] | None) -> _Config:
    if max_cycles is not None and (isinstance(max_cycles, bool) or not isinstance(
            max_cycles, (int, np.integer)) or not 0 < max_cycles < 2**64):
        raise SimulatorError(f"max_cycles must be a positive integer, got {max_cycles!r}")
    layout = cfg.region_layout()
    for name, value in (regions or {}).items():
        if name not in layout:
            raise SimulatorError(f"unknown DDR region {name!r} (regions: "
                                 f"{', '.join(REGION_NAMES)})")
        try:
            base, size = (int(v) for v in value)
        except (TypeError, ValueError):
            raise SimulatorError(f"DDR region {name}: expected (base, size), got {value!r}"
                                 ) from None
        if not (0 <= base < 2**62 and 0 <= size <= 2**32):
            raise SimulatorError(f"DDR region {name}: base {base} / size {size} out of range "
                                 "(size at most 2^32)")
        layout[name] = (base, size)
    c = _Config()
    simlib.fill_struct(c, {
        "num_pe": cfg.NUM_PE, "fm_memories": cfg.FM_MEMORIES, "fm_banks": cfg.FM_BANKS,
        "fm_bank_bytes": cfg.FM_BANK_BYTES, "pm_bytes": cfg.PM_BYTES,
        "conv_ic_par": cfg.CONV_IC_PAR, "conv_oc_par": cfg.CONV_OC_PAR,
        "conv_row_par": cfg.CONV_ROW_PAR, "misc_ch_par": cfg.MISC_CH_PAR,
        "misc_row_par": cfg.MISC_ROW_PAR, "format_max_channels": cfg.FORMAT_MAX_CHANNELS,
        "format_max_factor": cfg.FORMAT_MAX_FACTOR,
        "load_latency_cycles": cfg.LOAD_LATENCY_CYCLES,
        "save_latency_cycles": cfg.SAVE_LATENCY_CYCLES,
        "conv_latency_cycles": cfg.CONV_LATENCY_CYCLES,
        "misc_latency_cycles": cfg.MISC_LATENCY_CYCLES, "clock_mhz": cfg.CLOCK_MHZ,
        "ddr_bytes_per_cycle": cfg.DDR_BYTES_PER_CYCLE}, "DPU simulator")
    for i, name in enumerate(REGION_NAMES):
        base, size = layout[name]
        if not (isinstance(base, int) and isinstance(size, int) and 0 <= base < 2**62
                and 0 <= size <= 2**32):  # from an unvalidated config
            raise simlib.config_error("DPU simulator", f"DDR region {name}: base {base} / size "
                                      f"{size} out of range (size at most 2^32)")
        c.region_base[i], c.region_size[i] = base, size
    c.max_cycles = int(max_cycles or 0)
    return c


def simulate(cfg: DPUConfig, insns: bytes, ddr: np.ndarray, trace_path: str | None = None,
             trace_offset_us: float = 0.0, trace_append: bool = False,
             max_cycles: int | None = None,
             regions: dict[str, tuple[int, int]] | None = None) -> DPUStats:
    """Run ``insns`` on the DPU simulator.

    ``ddr`` is a writable C-contiguous ``uint8`` array, read and written in place; ``regions``
    maps region names to ``(base, size)`` byte ranges of it (default: the config's layout).
    ``trace_path`` writes a Chrome/Perfetto trace (one track per unit); with
    ``trace_append=True`` the events are added to a trace written by an earlier run, shifted by
    ``trace_offset_us``. ``max_cycles`` bounds the run (default:
    :func:`tvm_accel.simlib.cycle_budget`, else 2^34 cycles). Ctrl-C stops the run within
    milliseconds and raises ``KeyboardInterrupt`` (:func:`tvm_accel.simlib.call`).
    """
    return _run(cfg, insns, ddr, None, trace_path, trace_offset_us, trace_append, max_cycles,
                regions)[0]


def simulate_ranges(cfg: DPUConfig, insns: bytes, ddr: np.ndarray, ends: list[int],
                    trace_path: str | None = None, trace_offset_us: float = 0.0,
                    trace_append: bool = False, max_cycles: int | None = None,
                    regions: dict[str, tuple[int, int]] | None = None
                    ) -> tuple[DPUStats, list[DPUStats]]:
    """:func:`simulate` for one stream made of consecutive instruction ranges (the layers or
    fused groups of a function compiled into one stream): range ``r`` is the instructions
    ``[ends[r-1], ends[r])``. Returns the totals and one :class:`DPUStats` per range with the
    counters of its instructions and its cycles: the run is cut where each range's compute
    (first CONV / MISC) starts, never before the earlier ranges' last CONV ends (see
    ``dpu_sim_run_ranges`` in ``sim/dpu/dpu_sim.h``), so the cycles sum to the total, a range's
    CONV work lies inside its window and the LOADs it issued during its predecessor's tail are
    hidden there."""
    if not ends:
        raise SimulatorError("simulate_ranges needs at least one range")
    try:
        arr = (ctypes.c_uint64 * len(ends))(*(int(e) for e in ends))
    except (TypeError, ValueError, OverflowError):
        raise SimulatorError(f"range ends must be non-negative integers, got {ends!r}") from None
    return _run(cfg, insns, ddr, arr, trace_path, trace_offset_us, trace_append, max_cycles,
                regions)


def _run(cfg, insns, ddr, ends, trace_path, trace_offset_us, trace_append, max_cycles, regions):
    if isinstance(insns, (bytearray, memoryview)):
        insns = bytes(insns)
    if not isinstance(insns, bytes):
        raise SimulatorError(f"instructions must be bytes, got {type(insns).__name__}")
    if not isinstance(ddr, np.ndarray):
        raise SimulatorError(f"ddr must be a numpy uint8 array, got {type(ddr).__name__}")
    if ddr.dtype != np.uint8:
        raise SimulatorError(f"ddr must have dtype uint8, got {ddr.dtype}")
    if not ddr.flags.c_contiguous:
        raise SimulatorError("ddr must be C-contiguous (use np.ascontiguousarray and copy back)")
    if not ddr.flags.writeable:
        raise SimulatorError("ddr must be writable (the simulator stores results into it)")
    c_cfg = _c_config(cfg, simlib.max_cycles_of(max_cycles), regions)
    stats = _Stats()
    err = simlib.err_buffer()
    path = os.fsencode(trace_path) if trace_path is not None else None
    head = (ctypes.byref(c_cfg), insns, len(insns), ddr.ctypes.data if ddr.size else None,
            ddr.nbytes, ctypes.byref(stats))
    tail = (path, float(trace_offset_us), int(bool(trace_append)), err, len(err))
    if ends is None:
        code = simlib.call(_lib_fns()["run"], *head, *tail)
        per = []
    else:
        out = (_Stats * len(ends))()
        code = simlib.call(_lib_fns()["ranges"], *head, ends, len(ends), out, *tail)
        per = [DPUStats._from_c(s) for s in out]
    simlib.check(code, err, "DPU simulator")
    return DPUStats._from_c(stats), per


def decode_fields(insn: bytes) -> list[int]:
    """Field values of one instruction as the C simulator decodes them (header first, layout
    order); raises SimulatorError for words the simulator rejects. For cross-checks."""
    if len(insn) != INSN_BYTES:
        raise SimulatorError(f"an instruction is {INSN_BYTES} bytes, got {len(insn)}")
    out = (ctypes.c_int64 * 64)()
    n = ctypes.c_uint64()
    err = simlib.err_buffer()
    code = _lib_fns()["decode"](bytes(insn), out, 64, ctypes.byref(n), err, len(err))
    simlib.check(code, err, "DPU decoder")
    return list(out[:n.value])
