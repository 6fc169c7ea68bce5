"""DPU assembly: formatter, disassembler and parser round trips, parse errors."""

import numpy as np
import pytest

from tvm_accel.errors import AsmError
from tvm_dpu import codegen as cg
from tvm_dpu.asm import ISA
from tvm_dpu.codegen import (
    INSN_BYTES,
    LAYOUTS,
    End,
    Load,
    decode,
    decode_stream,
    encode,
    encode_stream,
    field_offsets,
)
from tvm_dpu.hw_config import load_config
from tvm_dpu.strategy import plan

from .test_dpu_codegen import sample_program
from .test_dpu_strategy import _single


@pytest.fixture
def isa():
    return ISA(load_config())


def test_assembly_round_trip_is_bit_identical(isa):
    data = encode_stream(sample_program())
    text = "\n".join(isa.disassemble(data))
    assert isa.assemble(text) == data
    plain = "\n".join(isa.format(i) for i in decode_stream(data))
    assert isa.assemble(plain) == data


def _random_insn(rng, kind):
    """Random field values within their widths (valid bits, not necessarily valid programs)."""
    vals = {}
    for name, w, signed in LAYOUTS[kind]:
        v = int(rng.integers(0, 1 << w))
        if signed and v >= 1 << (w - 1):
            v -= 1 << w
        vals[name] = v
    word = sum((v & ((1 << w) - 1)) << lo for (_, lo, w, _), v in
               zip(field_offsets(kind)[3:], vals.values(), strict=True))
    opcode = {"LOAD": 1, "SAVE": 2, "CONV": 3}.get(kind, 4)
    if kind in ("MAXPOOL", "AVGPOOL", "ELTADD", "UPSAMPLE", "COPY", "ELTMUL"):
        op = ["MAXPOOL", "AVGPOOL", "ELTADD", "UPSAMPLE", "COPY", "ELTMUL"].index(kind)
        word &= ~(0xF << 12)
        word |= op << 12
    word |= opcode | int(rng.integers(0, 16)) << 4 | int(rng.integers(0, 16)) << 8
    return word.to_bytes(INSN_BYTES, "little")


@pytest.mark.parametrize("kind", ["LOAD", "SAVE", "CONV", "MAXPOOL", "AVGPOOL", "ELTADD",
                                  "UPSAMPLE", "COPY", "ELTMUL"])
def test_random_words_round_trip_through_decode_format_parse_encode(isa, kind):
    rng = np.random.default_rng(len(kind))
    for _ in range(50):
        raw = _random_insn(rng, kind)
        insn = decode(raw)
        assert encode(insn) == raw
        assert isa.parse_line(isa.format(insn)) == insn
        assert isa.assemble(isa.format(insn)) == raw


def test_parser_accepts_comments_listings_linear_fm_addresses_and_case(isa):
    text = """
    ; a comment line
         0: load dpon=- dpby=conv dst=FM1:0x8010 src=input+16 size=1x2x3 src_stride=3,6 \
dst_stride=3,6  # trailing comment
    CONV DPON=load DPBY=- in=fm1:1:0x10 in_stride=3,6 ic=3 out=FM0:0:0 out_stride=4,8 \
out_size=1x2x4 kernel=1x1 stride=1x1 pad=0,0,0,0 params=PM:0x40 shift=0 clip=-128,127
    END
    """.replace("\\\n", "")
    prog = isa.parse(text)
    assert prog[0] == Load(dpby="CONV", fm_mem=1, dst_addr=0x8010, ddr_offset=16, rows=1, cols=2,
                           chans=3, ddr_pix_stride=3, ddr_row_stride=6, fm_pix_stride=3,
                           fm_row_stride=6)
    assert prog[1].in_addr == 0x8010  # bank 1 of 32 KiB + 0x10
    assert prog[1].param_addr == 0x40 and prog[1].dpon == {"LOAD"}
    assert isinstance(prog[2], End)
    assert isa.format(prog[0]).startswith("LOAD DPON=- DPBY=CONV dst=FM1:1:0x0010")


@pytest.mark.parametrize("line, message", [
    ("FOO DPON=-", r"line 1: unknown mnemonic 'FOO'"),
    ("CONV DPON=LOAD bogus=1", r"unknown operand 'bogus' for CONV"),
    ("CONV kernel=3", r"kernel=3: expected 2 values"),
    ("LOAD dst=FM0:zz", r"not an FM address"),
    ("LOAD src=STACK+0x10", r"unknown DDR region"),
    ("SAVE rows=ten", r"'ten' is not an integer"),
    ("CONV DPON=LOAD|FPU", r"unknown unit 'FPU'"),
    ("CONV ic=5000", r"field ic=5000 does not fit in 12 bits"),
    ("END DPON=LOAD", r"END takes no operands"),
    ("COPY ic=3", r"unknown operand 'ic' for COPY"),
])
def test_parser_errors_name_the_line_and_token(isa, line, message):
    with pytest.raises(AsmError, match=message):
        isa.assemble(line)


def test_disassembler_shows_undecodable_words_instead_of_raising(isa):
    lines = isa.disassemble(encode(End()) + bytes(INSN_BYTES))
    assert lines[0].endswith("END")
    assert ".word 0x" in lines[1] and "unknown opcode 0" in lines[1]


def test_disassembly_prints_dpu_assembly(cfg):
    import tvm_dpu

    prog = plan(_single(hw=16), cfg)
    text = tvm_dpu.TARGET.disassemble(cg.build_blob(prog, cfg, "f"))
    assert "CONV DPON=LOAD DPBY=" in text and "LOAD DPON=- DPBY=CONV" in text
    assert text.strip().splitlines()[-1].strip().endswith("END")
