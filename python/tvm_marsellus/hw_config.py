"""MARSELLUS hardware configuration: the JSON parameters of the CLUSTER (RBE, 16 XpulpNN cores,
TCDM, DMA) and the timing constants of the cycle model in ``sim/marsellus``.

Source: the MARSELLUS paper (``seeds/001``), section II (architecture) and III (measurements).

Memories (paper Sec. II): **L1** = 128 KiB TCDM shared by cores, DMA and RBE (32 word-interleaved
banks, 0 wait states); **L2** = 1 MiB SoC memory; **L3** = optional external HyperRAM reached
through the SoC I/O DMA (size and bandwidth are not in the paper: 8 MiB and 1 byte per CLUSTER
cycle, i.e. ~400 MB/s of an 8-bit DDR HyperBus at 200 MHz, are our choice). The CLUSTER DMA moves
64 bit/cycle read and 64 bit/cycle write (L2->L1 and L1->L2 run concurrently).

RBE (Sec. II-B): ``RBE_CORES`` = 9 Cores (a 3x3 output patch), each of ``RBE_BLOCKS`` = 9 Blocks
(the 9 filter taps in 3x3 mode, the W weight bits in 1x1 mode), each of ``RBE_BINCONVS`` = 4
BinConvs (up to 4 input bits in parallel) doing a 32x32 1-bit dot product per cycle: 10368 AND
gates. ``RBE_TCDM_PORT_BITS`` = 288 (9 x 32-bit words per cycle), ``RBE_JOB_QUEUE_DEPTH`` = 2.
Precisions W, I, O in ``RBE_MIN_BITS``..``RBE_MAX_BITS`` = 2..8.

RBE cycle model (per job; calibration in docs/marsellus.md). With P =
sqrt(RBE_CORES) = 3 output pixels per patch side, k = 3 or 1, s = stride, bit groups of
``RBE_BINCONVS`` input bits (ib = bits of the group)::

    patch input rows/cols  r = (P - 1) * s + k                   (5 for 3x3 s1, 3 for 1x1 s1)
    LOAD      = RBE_LOAD_LATENCY_CYCLES + ceil(r * ib * r / port_words)   per Kin tile and group
    COMPUTE   = kout_t * (W + RBE_KOUT_OVERHEAD_CYCLES) + RBE_COMPUTE_LATENCY_CYCLES   3x3
              = kout_t + RBE_COMPUTE_LATENCY_CYCLES                                     1x1
                per Kin tile and group; kout_t = output channels of the tile (<= 32). In 3x3
                mode the W weight bit-planes of an output channel are serialized and followed
                by one cycle switching the Accum bank (our reading; it reproduces 1610 ops/cycle
                and the ~7100 1x1-bit Gop/s of W=8 I=4); in 1x1 mode the W bits run in parallel
                on the Blocks, one cycle per output channel.
    NORMQUANT = ceil(kout_t / 4) * RBE_NORMQUANT_CYCLES_PER_GROUP         per Kout tile
    STREAMOUT = P * P * O                                                  per Kout tile
    job = setup + sum over patches, Kout tiles: (sum over Kin tiles, groups: LOAD + COMPUTE)
          + NORMQUANT + STREAMOUT

The phases run in series: a patch's NORMQUANT / STREAMOUT do not overlap the next patch's
LOAD / COMPUTE (one controller FSM, one TCDM port shared by loads and stores, one accumulator
bank per Core; the evidence from the paper and the public RBE RTL is in docs/marsellus.md,
"RBE timing").

``RBE_JOB_SETUP_CYCLES`` is the time a core needs to write the job registers through the 32-bit
peripheral interconnect and trigger; with a 2-deep queue it is hidden when the job was ready
while the previous one ran.

Cluster (Sec. II-A, III-C): ``CLUSTER_CORES`` = 16. MatMul throughput of the whole cluster in
MAC/cycle: ``CL_MATMUL_8B_MACS_PER_CYCLE`` = 30.3 (Xpulp 8-bit baseline: 25.45 Gop/s at 420 MHz,
Sec. III-C3), x ``CL_MACLOAD_SPEEDUP`` = 1.67 with MAC&LOAD (``CL_MAC_LOAD`` = 1), x
``CL_4B_SPEEDUP`` = 3.2 / ``CL_2B_SPEEDUP`` = 6.3 for 4-/2-bit MAC&LOAD (both against the 8-bit
baseline). The other kernel rates are our choices (not in the paper), documented in
``sim/marsellus/mars_sim.h``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from tvm_accel.errors import ConfigError
from tvm_accel.hwconfig import HardwareConfig, parse_fields, read_config_json

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_CONFIG = "marsellus_default"

#: channels per BinConv / per word of the bit-plane layouts (fixed by the layouts)
RBE_CHANNELS = 32
#: memory levels in the order of the ISA's 2-bit memory field
MEMORIES = ("L3", "L2", "L1")

_INT_FIELDS = (
    "RBE_CORES",                 # Cores = output pixels of a patch (9 -> 3x3 patch)
    "RBE_BLOCKS",                # Blocks per Core (9 = 3x3 taps)
    "RBE_BINCONVS",              # BinConvs per Block = input bits processed in parallel
    "RBE_TCDM_PORT_BITS",        # streamer port width (288 = 9 words)
    "RBE_JOB_QUEUE_DEPTH",       # job contexts in the register file (2)
    "RBE_MIN_BITS",              # smallest W/I/O precision (2)
    "RBE_MAX_BITS",              # largest W/I/O precision (8)
    "RBE_LOAD_LATENCY_CYCLES",   # fixed part of a LOAD phase (TCDM latency, buffer fill)
    "RBE_KOUT_OVERHEAD_CYCLES",  # extra cycle per output channel in 3x3 COMPUTE (Accum switch)
    "RBE_COMPUTE_LATENCY_CYCLES",  # pipeline fill/drain of one COMPUTE phase
    "RBE_NORMQUANT_CYCLES_PER_GROUP",  # NORMQUANT cycles per group of 4 output channels
    "RBE_JOB_SETUP_CYCLES",      # register programming + trigger by a core
    "CLUSTER_CORES",             # RISC-V cores with XpulpNN (16)
    "CL_MAC_LOAD",               # 1: kernels use MAC&LOAD, 0: plain Xpulp dotp kernels
    "CL_KERNEL_OVERHEAD_CYCLES",  # fork, per-core setup and final barrier of a kernel
    "L1_BYTES",                  # TCDM (128 KiB)
    "L1_BANKS",                  # TCDM banks (32; informative, no contention model)
    "L2_BYTES",                  # SoC L2 (1 MiB)
    "L3_BYTES",                  # external HyperRAM (0 = none)
    "DMA_LATENCY_CYCLES",        # CLUSTER DMA: programming + AXI round trip per command
    "DMA_ROW_OVERHEAD_CYCLES",   # extra cycles per 1-D burst of a 2-D/3-D transfer
    "L3_LATENCY_CYCLES",         # I/O DMA + HyperRAM access latency per command
)
_FLOAT_FIELDS = (
    "CLOCK_MHZ",                 # CLUSTER clock (420 MHz at 0.8 V)
    "DMA_BYTES_PER_CYCLE",       # CLUSTER DMA per direction (64 bit = 8 bytes)
    "L3_BYTES_PER_CYCLE",        # I/O DMA to/from HyperRAM, in CLUSTER cycles
    "CL_MATMUL_8B_MACS_PER_CYCLE",  # 8-bit Xpulp MatMul, whole cluster
    "CL_MACLOAD_SPEEDUP",        # MAC&LOAD gain on the 8-bit MatMul
    "CL_4B_SPEEDUP",             # 4-bit MAC&LOAD MatMul vs 8-bit baseline
    "CL_2B_SPEEDUP",             # 2-bit MAC&LOAD MatMul vs 8-bit baseline
    "CL_DW_MACS_PER_CYCLE",      # depthwise conv, whole cluster
    "CL_FC_EFFICIENCY",          # matrix-vector vs matrix-matrix rate
    "CL_IM2COL_BYTES_PER_CYCLE",  # im2col buffer fill, whole cluster
    "CL_NQ_CYCLES_PER_OUTPUT",   # requant (mul, add, shift, clip, pack) per output, per core
    "CL_ELTWISE_ELEMS_PER_CYCLE",  # element-wise add with requant, whole cluster
    "CL_POOL_TAPS_PER_CYCLE",    # pooling window taps, whole cluster
    "CL_MARSHAL_BITS_PER_CYCLE",  # HWC <-> bit-plane marshaling, bits per cycle, whole cluster
    "CL_LUT_CYCLES_PER_ELEMENT",  # table lookup (load, indexed table load, store), per core
)
_OPTIONAL = {"TARGET": "sim", "HW_VER": "marsellus-1"}


@dataclass(frozen=True)
class MarsellusConfig(HardwareConfig):
    """One MARSELLUS CLUSTER. Construct with :func:`load_config`; fields mirror the JSON keys."""

    RBE_CORES: int
    RBE_BLOCKS: int
    RBE_BINCONVS: int
    RBE_TCDM_PORT_BITS: int
    RBE_JOB_QUEUE_DEPTH: int
    RBE_MIN_BITS: int
    RBE_MAX_BITS: int
    RBE_LOAD_LATENCY_CYCLES: int
    RBE_KOUT_OVERHEAD_CYCLES: int
    RBE_COMPUTE_LATENCY_CYCLES: int
    RBE_NORMQUANT_CYCLES_PER_GROUP: int
    RBE_JOB_SETUP_CYCLES: int
    CLUSTER_CORES: int
    CL_MAC_LOAD: int
    CL_KERNEL_OVERHEAD_CYCLES: int
    L1_BYTES: int
    L1_BANKS: int
    L2_BYTES: int
    L3_BYTES: int
    DMA_LATENCY_CYCLES: int
    DMA_ROW_OVERHEAD_CYCLES: int
    L3_LATENCY_CYCLES: int
    CLOCK_MHZ: float
    DMA_BYTES_PER_CYCLE: float
    L3_BYTES_PER_CYCLE: float
    CL_MATMUL_8B_MACS_PER_CYCLE: float
    CL_MACLOAD_SPEEDUP: float
    CL_4B_SPEEDUP: float
    CL_2B_SPEEDUP: float
    CL_DW_MACS_PER_CYCLE: float
    CL_FC_EFFICIENCY: float
    CL_IM2COL_BYTES_PER_CYCLE: float
    CL_NQ_CYCLES_PER_OUTPUT: float
    CL_ELTWISE_ELEMS_PER_CYCLE: float
    CL_POOL_TAPS_PER_CYCLE: float
    CL_MARSHAL_BITS_PER_CYCLE: float
    CL_LUT_CYCLES_PER_ELEMENT: float
    TARGET: str = "sim"
    HW_VER: str = "marsellus-1"
    name: str = "custom"

    def at_clock(self, freq_mhz: float) -> MarsellusConfig:
        """The config with the CLUSTER at ``freq_mhz`` (an operating point's clock). Every
        CLUSTER unit counts in its own cycles and keeps its figures; the I/O DMA's HyperRAM
        link does not: it runs on the SoC peripheral clock, generated by its own FLL (paper
        Sec. II: three FLLs, for the SoC, its peripherals and the CLUSTER), so its bandwidth
        and latency are fixed in time and ``L3_BYTES_PER_CYCLE`` / ``L3_LATENCY_CYCLES``, in
        CLUSTER cycles, scale with ``CLOCK_MHZ / freq_mhz`` (at 0.5 V / 100 MHz the ~420 MB/s
        link moves 4.2 bytes per CLUSTER cycle instead of 1)."""
        if freq_mhz == self.CLOCK_MHZ:
            return self
        ratio = self.CLOCK_MHZ / freq_mhz
        return dataclasses.replace(self, CLOCK_MHZ=float(freq_mhz),
                                   L3_BYTES_PER_CYCLE=self.L3_BYTES_PER_CYCLE * ratio,
                                   L3_LATENCY_CYCLES=max(1, math.ceil(
                                       self.L3_LATENCY_CYCLES / ratio - 1e-9)))

    # --- RBE geometry ---------------------------------------------------------------------------
    @property
    def rbe_patch(self) -> int:
        """Output pixels per side of the spatial patch the Cores work on (3)."""
        return math.isqrt(self.RBE_CORES)

    @property
    def rbe_port_words(self) -> int:
        """32-bit words the streamer moves per cycle (9)."""
        return self.RBE_TCDM_PORT_BITS // 32

    @property
    def rbe_and_gates(self) -> int:
        """1-bit multipliers of the RBE (10368)."""
        return self.RBE_CORES * self.RBE_BLOCKS * self.RBE_BINCONVS * RBE_CHANNELS

    def cluster_macs_per_cycle(self, bits: int) -> float:
        """MatMul MAC/cycle of the whole cluster at a symmetric precision of 8, 4 or 2 bits."""
        base = self.CL_MATMUL_8B_MACS_PER_CYCLE
        ml = self.CL_MACLOAD_SPEEDUP
        if bits >= 8:
            return base * (ml if self.CL_MAC_LOAD else 1.0)
        gain = self.CL_4B_SPEEDUP if bits >= 4 else self.CL_2B_SPEEDUP
        return base * (gain if self.CL_MAC_LOAD else gain / ml)

    @property
    def on_chip_bytes(self) -> int:
        """The CLUSTER's L1 TCDM plus the SoC's L2, in bytes (L3 is off chip)."""
        return self.L1_BYTES + self.L2_BYTES

    # --- validation ------------------------------------------------------------------------------
    def validate(self, where: str = "config") -> None:
        """Reject configs the ISA or the simulator cannot express, naming the field."""

        def bad(field: str, msg: str) -> ConfigError:
            return ConfigError(f"{where}: field {field}: {msg}")

        def in_range(field: str, lo: float, hi: float) -> None:
            v = getattr(self, field)
            if not lo <= v <= hi:
                raise bad(field, f"{v} is outside {lo}..{hi}")

        in_range("RBE_CORES", 1, 16)
        if self.rbe_patch ** 2 != self.RBE_CORES:
            raise bad("RBE_CORES", f"{self.RBE_CORES} is not a square (the Cores form a square "
                      "output patch)")
        in_range("RBE_BLOCKS", 9, 9)  # one Block per 3x3 tap; the layouts fix it
        in_range("RBE_BINCONVS", 1, 8)
        in_range("RBE_TCDM_PORT_BITS", 32, 1024)
        if self.RBE_TCDM_PORT_BITS % 32:
            raise bad("RBE_TCDM_PORT_BITS", f"{self.RBE_TCDM_PORT_BITS} is not a multiple of 32")
        in_range("RBE_JOB_QUEUE_DEPTH", 1, 16)
        in_range("RBE_MIN_BITS", 1, 8)
        in_range("RBE_MAX_BITS", self.RBE_MIN_BITS, 8)
        for f in ("RBE_LOAD_LATENCY_CYCLES", "RBE_KOUT_OVERHEAD_CYCLES",
                  "RBE_COMPUTE_LATENCY_CYCLES", "RBE_JOB_SETUP_CYCLES",
                  "CL_KERNEL_OVERHEAD_CYCLES", "DMA_LATENCY_CYCLES", "DMA_ROW_OVERHEAD_CYCLES",
                  "L3_LATENCY_CYCLES"):
            in_range(f, 0, 1 << 20)
        in_range("RBE_NORMQUANT_CYCLES_PER_GROUP", 1, 1 << 10)
        in_range("CLUSTER_CORES", 1, 64)
        in_range("CL_MAC_LOAD", 0, 1)
        in_range("L1_BYTES", 1024, 1 << 24)
        in_range("L1_BANKS", 1, 256)
        in_range("L2_BYTES", 1024, 1 << 30)
        in_range("L3_BYTES", 0, 1 << 32)
        if not 0 < self.CLOCK_MHZ < 1e5:
            raise bad("CLOCK_MHZ", f"{self.CLOCK_MHZ} must be positive (MHz)")
        for f in _FLOAT_FIELDS[1:]:
            v = getattr(self, f)
            if not 0 < v <= 1 << 16:
                raise bad(f, f"{v} is outside (0, 65536]")
        if self.CL_FC_EFFICIENCY > 1:
            raise bad("CL_FC_EFFICIENCY", f"{self.CL_FC_EFFICIENCY} is above 1")


def config_from_dict(d: dict, where: str = "config", name: str = "custom") -> MarsellusConfig:
    """Build and validate a config from parsed JSON, naming any bad or missing field."""
    kw = parse_fields(d, _INT_FIELDS, _FLOAT_FIELDS, _OPTIONAL, where, "MARSELLUS")
    cfg = MarsellusConfig(**kw, name=name)
    cfg.validate(where)
    return cfg


def load_config(path_or_name: str | Path | MarsellusConfig | None = None) -> MarsellusConfig:
    """Load a config by file path or bundled name (``marsellus_default``)."""
    if path_or_name is None:
        path_or_name = DEFAULT_CONFIG
    if isinstance(path_or_name, MarsellusConfig):
        return path_or_name
    d, p = read_config_json(path_or_name, CONFIG_DIR)
    return config_from_dict(d, where=str(p), name=p.stem)
