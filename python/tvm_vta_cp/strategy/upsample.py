"""Nearest upsample by integer factors (ONNX Resize nearest) on VTA as data movement.

Per tile (a batch block x channel blocks x input rows x input columns): the input is loaded
into ACC (``ACC_8BIT``); the column replication is one ALU ADD onto a reset region whose
micro-ops write each input entry to its ``SW`` output columns; the row replication is in the
STOREs, each output row written ``SH`` times (one STORE group per replica, rows ``SH`` apart).
With ``SW == 1`` and no requantize the ALU does nothing: the loaded tile is stored as is. A
rescaled upsample (quantization changes) runs the requantize tail (``alu_tail``) on the tile.
"""

from __future__ import annotations

import numpy as np

from tvm_accel.errors import KnobError, MappingError
from tvm_accel.layers import UpsampleLayer
from tvm_vta_cp.codegen import ALU_ADD, MEM_ACC_8BIT, MEM_OUT, OP_LOAD, OP_STORE, MemInsn
from tvm_vta_cp.layout import cdiv, dims4, stored_offset
from tvm_vta_cp.program import LayerProgram
from tvm_vta_cp.strategy.alu_tail import AluOp, VectorLoads, n_vec, requant_tail, vector_image
from tvm_vta_cp.strategy.emitter import Emitter, emit_layer, emit_tail
from tvm_vta_cp.strategy.geometry import segs
from tvm_vta_cp.strategy.placement import DramTensor, PlanContext

UPSAMPLE_KNOBS = ("tile_co", "tile_h", "tile_w")


def upsample_numerics(layer: UpsampleLayer, in_dtype: str, out_dtype: str, k: int
                      ) -> list[AluOp]:
    """ALU tail ops of an upsample: none when the quantization is kept, else
    ``requant(v - zx)`` on the stored input; raises MappingError."""
    if layer.requant is None:
        if in_dtype != out_dtype:
            raise MappingError(f"layer {layer.name}: an upsample without requantize changes the "
                               f"dtype {in_dtype} -> {out_dtype}")
        return []
    zxp = int(layer.input_zero_point) + stored_offset(in_dtype)
    return requant_tail(np.full(k, -128, np.int64), np.full(k, 127, np.int64),
                        np.full(k, -zxp, np.int64), layer.requant, out_dtype, k,
                        f"layer {layer.name}")


def _need(tc: int, th: int, tw: int, sw: int, nvec: int) -> int:
    """ACC entries of one tile: input, column-replicated output and requantize vectors."""
    return tc * th * tw * (1 + (sw if sw > 1 else 0)) + nvec * tc


def _knobs(layer: UpsampleLayer, user: dict | None, CB: int, H: int, W: int, cfg, nvec: int
           ) -> tuple[dict, int]:
    sw = int(layer.scale[1])
    kn = None
    for budget in (cfg.acc_depth // 2, cfg.acc_depth):
        for tw in sorted({W, *(w for w in (64, 32, 16, 8, 4, 2, 1) if w < W)}, reverse=True):
            best = None
            for tc in range(CB, 0, -1):
                th = next((h for h in range(H, 0, -1) if _need(tc, h, tw, sw, nvec) <= budget),
                          0)
                if th and (best is None or tc * th > best[0]):
                    best = (tc * th, {"tile_co": tc, "tile_h": th, "tile_w": tw})
            if best is not None:
                kn = best[1]
                break
        if kn is not None:
            break
    if kn is None:
        raise MappingError(f"layer {layer.name}: one upsampled entry does not fit the ACC "
                           f"buffer ({cfg.acc_depth} entries)")
    for k, v in (user or {}).items():
        if k not in UPSAMPLE_KNOBS:
            raise KnobError(f"layer {layer.name}: unknown upsample knob {k!r} (knobs: "
                            f"{', '.join(UPSAMPLE_KNOBS)})")
        if not isinstance(v, int) or v < 1:
            raise KnobError(f"layer {layer.name}: knob {k} must be a positive integer, got {v!r}")
        kn[k] = v
    kn = {k: min(v, lim) for (k, v), lim in zip(kn.items(), (CB, H, W), strict=True)}
    need = _need(kn["tile_co"], kn["tile_h"], kn["tile_w"], sw, nvec)
    if need > cfg.acc_depth:
        raise MappingError(f"layer {layer.name}: an upsample tile needs {need} ACC entries, the "
                           f"ACC holds {cfg.acc_depth}")
    return kn, 2 if 2 * need <= cfg.acc_depth else 1


def upsample(ctx: PlanContext, layer: UpsampleLayer, user_knobs: dict | None) -> LayerProgram:
    """A nearest upsample as LOADs, one ALU column-replicating copy and row-replicating
    STOREs per tile (module docstring); ``user_knobs`` may set :data:`UPSAMPLE_KNOBS`."""
    cfg, name = ctx.cfg, layer.name
    pin, pout = ctx.placements[layer.input], ctx.placements[layer.output]
    N, C, H, W = dims4(pin.shape)
    sh, sw = (int(s) for s in layer.scale)
    if tuple(dims4(pout.shape)) != (N, C, H * sh, W * sw):
        raise MappingError(f"layer {name}: output {pout.shape} is not the upsample's "
                           f"{(N, C, H * sh, W * sw)}")
    ops = upsample_numerics(layer, pin.dtype, pout.dtype, C)
    nvec = n_vec(ops)
    NB, CB = cdiv(N, cfg.batch), cdiv(C, cfg.block_out)
    kn, nthr = _knobs(layer, user_knobs, CB, H, W, cfg, nvec)
    tc, th, tw = kn["tile_co"], kn["tile_h"], kn["tile_w"]
    vdata, vidx = vector_image(ops, C, cfg)
    vbase_dram = ctx.dram.const(vdata) // cfg.acc_entry_bytes if nvec else 0
    tin, tout = DramTensor(pin, cfg), DramTensor(pout, cfg)
    acc_h = cfg.acc_depth // nthr
    in_max = tc * th * tw
    out_max = in_max * sw if sw > 1 else 0
    tiles = [(b, c, h, w) for b in segs(NB, 1) for c in segs(CB, tc)
             for h in segs(H, th) for w in segs(W, tw)]

    def body(em: Emitter):
        vectors = VectorLoads(nvec, CB)
        for i, ((b0, _), (c0, nc), (h0, nh), (w0, nw)) in enumerate(tiles):
            half = i % nthr
            ibase = half * acc_h
            obase = ibase + in_max if sw > 1 else ibase
            vbase = ibase + in_max + out_max
            S = nh * nw
            vectors.load(em, half, vbase, vbase_dram + c0, nc)
            lds = [em.emit(MemInsn(OP_LOAD, MEM_ACC_8BIT, ibase + so, de, y, x, st))
                   for so, de, y, x, st in tin.region(b0, 1, c0, nc, tin.ht + h0, nh,
                                                      tin.hl + w0, nw)]
            last = lds[-1]
            if sw > 1:
                reset = em.alu(ALU_ADD, ((nc * S * sw, 1, 0, 0),), (obase, 0), 0)
                reset.reset = True
                em.acc_acquire(half, reset)
                last = em.alu(ALU_ADD, ((nc, S * sw, S, 0), (nh, nw * sw, nw, 0),
                                        (nw, sw, 1, 0), (sw, 1, 0, 0)), (obase, ibase), None)
            else:
                em.acc_acquire(half, lds[0])
            last = emit_tail(em, ops, vidx, nc * S * sw, 1, nc, S * sw, obase, vbase) or last
            em.compute_done(last)
            sts = [MemInsn(OP_STORE, MEM_OUT, obase + so, de, y, x, st)
                   for r in range(sh)
                   for so, de, y, x, st in tout.scatter(b0, 1, c0, nc, tout.ht + h0 * sh + r, nh,
                                                         tout.hl + w0 * sw, nw * sw, sh, 1)]
            em.store_group(half, sts)

    insns = emit_layer(cfg, ctx.isa, ctx.dram, name, body)
    shape = f"{N}x{C}x{H}x{W} -> {N}x{C}x{H * sh}x{W * sw} x{sh}" + (f"x{sw}" if sw != sh else "")
    return LayerProgram(name, layer.op_name, insns, len(insns) // 16, 0, 0, shape, dict(kn))
