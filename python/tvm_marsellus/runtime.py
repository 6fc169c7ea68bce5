"""MARSELLUS runtime: run a :class:`~tvm_marsellus.program.MarsProgram` on the C simulator.

:func:`execute_program` is the one program runner, the device-side half (L2/L3 images, host
arrays packed at the placements, one simulator run per layer or of the whole stream); it needs
neither TVM nor a blob. ``tvm_marsellus.run`` is the packed
function behind ``call_dps_packed``; with a profiler active it records one row per layer with
engine (RBE / cluster / mixed), cycles, latency and energy at the operating point the blob was
compiled for (layer meta ``op``; default nominal 0.8 V / 420 MHz).
"""

from __future__ import annotations

import numpy as np

from tvm_accel import profiler
from tvm_accel.errors import BlobError, SimulatorError
from tvm_accel.runtime import BlobCache, register_run
from tvm_marsellus.energy import NOMINAL, OperatingPoint, energy_uj
from tvm_marsellus.hw_config import MarsellusConfig
from tvm_marsellus.layout import pack_tensor, unpack_tensor
from tvm_marsellus.program import MarsProgram, TensorPlacement, load_blob
from tvm_marsellus.simulator import MarsellusStats, simulate, simulate_streams


def io_spec(program: MarsProgram, name: str) -> tuple[tuple[int, ...], str]:
    """Host (NCHW / NC) shape and dtype of a program input or output: the whole batch, the
    placement's times the program's passes."""
    t = program.tensors[name]
    s = (t.shape[0] * program.passes, *t.shape[1:])
    shape = (s[0], s[3], s[1], s[2]) if len(s) == 4 else s
    return shape, "int8" if t.signed else "uint8"


def operating_point(program: MarsProgram) -> OperatingPoint:
    """The operating point recorded at compile time (nominal if none)."""
    for ly in program.layers:
        op = ly.meta.get("op")
        if op:
            return OperatingPoint(float(op[0]), float(op[1]), bool(op[2]))
    return NOMINAL


def execute_program(program: MarsProgram, inputs: dict[str, np.ndarray], cfg: MarsellusConfig,
                    trace_path: str | None = None, max_cycles: int | None = None,
                    whole_stream: bool = False, checked: bool = False
                    ) -> tuple[dict[str, np.ndarray], list[tuple[str, MarsellusStats]]]:
    """Run a program on the simulator: L2 / L3 images from offset 0, the inputs packed at their
    placements (:func:`~tvm_marsellus.layout.pack_tensor`; 4-D ``hwc`` tensors as NCHW host
    arrays, every other one in its placement's shape), the outputs unpacked the same way (int64).

    By default one simulator run per layer, so every layer gets its own cycles and energy (L1,
    L2 and L3 persist between the runs: a layer may load the next layer's first weight group
    into L1; the strategy balances every layer's semaphores). With
    ``whole_stream`` one run of ``program.stream()``: the layers overlap, and L1 and the
    semaphores carry over from layer to layer (hand-written programs). A program of several
    batch ``passes`` runs once per slice of the inputs' leading axis, from fresh L2 / L3
    images, its outputs concatenated and its statistics summed per layer. Returns ``(outputs,
    [(layer, MarsellusStats), ...])``, one ``("program", stats)`` row for a whole stream.
    ``checked``: the program was checked against ``cfg`` already (a decoded blob,
    :func:`~tvm_marsellus.program.load_blob`), so the memory map is not checked again."""
    if not checked:
        program.check(cfg)
    for n in program.inputs:
        if n not in inputs:
            raise SimulatorError(f"marsellus program input {n} was not given")
    if program.passes == 1:
        return _execute_pass(program, inputs, cfg, trace_path, max_cycles, whole_stream)
    passes = program.passes
    xs = {n: np.asarray(inputs[n]) for n in program.inputs}
    for n, x in xs.items():
        if x.ndim == 0 or x.shape[0] % passes:
            raise SimulatorError(f"marsellus program input {n} of shape {list(x.shape)} does "
                                 f"not split into {passes} batch passes")
    outs: dict[str, list[np.ndarray]] = {n: [] for n in program.outputs}
    stats: list[tuple[str, MarsellusStats]] = []
    for p in range(passes):
        feed = {n: x[p * (x.shape[0] // passes):(p + 1) * (x.shape[0] // passes)]
                for n, x in xs.items()}
        offset_us = sum(st.cycles for _, st in stats) / cfg.CLOCK_MHZ
        o, st = _execute_pass(program, feed, cfg, trace_path, max_cycles, whole_stream,
                              offset_us, p > 0)
        for n, v in o.items():
            outs[n].append(v)
        stats = st if not stats else [(name, a + b) for (name, a), (_, b) in zip(stats, st,
                                                                             strict=True)]
    return {n: np.concatenate(v) for n, v in outs.items()}, stats


def _execute_pass(program: MarsProgram, inputs: dict[str, np.ndarray], cfg: MarsellusConfig,
                  trace_path: str | None, max_cycles: int | None, whole_stream: bool,
                  offset_us: float = 0.0, append: bool = False
                  ) -> tuple[dict[str, np.ndarray], list[tuple[str, MarsellusStats]]]:
    """One run of the program over inputs of its placements' batch (its trace from
    ``offset_us``, appended to the file when ``append``)."""
    mems = _memories(program)
    for n in program.inputs:
        t = program.tensors[n]
        x = np.asarray(inputs[n])
        data = pack_tensor(t, _device_order(t, x, 1, -1))
        mems[t.mem][t.offset:t.offset + data.size] = data
    if whole_stream:
        stats = [("program", simulate(cfg, program.stream(), l2=mems["L2"], l3=mems["L3"],
                                      trace_path=trace_path, trace_offset_us=offset_us,
                                      trace_append=append, max_cycles=max_cycles))]
    else:
        l1 = np.zeros(cfg.L1_BYTES, np.uint8)  # carries a prefetched weight group over
        runs = simulate_streams(cfg, [ly.stream() for ly in program.layers], l1=l1,
                                l2=mems["L2"], l3=mems["L3"], trace_path=trace_path,
                                trace_offset_us=offset_us, trace_append=append,
                                max_cycles=max_cycles)
        stats = [(ly.name, st) for ly, st in zip(program.layers, runs, strict=True)]
    outs = {}
    for n in program.outputs:
        t = program.tensors[n]
        v = unpack_tensor(t, mems[t.mem][t.offset:t.offset + t.nbytes])
        outs[n] = np.ascontiguousarray(_device_order(t, v, -1, 1))
    return outs, stats


def _memories(program: MarsProgram) -> dict[str, np.ndarray]:
    """Zeroed L2 / L3 of the program's sizes holding its initial images."""
    mems = {}
    for name, size, image in (("L2", max(program.l2_bytes, 1), program.l2_image),
                              ("L3", program.l3_bytes, program.l3_image)):
        mem = mems[name] = np.empty(size, np.uint8)  # the image, then zeros: one pass
        mem[:len(image)] = np.frombuffer(image, np.uint8)
        mem[len(image):] = 0
    return mems


def _device_order(t: TensorPlacement, x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """NCHW <-> NHWC of a 4-D ``hwc`` tensor (channels moved from axis ``src`` to ``dst``)."""
    return np.moveaxis(x, src, dst) if t.layout == "hwc" and x.ndim == 4 else x


_CACHE = BlobCache(load_blob)


def decode_blob(data: np.ndarray):
    """Validated ``(program, config, name)`` of a blob (cached)."""
    return _CACHE.decode(data)


def run_blob(blob: np.ndarray, inputs: list[np.ndarray], decoded: tuple | None = None
             ) -> list[np.ndarray]:
    """Run one offloaded function on the simulator; per-layer profiler records when profiling."""
    program, cfg, name = decoded or decode_blob(blob)
    if len(inputs) != len(program.inputs):
        raise BlobError(f"marsellus function {name} takes {len(program.inputs)} inputs, got "
                        f"{len(inputs)}")
    feed = {}
    for tname, arr in zip(program.inputs, inputs, strict=True):
        shape, dtype = io_spec(program, tname)
        if tuple(arr.shape) != shape or str(arr.dtype) != dtype:
            raise BlobError(f"marsellus function {name}: input {tname} is {arr.dtype}"
                            f"{list(arr.shape)}, the blob expects {dtype}{list(shape)}")
        feed[tname] = arr
    prof = profiler.active()
    trace = prof.trace_file() if prof is not None else None
    outputs, stats = execute_program(program, feed, cfg, trace_path=trace, checked=True)
    if prof is not None:
        prof.absorb_trace(trace, prof.time_us)
        op = operating_point(program)
        layers = {ly.name: ly for ly in program.layers}
        for lname, st in stats:
            ly = layers[lname]
            peak = cfg.rbe_and_gates / 64 if ly.engine == "rbe" else \
                cfg.cluster_macs_per_cycle(8)
            macs = ly.macs * program.passes
            util = macs / (st.cycles * peak) if st.cycles and macs else 0.0
            profiler.record(profiler.LayerRecord(
                function=name, layer=lname, op=ly.op, shape=str(ly.meta.get("shape", "")),
                engine="RBE" if ly.engine == "rbe" else "cluster", macs=macs,
                cycles=st.cycles, utilization=min(util, 1.0),
                bytes_moved=int(st.l2_read_bytes + st.l2_write_bytes),
                time_us=st.cycles / op.freq_mhz,
                extra={"energy_uj": energy_uj(st, op), "vdd": op.vdd, "freq_mhz": op.freq_mhz,
                       "abb": op.abb, "rbe_busy": st.rbe_busy,
                       "cluster_busy": st.cluster_busy, "tiles": ly.meta.get("tiles"),
                       "tile_h": ly.meta.get("tile_h"), "tile_k": ly.meta.get("tile_k"),
                       **({"batch": ly.meta["batch"]} if "batch" in ly.meta else {})},
                bound=profiler.bound_label({
                    "off-chip": st.iodma_busy, "on-chip": max(st.dma_in_busy, st.dma_out_busy),
                    "compute": max(st.rbe_busy, st.cluster_busy)})))
    return [outputs[n].astype(io_spec(program, n)[1]) for n in program.outputs]


register_run("tvm_marsellus.run", _CACHE, run_blob)
