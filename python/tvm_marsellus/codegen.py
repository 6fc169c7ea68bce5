"""MARSELLUS command ISA: the command dataclasses, their 64-byte encoder / decoder and the
assembly formatter / parser, plus the NormQuant the engines apply (the reference in numpy).

Five engines (IODMA, DMA_IN, DMA_OUT, RBE, CLUSTER) each run their own commands in stream order
and synchronise through 16 counting semaphores (``wait`` / ``signal`` masks in word 1). The
field layout of every command and the semantics of the RBE job and the cluster kernels are
specified in ``docs/marsellus.md`` (Command ISA); the simulator (``sim/marsellus``) implements
them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from tvm_accel.errors import AsmError, DecodeError, EncodeError
from tvm_marsellus.hw_config import MEMORIES

CMD_BYTES = 64
NUM_SEMS = 16
ENGINES = ("IODMA", "DMA_IN", "DMA_OUT", "RBE", "CLUSTER")
OP_DMA, OP_RBE, OP_CLUSTER, OP_NOP, OP_END = 1, 2, 3, 4, 15
KERNELS = ("CONV", "DWCONV", "FC", "ADD", "MAXPOOL", "AVGPOOL", "HWC2RBE", "RBE2HWC", "LUT", "MUL")
NQ_RECORD_BYTES = 6


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
    """One kernel run by the 16 cores on L1 HWC tensors (docs/marsellus.md, Command ISA)."""

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
_KAPPA_KERNELS = ("ADD", "AVGPOOL", "MUL")


def _field_used(cmd, tr: str) -> bool:
    if tr == "nq":
        return cmd.kernel not in _KAPPA_KERNELS
    if tr == "kap":
        return cmd.kernel in _KAPPA_KERNELS
    return True


#: enumerated fields: transform -> (names, what they are, raw value of the first name)
_ENUMS = {"mem": (MEMORIES, "a memory", 0), "eng": (ENGINES, "an engine", 0),
          "kern": (KERNELS, "a cluster kernel", 1)}


def _to_raw(cmd, name: str, value, width: int, tr: str) -> int:
    """The raw bits of one field value (before shifting into its word)."""
    def err(msg: str) -> EncodeError:
        return EncodeError(f"{type(cmd).__name__}.{name}: {value!r} {msg}")

    if tr in _ENUMS:
        names, what, first = _ENUMS[tr]
        if value not in names:
            raise err(f"is not {what} ({', '.join(names)})")
        return names.index(value) + first
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise err("is not an integer")
    return _int_to_raw(cmd, int(value), width, tr, err)


def _int_to_raw(cmd, v: int, width: int, tr: str, err) -> int:
    """:func:`_to_raw` of an integer field: range check, then the field's transform."""
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


__all__ = [
    "CMD_BYTES", "NUM_SEMS", "ENGINES", "KERNELS", "Dma", "RbeJob", "ClusterKernel", "Nop", "End",
    "Command", "encode", "encode_stream", "decode", "decode_stream", "format_cmd", "disassemble",
    "parse", "parse_line", "assemble", "normquant", "EncodeError", "DecodeError", "AsmError",
]
