"""MARSELLUS command ISA: dataclasses, 64-byte encoder/decoder, assembly formatter and parser,
RBE bit-plane layouts, the program container and its blob.

Commands
--------
Every command is 64 bytes = 16 little-endian 32-bit words. Word 0 ``[7:0]`` is the opcode (1 DMA,
2 RBE, 3 CLUSTER, 4 NOP, 15 END), word 1 holds the synchronisation masks ``wait[15:0]`` and
``signal[31:16]`` over 16 semaphores. Unused words and bits are reserved and must be zero.

Engines and synchronisation
---------------------------
Five engines run concurrently, each executing its own commands in stream order: IODMA (L3<->L2),
DMA_IN (L2->L1), DMA_OUT (L1->L2), RBE, CLUSTER (the 16 cores). The engine of a DMA follows from
its (src, dst) memories; NOP names its engine. The 16 semaphores are counting event counters: a
command starts only when every semaphore of its ``wait`` set holds a token and takes one token
from each; when it completes it adds one token to each semaphore of its ``signal`` set. NOP costs
0 cycles and is how a program pre-loads credits, e.g. double buffering of L1 tiles::

    NOP engine=DMA_IN signal=2      ; two "buffer free" credits on sem 2
    NOP engine=DMA_IN signal=2
    DMA wait=2 signal=0 ...         ; tile i in    (DMA_IN: needs a free buffer, marks it full)
    RBE wait=0 signal=1 ...         ; compute tile i (needs a full buffer, marks result ready)
    DMA wait=1 signal=2 ...         ; tile i out   (DMA_OUT: frees the buffer)

so DMA_IN of tile i+1 overlaps the RBE job of tile i. Tokens left at the end are allowed; a state
where no engine can progress is reported as a deadlock.

DMA (opcode 1)::

    w2 src_mem[1:0] dst_mem[3:2] (0 L3, 1 L2, 2 L1)   w3 src   w4 dst   w5 len (bytes per row)
    w6 rows   w7 planes   w8 src_row_stride   w9 src_plane_stride
    w10 dst_row_stride   w11 dst_plane_stride

copies ``planes x rows x len`` bytes: byte (p, r, i) from ``src + p*src_plane_stride +
r*src_row_stride + i`` to the same position at dst (3-D strided; 1-D with rows = planes = 1).
Destination rows/planes may not overlap. An empty transfer (any size 0) takes 1 cycle.

RBE job (opcode 2): the job registers of the RBE register file (paper Sec. II-B; field packing
after ``rbe_ctrl.sv``, the hwpe "value - 1" convention on sizes and precisions)::

    w2 X_PTR  w3 W_PTR  w4 NQ_PTR  w5 Y_PTR                    (L1 byte addresses, X/W/Y 4-aligned)
    w6 IMG_SIZE_INP  [31:16] W_in - 1   [15:0] H_in - 1
    w7 IMG_SIZE_OUT  [31:16] W_out - 1  [15:0] H_out - 1
    w8 CHANNELS      [31:16] Kin - 1    [15:0] Kout - 1
    w9 QA_QW_QAO     [7:0] I - 1  [15:8] W - 1  [23:16] O - 1  [24] mode 1x1  [25] stride 2
                     [26] ReLU  [27] signed output  [28] unsigned weights
    w10 SHIFT_PAD    [4:0] shift  [15:8] pad value  [19:16] top  [23:20] bottom  [27:24] left
                     [31:28] right
    w11 x_pix_stride  w12 x_row_stride  w13 y_pix_stride  w14 y_row_stride   (bytes, 0 = dense)

Layouts (paper Sec. II-B3), all of 32-bit little-endian words, bit j of a word = channel 32t+j:

- activations ``(H, W, K/32, bits, 32)``: pixel (h, w) at ``ptr + h*row_stride + w*pix_stride``,
  then for each 32-channel tile t and bit b one word (``ceil(K/32) * bits * 4`` bytes per pixel);
- 3x3 weights ``(Kout, Kin/32, W, 9, 32)`` (tap f = 3*ky + kx), 1x1 weights ``(Kout, Kin/32, W,
  32)``. Signed weights are stored offset-binary, ``w + 2^(W-1)``; the engine removes the offset
  (the real RBE computes the correction from the input sums, notes 1.2). Flag 28 = unsigned.
- NormQuant parameters: 6 bytes per output channel, ``kappa`` u16 then ``lambda`` i32.

Channels are padded to a multiple of 32 (pad channels read as 0 and are written as 0). Inputs are
unsigned I-bit activations. With k = 3 or 1 and s = 1 or 2::

    X(h, w, c) = x(h - top, w - left, c) inside H_in x W_in, else pad_value
    acc = sum over ky, kx, c of X(ho*s + ky, wo*s + kx, c) * w(o, c, ky, kx)   exact, then wrapped
          to the 32-bit two's-complement accumulator
    y   = floor((acc * kappa + lambda) / 2^shift)        int64, kappa u16, lambda i32, shift 0..31
    y   = clamp(y, lo, hi)   lo, hi = -2^(O-1), 2^(O-1)-1 when signed, else 0, 2^O - 1;
                             ReLU raises lo to 0

The shift is a floor (no rounding term): a compiler wanting round-half-up adds
``1 << (shift - 1)`` to lambda. Requires ``(H_out - 1)*s + k <= H_in + top + bottom`` (same in W).
Output bits are the two's-complement O-bit pattern of y.

CLUSTER kernel (opcode 3) on L1 HWC tensors, bit-packed (element i at bits ``[i*b, (i+1)*b)``,
little-endian, b = 2, 4 or 8)::

    w2 kernel[7:0] relu[8] out_signed[9] in_signed[10] b_signed[11] in_bits[15:12]
       w_bits[19:16] out_bits[23:20] shift[28:24] psum_in[29] psum_out[30]
    w3 in_addr  w4 out_addr  w5 w_addr (ADD: B)  w6 nq_addr (ADD: kappa_a[15:0] kappa_b[31:16];
       AVGPOOL: kappa_a[15:0])
    w7 H_in[15:0] W_in[31:16]  w8 C_in[15:0] C_out[31:16]  w9 H_out[15:0] W_out[31:16]
    w10 kh[3:0] kw[7:4] sh[11:8] sw[15:12] top[19:16] bottom[23:20] left[27:24] right[31:28]
    w11 pad_value[7:0] (signed when in_signed)   w12 lambda (i32, ADD / AVGPOOL)
    w13 psum_addr (CONV / FC with psum_in or psum_out, else 0)
    w14 the high nibbles [7:4] of the eight w10 fields, in the same positions

so kernel, stride and padding are 8-bit (0..255): the kernels are software on the cores, whose
loops take any window (DeepBench's 20x5 kernels, a 1x1 stride-2 conv with padding 3); a stream
with w14 = 0 reads as 4-bit fields. Padding may exceed the kernel: an output whose window lies
in the padding only gets NormQuant of the padding taps (the bias-only value after the folding).

Kernels (padding taps read pad_value; NQ = the RBE NormQuant above, per output channel):

- CONV (im2col + MatMul): weights (C_out, kh, kw, C_in) signed w_bits; acc int32-wrapped; NQ.
  Partial sums (input-channel tiling, ``strategy``): with ``psum_in`` the accumulators start
  from the int32 values at ``psum_addr`` (layout (H_out, W_out, C_out), little-endian) instead
  of 0; with ``psum_out`` they are written back there, wrapped to int32, and neither NormQuant
  nor the output is touched. A reduction split over chunks c is thus exact: the first chunk
  runs with psum_out, the middle ones with both, the last with psum_in and NormQuant.
- DWCONV: weights (C, kh, kw); NQ. FC: C_in -> C_out, weights (C_out, C_in), H = W = 1; NQ.
- ADD: ``y = clamp(floor((A*kappa_a + B*kappa_b + lambda) / 2^shift))`` in int64 (A: in_signed,
  B: b_signed, both in_bits).
- MAXPOOL: max over the window, clamped to the output range. AVGPOOL: ``clamp(floor((sum *
  kappa_a + lambda) / 2^shift))``.
- HWC2RBE: HWC (in_bits) to the activation bit-plane layout with out_bits planes (the low bits of
  each value). RBE2HWC: bit planes (in_bits, sign-extended if in_signed) to HWC (out_bits).

Assembly: one command per line, mnemonic (``DMA``, ``RBE``, ``CL.<KERNEL>``, ``NOP``, ``END``),
``wait=`` and ``signal=`` (comma-separated semaphores or ``-``) and every field that differs from
its default as ``name=value``. ``;`` and ``#`` start comments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

import numpy as np

from tvm_accel.blob import Blob, pack_blob, unpack_blob
from tvm_accel.errors import BlobError, ConfigError
from tvm_marsellus.hw_config import MEMORIES, RBE_CHANNELS, MarsellusConfig, config_from_dict

CMD_BYTES = 64
NUM_SEMS = 16
BLOB_TARGET = "marsellus"
ENGINES = ("IODMA", "DMA_IN", "DMA_OUT", "RBE", "CLUSTER")
OP_DMA, OP_RBE, OP_CLUSTER, OP_NOP, OP_END = 1, 2, 3, 4, 15
KERNELS = ("CONV", "DWCONV", "FC", "ADD", "MAXPOOL", "AVGPOOL", "HWC2RBE", "RBE2HWC")
NQ_RECORD_BYTES = 6


class EncodeError(ValueError):
    """A command field does not fit its encoding."""


class DecodeError(ValueError):
    """Bytes that are not a valid command (unknown opcode, reserved bits, bad enumeration)."""


class AsmError(ValueError):
    """An assembly line that cannot be parsed."""


def _sems(v) -> tuple[int, ...]:
    if isinstance(v, int):
        v = (v,)
    out = tuple(sorted(set(int(s) for s in v)))
    for s in out:
        if not 0 <= s < NUM_SEMS:
            raise EncodeError(f"semaphore {s} is outside 0..{NUM_SEMS - 1}")
    return out


@dataclass
class _Sync:
    wait: tuple[int, ...] = ()
    signal: tuple[int, ...] = ()

    def __post_init__(self):
        self.wait = _sems(self.wait)
        self.signal = _sems(self.signal)


@dataclass
class Dma(_Sync):
    """3-D strided copy between memory levels (engine from the path: IODMA, DMA_IN, DMA_OUT)."""

    src_mem: str = "L2"
    dst_mem: str = "L1"
    src: int = 0
    dst: int = 0
    length: int = 0
    rows: int = 1
    planes: int = 1
    src_row_stride: int = 0
    src_plane_stride: int = 0
    dst_row_stride: int = 0
    dst_plane_stride: int = 0

    @property
    def nbytes(self) -> int:
        return self.length * self.rows * self.planes

    @property
    def engine(self) -> str:
        return {("L2", "L1"): "DMA_IN", ("L1", "L2"): "DMA_OUT"}.get(
            (self.src_mem, self.dst_mem), "IODMA")


@dataclass
class RbeJob(_Sync):
    """One RBE job: a full 3x3 or 1x1 convolution with NormQuant on L1 bit-plane tensors."""

    x_ptr: int = 0
    w_ptr: int = 0
    nq_ptr: int = 0
    y_ptr: int = 0
    h_in: int = 3
    w_in: int = 3
    h_out: int = 1
    w_out: int = 1
    k_in: int = 32
    k_out: int = 32
    in_bits: int = 8
    w_bits: int = 8
    out_bits: int = 8
    kernel: int = 3
    stride: int = 1
    relu: int = 0
    out_signed: int = 0
    w_unsigned: int = 0
    shift: int = 0
    pad_value: int = 0
    pad_top: int = 0
    pad_bottom: int = 0
    pad_left: int = 0
    pad_right: int = 0
    x_pix_stride: int = 0
    x_row_stride: int = 0
    y_pix_stride: int = 0
    y_row_stride: int = 0

    engine = "RBE"

    @property
    def macs(self) -> int:
        return self.h_out * self.w_out * self.k_out * self.k_in * self.kernel ** 2


@dataclass
class ClusterKernel(_Sync):
    """One kernel run by the 16 cores on L1 HWC tensors (see the module docstring)."""

    kernel: str = "CONV"
    relu: int = 0
    out_signed: int = 1
    in_signed: int = 1
    b_signed: int = 0
    in_bits: int = 8
    w_bits: int = 0
    out_bits: int = 8
    shift: int = 0
    in_addr: int = 0
    out_addr: int = 0
    w_addr: int = 0
    nq_addr: int = 0
    kappa_a: int = 0
    kappa_b: int = 0
    h_in: int = 1
    w_in: int = 1
    c_in: int = 1
    c_out: int = 1
    h_out: int = 1
    w_out: int = 1
    kh: int = 1
    kw: int = 1
    sh: int = 1
    sw: int = 1
    pad_top: int = 0
    pad_bottom: int = 0
    pad_left: int = 0
    pad_right: int = 0
    pad_value: int = 0
    lambda_: int = 0
    psum_in: int = 0
    psum_out: int = 0
    psum_addr: int = 0

    engine = "CLUSTER"

    @property
    def macs(self) -> int:
        if self.kernel in ("CONV", "FC"):
            return self.h_out * self.w_out * self.c_out * self.kh * self.kw * self.c_in
        if self.kernel == "DWCONV":
            return self.h_out * self.w_out * self.c_out * self.kh * self.kw
        return 0


@dataclass
class Nop(_Sync):
    """0-cycle command on ``engine``: waits and signals only (credits, barriers)."""

    engine: str = "CLUSTER"


@dataclass
class End:
    """Last command of a stream."""


Command = Dma | RbeJob | ClusterKernel | Nop | End

# --- field tables: name -> (word, lo, width, transform) -------------------------------------
# transform: "" raw, "m1" value-1, "s" signed, "k" 3->0/1->1, "st" 1->0/2->1, "mem", "eng"
_DMA = [("src_mem", 2, 0, 2, "mem"), ("dst_mem", 2, 2, 2, "mem"), ("src", 3, 0, 32, ""),
        ("dst", 4, 0, 32, ""), ("length", 5, 0, 32, ""), ("rows", 6, 0, 32, ""),
        ("planes", 7, 0, 32, ""), ("src_row_stride", 8, 0, 32, ""),
        ("src_plane_stride", 9, 0, 32, ""), ("dst_row_stride", 10, 0, 32, ""),
        ("dst_plane_stride", 11, 0, 32, "")]
_RBE = [("x_ptr", 2, 0, 32, ""), ("w_ptr", 3, 0, 32, ""), ("nq_ptr", 4, 0, 32, ""),
        ("y_ptr", 5, 0, 32, ""), ("h_in", 6, 0, 16, "m1"), ("w_in", 6, 16, 16, "m1"),
        ("h_out", 7, 0, 16, "m1"), ("w_out", 7, 16, 16, "m1"), ("k_out", 8, 0, 16, "m1"),
        ("k_in", 8, 16, 16, "m1"), ("in_bits", 9, 0, 8, "m1"), ("w_bits", 9, 8, 8, "m1"),
        ("out_bits", 9, 16, 8, "m1"), ("kernel", 9, 24, 1, "k"), ("stride", 9, 25, 1, "st"),
        ("relu", 9, 26, 1, ""), ("out_signed", 9, 27, 1, ""), ("w_unsigned", 9, 28, 1, ""),
        ("shift", 10, 0, 5, ""), ("pad_value", 10, 8, 8, ""), ("pad_top", 10, 16, 4, ""),
        ("pad_bottom", 10, 20, 4, ""), ("pad_left", 10, 24, 4, ""),
        ("pad_right", 10, 28, 4, ""), ("x_pix_stride", 11, 0, 32, ""),
        ("x_row_stride", 12, 0, 32, ""), ("y_pix_stride", 13, 0, 32, ""),
        ("y_row_stride", 14, 0, 32, "")]
_CL = [("kernel", 2, 0, 8, "kern"), ("relu", 2, 8, 1, ""), ("out_signed", 2, 9, 1, ""),
       ("in_signed", 2, 10, 1, ""), ("b_signed", 2, 11, 1, ""), ("in_bits", 2, 12, 4, ""),
       ("w_bits", 2, 16, 4, ""), ("out_bits", 2, 20, 4, ""), ("shift", 2, 24, 5, ""),
       ("in_addr", 3, 0, 32, ""), ("out_addr", 4, 0, 32, ""), ("w_addr", 5, 0, 32, ""),
       ("nq_addr", 6, 0, 32, "nq"), ("kappa_a", 6, 0, 16, "kap"), ("kappa_b", 6, 16, 16, "kap"),
       ("h_in", 7, 0, 16, ""), ("w_in", 7, 16, 16, ""), ("c_in", 8, 0, 16, ""),
       ("c_out", 8, 16, 16, ""), ("h_out", 9, 0, 16, ""), ("w_out", 9, 16, 16, ""),
       ("pad_value", 11, 0, 8, "pv"), ("lambda_", 12, 0, 32, "s"),
       ("psum_in", 2, 29, 1, ""), ("psum_out", 2, 30, 1, ""), ("psum_addr", 13, 0, 32, "")]
#: the 8-bit window fields of a cluster kernel: low nibble in word 10, high nibble in word 14
_WINDOW = ("kh", "kw", "sh", "sw", "pad_top", "pad_bottom", "pad_left", "pad_right")
_CL += [(n, 10, 4 * i, 4, "lo4") for i, n in enumerate(_WINDOW)]
_CL += [(n, 14, 4 * i, 4, "hi4") for i, n in enumerate(_WINDOW)]
_NOP = [("engine", 2, 0, 8, "eng")]
_LAYOUT = {Dma: (OP_DMA, _DMA), RbeJob: (OP_RBE, _RBE), ClusterKernel: (OP_CLUSTER, _CL),
           Nop: (OP_NOP, _NOP), End: (OP_END, [])}
_BY_OP = {op: (cls, table) for cls, (op, table) in _LAYOUT.items()}
#: kernels whose word 6 holds kappas instead of the NormQuant pointer
_KAPPA_KERNELS = ("ADD", "AVGPOOL")


def _field_used(cmd, tr: str) -> bool:
    if tr == "nq":
        return cmd.kernel not in _KAPPA_KERNELS
    if tr == "kap":
        return cmd.kernel in _KAPPA_KERNELS
    return True


def _to_raw(cmd, name: str, value, width: int, tr: str) -> int:
    def err(msg: str) -> EncodeError:
        return EncodeError(f"{type(cmd).__name__}.{name}: {value!r} {msg}")

    if tr == "mem":
        if value not in MEMORIES:
            raise err(f"is not a memory ({', '.join(MEMORIES)})")
        return MEMORIES.index(value)
    if tr == "eng":
        if value not in ENGINES:
            raise err(f"is not an engine ({', '.join(ENGINES)})")
        return ENGINES.index(value)
    if tr == "kern":
        if value not in KERNELS:
            raise err(f"is not a cluster kernel ({', '.join(KERNELS)})")
        return KERNELS.index(value) + 1
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise err("is not an integer")
    v = int(value)
    if tr == "k":
        if v not in (3, 1):
            raise err("is not a kernel size (3 or 1)")
        return 0 if v == 3 else 1
    if tr == "st":
        if v not in (1, 2):
            raise err("is not a stride (1 or 2)")
        return v - 1
    if tr in ("lo4", "hi4"):  # one 8-bit field split over two words
        if not 0 <= v < 256:
            raise err("does not fit 8 unsigned bits")
        return v & 0xF if tr == "lo4" else v >> 4
    if tr == "m1":
        if not 1 <= v <= 1 << width:
            raise err(f"is outside 1..{1 << width}")
        return v - 1
    if tr == "s":
        if not -(1 << (width - 1)) <= v < 1 << (width - 1):
            raise err(f"does not fit {width} signed bits")
        return v & ((1 << width) - 1)
    if tr == "pv":
        lo, hi = (-128, 127) if cmd.in_signed else (0, 255)
        if not lo <= v <= hi:
            raise err(f"is outside {lo}..{hi}")
        return v & 0xFF
    if not 0 <= v < 1 << width:
        raise err(f"does not fit {width} unsigned bits")
    return v


def _from_raw(raw: int, width: int, tr: str, kw: dict):
    if tr == "mem":
        if raw >= len(MEMORIES):
            raise DecodeError(f"memory field {raw} is not a memory")
        return MEMORIES[raw]
    if tr == "eng":
        if raw >= len(ENGINES):
            raise DecodeError(f"engine field {raw} is not an engine")
        return ENGINES[raw]
    if tr == "kern":
        if not 1 <= raw <= len(KERNELS):
            raise DecodeError(f"kernel field {raw} is not a cluster kernel")
        return KERNELS[raw - 1]
    if tr == "k":
        return 3 if raw == 0 else 1
    if tr == "st":
        return raw + 1
    if tr == "m1":
        return raw + 1
    if tr == "s":
        return raw - (1 << width) if raw >> (width - 1) else raw
    if tr == "pv":
        return raw - 256 if kw.get("in_signed") and raw >= 128 else raw
    return raw


def encode(cmd: Command) -> bytes:
    """The 64 bytes of one command; :class:`EncodeError` names a field that does not fit."""
    op, table = _LAYOUT[type(cmd)]
    words = [0] * 16
    words[0] = op
    if not isinstance(cmd, End):
        words[1] = sum(1 << s for s in _sems(cmd.wait)) | sum(
            1 << (16 + s) for s in _sems(cmd.signal))
    for name, w, lo, width, tr in table:
        value = getattr(cmd, name)
        if not _field_used(cmd, tr):
            if value:
                raise EncodeError(f"ClusterKernel.{name}: must be 0 for kernel {cmd.kernel}")
            continue
        words[w] |= _to_raw(cmd, name, value, width, tr) << lo
    return b"".join(int(x).to_bytes(4, "little") for x in words)


def encode_stream(cmds: list[Command]) -> bytes:
    """Concatenated commands; appends END when the list does not end with one."""
    cmds = list(cmds)
    if not cmds or not isinstance(cmds[-1], End):
        cmds.append(End())
    return b"".join(encode(c) for c in cmds)


def decode(data: bytes) -> Command:
    """One command from 64 bytes; :class:`DecodeError` for bytes the hardware would reject."""
    if len(data) != CMD_BYTES:
        raise DecodeError(f"a command is {CMD_BYTES} bytes, got {len(data)}")
    words = [int.from_bytes(data[4 * i:4 * i + 4], "little") for i in range(16)]
    op = words[0] & 0xFF
    if words[0] >> 8:
        raise DecodeError(f"reserved bits of word 0 set (0x{words[0]:08x})")
    if op not in _BY_OP:
        raise DecodeError(f"unknown opcode {op}")
    cls, table = _BY_OP[op]
    used = [0] * 16
    used[0] = 0xFF
    kw: dict = {}
    if cls is not End:
        used[1] = 0xFFFFFFFF
        kw["wait"] = tuple(s for s in range(16) if words[1] >> s & 1)
        kw["signal"] = tuple(s for s in range(16) if words[1] >> (16 + s) & 1)
    elif words[1]:
        raise DecodeError("END carries wait/signal masks")
    kernel = None
    if cls is ClusterKernel:
        kernel = _from_raw(words[2] & 0xFF, 8, "kern", kw)
    for name, w, lo, width, tr in table:
        if tr in ("nq", "kap") and (tr == "nq") == (kernel in _KAPPA_KERNELS):
            continue
        raw = (words[w] >> lo) & ((1 << width) - 1)
        used[w] |= ((1 << width) - 1) << lo
        if tr == "hi4":  # the high nibble of a field whose low one came first
            kw[name] |= raw << 4
            continue
        kw[name] = _from_raw(raw, width, tr, kw)
    for i in range(16):
        if words[i] & ~used[i] & 0xFFFFFFFF:
            raise DecodeError(f"{cls.__name__}: reserved bits of word {i} set "
                              f"(0x{words[i] & ~used[i] & 0xFFFFFFFF:08x})")
    return cls(**kw)


def decode_stream(data: bytes) -> list[Command]:
    if len(data) % CMD_BYTES:
        raise DecodeError(f"stream of {len(data)} bytes is not a multiple of {CMD_BYTES}")
    return [decode(data[i:i + CMD_BYTES]) for i in range(0, len(data), CMD_BYTES)]


# --- assembly ----------------------------------------------------------------------------------
def mnemonic(cmd: Command) -> str:
    if isinstance(cmd, ClusterKernel):
        return f"CL.{cmd.kernel}"
    return {Dma: "DMA", RbeJob: "RBE", Nop: "NOP", End: "END"}[type(cmd)]


def _fmt_value(name: str, v) -> str:
    if isinstance(v, str):
        return v
    if name.endswith(("ptr", "addr")) or name in ("src", "dst"):
        return hex(v)
    return str(v)


def format_cmd(cmd: Command) -> str:
    """One assembly line; parsing it back with :func:`parse_line` gives the same command."""
    if isinstance(cmd, End):
        return "END"
    parts = [mnemonic(cmd)]
    parts.append("wait=" + (",".join(map(str, cmd.wait)) or "-"))
    parts.append("signal=" + (",".join(map(str, cmd.signal)) or "-"))
    default = type(cmd)() if not isinstance(cmd, ClusterKernel) else ClusterKernel(
        kernel=cmd.kernel)
    for f in fields(cmd):
        if f.name in ("wait", "signal", "kernel") and isinstance(cmd, ClusterKernel):
            continue
        if f.name in ("wait", "signal"):
            continue
        v = getattr(cmd, f.name)
        if v != getattr(default, f.name) or f.name == "engine":
            parts.append(f"{f.name}={_fmt_value(f.name, v)}")
    return " ".join(parts)


def disassemble(data: bytes) -> list[str]:
    """Assembly listing of an encoded stream, one ``index: line`` per command."""
    return [f"{i}: {format_cmd(c)}" for i, c in enumerate(decode_stream(data))]


def parse_line(line: str) -> Command | None:
    """A command from one assembly line (``None`` for blank/comment lines)."""
    text = line.split(";")[0].split("#")[0].strip()
    if ":" in text.split(" ")[0] and text.split(" ")[0].rstrip(":").isdigit():
        text = text.split(" ", 1)[1] if " " in text else ""
    if not text:
        return None
    mn, *ops = text.split()
    kw: dict = {}
    if mn.startswith("CL."):
        cls = ClusterKernel
        kw["kernel"] = mn[3:]
        if kw["kernel"] not in KERNELS:
            raise AsmError(f"{line!r}: unknown cluster kernel {mn}")
    else:
        cls = {"DMA": Dma, "RBE": RbeJob, "NOP": Nop, "END": End}.get(mn)
        if cls is None:
            raise AsmError(f"{line!r}: unknown mnemonic {mn}")
    names = {f.name: f for f in fields(cls)}
    for op in ops:
        if "=" not in op:
            raise AsmError(f"{line!r}: operand {op!r} is not name=value")
        k, v = op.split("=", 1)
        if k not in names or k == "kernel" and cls is ClusterKernel:
            raise AsmError(f"{line!r}: {mn} has no field {k!r}")
        if k in ("wait", "signal"):
            try:
                kw[k] = () if v == "-" else tuple(int(s) for s in v.split(","))
            except ValueError:
                raise AsmError(f"{line!r}: bad semaphore list {v!r}") from None
        elif k in ("src_mem", "dst_mem", "engine"):
            kw[k] = v
        else:
            try:
                kw[k] = int(v, 0)
            except ValueError:
                raise AsmError(f"{line!r}: field {k}: {v!r} is not an integer") from None
    try:
        cmd = cls(**kw)
        encode(cmd)
    except EncodeError as e:
        raise AsmError(f"{line!r}: {e}") from None
    return cmd


def parse(text: str) -> list[Command]:
    """Commands of an assembly listing."""
    return [c for c in (parse_line(ln) for ln in text.splitlines()) if c is not None]


def assemble(text: str) -> bytes:
    return b"".join(encode(c) for c in parse(text))


# --- layouts -----------------------------------------------------------------------------------
def _tiles(k: int) -> int:
    return -(-k // RBE_CHANNELS)


def activation_bytes(h: int, w: int, k: int, bits: int) -> int:
    """Bytes of an (H, W, K) tensor in the bit-plane layout (H, W, K/32, bits, 32)."""
    return h * w * _tiles(k) * bits * 4


def weight_bytes(k_out: int, k_in: int, kernel: int, bits: int) -> int:
    return k_out * _tiles(k_in) * bits * kernel * kernel * 4


def _planes(v: np.ndarray, bits: int) -> np.ndarray:
    """(..., 32) values -> (..., bits, 4) bytes of the bit-plane words."""
    b = ((v[..., None, :] >> np.arange(bits, dtype=np.int64)[:, None]) & 1).astype(np.uint8)
    return np.packbits(b, axis=-1, bitorder="little")


def _unplanes(data: np.ndarray, bits: int) -> np.ndarray:
    """(..., bits, 4) bytes -> (..., 32) unsigned values."""
    b = np.unpackbits(data, axis=-1, bitorder="little").astype(np.int64)
    return (b << np.arange(bits, dtype=np.int64)[:, None]).sum(axis=-2)


def pack_activations(x: np.ndarray, bits: int) -> np.ndarray:
    """(H, W, K) integers -> uint8 bytes of the RBE layout (H, W, K/32, bits, 32).

    Each value's low ``bits`` bits are stored (unsigned values, or two's complement patterns of
    signed ones); channels are zero-padded to a multiple of 32.
    """
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"activations must be (H, W, K), got shape {x.shape}")
    h, w, k = x.shape
    t = _tiles(k)
    v = np.zeros((h, w, t * RBE_CHANNELS), np.int64)
    v[..., :k] = x.astype(np.int64) & ((1 << bits) - 1)
    return _planes(v.reshape(h, w, t, RBE_CHANNELS), bits).reshape(-1)


def unpack_activations(data, h: int, w: int, k: int, bits: int,
                       signed: bool = False) -> np.ndarray:
    """Inverse of :func:`pack_activations`: (H, W, K) int64 (sign-extended when ``signed``)."""
    t = _tiles(k)
    raw = np.frombuffer(bytes(data), np.uint8)[:activation_bytes(h, w, k, bits)]
    v = _unplanes(raw.reshape(h, w, t, bits, 4), bits).reshape(h, w, t * RBE_CHANNELS)[..., :k]
    if signed:
        v = np.where(v >> (bits - 1), v - (1 << bits), v)
    return v


def pack_weights(w: np.ndarray, bits: int, signed: bool = True) -> np.ndarray:
    """(Kout, Kin, k, k) weights (k = 3 or 1, OIHW) -> uint8 bytes of the RBE weight layout.

    3x3: (Kout, Kin/32, W, 9, 32) with tap f = 3*ky + kx; 1x1: (Kout, Kin/32, W, 32). Signed
    weights in [-2^(W-1), 2^(W-1)) are stored offset-binary (w + 2^(W-1)).
    """
    w = np.asarray(w).astype(np.int64)
    if w.ndim != 4 or w.shape[2] != w.shape[3] or w.shape[2] not in (1, 3):
        raise ValueError(f"weights must be (Kout, Kin, 3, 3) or (Kout, Kin, 1, 1), got {w.shape}")
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if w.size and (w.min() < lo or w.max() > hi):
        raise ValueError(f"weights outside {lo}..{hi} for {bits}-bit "
                         f"{'signed' if signed else 'unsigned'} weights")
    ko, ki, k, _ = w.shape
    t = _tiles(ki)
    u = w + (1 << (bits - 1)) if signed else w
    v = np.zeros((ko, t * RBE_CHANNELS, k * k), np.int64)
    v[:, :ki] = u.reshape(ko, ki, k * k)
    v = v.reshape(ko, t, RBE_CHANNELS, k * k).transpose(0, 1, 3, 2)  # (Kout, T, taps, 32)
    p = _planes(v, bits)  # (Kout, T, taps, bits, 4)
    return np.ascontiguousarray(p.transpose(0, 1, 3, 2, 4)).reshape(-1)


def unpack_weights(data, k_out: int, k_in: int, kernel: int, bits: int,
                   signed: bool = True) -> np.ndarray:
    """Inverse of :func:`pack_weights`: (Kout, Kin, k, k) int64."""
    t, taps = _tiles(k_in), kernel * kernel
    raw = np.frombuffer(bytes(data), np.uint8)[:weight_bytes(k_out, k_in, kernel, bits)]
    p = raw.reshape(k_out, t, bits, taps, 4).transpose(0, 1, 3, 2, 4)
    v = _unplanes(p, bits)  # (Kout, T, taps, 32)
    v = v.transpose(0, 1, 3, 2).reshape(k_out, t * RBE_CHANNELS, taps)[:, :k_in]
    if signed:
        v = v - (1 << (bits - 1))
    return v.reshape(k_out, k_in, kernel, kernel)


def pack_normquant(kappa, lambda_) -> np.ndarray:
    """Per-channel NormQuant records: kappa u16 then lambda i32, 6 bytes each."""
    kappa = np.asarray(kappa, np.int64).reshape(-1)
    lam = np.asarray(lambda_, np.int64).reshape(-1)
    if kappa.shape != lam.shape:
        raise ValueError("kappa and lambda need one value per channel each")
    if kappa.size and (kappa.min() < 0 or kappa.max() > 0xFFFF):
        raise ValueError("kappa must fit 16 unsigned bits")
    if lam.size and (lam.min() < -(1 << 31) or lam.max() >= 1 << 31):
        raise ValueError("lambda must fit 32 signed bits")
    rec = np.zeros(kappa.size, np.dtype([("k", "<u2"), ("l", "<i4")]))
    rec["k"], rec["l"] = kappa, lam
    return np.frombuffer(rec.tobytes(), np.uint8).copy()


def pack_hwc(x: np.ndarray, bits: int) -> np.ndarray:
    """Cluster tensor bytes: elements in C order, ``bits`` (2, 4, 8) each, little-endian packed."""
    v = (np.asarray(x).astype(np.int64).reshape(-1) & ((1 << bits) - 1)).astype(np.uint8)
    if bits == 8:
        return v
    per = 8 // bits
    v = np.concatenate([v, np.zeros((-v.size) % per, np.uint8)]).reshape(-1, per)
    return (v << (np.arange(per, dtype=np.uint8) * bits)).sum(axis=1).astype(np.uint8)


def unpack_hwc(data, shape: tuple[int, ...], bits: int, signed: bool) -> np.ndarray:
    """Inverse of :func:`pack_hwc`."""
    n = int(np.prod(shape))
    raw = np.frombuffer(bytes(data), np.uint8)
    per = 8 // bits
    v = ((raw[:, None] >> (np.arange(per) * bits)) & ((1 << bits) - 1)).reshape(-1)[:n]
    v = v.astype(np.int64)
    if signed:
        v = np.where(v >> (bits - 1), v - (1 << bits), v)
    return v.reshape(shape)


def normquant(acc, kappa, lambda_, shift: int, bits: int, signed: bool, relu: bool) -> np.ndarray:
    """The RBE / cluster NormQuant in numpy (the recipe the compiler's reference must mirror).

    ``acc`` is wrapped to int32 first (the hardware accumulators), then
    ``clamp(floor((acc * kappa + lambda) / 2^shift))`` in int64.
    """
    a = np.asarray(acc, np.int64)
    a = ((a + (1 << 31)) % (1 << 32)) - (1 << 31)
    y = (a * np.asarray(kappa, np.int64) + np.asarray(lambda_, np.int64)) >> shift
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if relu:
        lo = max(lo, 0)
    return np.clip(y, lo, hi)


# --- program container and blob ---------------------------------------------------------------
@dataclass
class TensorPlacement:
    """Where a program input/output/scratch tensor lives in L2 or L3.

    ``layout`` "hwc" (bit-packed HWC, ``bits`` per element) or "rbe" (bit-plane layout, shape
    (H, W, K)).
    """

    name: str
    shape: tuple[int, ...]
    mem: str = "L2"
    offset: int = 0
    layout: str = "hwc"
    bits: int = 8
    signed: bool = True

    @property
    def nbytes(self) -> int:
        if self.layout == "rbe":
            h, w, k = self.shape
            return activation_bytes(h, w, k, self.bits)
        return -(-int(np.prod(self.shape)) * self.bits // 8)


@dataclass
class LayerProgram:
    """Commands of one layer; ``engine`` is "rbe", "cluster" or "mixed"."""

    name: str
    op: str
    engine: str
    commands: list[Command]
    macs: int = 0
    meta: dict = field(default_factory=dict)


@dataclass
class MarsProgram:
    """What the compiler fills: layers in order, the memory map and the initial L2/L3 images
    (weights and NormQuant parameters, placed from offset 0)."""

    layers: list[LayerProgram]
    tensors: dict[str, TensorPlacement] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    l2_image: bytes = b""
    l3_image: bytes = b""
    l2_bytes: int = 0
    l3_bytes: int = 0

    def stream(self) -> bytes:
        """Every layer's commands back to back, one END at the end."""
        return encode_stream([c for ly in self.layers for c in ly.commands])

    def check(self, cfg: MarsellusConfig) -> None:
        """Memory-map consistency against a config (BlobError naming the tensor)."""
        if not 0 <= self.l2_bytes <= cfg.L2_BYTES or len(self.l2_image) > max(self.l2_bytes, 0):
            raise BlobError(f"marsellus program: L2 use {self.l2_bytes} bytes (image "
                            f"{len(self.l2_image)}) exceeds L2 of {cfg.L2_BYTES}")
        if not 0 <= self.l3_bytes <= cfg.L3_BYTES or len(self.l3_image) > max(self.l3_bytes, 0):
            raise BlobError(f"marsellus program: L3 use {self.l3_bytes} bytes (image "
                            f"{len(self.l3_image)}) exceeds L3 of {cfg.L3_BYTES}")
        for t in self.tensors.values():
            size = {"L2": self.l2_bytes, "L3": self.l3_bytes}.get(t.mem)
            if size is None or t.layout not in ("hwc", "rbe") or t.bits not in range(1, 9):
                raise BlobError(f"marsellus program: tensor {t.name} has an invalid placement "
                                f"({t.mem}, {t.layout}, {t.bits} bits)")
            if t.offset < 0 or t.offset + t.nbytes > size:
                raise BlobError(f"marsellus program: tensor {t.name} [{t.offset}, "
                                f"{t.offset + t.nbytes}) lies outside {t.mem} ({size} bytes)")
        for n in self.inputs + self.outputs:
            if n not in self.tensors:
                raise BlobError(f"marsellus program: input/output {n} has no placement")


def build_blob(program: MarsProgram, cfg: MarsellusConfig, name: str = "") -> bytes:
    """Serialize a program. Sections: ``HWCF`` (config JSON), ``META`` (memory map, layer table),
    ``CMDS`` (the encoded stream), ``L2IM`` / ``L3IM`` (initial memory images)."""
    program.check(cfg)
    layers, off = [], 0
    for ly in program.layers:
        n = len(ly.commands)
        layers.append({"name": ly.name, "op": ly.op, "engine": ly.engine, "cmd_offset": off,
                       "n_cmds": n, "macs": ly.macs, "meta": ly.meta})
        off += n
    tensors = {t.name: {"shape": list(t.shape), "mem": t.mem, "offset": t.offset,
                        "layout": t.layout, "bits": t.bits, "signed": t.signed}
               for t in program.tensors.values()}
    meta = {"name": name, "inputs": program.inputs, "outputs": program.outputs,
            "tensors": tensors, "layers": layers, "l2_bytes": program.l2_bytes,
            "l3_bytes": program.l3_bytes}
    cfg_json = dict(cfg.to_json(), name=cfg.name)
    return pack_blob(Blob(BLOB_TARGET, cfg.fingerprint, {
        "HWCF": json.dumps(cfg_json).encode(),
        "META": json.dumps(meta).encode(),
        "CMDS": program.stream(),
        "L2IM": bytes(program.l2_image),
        "L3IM": bytes(program.l3_image),
    }))


def load_blob(data: bytes, expect_config: MarsellusConfig | None = None
              ) -> tuple[MarsProgram, MarsellusConfig, str]:
    """Validate a MARSELLUS blob and rebuild ``(MarsProgram, config, name)``; errors are
    :class:`BlobError`."""
    blob = unpack_blob(data, expect_target=BLOB_TARGET,
                       expect_fingerprint=expect_config.fingerprint if expect_config else None)
    raw = blob.json_section("HWCF")
    if not isinstance(raw, dict):
        raise BlobError("marsellus blob: HWCF section is not a JSON object; recompile the model")
    try:
        cfg = config_from_dict({k: v for k, v in raw.items() if k != "name"},
                               where="blob HWCF section", name=str(raw.get("name", "custom")))
    except ConfigError as e:
        raise BlobError(f"marsellus blob carries an invalid hardware config: {e}") from None
    if cfg.fingerprint != blob.fingerprint:
        raise BlobError("marsellus blob: embedded hardware config does not match its fingerprint")
    meta = blob.json_section("META")
    if not isinstance(meta, dict):
        raise BlobError("marsellus blob: META section is not a JSON object; recompile the model")
    try:
        cmds = decode_stream(blob.section("CMDS"))
    except DecodeError as e:
        raise BlobError(f"marsellus blob: CMDS section does not decode ({e})") from None
    if not cmds or not isinstance(cmds[-1], End) or any(isinstance(c, End) for c in cmds[:-1]):
        raise BlobError("marsellus blob: CMDS section must end with exactly one END")
    try:
        layers = []
        for ly in meta["layers"]:
            lo, n = int(ly["cmd_offset"]), int(ly["n_cmds"])
            if lo < 0 or n < 0 or lo + n > len(cmds) - 1:
                raise BlobError(f"marsellus blob: layer {ly['name']} commands [{lo}, {lo + n}) "
                                f"lie outside the CMDS section ({len(cmds) - 1} commands)")
            layers.append(LayerProgram(name=str(ly["name"]), op=str(ly["op"]),
                                       engine=str(ly["engine"]), commands=cmds[lo:lo + n],
                                       macs=int(ly["macs"]), meta=dict(ly["meta"])))
        tensors = {str(k): TensorPlacement(name=str(k), shape=tuple(int(s) for s in t["shape"]),
                                           mem=str(t["mem"]), offset=int(t["offset"]),
                                           layout=str(t["layout"]), bits=int(t["bits"]),
                                           signed=bool(t["signed"]))
                   for k, t in meta["tensors"].items()}
        prog = MarsProgram(layers=layers, tensors=tensors,
                           inputs=[str(x) for x in meta["inputs"]],
                           outputs=[str(x) for x in meta["outputs"]],
                           l2_image=blob.section("L2IM"), l3_image=blob.section("L3IM"),
                           l2_bytes=int(meta["l2_bytes"]), l3_bytes=int(meta["l3_bytes"]))
        name = str(meta.get("name", ""))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, BlobError):
            raise
        raise BlobError(f"marsellus blob: META section is malformed ({e!r}); recompile the "
                        "model") from None
    prog.check(cfg)
    return prog, cfg, name


__all__ = [
    "CMD_BYTES", "NUM_SEMS", "ENGINES", "KERNELS", "Dma", "RbeJob", "ClusterKernel", "Nop", "End",
    "Command", "encode", "encode_stream", "decode", "decode_stream", "format_cmd", "disassemble",
    "parse", "parse_line", "assemble", "pack_activations", "unpack_activations", "pack_weights",
    "unpack_weights", "pack_normquant", "pack_hwc", "unpack_hwc", "normquant", "activation_bytes",
    "weight_bytes", "TensorPlacement", "LayerProgram", "MarsProgram", "build_blob", "load_blob",
    "EncodeError", "DecodeError", "AsmError",
]
