"""VTA ISA encoder, decoder and disassembler (128-bit instructions, 32-bit micro-ops).

The bit layout follows the public ``hw_spec.h``: two little-endian 64-bit words per instruction,
no field crossing bit 64, field widths derived from the buffer depths of the config (so the 8x8x8
variant gets its own widths). Word 0 starts with ``opcode[0:3] pop_prev[3] pop_next[4]
push_prev[5] push_next[6]``.

LOAD/STORE word0: ``memory_type[7:10] sram_base[10:26] dram_base[26:58]``; word1: ``y_size[0:16]
x_size[16:32] x_stride[32:48] y_pad_0[48:52] y_pad_1[52:56] x_pad_0[56:60] x_pad_1[60:64]``.
``dram_base`` and ``x_stride`` count entries of the memory type (DRAM byte address = dram_base x
entry bytes).

GEMM/ALU word0: ``reset_reg[7] uop_bgn[8:+U] uop_end[+U+1] iter_out[14] iter_in[14]`` with U =
log2(uop depth); GEMM word1: ``dst_factor_out/in (A bits each) src_factor_out/in (I bits)
wgt_factor_out/in (W bits)``; ALU word1: ``dst_factor_out/in (A) src_factor_out/in (I)
alu_opcode[3] use_imm[1] imm[16]`` (imm signed). A, I, W = log2 of the ACC, INP, WGT depths.

Micro-op: ``dst_idx[0:A] src_idx[A:A+I] wgt_idx[A+I:A+I+W]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tvm_accel.errors import DecodeError, EncodeError
from tvm_vta_cp.hw_config import VTAConfig

OP_LOAD, OP_STORE, OP_GEMM, OP_FINISH, OP_ALU = 0, 1, 2, 3, 4
OPCODE_NAMES = {OP_LOAD: "LOAD", OP_STORE: "STORE", OP_GEMM: "GEMM", OP_FINISH: "FINISH",
                OP_ALU: "ALU"}
MEM_UOP, MEM_WGT, MEM_INP, MEM_ACC, MEM_OUT, MEM_ACC_8BIT = 0, 1, 2, 3, 4, 5
MEM_NAMES = {MEM_UOP: "UOP", MEM_WGT: "WGT", MEM_INP: "INP", MEM_ACC: "ACC", MEM_OUT: "OUT",
             MEM_ACC_8BIT: "ACC8"}
ALU_MIN, ALU_MAX, ALU_ADD, ALU_SHR, ALU_MUL = 0, 1, 2, 3, 4
ALU_NAMES = {ALU_MIN: "MIN", ALU_MAX: "MAX", ALU_ADD: "ADD", ALU_SHR: "SHR", ALU_MUL: "MUL"}
LOOP_ITER_BITS = 14
IMM_BITS = 16
#: largest value of a 16-bit LOAD/STORE field (y_size, x_size, x_stride)
MAX_FIELD16 = (1 << 16) - 1

# Queues a module pops from / pushes to, by instruction routing (see module docstring of sim/vta).
QUEUE_LOAD, QUEUE_COMPUTE, QUEUE_STORE = 0, 1, 2


@dataclass
class Deps:
    """Token flags: pop before executing, push after completing (prev/next neighbour module)."""

    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False


@dataclass
class MemInsn:
    """LOAD or STORE of a 2-D block of entries, with zero padding on LOAD."""

    opcode: int
    memory_type: int
    sram_base: int
    dram_base: int
    y_size: int
    x_size: int
    x_stride: int
    y_pad_0: int = 0
    y_pad_1: int = 0
    x_pad_0: int = 0
    x_pad_1: int = 0
    deps: Deps = field(default_factory=Deps)


@dataclass
class GemmInsn:
    """GEMM over a uop range with two affine loops (``iter_out`` x ``iter_in``)."""

    reset: bool
    uop_bgn: int
    uop_end: int
    iter_out: int
    iter_in: int
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0
    wgt_factor_out: int = 0
    wgt_factor_in: int = 0
    deps: Deps = field(default_factory=Deps)


@dataclass
class AluInsn:
    """Vector ALU op on ACC lanes: ``acc[dst] = op(acc[dst], imm if use_imm else acc[src])``."""

    alu_opcode: int
    uop_bgn: int
    uop_end: int
    iter_out: int
    iter_in: int
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0
    use_imm: bool = False
    imm: int = 0
    reset: bool = False
    deps: Deps = field(default_factory=Deps)


@dataclass
class FinishInsn:
    """Raises ``done``; must not carry pops."""

    deps: Deps = field(default_factory=Deps)


Insn = MemInsn | GemmInsn | AluInsn | FinishInsn


@dataclass(frozen=True)
class Uop:
    """Micro-op: ACC index, INP index (ACC for ALU), WGT index."""

    dst: int
    src: int
    wgt: int = 0


def _put(word: int, value: int, lo: int, width: int, name: str) -> int:
    if value < 0 or value >= (1 << width):
        raise EncodeError(f"field {name}={value} does not fit in {width} bits")
    return word | (value << lo)


def _get(word: int, lo: int, width: int) -> int:
    return (word >> lo) & ((1 << width) - 1)


class ISA:
    """Field layout of one config; encodes, decodes and disassembles instructions and uops."""

    def __init__(self, cfg: VTAConfig):
        self.cfg = cfg
        self.U = cfg.log_uop_depth
        self.A = cfg.log_acc_depth
        self.I = cfg.log_inp_depth
        self.W = cfg.log_wgt_depth

    # --- instructions -----------------------------------------------------------------------
    def _head(self, opcode: int, deps: Deps) -> int:
        return (opcode | (int(deps.pop_prev) << 3) | (int(deps.pop_next) << 4)
                | (int(deps.push_prev) << 5) | (int(deps.push_next) << 6))

    def encode(self, insn: Insn) -> tuple[int, int]:
        """Encode one instruction into its two 64-bit words."""
        if isinstance(insn, MemInsn):
            w0 = self._head(insn.opcode, insn.deps)
            w0 = _put(w0, insn.memory_type, 7, 3, "memory_type")
            w0 = _put(w0, insn.sram_base, 10, 16, "sram_base")
            w0 = _put(w0, insn.dram_base, 26, 32, "dram_base")
            w1 = _put(0, insn.y_size, 0, 16, "y_size")
            w1 = _put(w1, insn.x_size, 16, 16, "x_size")
            w1 = _put(w1, insn.x_stride, 32, 16, "x_stride")
            w1 = _put(w1, insn.y_pad_0, 48, 4, "y_pad_0")
            w1 = _put(w1, insn.y_pad_1, 52, 4, "y_pad_1")
            w1 = _put(w1, insn.x_pad_0, 56, 4, "x_pad_0")
            w1 = _put(w1, insn.x_pad_1, 60, 4, "x_pad_1")
            return w0, w1
        if isinstance(insn, FinishInsn):
            return self._head(OP_FINISH, insn.deps), 0
        is_alu = isinstance(insn, AluInsn)
        w0 = self._head(OP_ALU if is_alu else OP_GEMM, insn.deps)
        U = self.U
        w0 = _put(w0, int(insn.reset), 7, 1, "reset_reg")
        w0 = _put(w0, insn.uop_bgn, 8, U, "uop_bgn")
        w0 = _put(w0, insn.uop_end, 8 + U, U + 1, "uop_end")
        w0 = _put(w0, insn.iter_out, 9 + 2 * U, LOOP_ITER_BITS, "iter_out")
        w0 = _put(w0, insn.iter_in, 9 + 2 * U + LOOP_ITER_BITS, LOOP_ITER_BITS, "iter_in")
        A, Ib = self.A, self.I
        w1 = _put(0, insn.dst_factor_out, 0, A, "dst_factor_out")
        w1 = _put(w1, insn.dst_factor_in, A, A, "dst_factor_in")
        w1 = _put(w1, insn.src_factor_out, 2 * A, Ib, "src_factor_out")
        w1 = _put(w1, insn.src_factor_in, 2 * A + Ib, Ib, "src_factor_in")
        lo = 2 * A + 2 * Ib
        if is_alu:
            w1 = _put(w1, insn.alu_opcode, lo, 3, "alu_opcode")
            w1 = _put(w1, int(insn.use_imm), lo + 3, 1, "use_imm")
            if not -(1 << 15) <= insn.imm < (1 << 15):
                raise EncodeError(f"field imm={insn.imm} does not fit in 16 signed bits")
            w1 = _put(w1, insn.imm & 0xFFFF, lo + 4, IMM_BITS, "imm")
        else:
            w1 = _put(w1, insn.wgt_factor_out, lo, self.W, "wgt_factor_out")
            w1 = _put(w1, insn.wgt_factor_in, lo + self.W, self.W, "wgt_factor_in")
        return w0, w1

    def encode_stream(self, insns: list[Insn]) -> bytes:
        """Encode a list of instructions to the little-endian byte stream the simulator reads."""
        arr = np.empty((len(insns), 2), dtype=np.uint64)
        for i, insn in enumerate(insns):
            arr[i] = self.encode(insn)
        return arr.astype("<u8").tobytes()

    def decode(self, w0: int, w1: int) -> Insn:
        """Decode two words; raises ``DecodeError`` for an unknown opcode."""
        opcode = _get(w0, 0, 3)
        deps = Deps(bool(_get(w0, 3, 1)), bool(_get(w0, 4, 1)), bool(_get(w0, 5, 1)),
                    bool(_get(w0, 6, 1)))
        if opcode in (OP_LOAD, OP_STORE):
            return MemInsn(opcode, _get(w0, 7, 3), _get(w0, 10, 16), _get(w0, 26, 32),
                           _get(w1, 0, 16), _get(w1, 16, 16), _get(w1, 32, 16), _get(w1, 48, 4),
                           _get(w1, 52, 4), _get(w1, 56, 4), _get(w1, 60, 4), deps)
        if opcode == OP_FINISH:
            return FinishInsn(deps)
        if opcode not in (OP_GEMM, OP_ALU):
            raise DecodeError(f"unknown opcode {opcode}")
        U, A, Ib = self.U, self.A, self.I
        common = dict(
            reset=bool(_get(w0, 7, 1)), uop_bgn=_get(w0, 8, U), uop_end=_get(w0, 8 + U, U + 1),
            iter_out=_get(w0, 9 + 2 * U, LOOP_ITER_BITS),
            iter_in=_get(w0, 9 + 2 * U + LOOP_ITER_BITS, LOOP_ITER_BITS),
            dst_factor_out=_get(w1, 0, A), dst_factor_in=_get(w1, A, A),
            src_factor_out=_get(w1, 2 * A, Ib), src_factor_in=_get(w1, 2 * A + Ib, Ib), deps=deps)
        lo = 2 * A + 2 * Ib
        if opcode == OP_ALU:
            imm = _get(w1, lo + 4, IMM_BITS)
            imm = imm - (1 << 16) if imm >= (1 << 15) else imm
            return AluInsn(alu_opcode=_get(w1, lo, 3), use_imm=bool(_get(w1, lo + 3, 1)),
                           imm=imm, **common)
        return GemmInsn(wgt_factor_out=_get(w1, lo, self.W), wgt_factor_in=_get(w1, lo + self.W,
                        self.W), **common)

    def decode_stream(self, data: bytes) -> list[Insn]:
        if len(data) % 16:
            raise DecodeError(f"instruction stream of {len(data)} bytes is not a multiple of 16")
        words = np.frombuffer(data, dtype="<u8").reshape(-1, 2)
        return [self.decode(int(a), int(b)) for a, b in words]

    # --- micro-ops --------------------------------------------------------------------------
    def encode_uop(self, u: Uop) -> int:
        w = _put(0, u.dst, 0, self.A, "uop.dst_idx")
        w = _put(w, u.src, self.A, self.I, "uop.src_idx")
        return _put(w, u.wgt, self.A + self.I, self.W, "uop.wgt_idx")

    def encode_uops(self, uops: list[Uop]) -> bytes:
        return np.array([self.encode_uop(u) for u in uops], dtype="<u4").tobytes()

    def decode_uop(self, w: int) -> Uop:
        return Uop(_get(w, 0, self.A), _get(w, self.A, self.I), _get(w, self.A + self.I, self.W))

    # --- assembly ---------------------------------------------------------------------------
    def format(self, insn: Insn) -> str:
        """One line of assembly with the dependency flags, e.g. ``LOAD INP ... | pop_next``."""
        d = insn.deps
        flags = [n for n, v in (("pop_prev", d.pop_prev), ("pop_next", d.pop_next),
                                ("push_prev", d.push_prev), ("push_next", d.push_next)) if v]
        tail = f"  | {' '.join(flags)}" if flags else ""
        if isinstance(insn, MemInsn):
            op = OPCODE_NAMES[insn.opcode]
            mt = MEM_NAMES.get(insn.memory_type, f"?{insn.memory_type}")
            if insn.x_size == 0:
                return f"{op:<6} NOP{tail}"
            pad = ""
            if insn.y_pad_0 or insn.y_pad_1 or insn.x_pad_0 or insn.x_pad_1:
                pad = f" pad=({insn.y_pad_0},{insn.y_pad_1},{insn.x_pad_0},{insn.x_pad_1})"
            return (f"{op:<6} {mt:<4} sram={insn.sram_base} dram={insn.dram_base} "
                    f"y={insn.y_size} x={insn.x_size} stride={insn.x_stride}{pad}{tail}")
        if isinstance(insn, FinishInsn):
            return f"FINISH{tail}"
        loops = (f"uop=[{insn.uop_bgn},{insn.uop_end}) iter=({insn.iter_out},{insn.iter_in}) "
                 f"dst=({insn.dst_factor_out},{insn.dst_factor_in}) "
                 f"src=({insn.src_factor_out},{insn.src_factor_in})")
        if isinstance(insn, AluInsn):
            if insn.reset:  # zeroes the destination entries (pools and upsample)
                return f"ALU    RESET {loops}{tail}"
            name = ALU_NAMES.get(insn.alu_opcode, f"?{insn.alu_opcode}")
            operand = f"imm={insn.imm}" if insn.use_imm else "acc"
            return f"ALU    {name:<4} {loops} {operand}{tail}"
        if insn.reset:
            return f"GEMM   RESET {loops}{tail}"
        return f"GEMM   {loops} wgt=({insn.wgt_factor_out},{insn.wgt_factor_in}){tail}"

    def disassemble(self, data: bytes) -> list[str]:
        """Readable listing of an instruction stream; undecodable words are shown, not raised."""
        lines = []
        words = np.frombuffer(data[: len(data) // 16 * 16], dtype="<u8").reshape(-1, 2)
        for i, (a, b) in enumerate(words):
            try:
                text = self.format(self.decode(int(a), int(b)))
            except DecodeError as e:
                text = f".word 0x{int(a):016x} 0x{int(b):016x}  ; {e}"
            lines.append(f"{i:6d}: {text}")
        return lines


def queue_of(insn: Insn) -> int:
    """Module that executes an instruction (VTA fetch routing)."""
    if isinstance(insn, MemInsn):
        if insn.opcode == OP_STORE:
            return QUEUE_STORE
        return QUEUE_LOAD if insn.memory_type in (MEM_INP, MEM_WGT) else QUEUE_COMPUTE
    return QUEUE_COMPUTE


# --- program blob -------------------------------------------------------------------------------
BLOB_TARGET = "vta"
MAX_DRAM_BYTES = 1 << 32


def build_blob(program, cfg: VTAConfig, name: str = "") -> bytes:
    """Serialize a planned :class:`~tvm_vta_cp.program.VTAProgram` into a program blob.

    Sections: ``HWCF`` (config JSON), ``META`` (memory map, layer table), ``INSN`` (all layers'
    instruction streams back to back), ``CNST`` (constant DRAM image: weights, biases, uops).
    """
    import json

    from tvm_accel.blob import Blob, pack_blob

    insn_parts, layers, off = [], [], 0
    for ly in program.layers:
        insn_parts.append(ly.insns)
        layers.append({"name": ly.name, "op": ly.op, "insn_offset": off, "n_insns": ly.n_insns,
                       "macs": ly.macs, "padded_macs": ly.padded_macs, "shape": ly.shape,
                       "knobs": ly.knobs})
        off += len(ly.insns)
    const_parts, consts, coff = [], [], 0
    for dram_off, data in program.const_image:
        consts.append([dram_off, coff, len(data)])
        const_parts.append(bytes(data))
        coff += len(data)
    tensors = {t.name: {"shape": list(t.shape), "dtype": t.dtype, "offset": t.offset,
                        "halo": list(t.halo), "fill": t.fill, "nbytes": t.nbytes,
                        "blocked": t.blocked}
               for t in program.tensors.values()}
    meta = {"name": name, "dram_size": program.dram_size, "inputs": program.inputs,
            "outputs": program.outputs, "tensors": tensors, "layers": layers, "const": consts}
    cfg_json = dict(cfg.to_json(), name=cfg.name)
    return pack_blob(Blob(BLOB_TARGET, cfg.fingerprint, {
        "HWCF": json.dumps(cfg_json).encode(),
        "META": json.dumps(meta).encode(),
        "INSN": b"".join(insn_parts),
        "CNST": b"".join(const_parts),
    }))


def load_blob(data: bytes, expect_config: VTAConfig | None = None):
    """Validate a VTA blob and rebuild ``(VTAProgram, VTAConfig)``; errors are ``BlobError``."""
    from tvm_accel.blob import unpack_target_blob
    from tvm_accel.errors import BlobError
    from tvm_vta_cp.hw_config import config_from_dict
    from tvm_vta_cp.layout import packed_shape
    from tvm_vta_cp.program import LayerProgram, TensorPlacement, VTAProgram

    blob, cfg, meta = unpack_target_blob(data, BLOB_TARGET, config_from_dict, expect_config)
    insn, cnst = blob.section("INSN"), blob.section("CNST")
    try:
        dram_size = int(meta["dram_size"])
        if not 0 < dram_size <= MAX_DRAM_BYTES:
            raise BlobError(f"vta blob asks for {dram_size} bytes of DRAM; the limit is "
                            f"{MAX_DRAM_BYTES} (4 GiB, VTA's 32-bit physical address space)")
        tensors = {}
        for tname, t in meta["tensors"].items():
            p = TensorPlacement(name=tname, shape=tuple(int(s) for s in t["shape"]),
                                dtype=str(t["dtype"]), offset=int(t["offset"]),
                                halo=tuple(int(h) for h in t["halo"]), fill=int(t["fill"]),
                                nbytes=int(t["nbytes"]), blocked=t.get("blocked", False))
            if not isinstance(p.blocked, bool):
                raise BlobError(f"vta blob: tensor {tname} has a non-boolean 'blocked' flag")
            if p.dtype not in ("int8", "uint8"):
                raise BlobError(f"vta blob: tensor {tname} has unsupported dtype {p.dtype}")
            if (len(p.shape) not in (2, 4) or min(p.shape) < 1 or len(p.halo) != 4
                    or min(p.halo) < 0 or not -128 <= p.fill <= 127
                    or p.nbytes != int(np.prod(packed_shape(p, cfg)))):
                raise BlobError(f"vta blob: tensor {tname} has an inconsistent placement "
                                f"(shape {list(p.shape)}, halo {list(p.halo)}, {p.nbytes} "
                                "bytes)")
            if p.offset < 0 or p.nbytes < 0 or p.offset + p.nbytes > dram_size:
                raise BlobError(f"vta blob: tensor {tname} [{p.offset}, {p.offset + p.nbytes}) "
                                f"lies outside DRAM of {dram_size} bytes")
            tensors[tname] = p
        layers = []
        for ly in meta["layers"]:
            lo, n = int(ly["insn_offset"]), int(ly["n_insns"])
            if lo < 0 or n < 0 or lo + 16 * n > len(insn):
                raise BlobError(f"vta blob: layer {ly['name']} instructions [{lo}, {lo + 16 * n})"
                                f" lie outside the INSN section ({len(insn)} bytes)")
            layers.append(LayerProgram(name=str(ly["name"]), op=str(ly["op"]),
                                       insns=insn[lo : lo + 16 * n], n_insns=n,
                                       macs=int(ly["macs"]), padded_macs=int(ly["padded_macs"]),
                                       shape=str(ly["shape"]), knobs=dict(ly["knobs"])))
        const_image = []
        for dram_off, c_off, size in meta["const"]:
            dram_off, c_off, size = int(dram_off), int(c_off), int(size)
            if c_off < 0 or size < 0 or c_off + size > len(cnst):
                raise BlobError("vta blob: a constant range lies outside the CNST section")
            if dram_off < 0 or dram_off + size > dram_size:
                raise BlobError(f"vta blob: constant at DRAM [{dram_off}, {dram_off + size}) "
                                f"exceeds DRAM of {dram_size} bytes")
            const_image.append((dram_off, cnst[c_off : c_off + size]))
        inputs = [str(n) for n in meta["inputs"]]
        outputs = [str(n) for n in meta["outputs"]]
        for n in inputs + outputs:
            if n not in tensors:
                raise BlobError(f"vta blob: function tensor {n} has no memory placement")
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise BlobError(f"vta blob: malformed META section ({type(e).__name__}: {e}); "
                        "recompile the model") from None
    program = VTAProgram(dram_size=dram_size, const_image=const_image, tensors=tensors,
                         inputs=inputs, outputs=outputs, layers=layers)
    return program, cfg, str(meta.get("name", ""))
