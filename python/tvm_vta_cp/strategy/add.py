"""Residual add on VTA: both operands loaded into ACC (``ACC_8BIT``), ``MUL ma; MUL mb; ADD``
on the ALU, then the requantize tail; tiles alternate between two ACC halves when they fit."""

from __future__ import annotations

from tvm_accel.errors import MappingError
from tvm_accel.layers import AddLayer, layer_shape_text
from tvm_vta_cp.codegen import (
    ALU_ADD,
    ALU_MUL,
    MEM_ACC_8BIT,
    MEM_OUT,
    OP_LOAD,
    OP_STORE,
    MemInsn,
)
from tvm_vta_cp.layout import cdiv, dims4
from tvm_vta_cp.program import LayerProgram
from tvm_vta_cp.strategy.alu_tail import VectorLoads, add_numerics, n_vec, vector_image
from tvm_vta_cp.strategy.emitter import Emitter, emit_layer, emit_tail
from tvm_vta_cp.strategy.geometry import segs
from tvm_vta_cp.strategy.knobs import knob_space, layer_knobs
from tvm_vta_cp.strategy.placement import DramTensor, PlanContext


def add(ctx: PlanContext, layer: AddLayer, user_knobs: dict | None) -> LayerProgram:
    cfg, name = ctx.cfg, layer.name
    pa, pb_ = (ctx.placements[n] for n in layer.inputs)
    pout = ctx.placements[layer.output]
    if tuple(pa.shape) != tuple(pout.shape) or tuple(pb_.shape) != tuple(pout.shape):
        raise MappingError(f"layer {name}: add operands {pa.shape} and {pb_.shape} must "
                           f"both have the output shape {pout.shape}")
    N, C, H, W = dims4(pout.shape)
    ma, mb, ops = add_numerics(layer, (pa.dtype, pb_.dtype), pout.dtype, C)
    space = knob_space(layer, pout.shape, cfg, _ctx=(None, ops))
    kn = layer_knobs(space, user_knobs, name)
    tb, tc, th, tw = kn["tile_b"], kn["tile_co"], kn["tile_h"], kn["tile_w"]
    vdata, vidx = vector_image(ops, C, cfg)
    nvec = n_vec(ops)
    NB, CB = cdiv(N, cfg.batch), cdiv(C, cfg.block_out)
    vbase_dram = ctx.dram.const(vdata) // cfg.acc_entry_bytes if nvec else 0
    ta, tbg, tout = DramTensor(pa, cfg), DramTensor(pb_, cfg), DramTensor(pout, cfg)
    nmax = tb * tc * th * tw
    nthr = 2 if 2 * (2 * nmax + nvec * tc) <= cfg.acc_depth else 1
    acc_h = cfg.acc_depth // nthr
    tiles = [(b, c, h, w) for b in segs(NB, tb) for c in segs(CB, tc)
             for h in segs(H, th) for w in segs(W, tw)]
    def body(em: Emitter):
        vectors = VectorLoads(nvec, CB)
        for i, ((b0, nb), (c0, nc), (h0, nh), (w0, nw)) in enumerate(tiles):
            half = i % nthr
            abase = half * acc_h
            bbase, vbase = abase + nmax, abase + 2 * nmax
            n, S = nb * nc * nh * nw, nh * nw
            vectors.load(em, half, vbase, vbase_dram + c0, nc)
            first = None
            for tg, base in ((ta, abase), (tbg, bbase)):
                for so, de, y, x, st in tg.region(b0, nb, c0, nc, tg.ht + h0, nh,
                                                  tg.hl + w0, nw):
                    ld = em.emit(MemInsn(OP_LOAD, MEM_ACC_8BIT, base + so, de, y, x, st))
                    first = first or ld
            em.acc_acquire(half, first)
            if ma != 1:
                em.alu(ALU_MUL, ((n, 1, 0, 0),), (abase, 0), ma)
            if mb != 1:
                em.alu(ALU_MUL, ((n, 1, 0, 0),), (bbase, 0), mb)
            last = em.alu(ALU_ADD, ((n, 1, 1, 0),), (abase, bbase), None)
            last = emit_tail(em, ops, vidx, n, nb, nc, S, abase, vbase) or last
            em.compute_done(last)
            sts = [MemInsn(OP_STORE, MEM_OUT, abase + so, de, y, x, st)
                   for so, de, y, x, st in tout.region(b0, nb, c0, nc, tout.ht + h0, nh,
                                                        tout.hl + w0, nw)]
            em.store_group(half, sts)

    insns = emit_layer(cfg, ctx.isa, ctx.dram, name, body)
    return LayerProgram(name, "add", insns, len(insns) // 16, 0, 0,
                        layer_shape_text(layer, [pout.shape, pout.shape], pout.shape), dict(kn))
