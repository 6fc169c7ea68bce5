"""VTA hardware configuration: the JSON parameters of ``vta_config.json`` plus a timing model.

The parameters follow the public VTA config (``LOG_BATCH``, ``LOG_BLOCK_IN``, ``LOG_BLOCK_OUT``,
widths, buffer sizes); every derived quantity (tile shapes, entry bytes, buffer depths, ISA field
widths) is computed here once and used by the encoder, the strategy and the simulator binding.

Timing parameters (our addition; the public VTA simulator has no cycle model):

- ``CLOCK_MHZ``: clock used to turn cycles into time (333 MHz as on the ZCU104/Ultra96 builds).
- ``DRAM_BYTES_PER_CYCLE``: DMA bandwidth (16 = a 128-bit AXI port).
- ``DRAM_LATENCY_CYCLES``: fixed cost of every LOAD/STORE burst.
- ``GEMM_CYCLES_PER_UOP`` / ``ALU_CYCLES_PER_UOP``: 1 and 2 (GEMM pipelined at II=1, ALU at II=2).
- ``PIPELINE_LATENCY_CYCLES``: fill latency paid once per GEMM/ALU instruction.
- ``HOST_COPY_BYTES_PER_CYCLE`` / ``HOST_GATHER_BYTES_PER_CYCLE`` (optional, defaults 25 and
  5.3): throughput of the host CPU that runs the layout passes around the calls, in bytes read
  plus written per accelerator cycle: contiguous copies (NCHWnc padding + blocking and its
  inverse, the image-pack unpack) and gathers (im2col / stencil unroll, image pack with its
  replicated halo). Calibrated on the CP paper's Table 3 (``host_cost``, ``docs/vta.md``).
  Host time on the machine running the simulator says nothing about that host, so the compile
  report and ``tvmc run --profile`` use this model and show the measured time beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tvm_accel.errors import ConfigError
from tvm_accel.hwconfig import HardwareConfig, finite_float, parse_fields, read_config_json

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = "vta_1x16x16"

_INT_FIELDS = (
    "LOG_INP_WIDTH", "LOG_WGT_WIDTH", "LOG_ACC_WIDTH", "LOG_BATCH", "LOG_BLOCK_IN", "LOG_BLOCK_OUT",
    "LOG_UOP_BUFF_SIZE", "LOG_INP_BUFF_SIZE", "LOG_WGT_BUFF_SIZE", "LOG_ACC_BUFF_SIZE",
    "DRAM_LATENCY_CYCLES", "GEMM_CYCLES_PER_UOP", "ALU_CYCLES_PER_UOP", "PIPELINE_LATENCY_CYCLES",
)
_FLOAT_FIELDS = ("CLOCK_MHZ", "DRAM_BYTES_PER_CYCLE")
_OPTIONAL = {"TARGET": "sim", "HW_VER": "0.0.2"}
#: the host cost model's two rates (optional fields, calibrated defaults)
HOST_RATE_FIELDS = ("HOST_COPY_BYTES_PER_CYCLE", "HOST_GATHER_BYTES_PER_CYCLE")
#: largest value of the C ``int32_t`` fields the simulator binding fills from this config
#: (``tvm_vta_cp.simulator._Config``); ctypes would silently truncate anything wider
INT32_MAX = 2**31 - 1
#: timing fields passed to the simulator as ``int32_t``, with their smallest legal value (the
#: LOG_* fields it also receives are bounded far more tightly by the ISA checks below)
_C_INT32_TIMING = {"DRAM_LATENCY_CYCLES": 0, "PIPELINE_LATENCY_CYCLES": 0,
                   "GEMM_CYCLES_PER_UOP": 1, "ALU_CYCLES_PER_UOP": 1}


@dataclass(frozen=True)
class VTAConfig(HardwareConfig):
    """One VTA instance. Construct with :func:`load_config`; fields mirror the JSON keys."""

    LOG_INP_WIDTH: int
    LOG_WGT_WIDTH: int
    LOG_ACC_WIDTH: int
    LOG_BATCH: int
    LOG_BLOCK_IN: int
    LOG_BLOCK_OUT: int
    LOG_UOP_BUFF_SIZE: int
    LOG_INP_BUFF_SIZE: int
    LOG_WGT_BUFF_SIZE: int
    LOG_ACC_BUFF_SIZE: int
    CLOCK_MHZ: float
    DRAM_BYTES_PER_CYCLE: float
    DRAM_LATENCY_CYCLES: int
    GEMM_CYCLES_PER_UOP: int
    ALU_CYCLES_PER_UOP: int
    PIPELINE_LATENCY_CYCLES: int
    HOST_COPY_BYTES_PER_CYCLE: float = 25.0
    HOST_GATHER_BYTES_PER_CYCLE: float = 5.3
    TARGET: str = "sim"
    HW_VER: str = "0.0.2"
    name: str = "custom"

    # --- GEMM intrinsic shape -------------------------------------------------------------
    @property
    def batch(self) -> int:
        return 1 << self.LOG_BATCH

    @property
    def block_in(self) -> int:
        return 1 << self.LOG_BLOCK_IN

    @property
    def block_out(self) -> int:
        return 1 << self.LOG_BLOCK_OUT

    @property
    def macs_per_cycle(self) -> int:
        """Useful MACs of one GEMM uop iteration (the intrinsic's peak per cycle)."""
        return self.batch * self.block_in * self.block_out

    # --- SRAM entries (one tile each) -----------------------------------------------------
    @property
    def inp_entry_bytes(self) -> int:
        return self.batch * self.block_in

    @property
    def wgt_entry_bytes(self) -> int:
        return self.block_out * self.block_in

    @property
    def acc_entry_bytes(self) -> int:
        return self.batch * self.block_out * 4

    @property
    def out_entry_bytes(self) -> int:
        return self.batch * self.block_out

    @property
    def log_uop_depth(self) -> int:
        return self.LOG_UOP_BUFF_SIZE - 2

    @property
    def log_inp_depth(self) -> int:
        return self.LOG_INP_BUFF_SIZE - self.LOG_BATCH - self.LOG_BLOCK_IN

    @property
    def log_wgt_depth(self) -> int:
        return self.LOG_WGT_BUFF_SIZE - self.LOG_BLOCK_OUT - self.LOG_BLOCK_IN

    @property
    def log_acc_depth(self) -> int:
        return self.LOG_ACC_BUFF_SIZE - self.LOG_BATCH - self.LOG_BLOCK_OUT - 2

    @property
    def uop_depth(self) -> int:
        return 1 << self.log_uop_depth

    @property
    def inp_depth(self) -> int:
        return 1 << self.log_inp_depth

    @property
    def wgt_depth(self) -> int:
        return 1 << self.log_wgt_depth

    @property
    def acc_depth(self) -> int:
        return 1 << self.log_acc_depth

    @property
    def on_chip_bytes(self) -> int:
        """The four SRAMs (micro-op, input, weight, accumulator buffers), in bytes."""
        return sum(1 << b for b in (self.LOG_UOP_BUFF_SIZE, self.LOG_INP_BUFF_SIZE,
                                    self.LOG_WGT_BUFF_SIZE, self.LOG_ACC_BUFF_SIZE))

    def validate(self, where: str = "config") -> None:
        """Reject configs the ISA or this compiler cannot express, naming the field."""

        def bad(field: str, msg: str) -> ConfigError:
            return ConfigError(f"{where}: field {field}: {msg}")

        if (self.LOG_INP_WIDTH, self.LOG_WGT_WIDTH, self.LOG_ACC_WIDTH) != (3, 3, 5):
            raise bad("LOG_INP_WIDTH/LOG_WGT_WIDTH/LOG_ACC_WIDTH",
                      "only int8 inputs/weights with int32 accumulators (3/3/5) are supported")
        for f in ("LOG_BATCH", "LOG_BLOCK_IN", "LOG_BLOCK_OUT"):
            v = getattr(self, f)
            if not 0 <= v <= 6:
                raise bad(f, f"{v} is outside 0..6")
        if self.LOG_BLOCK_IN != self.LOG_BLOCK_OUT:
            raise bad("LOG_BLOCK_OUT", "must equal LOG_BLOCK_IN (tensors are packed once and "
                      "chained between layers, as in VTA's pkg_config)")
        if self.wgt_entry_bytes > 4096 or self.acc_entry_bytes > 4096:
            raise bad("LOG_BLOCK_IN", "a WGT or ACC entry would exceed the 4 KiB DMA page")
        for f, depth_log in (("LOG_UOP_BUFF_SIZE", self.log_uop_depth),
                             ("LOG_INP_BUFF_SIZE", self.log_inp_depth),
                             ("LOG_WGT_BUFF_SIZE", self.log_wgt_depth),
                             ("LOG_ACC_BUFF_SIZE", self.log_acc_depth)):
            if depth_log < 4:
                raise bad(f, f"buffer holds only {1 << max(depth_log, 0)} entries; "
                          "need at least 16")
            if depth_log > 16:
                raise bad(f, "buffer depth exceeds the 16-bit sram_base field")
        if 8 + 2 * self.log_uop_depth + 1 + 28 > 64:
            raise bad("LOG_UOP_BUFF_SIZE", "uop_bgn/uop_end/iter fields would not fit in 64 bits")
        if self.log_acc_depth + self.log_inp_depth + self.log_wgt_depth > 32:
            raise bad("LOG_*_BUFF_SIZE", "a micro-op (acc+inp+wgt index bits) would exceed 32 bits")
        if 2 * self.log_acc_depth + 2 * self.log_inp_depth + 2 * self.log_wgt_depth > 64:
            raise bad("LOG_*_BUFF_SIZE", "GEMM factor fields would exceed 64 bits")
        if 2 * self.log_acc_depth + 2 * self.log_inp_depth + 20 > 64:
            raise bad("LOG_*_BUFF_SIZE", "ALU factor fields would exceed 64 bits")
        for f in ("CLOCK_MHZ", "DRAM_BYTES_PER_CYCLE", *HOST_RATE_FIELDS):
            v = getattr(self, f)
            if not (math.isfinite(v) and v > 0):
                raise bad(f, f"{v} must be a positive finite number")
        for f, lo in _C_INT32_TIMING.items():
            v = getattr(self, f)
            if not lo <= v <= INT32_MAX:
                raise bad(f, f"{v} is outside {lo}..{INT32_MAX} (a 32-bit field of the "
                          "simulator)")


def config_from_dict(d: dict, where: str = "config", name: str = "custom") -> VTAConfig:
    """Build and validate a config from parsed JSON, naming any bad or missing field."""
    d = dict(d) if isinstance(d, dict) else d
    host = {f: finite_float(d.pop(f), f, where) for f in HOST_RATE_FIELDS
            if isinstance(d, dict) and f in d}
    kw = parse_fields(d, _INT_FIELDS, _FLOAT_FIELDS, _OPTIONAL, where, "VTA")
    cfg = VTAConfig(**kw, **host, name=name)
    cfg.validate(where)
    return cfg


def load_config(path_or_name: str | Path | None = None) -> VTAConfig:
    """Load a config by file path or bundled name (``vta_1x16x16`` default, ``vta_8x8x8``)."""
    if path_or_name is None:
        path_or_name = DEFAULT_CONFIG
    if isinstance(path_or_name, VTAConfig):
        return path_or_name
    d, p = read_config_json(path_or_name, CONFIG_DIR)
    return config_from_dict(d, where=str(p), name=p.stem)
