"""Conv2d and dense on VTA: TVM's ``conv2d_packed`` / ``dense_packed`` template.

An output tile is accumulated in ACC over input-channel chunks (one LOAD of the input tile with
its halo, one of the weight tile, ONE GEMM per chunk), then the requantize tail runs on the ALU
and the tile is stored; dilation, groups and virtual threads as in ``docs/vta.md``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tvm_accel.layers import ConvLayer, SubConv, layer_shape_text
from tvm_vta_cp.codegen import (
    MAX_FIELD16,
    MEM_INP,
    MEM_OUT,
    MEM_WGT,
    OP_LOAD,
    OP_STORE,
    MemInsn,
)
from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.layout import cdiv, pack_weight
from tvm_vta_cp.program import LayerProgram
from tvm_vta_cp.strategy.alu_tail import (
    VectorLoads,
    alu_ops,
    bias_input,
    bias_lanes,
    conv_numerics,
    gemm_bias,
    n_vec,
    vector_image,
)
from tvm_vta_cp.strategy.emitter import Emitter, emit_layer, emit_tail
from tvm_vta_cp.strategy.geometry import ConvGeom, conv_geom, segs
from tvm_vta_cp.strategy.knobs import conv_cost, conv_tile_extents, knob_space, layer_knobs, threads
from tvm_vta_cp.strategy.placement import DramTensor, PlanContext


def _grouped_weight_image(weight: np.ndarray, g: ConvGeom) -> tuple[bytes, list[int]]:
    """OIHWoi blocks of a grouped conv's block-diagonal dense weight, keeping per output-channel
    block ``j`` only the input-channel blocks ``g.ci_range(j)`` (the others are all zero):
    ``[j][ci][KH][KW][BLOCK_OUT][BLOCK_IN]``, blocks of consecutive ``j`` back to back. Returns
    the bytes and the first WGT entry of each ``j``."""
    BLK, kg, cg = g.blk, g.K // g.groups, g.C // g.groups
    w = np.asarray(weight).astype(np.int8)
    parts, offsets, off = [], [], 0
    for j in range(g.KB):
        lo, hi = g.ci_range(j)
        slab = np.zeros((BLK, (hi - lo) * BLK, g.KH, g.KW), dtype=np.int8)
        for kl in range(min(BLK, g.K - j * BLK)):
            k = j * BLK + kl
            c0 = (k // kg) * cg - lo * BLK
            slab[kl, c0:c0 + cg] = w[k]
        parts.append(slab.reshape(BLK, hi - lo, BLK, g.KH, g.KW).transpose(1, 3, 4, 0, 2))
        offsets.append(off)
        off += (hi - lo) * g.KK
    return np.ascontiguousarray(np.concatenate(parts)).tobytes(), offsets


def _grouped_wgt_runs(g: ConvGeom, woff: list[int], co0: int, nco: int, ci0: int,
                      nci: int) -> list[tuple[int, int, int]]:
    """WGT loads ``(sram offset, dram offset, entries)`` of a grouped conv's chunk: the blocks of
    :meth:`ConvGeom.pairs` in order, runs adjacent in DRAM merged into one transfer."""
    runs: list[list[int]] = []
    sram = 0
    for j in range(co0, co0 + nco):
        lo, hi = g.ci_range(j)
        a, b = max(lo, ci0), min(hi, ci0 + nci)
        if a >= b:
            continue
        de, x = woff[j] + (a - lo) * g.KK, (b - a) * g.KK
        if runs and runs[-1][1] + runs[-1][2] == de and runs[-1][2] + x <= MAX_FIELD16:
            runs[-1][2] += x
        else:
            runs.append([sram, de, x])
        sram += x
    return [(so, de, x) for so, de, x in runs]


def conv_macs(g: ConvGeom, cfg: VTAConfig) -> tuple[int, int]:
    """(MACs, MACs incl. the padded lanes and zero weight blocks VTA multiplies) of a conv."""
    macs = g.N * g.K * (g.C // g.groups) * g.Ho * g.Wo * g.KK
    nblocks = sum(hi - lo for lo, hi in map(g.ci_range, range(g.KB)))  # (co, ci) blocks
    return macs, g.NB * cfg.batch * cfg.block_out * nblocks * cfg.block_out * g.Ho * g.Wo * g.KK


def _weight_image(weight: np.ndarray, g: ConvGeom, blk: int) -> tuple[bytes, list[int]]:
    """OIHWoi weight bytes; grouped: only the non-zero blocks and the first WGT entry of each
    output-channel block."""
    if g.grouped:
        return _grouped_weight_image(weight, g)
    return pack_weight(weight, g.KB, g.CB, blk), []


def _tile_order(order: str, b_s, co_s, h_s, w_s):
    if order == "h_inner":
        return [(b, co, h, w) for co in co_s for b in b_s for w in w_s for h in h_s]
    if order == "co_inner":
        return [(b, co, h, w) for b in b_s for h in h_s for w in w_s for co in co_s]
    return [(b, co, h, w) for co in co_s for b in b_s for h in h_s for w in w_s]


def _tiles(g: ConvGeom, cfg: VTAConfig, kn: dict, nops: int, nvec: int,
           gbias: bool = False) -> list[tuple]:
    """Output tiles ``((b0, nb), (co0, nco), (h0, nh), (w0, nw))`` in emission order: the
    virtual threads' axis innermost, else the cheaper of co-outer / co-inner (cost model)."""
    tb, tco, tci, th, tw = conv_tile_extents(g, kn)
    _, axis = threads(kn)
    if axis == "co":
        order = "co_inner"
    elif axis == "h":
        order = "h_inner"
    else:
        c_out = conv_cost(g, cfg, nops, nvec, tb, tco, tci, th, tw, 1, "co_outer", gbias=gbias)
        c_in = conv_cost(g, cfg, nops, nvec, tb, tco, tci, th, tw, 1, "co_inner", gbias=gbias)
        order = "co_inner" if c_in < c_out else "co_outer"
    return _tile_order(order, segs(g.NB, tb), segs(g.KB, tco), segs(g.Ho, th), segs(g.Wo, tw))


def conv(ctx: PlanContext, layer: ConvLayer, user_knobs: dict | None,
         use_halo: bool) -> LayerProgram:
    """A conv or dense layer's stream (the static template)."""
    g, kn, body = conv_body(ctx, layer, user_knobs, use_halo)
    insns = emit_layer(ctx.cfg, ctx.isa, ctx.dram, layer.name, body)
    macs, padded = conv_macs(g, ctx.cfg)
    shape = layer_shape_text(layer, [ctx.placements[layer.input].shape],
                             ctx.placements[layer.output].shape)
    return LayerProgram(layer.name, "dense" if g.dense else "conv2d", insns,
                        len(insns) // 16, macs, padded, shape, dict(kn))


def conv_body(ctx: PlanContext, layer: ConvLayer, user_knobs: dict | None, use_halo: bool,
              output: str | None = None, sub: SubConv | None = None,
              strides: tuple[int, int] = (1, 1)
              ) -> tuple[ConvGeom, dict, Callable[[Emitter], None]]:
    """``(geometry, knobs, body)`` of a conv: ``body(emitter)`` emits its tiles. With
    ``sub`` (a phase of a transpose conv with ``strides`` writing tensor ``output``) only
    the phase's window is computed, its pixels stored to every ``strides``-th row/column
    of ``output`` from the phase's offset."""
    cfg, name = ctx.cfg, layer.name
    pin, pout = ctx.placements[layer.input], ctx.placements[output or layer.output]
    g = conv_geom(layer, pin.shape, cfg, sub, strides)
    orow, ocol = sub.offset if sub is not None else (0, 0)
    zxp, ops = conv_numerics(layer, pin.dtype, pout.dtype, cfg)
    space = knob_space(layer, pin.shape, cfg, _ctx=(g, ops))
    kn = layer_knobs(space, user_knobs, name)
    nthr, _ = threads(kn)
    tb, tco, tci, th, tw = conv_tile_extents(g, kn)
    KK = g.KK
    wdata, woff = _weight_image(np.asarray(layer.weight), g, cfg.block_out)
    wbase_dram = ctx.dram.const(wdata) // cfg.wgt_entry_bytes
    vdata, vidx = vector_image(ops, g.K, cfg)
    nvec = n_vec(ops)
    vbase_dram = ctx.dram.const(vdata) // cfg.acc_entry_bytes if nvec else 0
    gb = gemm_bias(ops)
    if gb is not None:  # bias lanes: one constant INP entry, one WGT block per output block
        bw = np.zeros((g.KB * cfg.block_out, cfg.block_in), dtype=np.int8)
        bw[:g.K] = bias_lanes(gb.values, cfg.block_in)
        bwgt_dram = ctx.dram.const(bw.tobytes()) // cfg.wgt_entry_bytes
        binp_dram = ctx.dram.const(bias_input(cfg)) // cfg.inp_entry_bytes
    tin, tout = DramTensor(pin, cfg), DramTensor(pout, cfg)
    inp_h, wgt_h, acc_h = cfg.inp_depth // nthr, cfg.wgt_depth // nthr, cfg.acc_depth // nthr
    nmax = tb * tco * th * tw
    # input-channel chunks (ci0, nci) of each output-channel tile
    co_chunks = {co: g.chunks(co[0], co[1], tci) for co in segs(g.KB, tco)}
    tiles = _tiles(g, cfg, kn, len(alu_ops(ops)), nvec, gb is not None)
    def body(em: Emitter):
        inp_key: dict[int, tuple] = {}
        wgt_key: dict[int, tuple] = {}
        vectors = VectorLoads(nvec, g.KB)
        bias_key: dict[int, tuple] = {}
        pt, pl = g.pad[0], g.pad[1]
        # the bias lanes sit at the top of each half: INP entry inp_h - 1, WGT inp_h - tco..
        binp, bwgt = inp_h - 1, wgt_h - tco

        def loads(t, chunk, half):
            (b0, nb), (co0, nco), (h0, nh), (w0, nw) = t
            ci0, nci = chunk
            out = []
            ikey = (b0, nb, ci0, nci, h0, nh, w0, nw)
            if inp_key.get(half) != ikey:
                inp_key[half] = ikey
                R, Cc = g.in_rows(nh), g.in_cols(nw)
                out += _inp_loads(ctx, tin, b0, nb, ci0, nci, (g.oh0 + h0) * g.sh - pt, R,
                                       g.rstep, (g.ow0 + w0) * g.sw - pl, Cc, use_halo,
                                       half * inp_h)
            wkey = (co0, nco, ci0, nci)
            if wgt_key.get(half) != wkey:
                wgt_key[half] = wkey
                if g.grouped:
                    out += [MemInsn(OP_LOAD, MEM_WGT, half * wgt_h + so, wbase_dram + de, 1,
                                    x, x)
                            for so, de, x in _grouped_wgt_runs(g, woff, co0, nco, ci0, nci)]
                elif nci == g.CB:
                    x = nco * g.CB * KK
                    out.append(MemInsn(OP_LOAD, MEM_WGT, half * wgt_h, wbase_dram
                                       + co0 * g.CB * KK, 1, x, x))
                else:
                    out.append(MemInsn(OP_LOAD, MEM_WGT, half * wgt_h, wbase_dram
                                       + (co0 * g.CB + ci0) * KK, nco, nci * KK, g.CB * KK))
            if gb is not None and bias_key.get(half) != (co0, nco):
                if half not in bias_key:
                    out.append(MemInsn(OP_LOAD, MEM_INP, half * inp_h + binp, binp_dram, 1, 1,
                                       1))
                bias_key[half] = (co0, nco)
                out.append(MemInsn(OP_LOAD, MEM_WGT, half * wgt_h + bwgt, bwgt_dram + co0, 1,
                                   nco, nco))
            return out

        for gi in range(0, len(tiles), nthr):
            group = [(tiles[gi + j], j) for j in range(nthr) if gi + j < len(tiles)]
            for ci_i in range(max(len(co_chunks[t[1]]) for t, _ in group)):
                active = [(t, half) for t, half in group if ci_i < len(co_chunks[t[1]])]
                popped = {half: em.load_group(half, loads(t, co_chunks[t[1]][ci_i], half))
                          for t, half in active}
                for t, half in active:
                    (b0, nb), (co0, nco), (h0, nh), (w0, nw) = t
                    ci0, nci = co_chunks[t[1]][ci_i]
                    abase = half * acc_h
                    vbase = abase + nmax
                    S, n = nh * nw, nb * nco * nh * nw
                    if ci_i == 0:
                        vectors.load(em, half, vbase, vbase_dram + co0, nco)
                        reset = em.gemm(((n, 1, 0, 0),), (abase, 0, 0), reset=True)
                        em.acc_acquire(half, reset)
                    R, Cc = g.in_rows(nh), g.in_cols(nw)
                    stencil = ((g.KH, 0, g.dh * Cc, g.KW), (g.KW, 0, g.dw, 1),
                               (nh, nw, g.sh // g.rstep * Cc, 0), (nw, 1, g.sw, 0))
                    bases = (abase, half * inp_h, half * wgt_h)
                    if g.grouped:  # only the (co, ci) blocks with non-zero weights
                        table = tuple((j * S, (c - ci0) * R * Cc, p * KK) for p, (j, c)
                                      in enumerate(g.pairs(co0, nco, ci0, nci)))
                        gm = em.gemm(((nb, nco * S, nci * R * Cc, 0), *stencil), bases,
                                     table=table)
                    else:
                        dims = ((nb, nco * S, nci * R * Cc, 0), (nco, S, 0, nci * KK),
                                (nci, 0, R * Cc, KK), *stencil)
                        gm = em.gemm(dims, bases)
                    em.gemm_reads(half, gm, popped[half])
                    if gb is not None and ci_i == 0:  # acc += bias, 1 cycle per entry
                        bg = em.gemm(((nb, nco * S, 0, 0), (nco, S, 0, 1), (S, 1, 0, 0)),
                                     (abase, half * inp_h + binp, half * wgt_h + bwgt))
                        em.gemm_reads(half, bg, False)
                        gm = bg
                    if ci_i == len(co_chunks[t[1]]) - 1:
                        last = emit_tail(em, ops, vidx, n, nb, nco, S, abase, vbase) or gm
                        em.compute_done(last)
                        sts = [MemInsn(OP_STORE, MEM_OUT, abase + so, de, y, x, st)
                               for so, de, y, x, st in tout.scatter(
                                   b0, nb, co0, nco, tout.ht + orow + h0 * g.osh, nh,
                                   tout.hl + ocol + w0 * g.osw, nw, g.osh, g.osw)]
                        em.store_group(half, sts)

    return g, kn, body


def _inp_loads(ctx: PlanContext, tg: DramTensor, b0, tb, c0, tc, rs, R, rstep, cs, Cc, use_halo,
               sbase):
    """LOAD INP instructions filling the dense block ``[tb][tc][R][Cc]`` with image rows
    ``rs + i * rstep`` (i < R) and cols ``cs..cs+Cc-1``; rows/cols outside the image are
    read from the halo (``use_halo``) or zero-padded by the LOAD."""
    def mk(so, de, y, x, st, p=(0, 0, 0, 0)):
        return MemInsn(OP_LOAD, MEM_INP, sbase + so, de, y, x, st, *p)

    plane = R * Cc
    if use_halo:
        if rstep == 1:
            return [mk(*t) for t in tg.region(b0, tb, c0, tc, tg.ht + rs, R, tg.hl + cs, Cc)]
        return [mk((b * tc + c) * plane, tg.entry(b0 + b, c0 + c, tg.ht + rs, tg.hl + cs), R,
                   Cc, rstep * tg.Wp) for b in range(tb) for c in range(tc)]
    # rows i with 0 <= rs + i * rstep < H are data, the others padding
    y0 = cdiv(-rs, rstep) if rs < 0 else 0
    i_hi = min(R - 1, (tg.H - 1 - rs) // rstep) if tg.H - 1 - rs >= 0 else -1
    ny = i_hi - y0 + 1
    y1 = R - y0 - max(ny, 0)
    x0, x1 = max(0, -cs), max(0, cs + Cc - tg.W)
    nx = Cc - x0 - x1
    if ny <= 0 or nx <= 0:  # the whole tile is padding: copy zeros
        n = tb * tc * plane
        return [mk(0, ctx.zero_region(), 1, n, n)]
    r0, c0d = tg.ht + rs + y0 * rstep, tg.hl + cs + x0
    if rstep == 1:
        if y0 == y1 == x0 == x1 == 0:
            return [mk(*t) for t in tg.region(b0, tb, c0, tc, r0, R, c0d, Cc)]
        if y0 == y1 == 0 and r0 == 0 and ny == tg.Hp and tc * tg.Hp <= MAX_FIELD16:
            return [mk(b * tc * plane, tg.entry(b0 + b, c0, 0, c0d), tc * tg.Hp, nx, tg.Wp,
                       (0, 0, x0, x1)) for b in range(tb)]
    return [mk((b * tc + c) * plane, tg.entry(b0 + b, c0 + c, r0, c0d), ny, nx,
               rstep * tg.Wp, (y0, y1, x0, x1)) for b in range(tb) for c in range(tc)]
