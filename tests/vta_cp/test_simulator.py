"""Behaviour of the C VTA simulator (sim/vta) through its Python binding.

Programs are built with ``tvm_vta_cp.codegen`` on both bundled configs. ACC contents are read
back exactly by an on-device "readout" (ALU copies of ACC shifted by 0/8/16/24 bits, stored as
int8 bytes), so GEMM/ALU results are compared as full int32 values.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys

import numpy as np
import pytest

from helpers import fuzz
from tvm_accel.errors import SimulatorError
from tvm_vta_cp.codegen import (
    ALU_ADD,
    ALU_MAX,
    ALU_MIN,
    ALU_MUL,
    ALU_SHR,
    ISA,
    MEM_ACC,
    MEM_ACC_8BIT,
    MEM_INP,
    MEM_OUT,
    MEM_UOP,
    MEM_WGT,
    OP_LOAD,
    OP_STORE,
    AluInsn,
    Deps,
    FinishInsn,
    GemmInsn,
    MemInsn,
    Uop,
)
from tvm_vta_cp.hw_config import load_config
from tvm_vta_cp.simulator import VTAStats, simulate

CONFIGS = ["vta_1x16x16", "vta_8x8x8"]


@pytest.fixture(params=CONFIGS)
def vcfg(request):
    return load_config(request.param)


def wrap32(x):
    x = np.asarray(x, dtype=np.int64)
    return ((x + 2**31) % 2**32 - 2**31).astype(np.int64)


class Prog:
    """A serial test program: load-module loads, compute instructions, stores, then FINISH.

    ``stream()`` adds the two token hand-offs (last load -> first compute, last compute -> first
    store). DRAM is allocated bump-pointer style, aligned to the entry size of each use.
    """

    def __init__(self, cfg, dram_size=1 << 18):
        self.cfg, self.isa = cfg, ISA(cfg)
        self.dram = np.zeros(dram_size, np.uint8)
        self.top = 0
        self.load, self.compute, self.store = [], [], []
        self.lanes = cfg.batch * cfg.block_out
        self._readouts = []

    # DRAM --------------------------------------------------------------------------------
    def alloc(self, nbytes, entry):
        self.top = -(-self.top // entry) * entry
        base = self.top
        self.top += nbytes
        assert self.top <= self.dram.size
        return base

    def put(self, data, entry):
        b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        off = self.alloc(b.size, entry)
        self.dram[off:off + b.size] = b
        return off // entry

    # instructions ------------------------------------------------------------------------
    def load_uops(self, uops, sram_base=0):
        base = self.put(np.frombuffer(self.isa.encode_uops(uops), np.uint8), 4)
        self.compute.append(MemInsn(OP_LOAD, MEM_UOP, sram_base, base, 1, len(uops), len(uops)))

    def load_acc(self, values, sram_base=0):
        v = np.asarray(values, np.int32).reshape(-1, self.lanes)
        base = self.put(v.astype("<i4"), self.cfg.acc_entry_bytes)
        self.compute.append(MemInsn(OP_LOAD, MEM_ACC, sram_base, base, 1, len(v), len(v)))

    def read_acc(self, n, spare=None):
        """Append a readout of ACC[0:n]; returns a callable giving int32 (n, batch, block_out)."""
        cfg = self.cfg
        spare = cfg.acc_depth // 2 if spare is None else spare
        assert spare >= n and spare + 4 * n <= cfg.acc_depth
        ubase = cfg.uop_depth - 4 * n
        self.load_uops([Uop(spare + b * n + i, i) for b in range(4) for i in range(n)], ubase)
        self.compute.append(AluInsn(ALU_ADD, ubase, ubase + 4 * n, 1, 1, reset=True))
        for b in range(4):
            lo, hi = ubase + b * n, ubase + (b + 1) * n
            self.compute.append(AluInsn(ALU_ADD, lo, hi, 1, 1))
            self.compute.append(AluInsn(ALU_SHR, lo, hi, 1, 1, use_imm=True, imm=8 * b))
        out = self.alloc(4 * n * cfg.out_entry_bytes, cfg.out_entry_bytes)
        self.store.append(MemInsn(OP_STORE, MEM_OUT, spare, out // cfg.out_entry_bytes, 1, 4 * n,
                                  4 * n))

        def result():
            by = self.dram[out:out + 4 * n * cfg.out_entry_bytes].reshape(4, n, self.lanes)
            v = sum(by[b].astype(np.uint32) << np.uint32(8 * b) for b in range(4))
            return v.astype(np.uint32).view(np.int32).reshape(n, cfg.batch, cfg.block_out)

        return result

    def stream(self):
        load, compute, store = self.load, list(self.compute), self.store
        if not compute:
            compute.append(MemInsn(OP_LOAD, MEM_UOP, 0, 0, 0, 0, 0))
        if load:
            load[-1].deps.push_next = True
            compute[0].deps.pop_prev = True
        if store:
            compute[-1].deps.push_next = True
            store[0].deps.pop_prev = True
        return self.isa.encode_stream(load + compute + store + [FinishInsn()])

    def run(self, **kw):
        return simulate(self.cfg, self.stream(), self.dram, **kw)


def rand_i8(rng, *shape):
    return rng.integers(-128, 128, size=shape, dtype=np.int64).astype(np.int8)


# --- GEMM ----------------------------------------------------------------------------------


def test_gemm_matches_numpy_with_int32_wrap(vcfg):
    cfg, rng = vcfg, np.random.default_rng(1)
    B, BI, BO = cfg.batch, cfg.block_in, cfg.block_out
    p = Prog(cfg)
    inp = rand_i8(rng, 16, B, BI)
    wgt = rand_i8(rng, 8, BO, BI)
    acc0 = np.full((24, B, BO), 2**31 - 5, np.int64)
    acc0[12:] = -(2**31) + 7
    uops = [Uop(int(rng.integers(0, 6)), int(rng.integers(0, 10)), int(rng.integers(0, 4)))
            for _ in range(5)]
    ib = p.put(inp, cfg.inp_entry_bytes)
    wb = p.put(wgt, cfg.wgt_entry_bytes)
    p.load += [MemInsn(OP_LOAD, MEM_INP, 0, ib, 1, 16, 16),
               MemInsn(OP_LOAD, MEM_WGT, 0, wb, 1, 8, 8)]
    p.load_acc(acc0)
    p.load_uops(uops)
    p.compute.append(GemmInsn(False, 0, 5, 2, 3, dst_factor_out=6, dst_factor_in=2,
                              src_factor_out=4, src_factor_in=1, wgt_factor_out=2,
                              wgt_factor_in=1))
    res = p.read_acc(24)
    st = p.run()

    ref = acc0.copy()
    for o in range(2):
        for i in range(3):
            for u in uops:
                d, s, w = u.dst + 6 * o + 2 * i, u.src + 4 * o + i, u.wgt + 2 * o + i
                ref[d] += inp[s].astype(np.int64) @ wgt[w].astype(np.int64).T
    assert (np.abs(ref) >= 2**31).any(), "test data should overflow int32"
    np.testing.assert_array_equal(res(), wrap32(ref))
    assert st.gemm_uop_iters == 2 * 3 * 5
    assert st.macs(cfg) == 30 * cfg.macs_per_cycle
    assert st.inp_load_bytes == 16 * cfg.inp_entry_bytes
    assert st.wgt_load_bytes == 8 * cfg.wgt_entry_bytes
    assert st.acc_load_bytes == 24 * cfg.acc_entry_bytes


def test_gemm_reset_zeroes_acc_entries(vcfg):
    cfg = vcfg
    p = Prog(cfg)
    acc0 = np.arange(8 * cfg.batch * cfg.block_out).reshape(8, cfg.batch, cfg.block_out) + 1
    p.load_acc(acc0)
    p.load_uops([Uop(1, 0, 0)])
    p.compute.append(GemmInsn(True, 0, 1, 2, 2, dst_factor_out=4, dst_factor_in=1))
    res = p.read_acc(8)
    st = p.run()
    ref = acc0.copy()
    ref[[1, 2, 5, 6]] = 0
    np.testing.assert_array_equal(res(), ref)
    assert st.gemm_reset_iters == 4 and st.gemm_uop_iters == 0


# --- ALU -----------------------------------------------------------------------------------


def alu_ref(op, a, b):
    a, b = np.asarray(a, np.int64), np.broadcast_to(np.asarray(b, np.int64), np.shape(a))
    if op == ALU_MIN:
        return np.minimum(a, b)
    if op == ALU_MAX:
        return np.maximum(a, b)
    if op == ALU_ADD:
        return wrap32(a + b)
    if op == ALU_MUL:
        return wrap32(a * b)
    right = a >> np.minimum(np.maximum(b, 0), 31)
    left = wrap32(a << np.minimum(np.maximum(-b, 0), 31))
    return np.where(b >= 0, right, left)


@pytest.mark.parametrize("op", [ALU_MIN, ALU_MAX, ALU_ADD, ALU_SHR, ALU_MUL],
                         ids=["min", "max", "add", "shr", "mul"])
def test_alu_op_with_register_operand(vcfg, op):
    cfg, rng = vcfg, np.random.default_rng(op)
    shape = (8, cfg.batch, cfg.block_out)
    a = rng.integers(-(2**31), 2**31, size=shape)
    a.reshape(-1)[:8] = [-(2**31), 2**31 - 1, -1, 0, 1, 12345, -12345, 77]
    if op == ALU_SHR:
        b = rng.integers(-40, 40, size=shape)  # negative = shift left; |amount| > 31 clamps
    elif op == ALU_MUL:
        b = rng.integers(-(2**20), 2**20, size=shape)
    else:
        b = rng.integers(-(2**31), 2**31, size=shape)
    p = Prog(cfg)
    p.load_acc(np.concatenate([a, b]))
    p.load_uops([Uop(i, 8 + i) for i in range(8)])
    p.compute.append(AluInsn(op, 0, 4, 1, 2, dst_factor_in=4, src_factor_in=4))
    res = p.read_acc(8)
    st = p.run()
    np.testing.assert_array_equal(res(), alu_ref(op, a, b))
    assert st.alu_uop_iters == 8 + 4 * 8 + 4 * 2 * 8  # the op + the readout's ALUs over 8 uops


@pytest.mark.parametrize("op,imm", [(ALU_MIN, -3), (ALU_MAX, -32768), (ALU_ADD, -1),
                                    (ALU_ADD, 32767), (ALU_SHR, 5), (ALU_SHR, -3),
                                    (ALU_SHR, 0), (ALU_MUL, -7)])
def test_alu_op_with_sign_extended_immediate(vcfg, op, imm):
    cfg, rng = vcfg, np.random.default_rng(abs(imm))
    a = rng.integers(-(2**31), 2**31, size=(4, cfg.batch, cfg.block_out))
    a[0, 0, :2] = [-40, 40]
    p = Prog(cfg)
    p.load_acc(a)
    p.load_uops([Uop(0, 0)])
    p.compute.append(AluInsn(op, 0, 1, 4, 1, dst_factor_out=1, use_imm=True, imm=imm))
    res = p.read_acc(4)
    p.run()
    np.testing.assert_array_equal(res(), alu_ref(op, a, imm))


def test_alu_reset_zeroes_destination(vcfg):
    p = Prog(vcfg)
    p.load_acc(np.full((2, vcfg.batch, vcfg.block_out), 9))
    p.load_uops([Uop(1, 0)])
    p.compute.append(AluInsn(ALU_MAX, 0, 1, 1, 1, reset=True))
    res = p.read_acc(2)
    p.run()
    assert (res()[0] == 9).all() and (res()[1] == 0).all()


# --- LOAD / STORE --------------------------------------------------------------------------


def test_inp_load_zero_pads_the_block(vcfg):
    """A padded INP load overwrites a previously loaded block; read back via an identity GEMM."""
    cfg, rng = vcfg, np.random.default_rng(3)
    B, BI = cfg.batch, cfg.block_in
    p = Prog(cfg)
    junk = rand_i8(rng, 30, B, BI)
    junk[junk == 0] = 1
    data = rand_i8(rng, 2, 3, B, BI)  # y_size 2 rows of x_size 3 entries, DRAM pitch 5
    src = np.zeros((2, 5, B, BI), np.int8)
    src[:, :3] = data
    eye = np.eye(BI, dtype=np.int8)[None]
    p.load += [MemInsn(OP_LOAD, MEM_INP, 0, p.put(junk, cfg.inp_entry_bytes), 1, 30, 30),
               MemInsn(OP_LOAD, MEM_INP, 0, p.put(src, cfg.inp_entry_bytes), 2, 3, 5,
                       y_pad_0=1, y_pad_1=2, x_pad_0=1, x_pad_1=1),
               MemInsn(OP_LOAD, MEM_WGT, 0, p.put(eye, cfg.wgt_entry_bytes), 1, 1, 1)]
    p.load_uops([Uop(0, 0, 0)])
    p.compute.append(GemmInsn(True, 0, 1, 30, 1, dst_factor_out=1))
    p.compute.append(GemmInsn(False, 0, 1, 30, 1, dst_factor_out=1, src_factor_out=1))
    res = p.read_acc(30)
    p.run()
    block = np.zeros((5, 5, B, BI), np.int64)  # (1 + 2 + 2) rows x (1 + 3 + 1) entries
    block[1:3, 1:4] = data
    expect = junk.astype(np.int64)
    expect[:25] = block.reshape(25, B, BI)
    np.testing.assert_array_equal(res(), expect)


def test_acc_load_padding_and_stride(vcfg):
    cfg = vcfg
    L = cfg.batch * cfg.block_out
    p = Prog(cfg)
    p.load_acc(np.full((12, L), 5))
    rows = np.arange(3 * 4 * L).reshape(3, 4, L) + 100
    base = p.put(rows.astype("<i4"), cfg.acc_entry_bytes)
    p.compute.append(MemInsn(OP_LOAD, MEM_ACC, 0, base + 1, 2, 2, 4, y_pad_0=1, x_pad_1=2))
    res = p.read_acc(12)
    p.run()
    got = res().reshape(12, L)
    expect = np.full((12, L), 5)
    expect[:12] = 0
    expect[4:6] = rows[0, 1:3]
    expect[8:10] = rows[1, 1:3]
    np.testing.assert_array_equal(got, expect)


def test_acc_8bit_load_sign_extends(vcfg):
    cfg = vcfg
    L = cfg.batch * cfg.block_out
    p = Prog(cfg)
    v = (np.arange(4 * L) * 37 % 256 - 128).astype(np.int8).reshape(4, L)
    v[0, :3] = [-128, -1, 127]
    base = p.put(v, cfg.out_entry_bytes)
    p.compute.append(MemInsn(OP_LOAD, MEM_ACC_8BIT, 0, base, 1, 4, 4))
    res = p.read_acc(4)
    st = p.run()
    np.testing.assert_array_equal(res().reshape(4, L), v.astype(np.int64))
    assert st.acc_load_bytes == 4 * L


def test_store_truncates_to_low_byte_with_pitch(vcfg):
    cfg = vcfg
    L = cfg.batch * cfg.block_out
    vals = np.array([300, -129, 0x12345678, -(2**31), 2**31 - 1, 127, -128, 255])
    acc = np.resize(vals, 4 * L).reshape(4, L)
    p = Prog(cfg)
    p.load_acc(acc)
    out = p.alloc(3 * 2 * L, L) // L
    p.dram[out * L:(out + 6) * L] = 0xEE
    p.store.append(MemInsn(OP_STORE, MEM_OUT, 0, out, 2, 2, 3))
    st = p.run()
    got = p.dram[out * L:(out + 6) * L].reshape(2, 3, L)
    low = (acc & 0xFF).astype(np.uint8).reshape(2, 2, L)
    np.testing.assert_array_equal(got[:, :2], low)
    assert (got[:, 2] == 0xEE).all()  # the pitch gap is untouched
    assert st.out_store_bytes == 4 * L


# --- tokens and timing ---------------------------------------------------------------------


def test_cycle_model_of_a_serial_program(vcfg):
    cfg = vcfg
    isa = ISA(cfg)
    dram = np.zeros(1 << 16, np.uint8)
    prog = [MemInsn(OP_LOAD, MEM_INP, 0, 0, 1, 4, 4, deps=Deps(push_next=True)),
            MemInsn(OP_LOAD, MEM_UOP, 0, 0, 1, 1, 1),
            GemmInsn(False, 0, 1, 1, 1, deps=Deps(pop_prev=True, push_next=True)),
            MemInsn(OP_STORE, MEM_OUT, 0, 0, 1, 1, 1, deps=Deps(pop_prev=True)),
            FinishInsn()]
    st = simulate(cfg, isa.encode_stream(prog), dram)
    lat, bpc = cfg.DRAM_LATENCY_CYCLES, cfg.DRAM_BYTES_PER_CYCLE
    load = lat + -(-4 * cfg.inp_entry_bytes // bpc)
    uop = lat + 1
    gemm = cfg.GEMM_CYCLES_PER_UOP + cfg.PIPELINE_LATENCY_CYCLES
    store = lat + -(-cfg.out_entry_bytes // bpc)
    assert load > uop
    assert st.cycles == load + gemm + store
    assert (st.load_busy, st.compute_busy, st.store_busy) == (load, uop + gemm + 1, store)
    assert (st.load_stall, st.compute_stall, st.store_stall) == (0, load - uop, load + gemm)
    assert (st.load_insns, st.compute_insns, st.store_insns) == (1, 3, 1)


def pipelined_matmul(cfg, tiles=6, rows=8, kb=4, nb=4, seed=0):
    """Double-buffered Y = X W^T: load tile t+1 while computing tile t and storing tile t-1."""
    rng = np.random.default_rng(seed)
    isa = ISA(cfg)
    B, BI, BO = cfg.batch, cfg.block_in, cfg.block_out
    x = rand_i8(rng, tiles * rows, kb, B, BI)
    w = rand_i8(rng, nb, kb, BO, BI)
    p = Prog(cfg)
    xb = p.put(x, cfg.inp_entry_bytes)
    wb = p.put(w, cfg.wgt_entry_bytes)
    ub = p.put(np.frombuffer(isa.encode_uops(
        [Uop(par * rows * nb, par * rows * kb + k, k) for par in range(2) for k in range(kb)]
        + [Uop(par * rows * nb, 0, 0) for par in range(2)]), np.uint8), 4)
    yb = p.alloc(tiles * rows * nb * cfg.out_entry_bytes, cfg.out_entry_bytes)
    yb //= cfg.out_entry_bytes
    prog = [MemInsn(OP_LOAD, MEM_UOP, 0, ub, 1, 2 * kb + 2, 2 * kb + 2),
            MemInsn(OP_LOAD, MEM_WGT, 0, wb, 1, nb * kb, nb * kb)]
    T = tiles
    for t in range(T):
        par = t % 2
        prog.append(MemInsn(OP_LOAD, MEM_INP, par * rows * kb, xb + t * rows * kb, rows, kb, kb,
                            deps=Deps(pop_next=t >= 2, push_next=True)))
        prog.append(GemmInsn(True, 2 * kb + par, 2 * kb + par + 1, rows, nb, dst_factor_out=nb,
                             dst_factor_in=1, deps=Deps(pop_next=t >= 2)))
        prog.append(GemmInsn(False, par * kb, (par + 1) * kb, rows, nb, dst_factor_out=nb,
                             dst_factor_in=1, src_factor_out=kb, wgt_factor_in=kb,
                             deps=Deps(pop_prev=True, push_prev=t < T - 2, push_next=True)))
        prog.append(MemInsn(OP_STORE, MEM_OUT, par * rows * nb, yb + t * rows * nb, rows, nb, nb,
                            deps=Deps(pop_prev=True, push_prev=t < T - 2)))
    prog.append(FinishInsn())
    ref = np.einsum("mkbi,nkoi->mnbo", x.astype(np.int64), w.astype(np.int64))
    return p, isa.encode_stream(prog), ref, yb


def test_pipeline_overlaps_load_compute_store(vcfg):
    cfg = vcfg
    p, stream, ref, yb = pipelined_matmul(cfg)
    st = simulate(cfg, stream, p.dram)
    e = cfg.out_entry_bytes
    got = p.dram[yb * e:yb * e + ref.size].view(np.int8).reshape(ref.shape)
    np.testing.assert_array_equal(got, ref.astype(np.int8))  # astype wraps = truncation
    assert st.cycles < st.load_busy + st.compute_busy + st.store_busy
    assert st.cycles >= max(st.load_busy, st.compute_busy, st.store_busy)
    for m in ("load", "compute", "store"):
        assert getattr(st, f"{m}_busy") + getattr(st, f"{m}_stall") <= st.cycles
    assert (st.load_insns, st.compute_insns, st.store_insns) == (7, 1 + 12 + 1, 6)
    assert st.gemm_uop_iters == 6 * 8 * 4 * 4


def test_deadlock_names_each_blocked_module_and_queue(vcfg):
    isa = ISA(vcfg)
    prog = [MemInsn(OP_LOAD, MEM_INP, 0, 0, 1, 1, 1, deps=Deps(pop_next=True, push_next=True)),
            GemmInsn(False, 0, 1, 1, 1, deps=Deps(pop_prev=True, push_prev=True)),
            FinishInsn()]
    with pytest.raises(SimulatorError, match=r"deadlock: load blocked at insn 0 \(LOAD INP\) "
                       r"waiting on G2L; compute blocked at insn 1 \(GEMM\) waiting on L2G; "
                       r"store done") as ei:
        simulate(vcfg, isa.encode_stream(prog), np.zeros(4096, np.uint8))
    assert ei.value.kind == "protocol"


def test_unbalanced_tokens_are_reported(vcfg):
    isa = ISA(vcfg)
    prog = [MemInsn(OP_LOAD, MEM_INP, 0, 0, 1, 1, 1, deps=Deps(push_next=True)),
            MemInsn(OP_LOAD, MEM_INP, 0, 0, 1, 1, 1, deps=Deps(push_next=True)),
            FinishInsn(deps=Deps(push_next=True))]
    with pytest.raises(SimulatorError, match="unbalanced tokens: 2 left in L2G, 1 left in G2S"):
        simulate(vcfg, isa.encode_stream(prog), np.zeros(4096, np.uint8))


def test_missing_finish_and_instructions_after_finish(vcfg):
    isa = ISA(vcfg)
    dram = np.zeros(4096, np.uint8)
    nop = MemInsn(OP_LOAD, MEM_UOP, 0, 0, 0, 0, 0)
    with pytest.raises(SimulatorError, match="no FINISH instruction"):
        simulate(vcfg, isa.encode_stream([nop]), dram)
    with pytest.raises(SimulatorError, match="no FINISH instruction"):
        simulate(vcfg, b"", dram)
    with pytest.raises(SimulatorError, match=r"insn 1 \(LOAD UOP\): instruction after FINISH"):
        simulate(vcfg, isa.encode_stream([FinishInsn(), nop]), dram)


def test_module_flag_misuse_and_finish_pop_are_rejected(vcfg):
    isa = ISA(vcfg)
    dram = np.zeros(4096, np.uint8)
    cases = [
        (MemInsn(OP_LOAD, MEM_WGT, 0, 0, 1, 1, 1, deps=Deps(pop_prev=True)),
         r"insn 0 \(LOAD WGT\): field pop_prev is set, the load module"),
        (MemInsn(OP_STORE, MEM_OUT, 0, 0, 1, 1, 1, deps=Deps(push_next=True)),
         r"insn 0 \(STORE\): field push_next is set, the store module"),
    ]
    for insn, msg in cases:
        with pytest.raises(SimulatorError, match=msg):
            simulate(vcfg, isa.encode_stream([insn, FinishInsn()]), dram)
    with pytest.raises(SimulatorError, match=r"insn 0 \(FINISH\): field pop_next is set"):
        simulate(vcfg, isa.encode_stream([FinishInsn(deps=Deps(pop_next=True))]), dram)


# --- decoding and bounds errors ------------------------------------------------------------


def raw(w0, w1=0):
    return np.array([w0, w1], dtype="<u8").tobytes()


def test_unknown_opcode_memory_type_and_alu_opcode(vcfg):
    isa = ISA(vcfg)
    fin = isa.encode_stream([FinishInsn()])
    dram = np.zeros(4096, np.uint8)
    with pytest.raises(SimulatorError, match="insn 0: unknown opcode 6") as ei:
        simulate(vcfg, raw(6) + fin, dram)
    assert ei.value.kind == "decode"
    with pytest.raises(SimulatorError, match=r"insn 0 \(LOAD \?7\): unknown memory_type 7"):
        simulate(vcfg, raw(0 | (7 << 7)) + fin, dram)
    with pytest.raises(SimulatorError, match=r"memory_type 4 \(OUT\) cannot be loaded"):
        simulate(vcfg, isa.encode_stream([MemInsn(OP_LOAD, MEM_OUT, 0, 0, 1, 1, 1)]) + fin, dram)
    with pytest.raises(SimulatorError, match=r"insn 0 \(STORE INP\): memory_type 2 \(INP\)"):
        simulate(vcfg, isa.encode_stream([MemInsn(OP_STORE, MEM_INP, 0, 0, 1, 1, 1)]) + fin,
                 dram)
    with pytest.raises(SimulatorError, match=r"field x_pad_1 = 2, STORE takes no padding"):
        simulate(vcfg, isa.encode_stream([MemInsn(OP_STORE, MEM_OUT, 0, 0, 1, 1, 1,
                                                  x_pad_1=2)]) + fin, dram)
    w0, w1 = isa.encode(AluInsn(ALU_ADD, 0, 1, 1, 1))
    lo = 2 * vcfg.log_acc_depth + 2 * vcfg.log_inp_depth
    with pytest.raises(SimulatorError, match=r"insn 0 \(ALU \?6\): unknown alu_opcode 6"):
        simulate(vcfg, raw(w0, w1 | (6 << lo)) + fin, dram)


def expect_bounds(cfg, prog, pattern, dram_size=1 << 16):
    isa = ISA(cfg)
    with pytest.raises(SimulatorError, match=pattern) as ei:
        simulate(cfg, isa.encode_stream(prog + [FinishInsn()]), np.zeros(dram_size, np.uint8))
    assert ei.value.kind == "bounds"
    return str(ei.value)


def test_dram_range_errors_name_the_range(vcfg):
    e = vcfg.inp_entry_bytes
    msg = expect_bounds(vcfg, [MemInsn(OP_LOAD, MEM_INP, 0, 10, 2, 3, 4)],
                        rf"insn 0 \(LOAD INP\): DRAM range \[{10 * e}, {17 * e}\) exceeds DRAM "
                        rf"size {17 * e - 1}", dram_size=17 * e - 1)
    assert "x_stride 4" in msg
    expect_bounds(vcfg, [MemInsn(OP_STORE, MEM_OUT, 0, 2**32 - 1, 1, 1, 1)],
                  r"insn 0 \(STORE\): DRAM range")
    expect_bounds(vcfg, [MemInsn(OP_LOAD, MEM_ACC_8BIT, 0, 4096, 1, 1, 1)],
                  r"insn 0 \(LOAD ACC8\): DRAM range")


def test_sram_range_errors_include_padding(vcfg):
    d = vcfg.inp_depth
    expect_bounds(vcfg, [MemInsn(OP_LOAD, MEM_INP, d - 6, 0, 1, 4, 4, x_pad_0=1, x_pad_1=1,
                                 y_pad_1=1)],
                  rf"insn 0 \(LOAD INP\): SRAM block \[{d - 6}, {d + 6}\) exceeds INP depth {d}")
    expect_bounds(vcfg, [MemInsn(OP_LOAD, MEM_WGT, vcfg.wgt_depth - 1, 0, 1, 2, 2)],
                  "exceeds WGT depth")
    expect_bounds(vcfg, [MemInsn(OP_LOAD, MEM_UOP, vcfg.uop_depth - 1, 0, 2, 1, 1)],
                  "exceeds UOP depth")
    expect_bounds(vcfg, [MemInsn(OP_STORE, MEM_OUT, vcfg.acc_depth - 3, 0, 2, 2, 2)],
                  r"insn 0 \(STORE\): SRAM range .* exceeds OUT/ACC depth")


def test_uop_and_index_range_errors_name_the_field(vcfg):
    cfg = vcfg
    isa = ISA(cfg)
    ub = np.frombuffer(isa.encode_uops([Uop(3, 2, 1)]), np.uint8)
    load_uop = MemInsn(OP_LOAD, MEM_UOP, 0, 0, 1, 1, 1)

    def run(insn, pattern):
        dram = np.zeros(4096, np.uint8)
        dram[:4] = ub
        with pytest.raises(SimulatorError, match=pattern):
            simulate(cfg, isa.encode_stream([load_uop, insn, FinishInsn()]), dram)

    run(GemmInsn(False, 0, cfg.uop_depth + 1, 1, 1),
        rf"insn 1 \(GEMM\): uop_end {cfg.uop_depth + 1} exceeds UOP depth {cfg.uop_depth}")
    a = cfg.acc_depth
    run(GemmInsn(False, 0, 1, 3, 1, dst_factor_out=a // 2),
        rf"insn 1 \(GEMM\): dst index {3 + a} exceeds ACC depth {a} \(uop 0 dst_idx 3 \+ "
        rf"dst_factor_out {a // 2} x 2")
    run(GemmInsn(False, 0, 1, 1, 2, src_factor_in=cfg.inp_depth - 2),
        rf"src index {cfg.inp_depth} exceeds INP depth")
    run(GemmInsn(False, 0, 1, 2, 1, wgt_factor_out=cfg.wgt_depth - 1),
        rf"wgt index {cfg.wgt_depth} exceeds WGT depth")
    run(AluInsn(ALU_ADD, 0, 1, 1, 2, src_factor_in=cfg.acc_depth - 2),
        r"insn 1 \(ALU ADD\): src index .* exceeds ACC depth")
    # a reset GEMM reads no INP/WGT and an immediate ALU no src: those indices are not checked
    dram = np.zeros(4096, np.uint8)
    dram[:4] = ub
    simulate(cfg, isa.encode_stream([
        load_uop, GemmInsn(True, 0, 1, 1, 2, src_factor_in=cfg.inp_depth - 1),
        AluInsn(ALU_ADD, 0, 1, 1, 2, src_factor_in=cfg.acc_depth - 1, use_imm=True),
        FinishInsn()]), dram)


def test_cycle_budget_stops_long_programs(vcfg):
    isa = ISA(vcfg)
    prog = [GemmInsn(False, 0, 1, 1000, 1000), FinishInsn()]
    with pytest.raises(SimulatorError, match=r"insn 0 \(GEMM\): cycle budget of 5000 cycles"
                       ) as ei:
        simulate(vcfg, isa.encode_stream(prog), np.zeros(16, np.uint8), max_cycles=5000)
    assert ei.value.kind == "budget"
    st = simulate(vcfg, isa.encode_stream(prog), np.zeros(16, np.uint8), max_cycles=10**7)
    assert st.cycles == 10**6 * vcfg.GEMM_CYCLES_PER_UOP + vcfg.PIPELINE_LATENCY_CYCLES + 1


# --- binding -------------------------------------------------------------------------------


def test_binding_validates_arguments(vcfg):
    fin = ISA(vcfg).encode_stream([FinishInsn()])
    with pytest.raises(SimulatorError, match="dtype uint8"):
        simulate(vcfg, fin, np.zeros(16, np.int8))
    with pytest.raises(SimulatorError, match="C-contiguous"):
        simulate(vcfg, fin, np.zeros(32, np.uint8)[::2])
    ro = np.zeros(16, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(SimulatorError, match="writable"):
        simulate(vcfg, fin, ro)
    with pytest.raises(SimulatorError, match="not a multiple of 16"):
        simulate(vcfg, fin + b"\0", np.zeros(16, np.uint8))
    with pytest.raises(SimulatorError, match="config: field LOG_BATCH: 7"):
        simulate(dataclasses.replace(vcfg, LOG_BATCH=7), fin, np.zeros(16, np.uint8))
    with pytest.raises(SimulatorError, match="config: field DRAM_BYTES_PER_CYCLE"):
        simulate(dataclasses.replace(vcfg, DRAM_BYTES_PER_CYCLE=float("nan")), fin,
                 np.zeros(16, np.uint8))
    assert simulate(vcfg, bytearray(fin), np.zeros(0, np.uint8)).cycles == 1


def test_stats_add_sums_every_field():
    a = VTAStats(*range(1, 19))
    b = VTAStats(*range(100, 118))
    s = a + b
    assert [getattr(s, f.name) for f in dataclasses.fields(s)] == [
        x + y for x, y in zip(range(1, 19), range(100, 118), strict=True)]
    assert sum([a, b], VTAStats()) == s


def test_trace_has_one_event_per_insn_on_three_tracks(tmp_path):
    cfg = load_config("vta_1x16x16")
    p, stream, _, _ = pipelined_matmul(cfg)
    path = str(tmp_path / "trace.json")
    st1 = simulate(cfg, stream, p.dram.copy(), trace_path=path)
    doc = json.loads(open(path).read())
    ev = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert names == {0: "load", 1: "compute", 2: "store"}
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == len(stream) // 16
    assert {e["tid"] for e in xs} == {0, 1, 2}
    assert {e["name"] for e in xs} >= {"LOAD UOP", "LOAD WGT", "LOAD INP", "GEMM", "STORE",
                                       "FINISH"}
    end = max(e["ts"] + e["dur"] for e in xs)
    assert end == pytest.approx(st1.cycles / cfg.CLOCK_MHZ, rel=1e-6)
    gemm = next(e for e in xs if e["name"] == "GEMM")
    assert gemm["dur"] == pytest.approx(gemm["args"]["cycles"] / cfg.CLOCK_MHZ)
    # a second run appended after the first, shifted by its duration
    off = st1.time_us(cfg)
    simulate(cfg, stream, p.dram.copy(), trace_path=path, trace_offset_us=off, trace_append=True)
    xs2 = [e for e in json.loads(open(path).read())["traceEvents"] if e["ph"] == "X"]
    assert len(xs2) == 2 * len(xs)
    assert min(e["ts"] for e in xs2[len(xs):]) == pytest.approx(off)
    # overwriting starts a fresh trace
    simulate(cfg, stream, p.dram.copy(), trace_path=path)
    assert len([e for e in json.loads(open(path).read())["traceEvents"] if e["ph"] == "X"]) == \
        len(xs)


# --- fuzzing -------------------------------------------------------------------------------

FUZZ_CASES = 2000


def _base_programs(cfg):
    """A few valid (stream, dram) pairs to mutate."""
    out = []
    p, stream, _, _ = pipelined_matmul(cfg, tiles=3, rows=2, kb=2, nb=2)
    out.append((stream, p.dram[: max(p.top, 1)].copy()))
    rng = np.random.default_rng(7)
    p = Prog(cfg, dram_size=1 << 14)
    p.load_acc(rng.integers(-1000, 1000, size=(4, cfg.batch * cfg.block_out)))
    p.load_uops([Uop(0, 1), Uop(1, 2)])
    for op in range(5):
        p.compute.append(AluInsn(op, 0, 2, 2, 1, dst_factor_out=2, src_factor_out=1,
                                 use_imm=op % 2 == 0, imm=-3))
    res = p.read_acc(4)  # noqa: F841
    out.append((p.stream(), p.dram[: p.top].copy()))
    return out


MUTATORS = [fuzz.flip_bits, fuzz.random_words(8), fuzz.truncate(16), fuzz.random_stream(16),
            fuzz.reorder(16), fuzz.byte_ff]


def _fuzz_case(seed: int, rng: np.random.Generator) -> None:
    name = CONFIGS[seed % 2]
    cfg = load_config(name)
    stream, dram = _fuzz_bases(name)[int(rng.integers(0, len(_fuzz_bases(name))))]
    stream = fuzz.mutate(rng, stream, MUTATORS)
    dram = fuzz.maybe_truncate(rng, dram)
    simulate(cfg, stream, dram.copy(), max_cycles=200_000)


@functools.cache
def _fuzz_bases(name: str):
    return _base_programs(load_config(name))


def test_fuzzed_streams_fail_cleanly_or_run():
    """Mutated streams end in success or SimulatorError; a crash names the seed."""
    ok, err = fuzz.run_worker(__file__, FUZZ_CASES)
    assert ok + err == FUZZ_CASES and ok > 0 and err > 0


if __name__ == "__main__":
    fuzz.worker_main(_fuzz_case, sys.argv)
