"""Binding of the MARSELLUS functional + timed simulator (``sim/marsellus``).

:func:`simulate` runs one command stream (``codegen.encode_stream``) against the L1, L2 and L3
memories (``uint8`` numpy arrays, modified in place; ``None`` = zeroed memory of the config's
size) and returns :class:`MarsellusStats`. Any fault of the program (bad field, out-of-range
address, deadlock, cycle budget) raises :class:`tvm_accel.errors.SimulatorError` with a one-line
message naming the command and field. Semantics: the command ISA in ``docs/marsellus.md``;
cycle model: ``hw_config`` and ``sim/marsellus/mars_sim.h`` (calibration: ``docs/marsellus.md``).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, fields

import numpy as np

from tvm_accel import simlib
from tvm_accel.errors import SimulatorError
from tvm_marsellus.codegen import CMD_BYTES, ENGINES, RbeJob, encode
from tvm_marsellus.hw_config import MarsellusConfig

_NE = len(ENGINES)
RBE_PHASES = ("load", "compute", "normquant", "streamout", "setup")


class _Config(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in (
        "rbe_cores", "rbe_blocks", "rbe_binconvs", "rbe_port_bits", "rbe_queue_depth",
        "rbe_min_bits", "rbe_max_bits", "rbe_load_latency", "rbe_kout_overhead",
        "rbe_compute_latency", "rbe_nq_cycles_per_group", "rbe_job_setup", "cluster_cores",
        "cl_mac_load", "cl_kernel_overhead", "dma_latency", "dma_row_overhead", "l3_latency")] + [
        (n, ctypes.c_double) for n in (
            "clock_mhz", "dma_bytes_per_cycle", "l3_bytes_per_cycle", "cl_matmul_8b",
            "cl_macload_speedup", "cl_4b_speedup", "cl_2b_speedup", "cl_dw_macs",
            "cl_fc_efficiency", "cl_im2col_bytes", "cl_nq_cycles_per_output",
            "cl_eltwise_elems", "cl_pool_taps", "cl_marshal_bits", "cl_lut_cycles")] + [
        ("max_cycles", ctypes.c_uint64)]


class _Stats(ctypes.Structure):
    _fields_ = [("cycles", ctypes.c_uint64), ("busy", ctypes.c_uint64 * _NE),
                ("stall", ctypes.c_uint64 * _NE), ("cmds", ctypes.c_uint64 * _NE),
                ("rbe_phase", ctypes.c_uint64 * len(RBE_PHASES))] + [
        (n, ctypes.c_uint64) for n in (
            "rbe_macs", "rbe_bin_ops", "cluster_macs", "cluster_elems", "l3_read_bytes",
            "l3_write_bytes", "l2_read_bytes", "l2_write_bytes", "l1_read_bytes",
            "l1_write_bytes")]


@dataclass
class MarsellusStats:
    """Counters of one run (or, summed with ``+``, of several).

    ``<engine>_busy`` / ``_stall`` / ``_cmds`` per engine (iodma, dma_in, dma_out, rbe,
    cluster); ``rbe_<phase>`` cycles of the RBE phases (``rbe_setup`` = job programming not
    hidden by the queue); ``rbe_macs`` / ``cluster_macs`` useful MACs (ops = 2 x MACs);
    ``rbe_bin_ops`` 1x1-bit operations (2 x MACs x W x I); bytes read/written per level.
    """

    cycles: int = 0
    iodma_busy: int = 0
    dma_in_busy: int = 0
    dma_out_busy: int = 0
    rbe_busy: int = 0
    cluster_busy: int = 0
    iodma_stall: int = 0
    dma_in_stall: int = 0
    dma_out_stall: int = 0
    rbe_stall: int = 0
    cluster_stall: int = 0
    iodma_cmds: int = 0
    dma_in_cmds: int = 0
    dma_out_cmds: int = 0
    rbe_cmds: int = 0
    cluster_cmds: int = 0
    rbe_load: int = 0
    rbe_compute: int = 0
    rbe_normquant: int = 0
    rbe_streamout: int = 0
    rbe_setup: int = 0
    rbe_macs: int = 0
    rbe_bin_ops: int = 0
    cluster_macs: int = 0
    cluster_elems: int = 0
    l3_read_bytes: int = 0
    l3_write_bytes: int = 0
    l2_read_bytes: int = 0
    l2_write_bytes: int = 0
    l1_read_bytes: int = 0
    l1_write_bytes: int = 0

    def __add__(self, other: MarsellusStats) -> MarsellusStats:
        if not isinstance(other, MarsellusStats):
            return NotImplemented
        return MarsellusStats(*(getattr(self, f.name) + getattr(other, f.name)
                                for f in fields(self)))

    @property
    def ops(self) -> int:
        return 2 * (self.rbe_macs + self.cluster_macs)

    def time_us(self, cfg: MarsellusConfig, freq_mhz: float | None = None) -> float:
        """Device time at ``freq_mhz`` (default: the config's clock)."""
        return self.cycles / (freq_mhz or cfg.CLOCK_MHZ)

    def gops(self, cfg: MarsellusConfig, freq_mhz: float | None = None) -> float:
        """Achieved Gop/s of the run (2 ops per MAC)."""
        t = self.time_us(cfg, freq_mhz)
        return self.ops / t / 1e3 if t else 0.0

    @classmethod
    def _from_c(cls, s) -> list[MarsellusStats]:
        """The stats of a C array of ``_Stats`` (all uint64 counters back to back: read in one
        go, each row's counters reordered from C order to the fields' order)."""
        rows = np.frombuffer(s, np.uint64).reshape(-1, len(_C_STATS_ORDER))[:, _FIELD_POS]
        out = []
        for r in rows.tolist():  # the fields set directly: __init__ of 31 arguments costs more
            st = object.__new__(cls)
            st.__dict__.update(zip(_FIELD_NAMES, r, strict=True))
            out.append(st)
        return out


#: the fields of :class:`MarsellusStats` in the order of the counters of ``_Stats``
_C_STATS_ORDER = ("cycles", *(f"{e.lower()}_{k}" for k in ("busy", "stall", "cmds")
                              for e in ENGINES),
                  *(f"rbe_{p}" for p in RBE_PHASES), *(n for n, _ in _Stats._fields_[5:]))
#: position in ``_C_STATS_ORDER`` of each field of :class:`MarsellusStats`
_FIELD_NAMES = tuple(f.name for f in fields(MarsellusStats))
_FIELD_POS = [_C_STATS_ORDER.index(n) for n in _FIELD_NAMES]


_fns: dict = {}
#: how the simulator's errors begin
WHAT = "MARSELLUS simulator"


def _lib_fns():
    if not _fns:
        size = simlib.function("mars_sim_config_size", ctypes.c_uint64, [])
        ssize = simlib.function("mars_sim_stats_size", ctypes.c_uint64, [])
        if size() != ctypes.sizeof(_Config) or ssize() != ctypes.sizeof(_Stats):
            raise SimulatorError("simulator library struct layout does not match the binding; "
                                 "rebuild it with `python setup.py build_sim`")
        p8 = ctypes.c_void_p
        _fns["run"] = simlib.function("mars_sim_run", ctypes.c_int, [
            ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_uint64, p8, ctypes.c_uint64, p8,
            ctypes.c_uint64, p8, ctypes.c_uint64, ctypes.POINTER(_Stats), ctypes.c_char_p,
            ctypes.c_double, ctypes.c_int32, ctypes.c_char_p, ctypes.c_uint64])
        _fns["job"] = simlib.function("mars_sim_rbe_job_cycles", ctypes.c_int, [
            ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64),
            ctypes.c_char_p, ctypes.c_uint64])
    return _fns


def _c_config(cfg: MarsellusConfig, max_cycles: int | None) -> _Config:
    """The C config of ``cfg`` (built once per config object, :class:`simlib.ConfigStructs`)."""
    if max_cycles is not None and (isinstance(max_cycles, bool) or not isinstance(
            max_cycles, (int, np.integer)) or not 0 < max_cycles < 2**64):
        raise SimulatorError(f"max_cycles must be a positive integer, got {max_cycles!r}")
    return _STRUCTS.get(cfg, None if max_cycles is None else int(max_cycles))


def _build_config(cfg: MarsellusConfig, max_cycles: int | None) -> _Config:
    c = _Config()
    vals = {
        "rbe_cores": cfg.RBE_CORES, "rbe_blocks": cfg.RBE_BLOCKS,
        "rbe_binconvs": cfg.RBE_BINCONVS, "rbe_port_bits": cfg.RBE_TCDM_PORT_BITS,
        "rbe_queue_depth": cfg.RBE_JOB_QUEUE_DEPTH, "rbe_min_bits": cfg.RBE_MIN_BITS,
        "rbe_max_bits": cfg.RBE_MAX_BITS, "rbe_load_latency": cfg.RBE_LOAD_LATENCY_CYCLES,
        "rbe_kout_overhead": cfg.RBE_KOUT_OVERHEAD_CYCLES,
        "rbe_compute_latency": cfg.RBE_COMPUTE_LATENCY_CYCLES,
        "rbe_nq_cycles_per_group": cfg.RBE_NORMQUANT_CYCLES_PER_GROUP,
        "rbe_job_setup": cfg.RBE_JOB_SETUP_CYCLES, "cluster_cores": cfg.CLUSTER_CORES,
        "cl_mac_load": cfg.CL_MAC_LOAD, "cl_kernel_overhead": cfg.CL_KERNEL_OVERHEAD_CYCLES,
        "dma_latency": cfg.DMA_LATENCY_CYCLES, "dma_row_overhead": cfg.DMA_ROW_OVERHEAD_CYCLES,
        "l3_latency": cfg.L3_LATENCY_CYCLES, "clock_mhz": cfg.CLOCK_MHZ,
        "dma_bytes_per_cycle": cfg.DMA_BYTES_PER_CYCLE,
        "l3_bytes_per_cycle": cfg.L3_BYTES_PER_CYCLE,
        "cl_matmul_8b": cfg.CL_MATMUL_8B_MACS_PER_CYCLE,
        "cl_macload_speedup": cfg.CL_MACLOAD_SPEEDUP, "cl_4b_speedup": cfg.CL_4B_SPEEDUP,
        "cl_2b_speedup": cfg.CL_2B_SPEEDUP, "cl_dw_macs": cfg.CL_DW_MACS_PER_CYCLE,
        "cl_fc_efficiency": cfg.CL_FC_EFFICIENCY,
        "cl_im2col_bytes": cfg.CL_IM2COL_BYTES_PER_CYCLE,
        "cl_nq_cycles_per_output": cfg.CL_NQ_CYCLES_PER_OUTPUT,
        "cl_eltwise_elems": cfg.CL_ELTWISE_ELEMS_PER_CYCLE,
        "cl_pool_taps": cfg.CL_POOL_TAPS_PER_CYCLE,
        "cl_marshal_bits": cfg.CL_MARSHAL_BITS_PER_CYCLE,
        "cl_lut_cycles": cfg.CL_LUT_CYCLES_PER_ELEMENT,
    }
    simlib.fill_struct(c, vals, WHAT)
    c.max_cycles = int(max_cycles or 0)
    return c


_STRUCTS = simlib.ConfigStructs(_build_config)


#: the largest memory :func:`simulate` allocates for a ``None`` memory (the L3 limit of
#: ``MarsellusConfig.validate``): an unvalidated config must not ask NumPy for 939 GiB
MAX_MEMORY_BYTES = 1 << 32


def _memory(arr, size: int, name: str) -> np.ndarray:
    if arr is None:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or \
                not 0 <= size <= MAX_MEMORY_BYTES:
            raise simlib.config_error(WHAT, f"{name}_BYTES = {size!r} is not a memory size in "
                                      f"0..2^32 bytes")
        return np.zeros(size, np.uint8)
    if not isinstance(arr, np.ndarray):
        raise SimulatorError(f"{name} must be a numpy uint8 array, got {type(arr).__name__}")
    if arr.dtype != np.uint8:
        raise SimulatorError(f"{name} must have dtype uint8, got {arr.dtype}")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise SimulatorError(f"{name} must be C-contiguous and writable")
    if arr.size > size:
        raise SimulatorError(f"{name} has {arr.size} bytes, the config's {name} has {size}")
    return arr


def simulate(cfg: MarsellusConfig, cmds: bytes, l1: np.ndarray | None = None,
             l2: np.ndarray | None = None, l3: np.ndarray | None = None,
             trace_path: str | None = None, trace_offset_us: float = 0.0,
             trace_append: bool = False, max_cycles: int | None = None) -> MarsellusStats:
    """Run a command stream on the simulator.

    ``l1``/``l2``/``l3`` are writable C-contiguous ``uint8`` arrays no larger than the config's
    memories (addresses are checked against the arrays given); ``None`` gives a zeroed memory
    of the config's size. ``trace_path`` writes a Chrome/Perfetto trace (one track per
    engine); with ``trace_append`` the events are added to an earlier trace, shifted by
    ``trace_offset_us``. ``max_cycles`` bounds the run (default:
    :func:`tvm_accel.simlib.cycle_budget`, else 2^34). Ctrl-C stops the run within milliseconds
    and raises ``KeyboardInterrupt`` (:func:`tvm_accel.simlib.call`).
    """
    return simulate_streams(cfg, [cmds], l1, l2, l3, trace_path, trace_offset_us, trace_append,
                            max_cycles)[0]


def simulate_streams(cfg: MarsellusConfig, streams: list[bytes], l1: np.ndarray | None = None,
                     l2: np.ndarray | None = None, l3: np.ndarray | None = None,
                     trace_path: str | None = None, trace_offset_us: float = 0.0,
                     trace_append: bool = False, max_cycles: int | None = None
                     ) -> list[MarsellusStats]:
    """Run command streams one after another on the same memories, exactly as one
    :func:`simulate` per stream would (each run's trace shifted by the cycles of the runs
    before it and appended to the first; the first fault raises and stops the sequence), but
    with one hand-off to the simulator thread (:func:`tvm_accel.simlib.call`, ~16 us each)
    instead of one per stream: the runtime runs one stream per layer."""
    streams = [bytes(c) if isinstance(c, (bytearray, memoryview)) else c for c in streams]
    for c in streams:
        if not isinstance(c, bytes):
            raise SimulatorError(f"commands must be bytes, got {type(c).__name__}")
    l1 = _memory(l1, cfg.L1_BYTES, "L1")
    l2 = _memory(l2, cfg.L2_BYTES, "L2")
    l3 = _memory(l3, cfg.L3_BYTES, "L3")
    c_cfg = _c_config(cfg, simlib.max_cycles_of(max_cycles))
    err = simlib.err_buffer()
    path = os.fsencode(trace_path) if trace_path is not None else None
    offset_us, append = float(trace_offset_us), bool(trace_append)
    run = _lib_fns()["run"]

    def ptr(a):
        return a.ctypes.data if a.size else None

    mems = (ptr(l3), l3.nbytes, ptr(l2), l2.nbytes, ptr(l1), l1.nbytes)

    stats = (_Stats * len(streams))()

    def run_all() -> int:
        # on the simulator thread; an interrupted run returns its status and ends the loop
        off = offset_us
        for i, cmds in enumerate(streams):
            code = run(ctypes.byref(c_cfg), cmds, len(cmds), *mems, ctypes.byref(stats[i]), path,
                       off, int(append or i > 0), err, len(err))
            if code:
                return code
            off += stats[i].cycles / cfg.CLOCK_MHZ
        return 0

    simlib.check(simlib.call(run_all), err, WHAT)
    return MarsellusStats._from_c(stats) if streams else []


def rbe_job_phases(cfg: MarsellusConfig, job: RbeJob) -> dict[str, int]:
    """Cycles of the LOAD / COMPUTE / NORMQUANT / STREAMOUT phases of one job (no setup), from
    the simulator's cycle model; addresses are not checked."""
    out = (ctypes.c_uint64 * 4)()
    err = simlib.err_buffer()
    code = _lib_fns()["job"](ctypes.byref(_c_config(cfg, None)), encode(job), out, err, len(err))
    simlib.check(code, err, "MARSELLUS RBE model")
    return dict(zip(RBE_PHASES[:4], (int(v) for v in out), strict=True))


assert CMD_BYTES == 64
