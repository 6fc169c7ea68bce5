"""Binding of the VTA functional + timed simulator (``sim/vta/vta_sim.c``).

:func:`simulate` runs one instruction stream against a DRAM image (a ``uint8`` numpy array,
modified in place) and returns :class:`VTAStats`. SRAM (UOP, INP, WGT, ACC) starts zeroed in every
run. Any fault of the program (bad field, out-of-range index, token deadlock, cycle budget)
raises :class:`tvm_accel.errors.SimulatorError` with a one-line message naming the instruction.

Timing model and ALU details (SHR with negative amounts etc.) are documented in
``sim/vta/vta_sim.h``.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, fields

import numpy as np

from tvm_accel import simlib
from tvm_accel.errors import SimulatorError
from tvm_vta_cp.hw_config import VTAConfig


class _Config(ctypes.Structure):
    _fields_ = [
        ("log_batch", ctypes.c_int32), ("log_block_in", ctypes.c_int32),
        ("log_block_out", ctypes.c_int32), ("log_uop_buff_size", ctypes.c_int32),
        ("log_inp_buff_size", ctypes.c_int32), ("log_wgt_buff_size", ctypes.c_int32),
        ("log_acc_buff_size", ctypes.c_int32),
        ("dram_bytes_per_cycle", ctypes.c_double), ("clock_mhz", ctypes.c_double),
        ("dram_latency_cycles", ctypes.c_int32), ("gemm_cycles_per_uop", ctypes.c_int32),
        ("alu_cycles_per_uop", ctypes.c_int32), ("pipeline_latency_cycles", ctypes.c_int32),
        ("max_cycles", ctypes.c_uint64),
    ]


class _Stats(ctypes.Structure):
    _fields_ = [
        ("cycles", ctypes.c_uint64), ("busy", ctypes.c_uint64 * 3),
        ("stall", ctypes.c_uint64 * 3), ("insns", ctypes.c_uint64 * 3),
        ("gemm_uop_iters", ctypes.c_uint64), ("gemm_reset_iters", ctypes.c_uint64),
        ("alu_uop_iters", ctypes.c_uint64), ("inp_load_bytes", ctypes.c_uint64),
        ("wgt_load_bytes", ctypes.c_uint64), ("acc_load_bytes", ctypes.c_uint64),
        ("uop_load_bytes", ctypes.c_uint64), ("out_store_bytes", ctypes.c_uint64),
    ]


@dataclass
class VTAStats:
    """Counters of one run (or, summed with ``+``, of several)."""

    cycles: int = 0
    load_busy: int = 0
    compute_busy: int = 0
    store_busy: int = 0
    load_stall: int = 0
    compute_stall: int = 0
    store_stall: int = 0
    load_insns: int = 0
    compute_insns: int = 0
    store_insns: int = 0
    gemm_uop_iters: int = 0
    gemm_reset_iters: int = 0
    alu_uop_iters: int = 0
    inp_load_bytes: int = 0
    wgt_load_bytes: int = 0
    acc_load_bytes: int = 0
    uop_load_bytes: int = 0
    out_store_bytes: int = 0

    def __add__(self, other: VTAStats) -> VTAStats:
        if not isinstance(other, VTAStats):
            return NotImplemented
        return VTAStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def macs(self, cfg: VTAConfig) -> int:
        """Multiply-accumulates the GEMM ran (non-reset uop iterations x MACs per iteration;
        a conv's bias-lanes pass, one iteration per output entry, included)."""
        return self.gemm_uop_iters * cfg.macs_per_cycle

    def time_us(self, cfg: VTAConfig) -> float:
        """Device time of the run at the config's clock."""
        return self.cycles / cfg.CLOCK_MHZ

    @classmethod
    def _from_c(cls, s: _Stats) -> VTAStats:
        return cls(
            cycles=s.cycles, load_busy=s.busy[0], compute_busy=s.busy[1], store_busy=s.busy[2],
            load_stall=s.stall[0], compute_stall=s.stall[1], store_stall=s.stall[2],
            load_insns=s.insns[0], compute_insns=s.insns[1], store_insns=s.insns[2],
            gemm_uop_iters=s.gemm_uop_iters, gemm_reset_iters=s.gemm_reset_iters,
            alu_uop_iters=s.alu_uop_iters, inp_load_bytes=s.inp_load_bytes,
            wgt_load_bytes=s.wgt_load_bytes, acc_load_bytes=s.acc_load_bytes,
            uop_load_bytes=s.uop_load_bytes, out_store_bytes=s.out_store_bytes)


_run = None


def _run_fn():
    global _run
    if _run is None:
        size = simlib.function("vta_sim_config_size", ctypes.c_uint64, [])
        ssize = simlib.function("vta_sim_stats_size", ctypes.c_uint64, [])
        if size() != ctypes.sizeof(_Config) or ssize() != ctypes.sizeof(_Stats):
            raise SimulatorError("simulator library struct layout does not match the binding; "
                                 "rebuild it with `python setup.py build_sim`")
        _run = simlib.function("vta_sim_run", ctypes.c_int, [
            ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_uint64, ctypes.c_void_p,
            ctypes.c_uint64, ctypes.POINTER(_Stats), ctypes.c_char_p, ctypes.c_double,
            ctypes.c_int32, ctypes.c_char_p, ctypes.c_uint64])
    return _run


def _c_config(cfg: VTAConfig, max_cycles: int | None) -> _Config:
    if max_cycles is not None and (isinstance(max_cycles, bool) or not isinstance(
            max_cycles, (int, np.integer)) or not 0 < max_cycles < 2**64):
        raise SimulatorError(f"max_cycles must be a positive integer, got {max_cycles!r}")
    c = _Config()
    simlib.fill_struct(c, {
        "log_batch": cfg.LOG_BATCH, "log_block_in": cfg.LOG_BLOCK_IN,
        "log_block_out": cfg.LOG_BLOCK_OUT, "log_uop_buff_size": cfg.LOG_UOP_BUFF_SIZE,
        "log_inp_buff_size": cfg.LOG_INP_BUFF_SIZE, "log_wgt_buff_size": cfg.LOG_WGT_BUFF_SIZE,
        "log_acc_buff_size": cfg.LOG_ACC_BUFF_SIZE,
        "dram_bytes_per_cycle": cfg.DRAM_BYTES_PER_CYCLE, "clock_mhz": cfg.CLOCK_MHZ,
        "dram_latency_cycles": cfg.DRAM_LATENCY_CYCLES,
        "gemm_cycles_per_uop": cfg.GEMM_CYCLES_PER_UOP,
        "alu_cycles_per_uop": cfg.ALU_CYCLES_PER_UOP,
        "pipeline_latency_cycles": cfg.PIPELINE_LATENCY_CYCLES}, "VTA simulator")
    c.max_cycles = int(max_cycles or 0)
    return c


def simulate(cfg: VTAConfig, insns: bytes, dram: np.ndarray, trace_path: str | None = None,
             trace_offset_us: float = 0.0, max_cycles: int | None = None,
             trace_append: bool = False) -> VTAStats:
    """Run ``insns`` (the bytes of ``ISA.encode_stream``) on the simulator.

    ``dram`` is a writable C-contiguous ``uint8`` array, read and written in place (addresses are
    byte offsets into it). ``trace_path`` writes a Chrome/Perfetto trace; with
    ``trace_append=True`` the events are added to an existing trace written by an earlier run,
    shifted by ``trace_offset_us`` (e.g. the summed ``time_us`` of the earlier runs).
    ``max_cycles`` bounds the run (default: :func:`tvm_accel.simlib.cycle_budget`, else 2^34
    cycles). Ctrl-C stops the run within milliseconds and raises ``KeyboardInterrupt``
    (:func:`tvm_accel.simlib.call`).
    """
    if isinstance(insns, (bytearray, memoryview)):
        insns = bytes(insns)
    if not isinstance(insns, bytes):
        raise SimulatorError(f"instructions must be bytes, got {type(insns).__name__}")
    if not isinstance(dram, np.ndarray):
        raise SimulatorError(f"dram must be a numpy uint8 array, got {type(dram).__name__}")
    if dram.dtype != np.uint8:
        raise SimulatorError(f"dram must have dtype uint8, got {dram.dtype}")
    if not dram.flags.c_contiguous:
        raise SimulatorError("dram must be C-contiguous (use np.ascontiguousarray and copy back)")
    if not dram.flags.writeable:
        raise SimulatorError("dram must be writable (the simulator stores results into it)")
    c_cfg = _c_config(cfg, simlib.max_cycles_of(max_cycles))
    stats = _Stats()
    err = simlib.err_buffer()
    path = os.fsencode(trace_path) if trace_path is not None else None
    code = simlib.call(_run_fn(), ctypes.byref(c_cfg), insns, len(insns),
                       dram.ctypes.data if dram.size else None, dram.nbytes, ctypes.byref(stats),
                       path, float(trace_offset_us), int(bool(trace_append)), err, len(err))
    simlib.check(code, err, "VTA simulator")
    return VTAStats._from_c(stats)
