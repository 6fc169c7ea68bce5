"""DPU runtime: run a planned :class:`~tvm_dpu.program.DPUProgram` on the C simulator.

:func:`execute_program` is the device-side half (DDR image with the five regions, tensors
packed by :mod:`tvm_dpu.layout`, batch split over the PEs, one simulation per stream); it
needs neither TVM nor a blob. ``tvm_dpu.run`` is the packed function behind ``call_dps_packed``.
"""

from __future__ import annotations

import numpy as np

from tvm_accel.errors import AccelError
from tvm_dpu.hw_config import REGION_NAMES, DPUConfig
from tvm_dpu.layout import pack_tensor, unpack_tensor


def streams(layers: list) -> list[list]:
    """The instruction streams of a program in order: a layer with its own stream (``stream``
    None) alone, consecutive layers of one merged stream together."""
    out: list[list] = []
    for ly in layers:
        if ly.stream is not None and out and out[-1][-1].stream == ly.stream:
            out[-1].append(ly)
        else:
            out.append([ly])
    return out


def execute_program(program, inputs: dict[str, np.ndarray], cfg: DPUConfig,
                    trace_path: str | None = None):
    """Run every stream in order on the simulator (a merged stream, the layers of a function
    compiled into one stream, in one run with per-layer instruction ranges).

    Returns ``(outputs, [(layer name, DPUStats), ...])``; a layer of a merged stream has the
    counters of its own instructions and its marginal cycles (the cycles sum to the total)."""
    from tvm_dpu.simulator import simulate, simulate_ranges

    missing = [n for n in program.inputs if n not in inputs]
    if missing:
        raise AccelError(f"DPU program input {missing[0]} was not given (inputs: "
                         f"{', '.join(program.inputs)})")
    sizes = dict(program.region_sizes)
    sizes["INSN"] = max(sizes.get("INSN", 64), 64)
    layout = cfg.region_layout(sizes)
    ddr = np.zeros(cfg.ddr_bytes(layout), dtype=np.uint8)
    base = {r: layout[r][0] for r in REGION_NAMES}
    ddr[base["PARAM"]:base["PARAM"] + len(program.params)] = np.frombuffer(program.params,
                                                                         dtype=np.uint8)
    for name in program.inputs:
        p = program.tensors[name]
        off = base[p.region] + p.offset
        ddr[off:off + p.nbytes] = pack_tensor(np.asarray(inputs[name]), p)
    stats = []
    offset_us = 0.0
    for k, run in enumerate(streams(program.layers)):
        if len(run) == 1:
            st = simulate(cfg, run[0].insns, ddr, trace_path=trace_path,
                          trace_offset_us=offset_us, trace_append=k > 0, regions=layout)
            per = [st]
        else:
            ends = list(np.cumsum([ly.n_insns for ly in run]))
            ends[-1] -= 1  # the END closing the stream belongs to no layer
            st, per = simulate_ranges(cfg, b"".join(ly.insns for ly in run), ddr, ends,
                                      trace_path=trace_path, trace_offset_us=offset_us,
                                      trace_append=k > 0, regions=layout)
        offset_us += st.cycles / cfg.CLOCK_MHZ
        stats += [(ly.name, s) for ly, s in zip(run, per, strict=True)]
    outputs = {}
    for n in program.outputs:
        p = program.tensors[n]
        off = base[p.region] + p.offset
        outputs[n] = unpack_tensor(ddr[off:off + p.nbytes], p)
    return outputs, stats


# --- TVM-facing runtime: the packed function behind call_dps_packed ------------------------------
from tvm_accel import profiler  # noqa: E402
from tvm_accel.runtime import BlobCache, check_inputs, register_run  # noqa: E402


def _load(data: bytes):
    from tvm_dpu.codegen import load_blob

    return load_blob(data)


_CACHE = BlobCache(_load)


def decode_blob(data: np.ndarray):
    """Validated ``(program, config, name)`` of a blob (cached)."""
    return _CACHE.decode(data)


def run_blob(blob: np.ndarray, inputs: list[np.ndarray], decoded: tuple | None = None
             ) -> list[np.ndarray]:
    """Run one offloaded function on the simulator; records per-layer stats when profiling."""
    program, cfg, name = decoded or decode_blob(blob)
    feed = check_inputs(program, inputs, "dpu", name)
    prof = profiler.active()
    trace = prof.trace_file() if prof is not None else None
    outputs, stats = execute_program(program, feed, cfg, trace_path=trace)
    if prof is not None:
        prof.absorb_trace(trace, prof.time_us)
        layers = {ly.name: ly for ly in program.layers}
        for lname, st in stats:
            ly = layers[lname]
            util = ly.macs / (st.cycles * cfg.peak_macs_per_cycle) if st.cycles else 0.0
            profiler.record(profiler.LayerRecord(
                function=name, layer=lname, op=ly.op, shape=ly.shape, engine="dpu",
                macs=ly.macs, cycles=st.cycles, utilization=util,
                bytes_moved=st.ddr_read_bytes + st.ddr_write_bytes,
                time_us=st.cycles / cfg.CLOCK_MHZ,
                extra={"load_busy": st.load_busy, "save_busy": st.save_busy,
                       "conv_busy": st.conv_busy, "misc_busy": st.misc_busy,
                       "knobs": ly.knobs},
                bound=profiler.bound_label({
                    "off-chip": max(st.load_busy, st.save_busy),
                    "compute": max(st.conv_busy, st.misc_busy)})))
    return [outputs[n] for n in program.outputs]


register_run("tvm_dpu.run", _CACHE, run_blob)
