"""VTA runtime: run a planned :class:`~tvm_vta_cp.strategy.VTAProgram` on the C simulator.

:func:`execute_program` is the device-side half (DRAM image, packing, per-layer simulation,
unpacking); it needs neither TVM nor a blob.
"""

from __future__ import annotations

import numpy as np
from tvm_accel.errors import AccelError

from tvm_vta_cp.hw_config import VTAConfig

# --- program execution (strategy side) ---------------------------------------------------------


def execute_program(program, inputs: dict[str, np.ndarray], cfg: VTAConfig,
                    trace_path: str | None = None):
    """Run every layer of ``program`` in order on the simulator.

    Allocates DRAM of ``program.dram_size`` bytes, writes the constant image, packs the inputs
    (uint8 stored as value-128, halo filled), pre-fills the halo of every other tensor with its
    fill value, simulates each layer's stream, and unpacks the outputs. With ``trace_path`` all
    layers go into one Chrome trace, laid out one after the other.

    Returns ``(outputs, [(layer name, VTAStats), ...])``.
    """
    from tvm_vta_cp.simulator import simulate
    from tvm_vta_cp.strategy import pack_tensor, unpack_tensor

    missing = [n for n in program.inputs if n not in inputs]
    if missing:
        raise AccelError(f"VTA program input {missing[0]} was not given (inputs: "
                         f"{', '.join(program.inputs)})")
    dram = np.zeros(program.dram_size, dtype=np.uint8)
    for off, data in program.const_image:
        dram[off:off + len(data)] = np.frombuffer(bytes(data), dtype=np.uint8)
    for name, p in program.tensors.items():
        if name in program.inputs:
            dram[p.offset:p.offset + p.nbytes] = pack_tensor(inputs[name], p, cfg)
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
    outputs = {n: unpack_tensor(dram[program.tensors[n].offset:], program.tensors[n], cfg)
               for n in program.outputs}
    return outputs, stats
