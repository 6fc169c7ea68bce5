"""DPU ISA: 256-bit encoding, documented bit layout, assembly formatter and parser."""

import re

import pytest

from tvm_dpu import codegen
from tvm_dpu import codegen as cg
from tvm_dpu.codegen import (
    HEADER,
    INSN_BYTES,
    MISC_AVGPOOL,
    MISC_MAXPOOL,
    REGION_PARAM,
    REGION_SWAP,
    UNIT_CONV,
    UNIT_LOAD,
    UNIT_MISC,
    UNIT_SAVE,
    Conv,
    Copy,
    EltAdd,
    EncodeError,
    End,
    Load,
    Pool,
    Save,
    Upsample,
    decode,
    decode_stream,
    encode,
    encode_stream,
    field_offsets,
    unit_of,
    units_mask,
)
from tvm_dpu.strategy import plan

from .test_dpu_strategy import _block


def sample_program():
    """One instruction of every kind with non-default values in every group of fields."""
    return [
        Load(dpby="CONV", fm_mem=2, dst_addr=0x3F00F, ddr_offset=0x12345678, rows=7, cols=9,
             chans=3, ddr_pix_stride=3, ddr_row_stride=27, fm_pix_stride=21, fm_row_stride=300,
             pad_top=3, pad_bottom=1, pad_left=3, pad_right=2, pad_value=-128,
             img_stride=0xFFFFFFFF, fmt=7),
        Load(to_pm=True, dpby={"CONV", "MISC"}, dpon="SAVE", dst_addr=0xFFFFFF,
             region=REGION_PARAM, rows=4095, cols=1, chans=4095, ddr_pix_stride=65535,
             ddr_row_stride=(1 << 24) - 1),
        Conv(dpon="LOAD", dpby="SAVE|MISC", in_mem=0, in_addr=0x100, in_pix_stride=64,
             in_row_stride=3584, ic=64, out_mem=1, out_addr=0xFFFFF, out_pix_stride=4095,
             out_row_stride=(1 << 20) - 1, out_h=8, out_w=56, oc=4095, kernel_h=15,
             kernel_w=3, stride_h=7, stride_w=2, pad_top=15, pad_bottom=0, pad_left=1,
             pad_right=14, pad_value=-3, param_addr=0x7BCDEF, leaky=True, shift=31, clip_lo=0,
             clip_hi=100, depthwise=True),
        Pool(op=MISC_MAXPOOL, dpon="CONV", dpby="SAVE", in_mem=1, in_addr=5, in_pix_stride=64,
             in_row_stride=640, out_mem=2, out_addr=7, out_pix_stride=64, out_row_stride=320,
             out_h=4, out_w=5, chans=64, kernel_h=3, kernel_w=3, stride_h=2, stride_w=2,
             pad_top=1, pad_bottom=1, pad_left=1, pad_right=0, pad_value=-128, clip_lo=-5),
        Pool(op=MISC_AVGPOOL, dpby="SAVE", in_mem=1, in_pix_stride=2048, in_row_stride=14336,
             out_h=1, out_w=1, chans=2048, kernel_h=7, kernel_w=7, shift=10, mult=21),
        EltAdd(dpon="CONV|LOAD", dpby="SAVE", in_mem=0, in_addr=1, in_pix_stride=256,
               in_row_stride=256 * 56, b_mem=2, b_addr=99, b_pix_stride=512,
               b_row_stride=512 * 56, out_mem=1, out_pix_stride=256, out_row_stride=256 * 56,
               out_h=8, out_w=56, chans=256, shift_a=-32, shift_b=31, shift=1, clip_lo=0),
        Upsample(dpon="LOAD", dpby="CONV", in_pix_stride=16, in_row_stride=160, out_mem=1,
                 out_pix_stride=16, out_row_stride=320, out_h=4, out_w=20, chans=16,
                 factor_h=2, factor_w=15),
        Copy(dpon="CONV", dpby="SAVE", in_pix_stride=8, in_row_stride=64, out_mem=2,
             out_addr=8, out_pix_stride=16, out_row_stride=256, out_h=8, out_w=8, chans=8),
        Save(dpon="MISC|CONV", fm_mem=1, src_addr=0x100, region=REGION_SWAP, ddr_offset=1,
             rows=4, cols=28, chans=64, fm_pix_stride=64, fm_row_stride=1792,
             ddr_pix_stride=128, ddr_row_stride=7168, img_stride=0xC400),
        End(),
    ]


def test_every_instruction_kind_round_trips_through_the_encoding():
    prog = sample_program()
    data = encode_stream(prog)
    assert len(data) == INSN_BYTES * len(prog)
    assert decode_stream(data) == prog


def test_header_and_field_positions_follow_the_documented_layout():
    word = int.from_bytes(encode(Conv(dpon="LOAD", dpby="SAVE|MISC", param_addr=0xABCDE,
                                      depthwise=True, clip_lo=-1, clip_hi=-1)), "little")
    assert word & 0xF == codegen.OP_CONV
    assert (word >> 4) & 0xF == 0b0001  # DPON: bit 0 LOAD
    assert (word >> 8) & 0xF == 0b1010  # DPBY: bit 1 SAVE, bit 3 MISC
    assert (word >> 206) & ((1 << 24) - 1) == 0xABCDE
    assert (word >> 235) & 0xFF == 0xFF and (word >> 243) & 0xFF == 0xFF
    assert (word >> 251) & 1 == 1
    assert word >> 252 == 1  # dilation 1: a dense kernel
    end = int.from_bytes(encode(End()), "little")
    assert end == codegen.OP_END


def test_module_docstring_lists_every_field_at_its_bit_range():
    doc = codegen.__doc__
    for kind in ("LOAD", "SAVE", "CONV"):
        block = doc.split(f"\n{kind} (")[1].split("\n\n", 2)[1]
        documented = re.findall(r"(\w+)\[(\d+):(\d+)\]", block)
        expect = [(n, str(lo), str(lo + w)) for n, lo, w, _ in field_offsets(kind)[3:]]
        assert documented == expect, kind
        total = field_offsets(kind)[-1][1] + field_offsets(kind)[-1][2]
        assert f"{kind} ({total} bits)" in doc
    misc = doc.split("MISC, common part")[1].split("END:")[0]
    documented = re.findall(r"(\w+)\[(\d+):(\d+)\]", misc)
    expect = [(n, str(lo), str(lo + w)) for n, lo, w, _ in field_offsets("MAXPOOL")[3:]]
    expect += [(n, str(lo), str(lo + w)) for n, lo, w, _ in field_offsets("ELTADD")[15:]]
    expect += [(n, str(lo), str(lo + w)) for n, lo, w, _ in field_offsets("UPSAMPLE")[15:]]
    expect += [(n, str(lo), str(lo + w)) for n, lo, w, _ in field_offsets("ELTMUL")[15:]]
    assert documented == expect
    assert [n for n, _, _ in HEADER] == ["opcode", "dpon", "dpby"]


def test_encoder_names_fields_that_do_not_fit():
    with pytest.raises(EncodeError, match=r"CONV: field shift=32 does not fit in 5 bits"):
        encode(Conv(shift=32))
    with pytest.raises(EncodeError, match=r"ELTADD: field shift_a=32 does not fit in 6 signed"):
        encode(EltAdd(shift_a=32))
    with pytest.raises(EncodeError, match=r"LOAD: field pad_value=128"):
        encode(Load(pad_value=128))
    with pytest.raises(EncodeError, match="unknown unit"):
        Conv(dpon="GEMM")
    with pytest.raises(EncodeError, match="unknown MISC op"):
        encode(Pool(op=7))
    assert units_mask("LOAD|misc") == 0b1001 and units_mask("-") == 0 and units_mask(5) == 5


def test_decoder_rejects_unknown_opcodes_ops_reserved_bits_and_end_with_deps():
    with pytest.raises(EncodeError, match="unknown opcode 0"):
        decode(bytes(INSN_BYTES))
    with pytest.raises(EncodeError, match="unknown MISC op 9"):
        decode((4 | 9 << 12).to_bytes(INSN_BYTES, "little"))
    word = int.from_bytes(encode(Copy()), "little") | 1 << 200
    with pytest.raises(EncodeError, match=r"COPY: reserved bits \[160, 256\)"):
        decode(word.to_bytes(INSN_BYTES, "little"))
    with pytest.raises(EncodeError, match="END: fields DPON/DPBY must be empty"):
        decode((15 | 1 << 4).to_bytes(INSN_BYTES, "little"))
    with pytest.raises(EncodeError, match="multiple of 32"):
        decode_stream(b"\0" * 33)


def test_units_and_mnemonics():
    prog = sample_program()
    assert [unit_of(i) for i in prog] == [UNIT_LOAD, UNIT_LOAD, UNIT_CONV] + [UNIT_MISC] * 5 + [
        UNIT_SAVE, None]
    assert [codegen.mnemonic(i) for i in prog[2:8]] == ["CONV", "MAXPOOL", "AVGPOOL", "ELTADD",
                                                        "UPSAMPLE", "COPY"]


def test_blob_round_trip_and_validation(cfg):
    from tvm_accel.errors import BlobError

    prog = plan(_block(c=16, hw=8, batch=1), cfg)
    blob = cg.build_blob(prog, cfg, "f")
    back, cfg2, name = cg.load_blob(blob)
    assert name == "f" and cfg2.fingerprint == cfg.fingerprint
    assert [ly.insns for ly in back.layers] == [ly.insns for ly in prog.layers]
    assert back.params == prog.params
    with pytest.raises(BlobError):
        cg.load_blob(blob[:-3])
    import json

    from tvm_accel.blob import Blob, pack_blob, unpack_blob

    b = unpack_blob(blob)
    meta = json.loads(b.sections["META"])
    meta["tensors"]["x"]["offset"] = 1 << 40
    b.sections["META"] = json.dumps(meta).encode()
    with pytest.raises(BlobError, match="outside"):
        cg.load_blob(pack_blob(Blob(b.target, b.fingerprint, b.sections)))
