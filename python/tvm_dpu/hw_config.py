"""DPU hardware configuration: the JSON parameters of a DPUV3INT8-style overlay plus its timing.

The abstraction is the one of the DPUV3INT8 compiler paper (section III, Fig. 2) with the ISA ideas
of DNNVM:

- **DDR** is a scratch pad logically split by register pointers into five regions: INPUT, OUTPUT,
  PARAM (weights + biases), INSN (the instruction stream) and SWAP (spill space, the compiler's
  "stack"). LOAD/SAVE address DDR as ``region + offset``; the region registers (base, size) are set
  by the runtime per program (:meth:`DPUConfig.region_layout`, ``simulate(regions=...)``); the
  ``DDR_*_BYTES`` fields are the default sizes (= the layout used when the runtime sets nothing).
- **PM**, one parameter memory shared by every PE (``PM_BYTES``, circular: addresses wrap modulo
  its size).
- **PEs**: ``NUM_PE`` processing engines working SIMD, one image each (4 in the paper, up to 16 on
  a U280). A CONV/MISC instruction runs on every PE's own FM; LOAD/SAVE move the N images.
- **FM** per PE: ``FM_MEMORIES`` (three) circular memories, each of ``FM_BANKS`` (eight) banks of
  ``FM_BANK_BYTES``. An FM address is linear within one memory (bank = address / FM_BANK_BYTES,
  banks are contiguous slices) and wraps modulo the memory size. The row parallelism of the
  engines reads its rows from different banks, so it may not exceed ``FM_BANKS``.
- **Format unit**: a LOAD of an input with at most ``FORMAT_MAX_CHANNELS`` (8) channels can
  re-layout it on the fly (W-direction im2col of up to ``FORMAT_MAX_FACTOR`` pixels) so a 3-channel
  image uses the input-channel parallelism of the CONV engine.
- Four units run in parallel: LOAD (DDR -> FM/PM), SAVE (FM -> DDR), CONV (systolic convolution
  engine) and MISC (pooling, element-wise add, up-sample, copy), synchronised by type only with
  DPON/DPBY (see ``docs/dpu.md`` and ``sim/dpu/dpu_sim.h``).

Default parallelism (``dpu_default``): the CONV engine of a PE computes ``CONV_IC_PAR`` = 16 input
channels x ``CONV_OC_PAR`` = 16 output channels x ``CONV_ROW_PAR`` = 8 output rows per cycle
(H_c = 8 is the paper's preferred conv output height) = **2048 MACs/cycle per PE, 8192 for the
four PEs**, i.e. 2.46 TMAC/s (4.9 TOPS) at 300 MHz. Calibration: ResNet-50 v1 (3.86 GMAC/image)
on four images at this peak takes 6.3 ms; the paper reports 7.5 ms hand-tuned and 8.2 ms compiled,
i.e. 84% / 77% efficiency, in line with its "80+% HW efficiency". The MISC unit processes
``MISC_CH_PAR`` = 16 channels x ``MISC_ROW_PAR`` = 2 rows per cycle (H_P = H_E = 2 in the paper).

Bundled variants: ``dpu_default`` (above) and ``dpu_8pe`` (8 PEs / 8 images, with two DDR channels,
128 bytes/cycle, so the per-image bandwidth stays the same).

Timing (cycle model of ``sim/dpu``):

- ``CLOCK_MHZ`` 300: converts cycles to time (Alveo U200/U250 DPU clock range).
- ``DDR_BYTES_PER_CYCLE`` 64: one DDR4-2400 channel (19.2 GB/s at 300 MHz), shared by the PEs.
- LOAD/SAVE: ``*_LATENCY_CYCLES`` + ceil(bytes moved over DDR, all PEs / DDR_BYTES_PER_CYCLE).
- CONV: ``CONV_LATENCY_CYCLES`` + ceil(out_h / ROW_PAR) x out_w x ceil(oc / OC_PAR) x
  ceil(ic / IC_PAR) x kh x kw (depthwise: without the ic factor).
- MISC: ``MISC_LATENCY_CYCLES`` + ceil(out_h / ROW_PAR) x out_w x ceil(c / CH_PAR) x (kh x kw
  for pools).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tvm_accel.errors import ConfigError
from tvm_accel.hwconfig import HardwareConfig, parse_fields, read_config_json

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = "dpu_default"

#: DDR regions in register order (the ISA's 3-bit region field indexes this tuple).
REGION_NAMES = ("INPUT", "OUTPUT", "PARAM", "INSN", "SWAP")
#: regions a SAVE may write (the others are read-only for the device)
WRITABLE_REGIONS = ("OUTPUT", "SWAP")
#: default alignment of region bases in :meth:`DPUConfig.region_layout`
REGION_ALIGN = 4096

# ISA field limits the config must respect (see ``docs/dpu.md``, ISA).
FM_ADDR_BITS = 20
PM_ADDR_BITS = 23
FORMAT_FACTOR_BITS = 4

_INT_FIELDS = (
    "NUM_PE",              # PEs working SIMD, one image each (paper: 4; U280: up to 16)
    "FM_MEMORIES",         # circular memories per FM (paper: 3)
    "FM_BANKS",            # banks per FM memory (paper: 8)
    "FM_BANK_BYTES",       # bytes per bank (power of two)
    "PM_BYTES",            # shared parameter memory
    "CONV_IC_PAR",         # CONV engine parallelism: input channels ...
    "CONV_OC_PAR",         # ... output channels ...
    "CONV_ROW_PAR",        # ... output rows (pixels of H_c = 8 rows)
    "MISC_CH_PAR",         # MISC parallelism: channels ...
    "MISC_ROW_PAR",        # ... output rows (H_P = H_E = 2)
    "FORMAT_MAX_CHANNELS",  # format unit: only for inputs with <= this many channels (0 = none)
    "FORMAT_MAX_FACTOR",   # format unit: at most this many W pixels packed per pixel (0 = none)
    "LOAD_LATENCY_CYCLES",  # fixed cost of a LOAD (DDR read latency, descriptor setup)
    "SAVE_LATENCY_CYCLES",  # fixed cost of a SAVE
    "CONV_LATENCY_CYCLES",  # systolic array fill/drain per CONV instruction
    "MISC_LATENCY_CYCLES",  # pipeline fill per MISC instruction
    "DDR_INPUT_BYTES",     # default DDR region sizes (laid out in REGION_NAMES order)
    "DDR_OUTPUT_BYTES",
    "DDR_PARAM_BYTES",
    "DDR_INSN_BYTES",
    "DDR_SWAP_BYTES",
)
_FLOAT_FIELDS = ("CLOCK_MHZ", "DDR_BYTES_PER_CYCLE")
_OPTIONAL = {"TARGET": "sim", "HW_VER": "dpuv3int8-1"}


@dataclass(frozen=True)
class DPUConfig(HardwareConfig):
    """One DPU instance. Construct with :func:`load_config`; fields mirror the JSON keys."""

    NUM_PE: int
    FM_MEMORIES: int
    FM_BANKS: int
    FM_BANK_BYTES: int
    PM_BYTES: int
    CONV_IC_PAR: int
    CONV_OC_PAR: int
    CONV_ROW_PAR: int
    MISC_CH_PAR: int
    MISC_ROW_PAR: int
    FORMAT_MAX_CHANNELS: int
    FORMAT_MAX_FACTOR: int
    LOAD_LATENCY_CYCLES: int
    SAVE_LATENCY_CYCLES: int
    CONV_LATENCY_CYCLES: int
    MISC_LATENCY_CYCLES: int
    DDR_INPUT_BYTES: int
    DDR_OUTPUT_BYTES: int
    DDR_PARAM_BYTES: int
    DDR_INSN_BYTES: int
    DDR_SWAP_BYTES: int
    CLOCK_MHZ: float
    DDR_BYTES_PER_CYCLE: float
    TARGET: str = "sim"
    HW_VER: str = "dpuv3int8-1"
    name: str = "custom"

    # --- memories ---------------------------------------------------------------------------
    @property
    def fm_memory_bytes(self) -> int:
        """Bytes of one circular FM memory (all its banks); FM addresses wrap modulo this."""
        return self.FM_BANKS * self.FM_BANK_BYTES

    @property
    def fm_bytes(self) -> int:
        """Bytes of the FM of one PE (all its memories)."""
        return self.FM_MEMORIES * self.fm_memory_bytes

    # --- compute ----------------------------------------------------------------------------
    @property
    def macs_per_cycle_per_pe(self) -> int:
        """Peak MACs per cycle of one PE's CONV engine (ic x oc x rows)."""
        return self.CONV_IC_PAR * self.CONV_OC_PAR * self.CONV_ROW_PAR

    @property
    def peak_macs_per_cycle(self) -> int:
        """Peak MACs per cycle of the whole DPU (all PEs)."""
        return self.NUM_PE * self.macs_per_cycle_per_pe

    @property
    def peak_gops(self) -> float:
        """Peak giga-operations per second (2 ops per MAC) at ``CLOCK_MHZ``."""
        return 2 * self.peak_macs_per_cycle * self.CLOCK_MHZ / 1000.0

    @property
    def format_unit(self) -> bool:
        return self.FORMAT_MAX_CHANNELS > 0 and self.FORMAT_MAX_FACTOR > 0

    # --- DDR ----------------------------------------------------------------------------------
    def region_sizes(self) -> dict[str, int]:
        """Default size of each DDR region, in :data:`REGION_NAMES` order."""
        return {r: getattr(self, f"DDR_{r}_BYTES") for r in REGION_NAMES}

    def region_layout(self, sizes: dict[str, int] | None = None,
                      align: int = REGION_ALIGN) -> dict[str, tuple[int, int]]:
        """Region registers ``{name: (base, size)}`` packing the regions one after another.

        ``sizes`` overrides the default size of some regions (e.g. the exact needs of one
        program); each must be within 0..2^32 (the 32-bit offset field). The DDR buffer given to
        the simulator must be at least ``ddr_bytes(layout)`` long.
        """
        sz = self.region_sizes()
        for k, v in (sizes or {}).items():
            if k not in sz:
                raise ConfigError(f"unknown DDR region {k!r} (regions: {', '.join(REGION_NAMES)})")
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 32:
                raise ConfigError(f"DDR region {k}: size {v!r} is outside 0..2^32")
            sz[k] = v
        out, base = {}, 0
        for r in REGION_NAMES:
            base = -(-base // align) * align
            out[r] = (base, sz[r])
            base += sz[r]
        return out

    @staticmethod
    def ddr_bytes(layout: dict[str, tuple[int, int]]) -> int:
        """Smallest DDR buffer holding every region of ``layout``."""
        return max((b + s for b, s in layout.values()), default=0)

    @property
    def on_chip_bytes(self) -> int:
        """Every PE's feature-map memories plus the shared parameter memory, in bytes."""
        return self.NUM_PE * self.FM_MEMORIES * self.FM_BANKS * self.FM_BANK_BYTES \
            + self.PM_BYTES

    # --- validation ------------------------------------------------------------------------------
    def validate(self, where: str = "config") -> None:
        """Reject configs the ISA or the simulator cannot express, naming the field."""

        def bad(field: str, msg: str) -> ConfigError:
            return ConfigError(f"{where}: field {field}: {msg}")

        def in_range(field: str, lo: int, hi: int) -> None:
            v = getattr(self, field)
            if not lo <= v <= hi:
                raise bad(field, f"{v} is outside {lo}..{hi}")

        def pow2(field: str) -> None:
            v = getattr(self, field)
            if v & (v - 1):
                raise bad(field, f"{v} is not a power of two")

        in_range("NUM_PE", 1, 16)
        in_range("FM_MEMORIES", 1, 4)  # 2-bit memory field
        in_range("FM_BANKS", 1, 64)
        pow2("FM_BANKS")
        in_range("FM_BANK_BYTES", 64, 1 << FM_ADDR_BITS)
        pow2("FM_BANK_BYTES")
        if self.fm_memory_bytes > 1 << FM_ADDR_BITS:
            raise bad("FM_BANK_BYTES", f"FM_BANKS x FM_BANK_BYTES = {self.fm_memory_bytes} "
                      f"exceeds the {FM_ADDR_BITS}-bit FM address field ({1 << FM_ADDR_BITS})")
        in_range("PM_BYTES", 1024, 1 << PM_ADDR_BITS)
        for f in ("CONV_IC_PAR", "CONV_OC_PAR", "CONV_ROW_PAR", "MISC_CH_PAR", "MISC_ROW_PAR"):
            in_range(f, 1, 256)
        for f in ("CONV_ROW_PAR", "MISC_ROW_PAR"):
            if getattr(self, f) > self.FM_BANKS:
                raise bad(f, f"{getattr(self, f)} rows in parallel need as many FM banks, "
                          f"FM_BANKS is {self.FM_BANKS}")
        in_range("FORMAT_MAX_CHANNELS", 0, 64)
        in_range("FORMAT_MAX_FACTOR", 0, (1 << FORMAT_FACTOR_BITS) - 1)
        for f in ("LOAD_LATENCY_CYCLES", "SAVE_LATENCY_CYCLES", "CONV_LATENCY_CYCLES",
                  "MISC_LATENCY_CYCLES"):
            in_range(f, 0, 1 << 20)
        for r in REGION_NAMES:
            in_range(f"DDR_{r}_BYTES", 0, 1 << 32)
        if not 0 < self.CLOCK_MHZ < 1e5:
            raise bad("CLOCK_MHZ", f"{self.CLOCK_MHZ} must be positive (MHz)")
        if not 0 < self.DDR_BYTES_PER_CYCLE <= 1 << 16:
            raise bad("DDR_BYTES_PER_CYCLE", f"{self.DDR_BYTES_PER_CYCLE} is outside (0, 65536]")


def config_from_dict(d: dict, where: str = "config", name: str = "custom") -> DPUConfig:
    """Build and validate a config from parsed JSON, naming any bad or missing field."""
    kw = parse_fields(d, _INT_FIELDS, _FLOAT_FIELDS, _OPTIONAL, where, "DPU")
    cfg = DPUConfig(**kw, name=name)
    cfg.validate(where)
    return cfg


def load_config(path_or_name: str | Path | DPUConfig | None = None) -> DPUConfig:
    """Load a config by file path or bundled name (``dpu_default``, ``dpu_8pe``)."""
    if path_or_name is None:
        path_or_name = DEFAULT_CONFIG
    if isinstance(path_or_name, DPUConfig):
        return path_or_name
    d, p = read_config_json(path_or_name, CONFIG_DIR)
    return config_from_dict(d, where=str(p), name=p.stem)
