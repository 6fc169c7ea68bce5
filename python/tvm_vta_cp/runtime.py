"""VTA runtime: run a planned :class:`~tvm_vta_cp.program.VTAProgram` on the C simulator.

:func:`execute_program` is the device-side half (DRAM image, packing, per-layer simulation,
unpacking); it needs neither TVM nor a blob.
"""

from __future__ import annotations

import time

import numpy as np

from tvm_accel.errors import AccelError
from tvm_vta_cp.hw_config import VTAConfig

# --- program execution (strategy side) ---------------------------------------------------------


def execute_program(program, inputs: dict[str, np.ndarray], cfg: VTAConfig,
                    trace_path: str | None = None, host_log: list | None = None):
    """Run every layer of ``program`` in order on the simulator.

    Allocates DRAM of ``program.dram_size`` bytes, writes the constant image, packs the inputs
    (uint8 stored as value-128, halo filled), pre-fills the halo of every other tensor with its
    fill value, simulates each layer's stream, and unpacks the outputs. With ``trace_path`` all
    layers go into one Chrome trace, laid out one after the other. With ``host_log``, each
    blocking / unblocking the runtime does is appended as ``(tensor, op, read, written,
    seconds)`` (``op`` ``block`` or ``unblock``; blocked tensors cost the runtime nothing).

    Returns ``(outputs, [(layer name, VTAStats), ...])``.
    """
    from tvm_vta_cp.layout import pack_tensor, unpack_tensor
    from tvm_vta_cp.simulator import simulate

    missing = [n for n in program.inputs if n not in inputs]
    if missing:
        raise AccelError(f"VTA program input {missing[0]} was not given (inputs: "
                         f"{', '.join(program.inputs)})")
    dram = np.zeros(program.dram_size, dtype=np.uint8)
    for off, data in program.const_image:
        dram[off:off + len(data)] = np.frombuffer(bytes(data), dtype=np.uint8)
    for name, p in program.tensors.items():
        if name in program.inputs and p.blocked:  # the host wrote the DRAM form already
            dram[p.offset:p.offset + p.nbytes] = _blocked_bytes(inputs[name], p, cfg)
        elif name in program.inputs:
            t0 = time.perf_counter()
            dram[p.offset:p.offset + p.nbytes] = pack_tensor(inputs[name], p, cfg)
            if host_log is not None:
                host_log.append((name, "block", _logical_bytes(p), p.nbytes,
                                 time.perf_counter() - t0))
        elif p.fill != 0 and any(p.halo):
            # the producer's STORE writes only the interior; the halo keeps this value
            dram[p.offset:p.offset + p.nbytes] = np.uint8(p.fill & 0xFF)
    stats = []
    offset_us = 0.0
    for i, ly in enumerate(program.layers):
        st = simulate(cfg, ly.insns, dram, trace_path=trace_path, trace_offset_us=offset_us,
                      trace_append=i > 0)
        offset_us += st.cycles / cfg.CLOCK_MHZ
        stats.append((ly.name, st))
    outputs = {}
    for n in program.outputs:
        p = program.tensors[n]
        region = dram[p.offset:p.offset + p.nbytes]
        t0 = time.perf_counter()
        outputs[n] = (region.view(np.int8).reshape(p.io_shape(cfg)).copy() if p.blocked
                      else unpack_tensor(region, p, cfg))
        if host_log is not None and not p.blocked:
            host_log.append((n, "unblock", _logical_bytes(p), _logical_bytes(p),
                             time.perf_counter() - t0))
    return outputs, stats


def _logical_bytes(p) -> int:
    """Bytes of a tensor in its logical (N, C, H, W) form."""
    return int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize


def _blocked_bytes(x: np.ndarray, p, cfg: VTAConfig) -> np.ndarray:
    """The bytes of a host-blocked input (checked: int8 in the placement's DRAM shape)."""
    x = np.asarray(x)
    if x.dtype != np.int8 or tuple(x.shape) != p.io_shape(cfg):
        raise ValueError(f"tensor {p.name}: expected the blocked int8{list(p.io_shape(cfg))}, "
                         f"got {x.dtype}{list(x.shape)}")
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


# --- TVM-facing runtime: the packed function behind call_dps_packed ------------------------------
from tvm_accel import profiler  # noqa: E402
from tvm_accel.runtime import BlobCache, check_inputs, register_run  # noqa: E402


def _load(data: bytes):
    from tvm_vta_cp.codegen import load_blob

    return load_blob(data)


_CACHE = BlobCache(_load)


def decode_blob(data: np.ndarray):
    """Validated ``(program, config, name)`` of a blob (cached)."""
    return _CACHE.decode(data)


def run_blob(blob: np.ndarray, inputs: list[np.ndarray], decoded: tuple | None = None
             ) -> list[np.ndarray]:
    """Run one offloaded function on the simulator; records per-layer stats when profiling."""
    program, cfg, name = decoded or decode_blob(blob)
    feed = check_inputs(program, inputs, "vta", name, lambda p: (p.io_shape(cfg), p.io_dtype))
    prof = profiler.active()
    trace = prof.trace_file() if prof is not None else None
    host_log: list | None = [] if prof is not None else None
    outputs, stats = execute_program(program, feed, cfg, trace_path=trace, host_log=host_log)
    if prof is not None:
        prof.absorb_trace(trace, prof.time_us)
        _record_host_passes(name, host_log, cfg)
        layers = {ly.name: ly for ly in program.layers}
        for lname, st in stats:
            ly = layers[lname]
            util = ly.macs / (st.cycles * cfg.macs_per_cycle) if st.cycles else 0.0
            moved = (st.inp_load_bytes + st.wgt_load_bytes + st.acc_load_bytes
                     + st.uop_load_bytes + st.out_store_bytes)
            profiler.record(profiler.LayerRecord(
                function=name, layer=lname, op=ly.op, shape=ly.shape, engine="vta",
                macs=ly.macs, cycles=st.cycles, utilization=util, bytes_moved=moved,
                time_us=st.cycles / cfg.CLOCK_MHZ,
                extra={"padded_macs": ly.padded_macs, "load_busy": st.load_busy,
                       "compute_busy": st.compute_busy, "store_busy": st.store_busy},
                bound=profiler.bound_label({"off-chip": max(st.load_busy, st.store_busy),
                                            "compute": st.compute_busy})))
    return [outputs[n] for n in program.outputs]


def _record_host_passes(function: str, host_log: list, cfg: VTAConfig) -> None:
    """The runtime's own blocking / unblocking as host records (copies in the host model)."""
    from tvm_vta_cp.host_cost import pass_cycles

    for tensor, op, read, written, seconds in host_log:
        cycles = pass_cycles(cfg, op, read, written)
        profiler.record_host(profiler.HostRecord(
            f"{function}:{tensor}", tensor, op, read + written, cycles, seconds * 1e6,
            "copy", cycles / cfg.CLOCK_MHZ))


register_run("tvm_vta_cp.run", _CACHE, run_blob)
