"""DPU ISA and program blob: instruction dataclasses, 256-bit encoder/decoder, blob (de)serializer.

Instructions are 256 bits (32 bytes, little-endian: bit b is bit b % 8 of byte b // 8). Every
instruction starts with the same 12-bit header::

    opcode[0:4]  DPON[4:8]  DPBY[8:12]

``opcode``: 1 LOAD, 2 SAVE, 3 CONV, 4 MISC, 15 END (0 and the rest are invalid). ``DPON`` /
``DPBY`` are unit-type masks, bit 0 LOAD, bit 1 SAVE, bit 2 CONV, bit 3 MISC: *depends on* and
*depended by*. No instruction numbers are involved, only types (DPUV3INT8 paper, section III).
Fields follow in the order below (``[lo:hi]`` bit ranges, ``s`` = two's-complement signed); the
bits after the last field of a kind are reserved and must be zero.

LOAD (242 bits)::

    to_pm[12:13] fm_mem[13:15] dst_addr[15:39] region[39:42] ddr_offset[42:74] rows[74:86]
    cols[86:98] chans[98:110] ddr_pix_stride[110:126] ddr_row_stride[126:150]
    fm_pix_stride[150:162] fm_row_stride[162:182] pad_top[182:186] pad_bottom[186:190]
    pad_left[190:194] pad_right[194:198] pad_value[198:206]s img_stride[206:238] fmt[238:242]

SAVE (209 bits)::

    fm_mem[12:14] src_addr[14:34] region[34:37] ddr_offset[37:69] rows[69:81] cols[81:93]
    chans[93:105] fm_pix_stride[105:117] fm_row_stride[117:137] ddr_pix_stride[137:153]
    ddr_row_stride[153:177] img_stride[177:209]

CONV (256 bits)::

    in_mem[12:14] in_addr[14:34] in_pix_stride[34:46] in_row_stride[46:66] ic[66:78]
    out_mem[78:80] out_addr[80:100] out_pix_stride[100:112] out_row_stride[112:132]
    out_h[132:144] out_w[144:156] oc[156:168] kernel_h[168:172] kernel_w[172:176]
    stride_h[176:179] stride_w[179:182] pad_top[182:186] pad_bottom[186:190] pad_left[190:194]
    pad_right[194:198] pad_value[198:206]s param_addr[206:229] leaky[229:230] shift[230:235]
    clip_lo[235:243]s clip_hi[243:251]s depthwise[251:252] dilation[252:256]

MISC, common part (160 bits), then per ``op`` (0 MAXPOOL, 1 AVGPOOL, 2 ELTADD, 3 UPSAMPLE,
4 COPY, 5 ELTMUL)::

    op[12:16] in_mem[16:18] in_addr[18:38] in_pix_stride[38:50] in_row_stride[50:70]
    out_mem[70:72] out_addr[72:92] out_pix_stride[92:104] out_row_stride[104:124]
    out_h[124:136] out_w[136:148] chans[148:160]
    MAXPOOL/AVGPOOL: kernel_h[160:164] kernel_w[164:168] stride_h[168:171] stride_w[171:174]
        pad_top[174:178] pad_bottom[178:182] pad_left[182:186] pad_right[186:190]
        pad_value[190:198]s shift[198:203] mult[203:219] clip_lo[219:227]s clip_hi[227:235]s
    ELTADD: b_mem[160:162] b_addr[162:182] b_pix_stride[182:194] b_row_stride[194:214]
        shift_a[214:220]s shift_b[220:226]s shift[226:231] clip_lo[231:239]s clip_hi[239:247]s
    UPSAMPLE: factor_h[160:164] factor_w[164:168]
    COPY: nothing more
    ELTMUL: b_mem[160:162] b_addr[162:182] b_pix_stride[182:194] b_row_stride[194:214]
        shift[214:219] clip_lo[219:227]s clip_hi[227:235]s

END: the header only, with empty DPON/DPBY; it must be the last instruction of the stream.

Memories, semantics and dependencies of the instructions: ``docs/dpu.md`` (ISA). The assembly syntax
is described in :mod:`tvm_dpu.asm`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from tvm_accel.errors import EncodeError
from tvm_dpu.hw_config import DPUConfig
from tvm_dpu.program import DPUProgram, LayerProgram, TensorPlacement

INSN_BYTES = 32
INSN_BITS = 8 * INSN_BYTES

#: unit types, in the order of the DPON/DPBY mask bits and of the simulator's stats/tracks
UNITS = ("LOAD", "SAVE", "CONV", "MISC")
UNIT_LOAD, UNIT_SAVE, UNIT_CONV, UNIT_MISC = range(4)

OP_LOAD, OP_SAVE, OP_CONV, OP_MISC, OP_END = 1, 2, 3, 4, 15
OPCODE_NAMES = {OP_LOAD: "LOAD", OP_SAVE: "SAVE", OP_CONV: "CONV", OP_MISC: "MISC", OP_END: "END"}

MISC_MAXPOOL, MISC_AVGPOOL, MISC_ELTADD, MISC_UPSAMPLE, MISC_COPY, MISC_ELTMUL = range(6)
MISC_NAMES = {MISC_MAXPOOL: "MAXPOOL", MISC_AVGPOOL: "AVGPOOL", MISC_ELTADD: "ELTADD",
              MISC_UPSAMPLE: "UPSAMPLE", MISC_COPY: "COPY", MISC_ELTMUL: "ELTMUL"}

REGION_INPUT, REGION_OUTPUT, REGION_PARAM, REGION_INSN, REGION_SWAP = range(5)


# --- dependency masks ------------------------------------------------------------------------

def units_mask(units) -> int:
    """``{"LOAD", "MISC"}`` / ``"LOAD|MISC"`` / ``9`` -> mask (bit i = ``UNITS[i]``)."""
    if isinstance(units, bool):
        raise EncodeError(f"dependency set must be unit names or a mask, got {units!r}")
    if isinstance(units, int):
        if not 0 <= units < 16:
            raise EncodeError(f"dependency mask {units} does not fit in 4 bits")
        return units
    if isinstance(units, str):
        units = [u for u in units.replace(",", "|").split("|") if u.strip() not in ("", "-")]
    mask = 0
    for u in units:
        name = str(u).strip().upper()
        if name not in UNITS:
            raise EncodeError(f"unknown unit {u!r} in a dependency set (units: "
                              f"{', '.join(UNITS)})")
        mask |= 1 << UNITS.index(name)
    return mask


def units_of(mask: int) -> frozenset[str]:
    return frozenset(UNITS[i] for i in range(4) if mask >> i & 1)


def deps_text(units: frozenset[str]) -> str:
    names = [u for u in UNITS if u in units]
    return "|".join(names) if names else "-"


def _deps_field():
    return field(default=frozenset(), compare=True)


class _Deps:
    """Mixin normalising ``dpon`` / ``dpby`` to frozensets of unit names."""

    def __post_init__(self):
        self.dpon = units_of(units_mask(self.dpon))
        self.dpby = units_of(units_mask(self.dpby))


# --- instructions ----------------------------------------------------------------------------

@dataclass
class Load(_Deps):
    """DDR -> FM of every PE (``to_pm=False``) or DDR -> the shared PM (``to_pm=True``).

    Moves ``rows x cols x chans`` bytes (channels innermost) read from ``region + ddr_offset`` with
    DDR strides ``ddr_pix_stride`` / ``ddr_row_stride``. FM: PE p reads its image at
    ``ddr_offset + p * img_stride`` and writes the block, surrounded by ``pad_*`` rows/columns of
    ``pad_value``, at ``dst_addr`` of memory ``fm_mem`` with FM strides; with ``fmt`` = F > 0 the
    format unit writes pixels of F x chans channels (W-direction im2col, see ``docs/dpu.md``).
    PM: one copy written contiguously at ``dst_addr``; FM-only fields must be 0.
    """

    to_pm: bool = False
    fm_mem: int = 0
    dst_addr: int = 0
    region: int = REGION_INPUT
    ddr_offset: int = 0
    rows: int = 0
    cols: int = 0
    chans: int = 0
    ddr_pix_stride: int = 0
    ddr_row_stride: int = 0
    fm_pix_stride: int = 0
    fm_row_stride: int = 0
    pad_top: int = 0
    pad_bottom: int = 0
    pad_left: int = 0
    pad_right: int = 0
    pad_value: int = 0
    img_stride: int = 0
    fmt: int = 0
    dpon: frozenset = _deps_field()
    dpby: frozenset = _deps_field()


@dataclass
class Save(_Deps):
    """FM of every PE -> DDR: PE p writes ``rows x cols x chans`` at ``ddr_offset + p *
    img_stride`` of ``region`` (OUTPUT or SWAP), reading FM with its strides."""

    fm_mem: int = 0
    src_addr: int = 0
    region: int = REGION_OUTPUT
    ddr_offset: int = 0
    rows: int = 0
    cols: int = 0
    chans: int = 0
    fm_pix_stride: int = 0
    fm_row_stride: int = 0
    ddr_pix_stride: int = 0
    ddr_row_stride: int = 0
    img_stride: int = 0
    dpon: frozenset = _deps_field()
    dpby: frozenset = _deps_field()


@dataclass
class Conv(_Deps):
    """Convolution with fix-point requantize on every PE (semantics in ``docs/dpu.md``)."""

    in_mem: int = 0
    in_addr: int = 0
    in_pix_stride: int = 0
    in_row_stride: int = 0
    ic: int = 0
    out_mem: int = 0
    out_addr: int = 0
    out_pix_stride: int = 0
    out_row_stride: int = 0
    out_h: int = 0
    out_w: int = 0
    oc: int = 0
    kernel_h: int = 1
    kernel_w: int = 1
    stride_h: int = 1
    stride_w: int = 1
    pad_top: int = 0
    pad_bottom: int = 0
    pad_left: int = 0
    pad_right: int = 0
    pad_value: int = 0
    param_addr: int = 0
    #: the nonlinear module's LeakyReLU (slope 26/256) on the int8 result, then the clip
    leaky: bool = False
    shift: int = 0
    clip_lo: int = -128
    clip_hi: int = 127
    depthwise: bool = False
    #: spacing of the kernel taps in rows and columns (1 = dense); one field for both axes
    dilation: int = 1
    dpon: frozenset = _deps_field()
    dpby: frozenset = _deps_field()


@dataclass
class _MiscBase(_Deps):
    in_mem: int = 0
    in_addr: int = 0
    in_pix_stride: int = 0
    in_row_stride: int = 0
    out_mem: int = 0
    out_addr: int = 0
    out_pix_stride: int = 0
    out_row_stride: int = 0
    out_h: int = 0
    out_w: int = 0
    chans: int = 0


@dataclass
class Pool(_MiscBase):
    """MAXPOOL (``op=MISC_MAXPOOL``) or AVGPOOL (``op=MISC_AVGPOOL``) over a padded window."""

    op: int = MISC_MAXPOOL
    kernel_h: int = 1
    kernel_w: int = 1
    stride_h: int = 1
    stride_w: int = 1
    pad_top: int = 0
    pad_bottom: int = 0
    pad_left: int = 0
    pad_right: int = 0
    pad_value: int = 0
    shift: int = 0
    mult: int = 1
    clip_lo: int = -128
    clip_hi: int = 127
    dpon: frozenset = _deps_field()
    dpby: frozenset = _deps_field()


@dataclass
class EltAdd(_MiscBase):
    """Element-wise add of A (``in_*``) and B (``b_*``) with per-input alignment shifts."""

    b_mem: int = 0
    b_addr: int = 0
    b_pix_stride: int = 0
    b_row_stride: int = 0
    shift_a: int = 0
    shift_b: int = 0
    shift: int = 0
    clip_lo: int = -128
    clip_hi: int = 127
    dpon: frozenset = _deps_field()
    dpby: frozenset = _deps_field()


@dataclass
class EltMul(_MiscBase):
    """Element-wise multiply of A (``in_*``) and B (``b_*``): ``clip((A * B + round) >> shift)``
    (DPUCZDX8G's Elementwise-Multiply); B strides of 0 repeat one pixel (a per-channel vector,
    the squeeze-excitation gate)."""

    b_mem: int = 0
    b_addr: int = 0
    b_pix_stride: int = 0
    b_row_stride: int = 0
    shift: int = 0
    clip_lo: int = -128
    clip_hi: int = 127
    dpon: frozenset = _deps_field()
    dpby: frozenset = _deps_field()


#: the MISC instructions with a second FM operand B (``b_mem``, ``b_addr``, strides)
ELEMENTWISE = (EltAdd, EltMul)


@dataclass
class Upsample(_MiscBase):
    """Nearest up-sampling by integer factors: out(y, x) = in(y // factor_h, x // factor_w)."""

    factor_h: int = 1
    factor_w: int = 1
    dpon: frozenset = _deps_field()
    dpby: frozenset = _deps_field()


@dataclass
class Copy(_MiscBase):
    """Strided FM -> FM copy (identity, concat by placement, sub-kernel shuffle)."""

    dpon: frozenset = _deps_field()
    dpby: frozenset = _deps_field()


@dataclass
class End:
    """End of the stream: the last instruction; carries no dependencies."""


Insn = Load | Save | Conv | Pool | EltAdd | EltMul | Upsample | Copy | End


def unit_of(insn: Insn) -> int | None:
    """Unit executing an instruction (``UNIT_*``); None for END."""
    if isinstance(insn, Load):
        return UNIT_LOAD
    if isinstance(insn, Save):
        return UNIT_SAVE
    if isinstance(insn, Conv):
        return UNIT_CONV
    if isinstance(insn, End):
        return None
    return UNIT_MISC


def mnemonic(insn: Insn) -> str:
    if isinstance(insn, Pool):
        return MISC_NAMES.get(insn.op, f"MISC?{insn.op}")
    if isinstance(insn, EltAdd):
        return "ELTADD"
    if isinstance(insn, EltMul):
        return "ELTMUL"
    if isinstance(insn, Upsample):
        return "UPSAMPLE"
    if isinstance(insn, Copy):
        return "COPY"
    return type(insn).__name__.upper()


# --- bit layout ------------------------------------------------------------------------------
# (field, width, signed). Fields are packed in order from bit 12 (after the header) of a
# 256-bit little-endian word; bits after the last field are reserved and must be zero.

HEADER = (("opcode", 4, False), ("dpon", 4, False), ("dpby", 4, False))

_FM_IN = (("in_mem", 2, False), ("in_addr", 20, False), ("in_pix_stride", 12, False),
          ("in_row_stride", 20, False))
_FM_OUT = (("out_mem", 2, False), ("out_addr", 20, False), ("out_pix_stride", 12, False),
           ("out_row_stride", 20, False))

LAYOUTS: dict[str, tuple] = {
    "LOAD": (
        ("to_pm", 1, False), ("fm_mem", 2, False), ("dst_addr", 24, False),
        ("region", 3, False), ("ddr_offset", 32, False),
        ("rows", 12, False), ("cols", 12, False), ("chans", 12, False),
        ("ddr_pix_stride", 16, False), ("ddr_row_stride", 24, False),
        ("fm_pix_stride", 12, False), ("fm_row_stride", 20, False),
        ("pad_top", 4, False), ("pad_bottom", 4, False), ("pad_left", 4, False),
        ("pad_right", 4, False), ("pad_value", 8, True),
        ("img_stride", 32, False), ("fmt", 4, False)),
    "SAVE": (
        ("fm_mem", 2, False), ("src_addr", 20, False),
        ("region", 3, False), ("ddr_offset", 32, False),
        ("rows", 12, False), ("cols", 12, False), ("chans", 12, False),
        ("fm_pix_stride", 12, False), ("fm_row_stride", 20, False),
        ("ddr_pix_stride", 16, False), ("ddr_row_stride", 24, False),
        ("img_stride", 32, False)),
    "CONV": (
        *_FM_IN, ("ic", 12, False), *_FM_OUT,
        ("out_h", 12, False), ("out_w", 12, False), ("oc", 12, False),
        ("kernel_h", 4, False), ("kernel_w", 4, False), ("stride_h", 3, False),
        ("stride_w", 3, False),
        ("pad_top", 4, False), ("pad_bottom", 4, False), ("pad_left", 4, False),
        ("pad_right", 4, False), ("pad_value", 8, True),
        ("param_addr", 23, False), ("leaky", 1, False), ("shift", 5, False),
        ("clip_lo", 8, True),
        ("clip_hi", 8, True), ("depthwise", 1, False), ("dilation", 4, False)),
}
MISC_COMMON = (("op", 4, False), *_FM_IN, *_FM_OUT, ("out_h", 12, False), ("out_w", 12, False),
               ("chans", 12, False))
_POOL = (("kernel_h", 4, False), ("kernel_w", 4, False), ("stride_h", 3, False),
         ("stride_w", 3, False), ("pad_top", 4, False), ("pad_bottom", 4, False),
         ("pad_left", 4, False), ("pad_right", 4, False), ("pad_value", 8, True),
         ("shift", 5, False), ("mult", 16, False), ("clip_lo", 8, True), ("clip_hi", 8, True))
LAYOUTS.update({
    "MAXPOOL": MISC_COMMON + _POOL,
    "AVGPOOL": MISC_COMMON + _POOL,
    "ELTADD": MISC_COMMON + (
        ("b_mem", 2, False), ("b_addr", 20, False), ("b_pix_stride", 12, False),
        ("b_row_stride", 20, False), ("shift_a", 6, True), ("shift_b", 6, True),
        ("shift", 5, False), ("clip_lo", 8, True), ("clip_hi", 8, True)),
    "UPSAMPLE": MISC_COMMON + (("factor_h", 4, False), ("factor_w", 4, False)),
    "COPY": MISC_COMMON,
    "ELTMUL": MISC_COMMON + (
        ("b_mem", 2, False), ("b_addr", 20, False), ("b_pix_stride", 12, False),
        ("b_row_stride", 20, False), ("shift", 5, False), ("clip_lo", 8, True),
        ("clip_hi", 8, True)),
    "END": (),
})
for _name, _lay in LAYOUTS.items():
    assert sum(w for _, w, _ in HEADER + _lay) <= INSN_BITS, _name


def field_offsets(kind: str) -> list[tuple[str, int, int, bool]]:
    """``[(field, lo, width, signed), ...]`` of an instruction kind, header included."""
    out, lo = [], 0
    for name, w, s in HEADER + LAYOUTS[kind]:
        out.append((name, lo, w, s))
        lo += w
    return out


def _layout_of(insn: Insn) -> tuple[str, tuple]:
    kind = mnemonic(insn)
    if kind not in LAYOUTS:
        raise EncodeError(f"{kind}: unknown MISC op {getattr(insn, 'op', None)!r}")
    return kind, LAYOUTS[kind]


# --- encoder / decoder -----------------------------------------------------------------------

_OPCODE_OF = {"LOAD": OP_LOAD, "SAVE": OP_SAVE, "CONV": OP_CONV, "END": OP_END}
_MISC_OP_OF = {name: op for op, name in MISC_NAMES.items()}


def encode(insn: Insn) -> bytes:
    """Encode one instruction into its 32 little-endian bytes."""
    kind, layout = _layout_of(insn)
    if isinstance(insn, End):
        head = {"opcode": OP_END, "dpon": 0, "dpby": 0}
    else:
        head = {"opcode": _OPCODE_OF.get(kind, OP_MISC), "dpon": units_mask(insn.dpon),
                "dpby": units_mask(insn.dpby)}
        if head["opcode"] == OP_MISC:
            head["op"] = _MISC_OP_OF[kind]
    word, lo = 0, 0
    for name, w, signed in HEADER + layout:
        v = head[name] if name in head else getattr(insn, name)
        if isinstance(v, bool):
            v = int(v)
        if not isinstance(v, int):
            raise EncodeError(f"{kind}: field {name}={v!r} is not an integer")
        if signed:
            if not -(1 << (w - 1)) <= v < (1 << (w - 1)):
                raise EncodeError(f"{kind}: field {name}={v} does not fit in {w} signed bits")
            v &= (1 << w) - 1
        elif not 0 <= v < (1 << w):
            raise EncodeError(f"{kind}: field {name}={v} does not fit in {w} bits")
        word |= v << lo
        lo += w
    return word.to_bytes(INSN_BYTES, "little")


def encode_stream(insns: list[Insn]) -> bytes:
    """Encode instructions back to back (the bytes the simulator and the blob take)."""
    return b"".join(encode(i) for i in insns)


CLASS_OF = {"LOAD": Load, "SAVE": Save, "CONV": Conv, "MAXPOOL": Pool, "AVGPOOL": Pool,
             "ELTADD": EltAdd, "UPSAMPLE": Upsample, "COPY": Copy, "ELTMUL": EltMul, "END": End}


def decode(data: bytes) -> Insn:
    """Decode 32 bytes; raises ``EncodeError`` for an unknown opcode / MISC op or set reserved
    bits (the simulator rejects the same words)."""
    if len(data) != INSN_BYTES:
        raise EncodeError(f"an instruction is {INSN_BYTES} bytes, got {len(data)}")
    word = int.from_bytes(data, "little")

    def get(lo: int, w: int, signed: bool) -> int:
        v = (word >> lo) & ((1 << w) - 1)
        return v - (1 << w) if signed and v >> (w - 1) else v

    opcode, dpon, dpby = get(0, 4, False), get(4, 4, False), get(8, 4, False)
    if opcode == OP_MISC:
        op = get(12, 4, False)
        if op not in MISC_NAMES:
            raise EncodeError(f"unknown MISC op {op}")
        kind = MISC_NAMES[op]
    elif opcode in OPCODE_NAMES:
        kind = OPCODE_NAMES[opcode]
    else:
        raise EncodeError(f"unknown opcode {opcode}")
    values, lo = {}, 12
    for name, w, signed in LAYOUTS[kind]:
        values[name] = get(lo, w, signed)
        lo += w
    if word >> lo:
        raise EncodeError(f"{kind}: reserved bits [{lo}, {INSN_BITS}) are not zero")
    cls = CLASS_OF[kind]
    if cls is End:
        if dpon or dpby:
            raise EncodeError("END: fields DPON/DPBY must be empty")
        return End()
    if cls is not Pool:
        values.pop("op", None)
    for f in fields(cls):
        if f.type in ("bool",) and f.name in values:
            values[f.name] = bool(values[f.name])
    return cls(**values, dpon=dpon, dpby=dpby)


def decode_stream(data: bytes) -> list[Insn]:
    if len(data) % INSN_BYTES:
        raise EncodeError(f"instruction stream of {len(data)} bytes is not a multiple of "
                          f"{INSN_BYTES}")
    return [decode(data[i:i + INSN_BYTES]) for i in range(0, len(data), INSN_BYTES)]


# --- program blob ------------------------------------------------------------------------------
BLOB_TARGET = "dpu"
#: DDR offsets are 32-bit fields
MAX_REGION_BYTES = 1 << 32


def build_blob(program, cfg: DPUConfig, name: str = "") -> bytes:
    """Serialize a planned :class:`~tvm_dpu.program.DPUProgram` into a program blob.

    Sections: ``HWCF`` (config JSON), ``META`` (DDR map, layer table), ``INSN`` (every layer's
    instructions back to back; a layer with ``stream`` null is a stream ending in END, the
    consecutive layers of one merged stream share one END after the last), ``PARM`` (the
    PARAM region image).
    """
    import json

    from tvm_accel.blob import Blob, pack_blob

    insn_parts, layers, off = [], [], 0
    for ly in program.layers:
        insn_parts.append(ly.insns)
        layers.append({"name": ly.name, "op": ly.op, "insn_offset": off, "n_insns": ly.n_insns,
                       "macs": ly.macs, "shape": ly.shape, "knobs": ly.knobs,
                       "stream": ly.stream})
        off += len(ly.insns)
    tensors = {t.name: {"shape": list(t.shape), "dtype": t.dtype, "region": t.region,
                        "offset": t.offset, "n_alloc": t.n_alloc, "pix_stride": t.pix_stride}
               for t in program.tensors.values()}
    meta = {"name": name, "inputs": program.inputs, "outputs": program.outputs,
            "tensors": tensors, "layers": layers, "region_sizes": program.region_sizes}
    cfg_json = dict(cfg.to_json(), name=cfg.name)
    return pack_blob(Blob(BLOB_TARGET, cfg.fingerprint, {
        "HWCF": json.dumps(cfg_json).encode(),
        "META": json.dumps(meta).encode(),
        "INSN": b"".join(insn_parts),
        "PARM": bytes(program.params),
    }))


def load_blob(data: bytes, expect_config: DPUConfig | None = None):
    """Validate a DPU blob and rebuild ``(DPUProgram, DPUConfig, name)``; errors are
    ``BlobError``."""
    from tvm_accel.blob import unpack_target_blob
    from tvm_accel.errors import BlobError
    from tvm_dpu.hw_config import config_from_dict

    blob, cfg, meta = unpack_target_blob(data, BLOB_TARGET, config_from_dict, expect_config)
    insn, params = blob.section("INSN"), blob.section("PARM")
    try:
        sizes = {str(k): int(v) for k, v in meta["region_sizes"].items()}
        for r in ("INPUT", "OUTPUT", "PARAM", "INSN", "SWAP"):
            if not 0 < sizes.get(r, -1) <= MAX_REGION_BYTES:
                raise BlobError(f"dpu blob: DDR region {r} size {sizes.get(r)} is outside "
                                f"1..2^32")
        if len(params) > sizes["PARAM"]:
            raise BlobError("dpu blob: PARM section is larger than its DDR region")
        tensors = {}
        for tname, t in meta["tensors"].items():
            p = TensorPlacement(name=str(tname), shape=tuple(int(s) for s in t["shape"]),
                                dtype=str(t["dtype"]), region=str(t["region"]),
                                offset=int(t["offset"]), n_alloc=int(t["n_alloc"]),
                                pix_stride=int(t.get("pix_stride", 0)))
            if p.dtype != "int8":
                raise BlobError(f"dpu blob: tensor {tname} has unsupported dtype {p.dtype}")
            if (len(p.shape) not in (2, 4) or min(p.shape) < 1 or p.n_alloc < p.shape[0]
                    or (p.pix_stride and (p.pix_stride < p.hwc[2] or p.pix_stride > 1 << 16))
                    or p.n_alloc % cfg.NUM_PE or p.region not in ("INPUT", "OUTPUT", "SWAP")):
                raise BlobError(f"dpu blob: tensor {tname} has an inconsistent placement "
                                f"(shape {list(p.shape)}, {p.n_alloc} images, region "
                                f"{p.region})")
            if p.offset < 0 or p.offset + p.nbytes > sizes[p.region]:
                raise BlobError(f"dpu blob: tensor {tname} [{p.offset}, {p.offset + p.nbytes}) "
                                f"lies outside its DDR region {p.region} of "
                                f"{sizes[p.region]} bytes")
            tensors[tname] = p
        layers = []
        for ly in meta["layers"]:
            lo, n = int(ly["insn_offset"]), int(ly["n_insns"])
            if lo < 0 or n < 1 or lo + INSN_BYTES * n > len(insn):
                raise BlobError(f"dpu blob: layer {ly['name']} instructions "
                                f"[{lo}, {lo + INSN_BYTES * n}) lie outside the INSN section "
                                f"({len(insn)} bytes)")
            stream = ly.get("stream")
            if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int)
                                       or stream < 0 or (
                    any(p.stream == stream for p in layers)
                    and layers[-1].stream != stream)):
                raise BlobError(f"dpu blob: layer {ly['name']} has stream {stream!r}; a "
                                "stream's layers must be consecutive")
            layers.append(LayerProgram(name=str(ly["name"]), op=str(ly["op"]),
                                       insns=insn[lo:lo + INSN_BYTES * n], n_insns=n,
                                       macs=int(ly["macs"]), shape=str(ly["shape"]),
                                       knobs=dict(ly["knobs"]), stream=stream))
        inputs = [str(n) for n in meta["inputs"]]
        outputs = [str(n) for n in meta["outputs"]]
        for n in inputs + outputs:
            if n not in tensors:
                raise BlobError(f"dpu blob: function tensor {n} has no DDR placement")
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        if isinstance(e, BlobError):
            raise
        raise BlobError(f"dpu blob: malformed META section ({type(e).__name__}: {e}); "
                        "recompile the model") from None
    program = DPUProgram(tensors=tensors, inputs=inputs, outputs=outputs, region_sizes=sizes,
                         params=params, layers=layers)
    return program, cfg, str(meta.get("name", ""))
