"""Max, average and global average pooling on VTA's ALU (TVM VTA's ALU schedules: the window
as micro-op index patterns over the accumulator buffer).

Per tile (batch blocks x channel blocks x output rows x output columns): the input window rows
are loaded into ACC (``ACC_8BIT``), the LOAD zero-padding the pool's padding; one ALU ADD
(immediate) turns the padded entries into the pool's padding value (the stored minimum -128
for max, so it never wins; the input zero point for average, i.e. real 0.0); the output region
is reset (plus -128 for max) and one ALU MAX / ADD whose micro-ops enumerate the window
positions reduces every window into it; an average then gets the canonical requantize of the
window sum (``alu_tail``: ``- window * zx'`` folds into its round add). A window taller than
the ACC holds is reduced in chunks of kernel rows, each loaded in turn (a global average pool
of a large map). Everything runs on the compute module, so only the output region is handed
between the compute and store modules (the token protocol of ``emitter``).
"""

from __future__ import annotations

import numpy as np

from tvm_accel.errors import KnobError, MappingError
from tvm_accel.layers import PoolLayer, pool_output_shape
from tvm_vta_cp.codegen import (
    ALU_ADD,
    ALU_MAX,
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
from tvm_vta_cp.strategy.placement import MAX_LOAD_PAD, DramTensor, PlanContext

#: the stored int8 minimum: a max pool's padding value
STORED_MIN = -128
POOL_KNOBS = ("tile_co", "tile_h", "tile_w", "tile_kh")


def span(o0: int, no: int, stride: int, k: int, pad: int, n: int) -> tuple[int, int, int, int]:
    """Input positions read by outputs ``o0 .. o0 + no - 1`` along one axis (window ``k``,
    ``pad`` before): ``(first valid, valid count, padding before, padding after)``; the
    window extent is their sum."""
    lo = o0 * stride - pad
    hi = (o0 + no - 1) * stride - pad + k  # exclusive
    v0, v1 = max(lo, 0), min(hi, n)
    if v1 <= v0:
        return v0, 0, hi - lo, 0
    return v0, v1 - v0, v0 - lo, hi - v1


def pool_numerics(layer: PoolLayer, in_dtype: str, out_dtype: str, k: int
                  ) -> tuple[int, list[AluOp]]:
    """(padding value in stored int8, ALU tail ops) of a pool; raises MappingError."""
    where = f"layer {layer.name}"
    zxp = int(layer.input_zero_point) + stored_offset(in_dtype)
    if layer.kind == "max":
        if layer.requant is None:
            if in_dtype != out_dtype:
                raise MappingError(f"{where}: a max pool without requantize changes the dtype "
                                   f"{in_dtype} -> {out_dtype}")
            return STORED_MIN, []
        ops = requant_tail(np.full(k, -128, np.int64), np.full(k, 127, np.int64),
                           np.full(k, -zxp, np.int64), layer.requant, out_dtype, k, where)
        return STORED_MIN, ops
    if not -128 <= zxp <= 127:
        raise MappingError(f"{where}: input zero point {layer.input_zero_point} is outside the "
                           f"{in_dtype} range")
    win = layer.window
    ops = requant_tail(np.full(k, -128 * win, np.int64), np.full(k, 127 * win, np.int64),
                       np.full(k, -win * zxp, np.int64), layer.requant, out_dtype, k, where)
    return zxp, ops


def _acc_need(tbc: int, tc: int, noh: int, now: int, ki: int, kw: int, sh: int, sw: int,
              nvec: int) -> int:
    """ACC entries of one tile: input window, output region and requantize vectors."""
    ir, ic = (noh - 1) * sh + ki, (now - 1) * sw + kw
    return tbc * (ir * ic + noh * now) + nvec * tc


def _default_tiles(layer: PoolLayer, CB: int, Ho: int, Wo: int, cfg, nvec: int) -> dict:
    """The largest output tile (channel blocks x rows x columns) whose window fits half the
    ACC (two tiles in flight), else all of it; full kernel rows when one output fits."""
    (kh, kw), (sh, sw) = layer.kernel, layer.strides
    for budget in (cfg.acc_depth // 2, cfg.acc_depth):
        best = None
        for now in sorted({Wo, *(w for w in (64, 32, 16, 8, 4, 2, 1) if w < Wo)}, reverse=True):
            for tc in range(CB, 0, -1):
                noh = next((h for h in range(Ho, 0, -1) if _acc_need(
                    tc, tc, h, now, kh, kw, sh, sw, nvec) <= budget), 0)
                if noh and (best is None or tc * noh * now > best[0]):
                    best = (tc * noh * now, {"tile_co": tc, "tile_h": noh, "tile_w": now,
                                             "tile_kh": kh})
            if best is not None:
                return best[1]
        ki = next((k for k in range(kh, 0, -1)
                   if _acc_need(1, 1, 1, 1, k, kw, sh, sw, nvec) <= budget), 0)
        if ki:
            return {"tile_co": 1, "tile_h": 1, "tile_w": 1, "tile_kh": ki}
    raise MappingError(f"layer {layer.name}: one row of its {kh}x{kw} window does not fit the "
                       f"ACC buffer ({cfg.acc_depth} entries)")


def _knobs(layer: PoolLayer, user: dict | None, CB: int, Ho: int, Wo: int, cfg, nvec: int
           ) -> tuple[dict, int]:
    """The tile knobs (defaults completed by ``user``) and the tiles in flight."""
    kn = _default_tiles(layer, CB, Ho, Wo, cfg, nvec)
    for k, v in (user or {}).items():
        if k not in POOL_KNOBS:
            raise KnobError(f"layer {layer.name}: unknown pool knob {k!r} (knobs: "
                            f"{', '.join(POOL_KNOBS)})")
        if not isinstance(v, int) or v < 1:
            raise KnobError(f"layer {layer.name}: knob {k} must be a positive integer, got {v!r}")
        kn[k] = v
    lim = {"tile_co": CB, "tile_h": Ho, "tile_w": Wo, "tile_kh": layer.kernel[0]}
    kn = {k: min(v, lim[k]) for k, v in kn.items()}
    (_, kw), (sh, sw) = layer.kernel, layer.strides
    need = _acc_need(kn["tile_co"], kn["tile_co"], kn["tile_h"], kn["tile_w"], kn["tile_kh"],
                     kw, sh, sw, nvec)
    if need > cfg.acc_depth:
        raise MappingError(f"layer {layer.name}: a pool tile needs {need} ACC entries, the ACC "
                           f"holds {cfg.acc_depth}")
    return kn, 2 if 2 * need <= cfg.acc_depth else 1


def pad_fix(em: Emitter, base: int, tbc: int, ir: int, ic: int, pads: tuple, value: int):
    """ALU ADD ``value`` on the zero-padded entries of ``tbc`` windows of ``ir x ic`` entries
    at ``base`` (``pads``: rows before / after, columns before / after); the last one, or
    None."""
    rt, rb, cl, cr = pads
    plane, last = ir * ic, None
    if not value:
        return None
    for rows, at in ((rt, 0), (rb, ir - rb)):
        if rows:
            last = em.alu(ALU_ADD, ((tbc, plane, 0, 0), (rows * ic, 1, 0, 0)),
                          (base + at * ic, 0), value)
    mid = ir - rt - rb
    for cols, at in ((cl, 0), (cr, ic - cr)):
        if cols and mid > 0:
            last = em.alu(ALU_ADD, ((tbc, plane, 0, 0), (mid, ic, 0, 0), (cols, 1, 0, 0)),
                          (base + rt * ic + at, 0), value)
    return last


def pool(ctx: PlanContext, layer: PoolLayer, user_knobs: dict | None) -> LayerProgram:
    """A max / average / global average pool as ALU programs over ACC tiles (module
    docstring); ``user_knobs`` may set :data:`POOL_KNOBS`."""
    cfg, name = ctx.cfg, layer.name
    pin, pout = ctx.placements[layer.input], ctx.placements[layer.output]
    N, C, H, W = dims4(pin.shape)
    _, _, Ho, Wo = pool_output_shape(layer, (N, C, H, W))
    if tuple(dims4(pout.shape)) != (N, C, Ho, Wo):
        raise MappingError(f"layer {name}: output {pout.shape} is not the pool's "
                           f"{(N, C, Ho, Wo)}")
    (kh, kw), (sh, sw) = (tuple(int(v) for v in layer.kernel),
                          tuple(int(v) for v in layer.strides))
    pt, pl, pb, pr = (int(p) for p in layer.padding)
    if max(pt, pl, pb, pr) > MAX_LOAD_PAD:
        raise MappingError(f"layer {name}: padding {layer.padding} exceeds the {MAX_LOAD_PAD} a "
                           "LOAD pads")
    fill, ops = pool_numerics(layer, pin.dtype, pout.dtype, C)
    nvec = n_vec(ops)
    NB, CB = cdiv(N, cfg.batch), cdiv(C, cfg.block_out)
    kn, nthr = _knobs(layer, user_knobs, CB, Ho, Wo, cfg, nvec)
    tc, th, tw, tk = kn["tile_co"], kn["tile_h"], kn["tile_w"], kn["tile_kh"]
    vdata, vidx = vector_image(ops, C, cfg)
    vbase_dram = ctx.dram.const(vdata) // cfg.acc_entry_bytes if nvec else 0
    tin, tout = DramTensor(pin, cfg), DramTensor(pout, cfg)
    acc_h = cfg.acc_depth // nthr
    out_max, in_max = tc * th * tw, tc * ((th - 1) * sh + tk) * ((tw - 1) * sw + kw)
    reduce_op = ALU_MAX if layer.kind == "max" else ALU_ADD
    tiles = [(b, c, h, w) for b in segs(NB, 1) for c in segs(CB, tc)
             for h in segs(Ho, th) for w in segs(Wo, tw)]

    def body(em: Emitter):
        vectors = VectorLoads(nvec, CB)
        for i, ((b0, _), (c0, nc), (h0, nh), (w0, nw)) in enumerate(tiles):
            half = i % nthr
            # fixed regions per half (sized for the largest tile), so a tile's loads never
            # touch the output region the previous tile of the half is still storing
            obase = half * acc_h
            ibase = obase + out_max
            vbase = ibase + in_max
            S = nh * nw
            ic = (nw - 1) * sw + kw
            x0, nx, cl, cr = span(w0, nw, sw, kw, pl, W)
            vectors.load(em, half, vbase, vbase_dram + c0, nc)
            for k0, nk in segs(kh, tk):
                ir = (nh - 1) * sh + nk
                y0, ny, rt, rb = span(h0, nh, sh, nk, pt - k0, H)
                if ny and nx:
                    for c in range(nc):
                        em.emit(MemInsn(OP_LOAD, MEM_ACC_8BIT, ibase + c * ir * ic,
                                        tin.entry(b0, c0 + c, tin.ht + y0, tin.hl + x0), ny, nx,
                                        tin.Wp, rt, rb, cl, cr))
                    pads = (rt, rb, cl, cr)
                else:  # the chunk reads padding only
                    em.alu(ALU_ADD, ((nc * ir * ic, 1, 0, 0),), (ibase, 0), 0).reset = True
                    pads = (ir, 0, 0, 0)
                pad_fix(em, ibase, nc, ir, ic, pads, fill)
                if k0 == 0:
                    first = em.alu(ALU_ADD, ((nc * S, 1, 0, 0),), (obase, 0), 0)
                    first.reset = True
                    em.acc_acquire(half, first)
                    if layer.kind == "max":
                        em.alu(ALU_ADD, ((nc * S, 1, 0, 0),), (obase, 0), STORED_MIN)
                last = em.alu(reduce_op, ((nc, S, ir * ic, 0), (nh, nw, sh * ic, 0),
                                          (nw, 1, sw, 0), (nk, 0, ic, 0), (kw, 0, 1, 0)),
                              (obase, ibase), None)
            last = emit_tail(em, ops, vidx, nc * S, 1, nc, S, obase, vbase) or last
            em.compute_done(last)
            sts = [MemInsn(OP_STORE, MEM_OUT, obase + so, de, y, x, st)
                   for so, de, y, x, st in tout.region(b0, 1, c0, nc, tout.ht + h0, nh,
                                                        tout.hl + w0, nw)]
            em.store_group(half, sts)

    insns = emit_layer(cfg, ctx.isa, ctx.dram, name, body)
    shape = f"{N}x{C}x{H}x{W} -> {N}x{C}x{Ho}x{Wo} k{kh}x{kw} s{sh}x{sw}"
    if any(layer.padding):
        shape += " p" + ",".join(str(int(p)) for p in layer.padding)
    return LayerProgram(name, layer.op_name, insns, len(insns) // 16, 0, 0, shape, dict(kn))
