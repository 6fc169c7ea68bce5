"""Element-wise layers on VTA's ALU: the squeeze-excitation product and LeakyReLU.

Both load their operands into ACC (``LOAD ACC_8BIT``), compute on the int32 lanes and STORE:

- **product** (``MulLayer``, ``y = requant((a - za) * (b - zb))``): ``ADD -za'`` and ``ADD -zb'``,
  ``MUL`` of the two ACC operands, then the requantize tail (``alu_tail``). The gate ``b`` of a
  squeeze-excitation block is ``(N, C, 1, 1)``: one ACC entry per channel block, read by every
  pixel of the tile (the micro-op's source index steps per channel block only).
- **LeakyReLU** (``LutLayer`` whose table :func:`~tvm_vta_cp.alu_activation.fit_leaky`
  reproduces): the input loaded twice, ``MUL m_pos; ADD c_pos`` on one copy, ``MUL m_neg; ADD
  c_neg`` on the other, ``MAX`` of the two, ``SHR``, the clip. Any other table has no ALU form
  (VTA has no lookup) and stays on the CPU.

Tiles alternate between the two ACC halves, as the residual add's do.
"""

from __future__ import annotations

import numpy as np

from tvm_accel.errors import MappingError
from tvm_accel.layers import LutLayer, MulLayer
from tvm_vta_cp.alu_activation import CODES, fit_leaky
from tvm_vta_cp.codegen import (
    ALU_ADD,
    ALU_MAX,
    ALU_MIN,
    ALU_MUL,
    ALU_SHR,
    MEM_ACC_8BIT,
    MEM_OUT,
    OP_LOAD,
    OP_STORE,
    MemInsn,
)
from tvm_vta_cp.layout import cdiv, dims4, stored_offset
from tvm_vta_cp.program import LayerProgram
from tvm_vta_cp.strategy.alu_tail import AluOp, VectorLoads, n_vec, requant_tail, vector_image
from tvm_vta_cp.strategy.emitter import Emitter, emit_layer, emit_tail
from tvm_vta_cp.strategy.geometry import segs
from tvm_vta_cp.strategy.placement import DramTensor, PlanContext

__all__ = ["lut_on_alu", "multiply"]


def _tiles(ctx: PlanContext, shape, per_pixel: int, per_block: int) -> list[tuple]:
    """Output tiles ``((b0, nb), (c0, nc), (h0, nh), (w0, nw))`` whose ACC operands
    (``per_pixel`` entries per tile pixel, ``per_block`` per channel block) fit half of ACC."""
    cfg = ctx.cfg
    N, C, H, W = dims4(shape)
    half = cfg.acc_depth // 2
    tw = min(W, max(1, (half - per_block) // per_pixel))
    th = min(H, max(1, (half - per_block) // (per_pixel * tw)))
    tc = min(cdiv(C, cfg.block_out), max(1, half // (per_pixel * th * tw + per_block)))
    if per_pixel * th * tw * tc + per_block * tc > half:
        raise MappingError("an ALU tile of one row does not fit half of ACC")
    return [(b, c, h, w) for b in segs(cdiv(N, cfg.batch), 1)
            for c in segs(cdiv(C, cfg.block_out), tc) for h in segs(H, th) for w in segs(W, tw)]


def _load(em: Emitter, t: DramTensor, base: int, b0, nb, c0, nc, h0, nh, w0, nw):
    """``LOAD ACC_8BIT`` of a dense block of ``t`` at ACC ``base``; returns the first LOAD."""
    first = None
    for so, de, y, x, st in t.region(b0, nb, c0, nc, t.ht + h0, nh, t.hl + w0, nw):
        ld = em.emit(MemInsn(OP_LOAD, MEM_ACC_8BIT, base + so, de, y, x, st))
        first = first or ld
    return first


def _run(ctx: PlanContext, name: str, op: str, pout, operands: list, per_block: int,
         vdata: bytes, nvec: int, compute) -> LayerProgram:
    """The tile loop: ``operands`` are ``(DramTensor, full)`` (``full``: one entry per pixel,
    else one per channel block) loaded into ACC one after the other (vectors after them), then
    ``compute(em, bases, vbase, nb, nc, S)`` returns the last ALU op; the result (at the first
    operand's base) is stored."""
    cfg = ctx.cfg
    tout = DramTensor(pout, cfg)
    per_pixel = sum(1 for _, full in operands if full)
    tiles = _tiles(ctx, pout.shape, per_pixel, per_block + nvec)
    CB = cdiv(dims4(pout.shape)[1], cfg.block_out)
    vbase_dram = ctx.dram.const(vdata) // cfg.acc_entry_bytes if nvec else 0
    half_depth = cfg.acc_depth // 2

    def body(em: Emitter):
        vectors = VectorLoads(nvec, CB)
        for i, ((b0, nb), (c0, nc), (h0, nh), (w0, nw)) in enumerate(tiles):
            half = i % 2
            base, bases, first = half * half_depth, [], None
            for t, full in operands:
                bases.append(base)
                ld = _load(em, t, base, b0, nb, c0, nc, h0 if full else 0, nh if full else 1,
                           w0 if full else 0, nw if full else 1)
                first = first or ld
                base += nb * nc * (nh * nw if full else 1)
            vbase = base
            vectors.load(em, half, vbase, vbase_dram + c0, nc)
            em.acc_acquire(half, first)
            em.compute_done(compute(em, bases, vbase, nb, nc, nh * nw))
            em.store_group(half, [
                MemInsn(OP_STORE, MEM_OUT, bases[0] + so, de, y, x, st)
                for so, de, y, x, st in tout.region(b0, nb, c0, nc, tout.ht + h0, nh,
                                                    tout.hl + w0, nw)])

    insns = emit_layer(cfg, ctx.isa, ctx.dram, name, body)
    shape = "x".join(map(str, pout.shape))
    return LayerProgram(name, op, insns, len(insns) // 16, 0, 0, f"-> {shape}", {})


def multiply(ctx: PlanContext, layer: MulLayer) -> LayerProgram:
    """``requant((a - za) * (b - zb))``; ``b`` (or ``a``) may be a per-channel ``(N, C, 1, 1)``
    gate broadcast over the other's pixels."""
    name = layer.name
    pa, pb = (ctx.placements[t] for t in layer.inputs)
    pout = ctx.placements[layer.output]
    za = int(layer.a_zero_point) + stored_offset(pa.dtype)
    zb = int(layer.b_zero_point) + stored_offset(pb.dtype)
    full_shape = dims4(pout.shape)
    if dims4(pa.shape) != full_shape:  # the gate first: swap so that a is the feature map
        (pa, za), (pb, zb) = (pb, zb), (pa, za)
    sa, sb = dims4(pa.shape), dims4(pb.shape)
    gate = sb != full_shape
    if sa != full_shape or (gate and sb != full_shape[:2] + (1, 1)):
        raise MappingError(f"layer {name}: product of {pa.shape} and {pb.shape}: VTA's ALU "
                           "multiplies equal shapes or a map by an (N, C, 1, 1) gate")
    k = full_shape[1]
    corners = [x * y for x in (-128 - za, 127 - za) for y in (-128 - zb, 127 - zb)]
    ops = requant_tail(np.full(k, min(corners), np.int64), np.full(k, max(corners), np.int64),
                       np.zeros(k, np.int64), layer.requant, pout.dtype, k, f"layer {name}")
    vdata, vidx = vector_image(ops, k, ctx.cfg)
    cfg = ctx.cfg

    def compute(em: Emitter, bases, vbase, nb, nc, S):
        n = nb * nc * S
        a, b = bases
        nbv = nb * nc * (1 if gate else S)
        if za:
            em.alu(ALU_ADD, ((n, 1, 0, 0),), (a, 0), -za)
        if zb:
            em.alu(ALU_ADD, ((nbv, 1, 0, 0),), (b, 0), -zb)
        dims = ((nb, nc * S, nc, 0), (nc, S, 1, 0), (S, 1, 0, 0)) if gate else ((n, 1, 1, 0),)
        last = em.alu(ALU_MUL, dims, (a, b), None)
        return emit_tail(em, ops, vidx, n, nb, nc, S, a, vbase) or last

    operands = [(DramTensor(pa, cfg), True), (DramTensor(pb, cfg), not gate)]
    return _run(ctx, name, "multiply", pout, operands, 1 if gate else 0, vdata, n_vec(ops),
                compute)


def lut_on_alu(ctx: PlanContext, layer: LutLayer) -> LayerProgram:
    """A LeakyReLU table as two lines and a MAX (module docstring); any other table raises
    :class:`MappingError` (VTA's ALU has no lookup)."""
    name, cfg = layer.name, ctx.cfg
    pin, pout = ctx.placements[layer.input], ctx.placements[layer.output]
    table = np.asarray(layer.table)
    form = fit_leaky(table, pin.dtype, pout.dtype) if table.shape[0] == 1 else None
    if form is None:
        raise MappingError(f"layer {name}: VTA's ALU has no table lookup (MIN, MAX, ADD, SHR, "
                           "MUL only) and this table is no LeakyReLU it composes exactly")
    k = dims4(pout.shape)[1]

    def full(v: int) -> np.ndarray:
        return np.full(k, v, dtype=np.int64)

    pos = [AluOp(ALU_MUL, full(form.m_pos)), AluOp(ALU_ADD, full(form.c_pos))]
    neg = [AluOp(ALU_MUL, full(form.m_neg)), AluOp(ALU_ADD, full(form.c_neg))]
    pre = np.maximum(*form.lines(CODES)) >> form.shift
    tail = [AluOp(ALU_SHR, full(form.shift))] if form.shift else []
    if pre.min() < -128:
        tail.append(AluOp(ALU_MAX, full(-128)))
    if pre.max() > 127:
        tail.append(AluOp(ALU_MIN, full(127)))
    vdata, vidx = vector_image(pos + neg + tail, k, cfg)
    vp, vn, vt = vidx[:2], vidx[2:4], vidx[4:]

    def compute(em: Emitter, bases, vbase, nb, nc, S):
        n = nb * nc * S
        a, b = bases
        emit_tail(em, pos, vp, n, nb, nc, S, a, vbase)
        emit_tail(em, neg, vn, n, nb, nc, S, b, vbase)
        last = em.alu(ALU_MAX, ((n, 1, 1, 0),), (a, b), None)
        return emit_tail(em, tail, vt, n, nb, nc, S, a, vbase) or last

    tin = DramTensor(pin, cfg)
    return _run(ctx, name, "alu_activation", pout, [(tin, True), (tin, True)], 0, vdata,
                sum(v is not None for v in vidx), compute)
