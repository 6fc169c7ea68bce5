"""Channel concat on VTA by placement: producers write into their channel-block slice of the
concatenated tensor, so nothing is copied, on the host or on VTA.

In the blocked layout ``NCHWnc`` the channel blocks of an image are consecutive planes, so an
input that starts at a channel-block boundary is a slice of the output (its batch blocks lie
the output's channel blocks apart: :attr:`TensorPlacement.channel_blocks`). An input is
*placed* there (:func:`concat_views`) when a layer of the same function produces it, its
quantization is the output's and the halos of its readers and the output's agree; every other
input (a function input, a rescaled one, one whose halo fill differs) is *copied* on VTA:
``LOAD ACC_8BIT`` of its tiles, the rescale on the ALU if any, ``STORE`` into its slice.

VTA moves whole channel blocks (no lane shift), so every input but the last must have a
multiple of ``BLOCK`` channels: a slice that starts inside a block cannot be written without
overwriting its neighbour's lanes. Such a concat runs on the CPU with that reason. The last
input's padded lanes fall into the output's padded lanes, which no reader uses.
"""

from __future__ import annotations

import numpy as np

from tvm_accel.errors import MappingError
from tvm_accel.layers import ConcatLayer, LayerGraph
from tvm_vta_cp.codegen import MEM_ACC_8BIT, MEM_OUT, OP_LOAD, OP_STORE, MemInsn
from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.layout import cdiv, dims4, stored_offset
from tvm_vta_cp.program import LayerProgram
from tvm_vta_cp.strategy.alu_tail import VectorLoads, n_vec, requant_tail, vector_image
from tvm_vta_cp.strategy.emitter import Emitter, emit_layer, emit_tail
from tvm_vta_cp.strategy.geometry import segs
from tvm_vta_cp.strategy.placement import DramTensor, PlanContext

__all__ = ["check_channel_blocks", "concat", "concat_views", "copy_tiles"]


def check_channel_blocks(layer: ConcatLayer, channels: list[int], block: int) -> list[int]:
    """First channel of each input; raises :class:`MappingError` when an input other than the
    last has a channel count that is not a multiple of ``block``."""
    starts, c0 = [], 0
    for i, c in enumerate(channels):
        if c0 % block:
            raise MappingError(
                f"layer {layer.name}: concat input {i} starts at channel {c0}, inside a "
                f"channel block of {block} (input {i - 1} has {channels[i - 1]} channels); VTA "
                "stores whole channel blocks and cannot shift lanes")
        starts.append(c0)
        c0 += c
    return starts


def concat_views(graph: LayerGraph, halo: dict, fill: dict, cfg: VTAConfig
                 ) -> dict[str, tuple[str, int]]:
    """The concat inputs their producers write in place: ``{tensor: (concat output, first
    channel block)}``. ``halo`` / ``fill`` of a placed input and its output are merged (the
    slice has the output's geometry)."""
    producer = {ly.output: ly for ly in graph.layers}
    outer = set(graph.inputs) | set(graph.outputs)
    views: dict[str, tuple[str, int]] = {}
    for ly in graph.layers:
        if not isinstance(ly, ConcatLayer) or ly.axis % 4 != 1:
            continue
        chans = [dims4(graph.tensors[t].shape)[1] for t in ly.inputs]
        starts = check_channel_blocks(ly, chans, cfg.block_out)
        out = ly.output
        for t, c0, rq in zip(ly.inputs, starts, ly.requants, strict=True):
            src = producer.get(t)
            if (rq is not None or t in outer or t in views or src is None
                    or isinstance(src, ConcatLayer) or ly.inputs.count(t) > 1
                    or graph.tensors[t].dtype != graph.tensors[out].dtype):
                continue
            if fill[t] is not None and fill[out] is not None and fill[t] != fill[out]:
                continue
            fill[out] = fill[out] if fill[out] is not None else fill[t]
            halo[out] = [max(a, b) for a, b in zip(halo[out], halo[t], strict=True)]
            views[t] = (out, c0 // cfg.block_out)
        for t, (parent, _) in views.items():
            if parent == out:
                halo[t], fill[t] = list(halo[out]), fill[out]
    return views


def copy_tiles(cfg: VTAConfig, N: int, CB: int, H: int, W: int, nvec: int) -> list[tuple]:
    """Tiles ``((b0, nb), (c0, nc), (h0, nh), (w0, nw))`` of a copy: as large as half of ACC
    holds (the halves alternate), with ``nvec`` operand vectors per channel block."""
    half = cfg.acc_depth // 2
    tw = min(W, max(1, half // (1 + nvec)))
    th = min(H, max(1, half // (tw * (1 + nvec))))
    tc = min(CB, max(1, half // (th * tw + nvec)))
    NB = cdiv(N, cfg.batch)
    return [(b, c, h, w) for b in segs(NB, 1) for c in segs(CB, tc) for h in segs(H, th)
            for w in segs(W, tw)]


def concat(ctx: PlanContext, layer: ConcatLayer, views: dict) -> LayerProgram:
    """The copies of the inputs not placed in the output (``LOAD ACC_8BIT``, the rescale tail,
    ``STORE`` into the slice); a concat whose inputs are all placed has no instruction but
    FINISH."""
    cfg, name = ctx.cfg, layer.name
    pout = ctx.placements[layer.output]
    chans = [dims4(ctx.placements[t].shape)[1] for t in layer.inputs]
    starts = check_channel_blocks(layer, chans, cfg.block_out)
    tout = DramTensor(pout, cfg)
    copies = []
    for i, (t, c0) in enumerate(zip(layer.inputs, starts, strict=True)):
        if views.get(t, (None,))[0] == layer.output:
            continue
        p = ctx.placements[t]
        rq = layer.requants[i]
        if rq is None and p.dtype != pout.dtype:
            raise MappingError(f"layer {name}: concat input {t} is {p.dtype}, the output "
                               f"{pout.dtype}")
        ops = []
        if rq is not None:
            zx = int(layer.input_zero_points[i]) + stored_offset(p.dtype)
            k = chans[i]
            ops = requant_tail(np.full(k, -128, np.int64), np.full(k, 127, np.int64),
                               np.full(k, -zx, np.int64), rq, pout.dtype, k,
                               f"layer {name} (input {t})")
        elif p.dtype != pout.dtype:
            raise MappingError(f"layer {name}: input {t} dtype differs from the output's")
        copies.append((p, c0 // cfg.block_out, ops))

    def body(em: Emitter):
        tile_i = 0
        for p, cb0, ops in copies:
            N, C, H, W = dims4(p.shape)
            CB = cdiv(C, cfg.block_out)
            tin = DramTensor(p, cfg)
            nvec = n_vec(ops)
            vdata, vidx = vector_image(ops, C, cfg)
            vbase_dram = ctx.dram.const(vdata) // cfg.acc_entry_bytes if nvec else 0
            half_depth = cfg.acc_depth // 2
            vectors = VectorLoads(nvec, CB)
            for (b0, nb), (c0, nc), (h0, nh), (w0, nw) in copy_tiles(cfg, N, CB, H, W, nvec):
                half = tile_i % 2
                tile_i += 1
                abase = half * half_depth
                n = nb * nc * nh * nw
                vbase = abase + n
                vectors.load(em, half, vbase, vbase_dram + c0, nc)
                first = last = None
                for so, de, y, x, st in tin.region(b0, nb, c0, nc, tin.ht + h0, nh,
                                                   tin.hl + w0, nw):
                    last = em.emit(MemInsn(OP_LOAD, MEM_ACC_8BIT, abase + so, de, y, x, st))
                    first = first or last
                em.acc_acquire(half, first)
                last = emit_tail(em, ops, vidx, n, nb, nc, nh * nw, abase, vbase) or last
                em.compute_done(last)
                em.store_group(half, [
                    MemInsn(OP_STORE, MEM_OUT, abase + so, de, y, x, st)
                    for so, de, y, x, st in tout.region(b0, nb, cb0 + c0, nc, tout.ht + h0, nh,
                                                        tout.hl + w0, nw)])

    insns = emit_layer(cfg, ctx.isa, ctx.dram, name, body)
    shape = "x".join(map(str, pout.shape))
    placed = len(layer.inputs) - len(copies)
    return LayerProgram(name, "concat", insns, len(insns) // 16, 0, 0,
                        f"{len(layer.inputs)} inputs ({placed} in place) -> {shape}", {})
