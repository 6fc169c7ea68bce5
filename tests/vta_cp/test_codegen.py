import pytest

from tvm_vta_cp.codegen import (
    ALU_MUL,
    ALU_SHR,
    ISA,
    MEM_ACC,
    MEM_INP,
    MEM_UOP,
    OP_LOAD,
    OP_STORE,
    QUEUE_COMPUTE,
    QUEUE_LOAD,
    QUEUE_STORE,
    AluInsn,
    Deps,
    EncodeError,
    FinishInsn,
    GemmInsn,
    MemInsn,
    Uop,
    queue_of,
)
from tvm_vta_cp.hw_config import load_config


@pytest.fixture(params=["vta_1x16x16", "vta_8x8x8"])
def isa(request):
    return ISA(load_config(request.param))


def test_every_instruction_kind_round_trips(isa):
    insns = [
        MemInsn(OP_LOAD, MEM_INP, 7, 123456, 3, 4, 10, 1, 2, 3, 4, Deps(pop_next=True)),
        MemInsn(OP_STORE, 4, 0, 99, 1, 16, 16, deps=Deps(pop_prev=True, push_prev=True)),
        GemmInsn(False, 1, 9, 3, 4, 5, 6, 7, 8, 9, 10, Deps(pop_prev=True, push_next=True)),
        GemmInsn(True, 0, 1, 16, 8, 1, 0),
        AluInsn(ALU_SHR, 0, 3, 5, 7, 1, 2, 3, 4, True, -5),
        AluInsn(ALU_MUL, 2, 4, 1, 1, use_imm=True, imm=32767),
        FinishInsn(),
    ]
    data = isa.encode_stream(insns)
    assert len(data) == 16 * len(insns)
    assert isa.decode_stream(data) == insns


def test_load_field_positions_follow_hw_spec():
    isa = ISA(load_config())
    w0, w1 = isa.encode(MemInsn(OP_LOAD, MEM_INP, 1, 2, 3, 4, 5, 6, 7, 8, 9))
    assert w0 == 0 | (MEM_INP << 7) | (1 << 10) | (2 << 26)
    assert w1 == 3 | (4 << 16) | (5 << 32) | (6 << 48) | (7 << 52) | (8 << 56) | (9 << 60)


def test_micro_op_round_trips_and_rejects_out_of_range_index(isa):
    u = Uop(isa.cfg.acc_depth - 1, isa.cfg.inp_depth - 1, isa.cfg.wgt_depth - 1)
    assert isa.decode_uop(isa.encode_uop(u)) == u
    with pytest.raises(EncodeError, match="uop.wgt_idx"):
        isa.encode_uop(Uop(0, 0, isa.cfg.wgt_depth))


def test_field_overflow_is_an_encode_error_naming_the_field(isa):
    with pytest.raises(EncodeError, match="x_pad_0"):
        isa.encode(MemInsn(OP_LOAD, MEM_INP, 0, 0, 1, 1, 1, x_pad_0=16))
    with pytest.raises(EncodeError, match="imm"):
        isa.encode(AluInsn(ALU_SHR, 0, 1, 1, 1, use_imm=True, imm=40000))


def test_modules_receive_instructions_by_vta_fetch_routing():
    assert queue_of(MemInsn(OP_LOAD, MEM_INP, 0, 0, 1, 1, 1)) == QUEUE_LOAD
    assert queue_of(MemInsn(OP_LOAD, MEM_UOP, 0, 0, 1, 1, 1)) == QUEUE_COMPUTE
    assert queue_of(MemInsn(OP_LOAD, MEM_ACC, 0, 0, 1, 1, 1)) == QUEUE_COMPUTE
    assert queue_of(MemInsn(OP_STORE, 4, 0, 0, 1, 1, 1)) == QUEUE_STORE
    assert queue_of(FinishInsn()) == QUEUE_COMPUTE


def test_disassembly_shows_flags_and_survives_garbage(isa):
    data = isa.encode_stream([GemmInsn(False, 0, 2, 1, 1, deps=Deps(pop_prev=True))])
    lines = isa.disassemble(data + b"\x07" * 16)
    assert "pop_prev" in lines[0] and "GEMM" in lines[0]
    assert ".word" in lines[1]
