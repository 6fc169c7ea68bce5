"""Streams of fused groups: conv+pool, pool+conv, conv+add and horizontal convs."""

from __future__ import annotations

import dataclasses

from tvm_accel.errors import MappingError
from tvm_accel.knobs import validate_knobs
from tvm_accel.layers import (
    AddLayer,
    ConvLayer,
    PoolLayer,
    pool_output_shape,
)
from tvm_dpu import codegen as cg
from tvm_dpu.program import LayerProgram
from tvm_dpu.strategy.dependencies import _Tile
from tvm_dpu.strategy.emit import _pool_maker
from tvm_dpu.strategy.emit_chain import ChainEmitter
from tvm_dpu.strategy.knobs import fused_knob_space
from tvm_dpu.strategy.tiling import _conv_geometry, _in_window
from tvm_dpu.xgraph import XGraphError, clip_fields, fold_add


class FusedEmitter(ChainEmitter):
    """Fused groups, built on the conv tiles and (conv+pool with halo keep) on chains."""

    def pool_conv(self, pool: PoolLayer, conv: ConvLayer, user: dict | None) -> LayerProgram:
        """pool+conv: per conv output tile, LOAD the input window the pool windows read, MISC
        pools it into FM 1, CONV reads it there (padding by the CONV's pad fields) into FM 2,
        SAVE."""
        tin, tout = self.tensors[pool.input], self.tensors[conv.output]
        in_shape = self._in_shape(pool.input)
        n, c, h, w = in_shape
        _, _, hp, wp = pool_output_shape(pool, in_shape)
        p_shape = (n, c, hp, wp)
        _, k, ho, wo, kh, kw = _conv_geometry(conv, p_shape)
        name = f"{pool.name}+{conv.name}"
        if conv.is_depthwise or conv.groups != 1:
            raise MappingError(f"{name}: pool+conv needs a dense conv")
        kn = validate_knobs(fused_knob_space("pool+conv", [pool, conv], in_shape, self.cfg),
                             user, name)
        folded = self._conv_params(conv, c)
        make = _pool_maker(pool)
        (pkh, pkw), (psh, psw), (ppt, ppl, _, _) = pool.kernel, pool.strides, pool.padding
        sh, sw = conv.strides
        pt, pl, _, _ = conv.padding
        rq, zx = conv.requant, folded["pad_value"]
        kt, th, tw = kn["oc_tile"], kn["tile_h"], kn["tile_w"]
        segments = []
        for k0 in range(0, k, kt):
            kk = min(kt, k - k0)
            pm, pm_addr = self._pm_chunk(folded, k0, kk)
            tiles = []
            for buf, g, y0, nh, x0, nw in self._grid(tin, (0, ho), (0, wo), th, tw):
                q0, rows, ctop, cbot = _in_window(y0, nh, sh, pt, kh, hp)
                r0, in_rows, ptop, pbot = _in_window(q0, rows, psh, ppt, pkh, h)
                p0, cols, cleft, cright = _in_window(x0, nw, sw, pl, kw, wp)
                c0, in_cols, pleft, pright = _in_window(p0, cols, psw, ppl, pkw, w)
                ld = self._load(tin, 0, buf, g, r0, in_rows, c0, in_cols, 0, c)
                op = make(pads=(ptop, pbot, pleft, pright), in_mem=0, in_addr=buf,
                          in_pix_stride=c, in_row_stride=in_cols * c, out_mem=1,
                          out_addr=buf, out_pix_stride=c, out_row_stride=cols * c,
                          out_h=rows, out_w=cols, chans=c)
                cv = cg.Conv(in_mem=1, in_addr=buf, in_pix_stride=c,
                             in_row_stride=cols * c, ic=c, out_mem=2, out_addr=buf,
                             out_pix_stride=kk, out_row_stride=nw * kk, out_h=nh,
                             out_w=nw, oc=kk, kernel_h=kh, kernel_w=kw, stride_h=sh,
                             stride_w=sw, pad_top=ctop, pad_bottom=cbot,
                             pad_left=cleft, pad_right=cright, pad_value=zx,
                             param_addr=pm_addr, shift=int(rq.shift),
                             **clip_fields(conv))
                sv = self._save(tout, buf, g, y0, nh, x0, nw, k0, kk, fm_mem=2)
                tiles.append(_Tile([ld], [op, cv], [sv]))
            segments.append(([pm], tiles))
        insns = self._schedule(segments, "CONV", kn["pipeline"], self.cfg.PM_BYTES // 2)
        macs = n * k * ho * wo * kh * kw * c
        return LayerProgram(name, f"{pool.op_name}+{conv.op_name}", cg.encode_stream(insns),
                            len(insns), int(macs),
                            self.shape_text(conv, f"after {pool.op_name} k{pkh}x{pkw}", pool),
                            kn)

    def conv_pool(self, conv: ConvLayer, pool: PoolLayer, template: str,
                  user: dict | None) -> LayerProgram:
        """conv+pool: per pool output tile, LOAD the conv input window, CONV the conv rows the
        pool windows read into FM 1, MAXPOOL/AVGPOOL them into FM 2, SAVE."""
        tin, tout = self.tensors[conv.input], self.tensors[pool.output]
        in_shape = self._in_shape(conv.input)
        c, k, hc, wc, kh, kw = _conv_geometry(conv, in_shape)
        name = f"{conv.name}+{pool.name}"
        space = fused_knob_space(template, [conv, pool], in_shape, self.cfg)
        if user and "halo" in space and "halo" not in user and not space.is_valid(user):
            user = {**user, "halo": "recompute"}  # knobs of the recompute form (e.g. a W-split)
        kn = validate_knobs(space, user, name)
        if kn.get("halo") == "keep":
            prog = self.chain([conv, pool], {"tile_h": kn["tile_h"],
                                             "pipeline": kn["pipeline"]})
            return dataclasses.replace(prog, op=f"{conv.op_name}+{pool.op_name}", knobs=kn)
        folded = self._conv_params(conv, c)
        make = _pool_maker(pool)
        (pkh, pkw), (psh, psw), (ppt, ppl, _, _) = pool.kernel, pool.strides, pool.padding
        _, _, ho, wo = pool_output_shape(pool, (in_shape[0], k, hc, wc))
        kt, th, tw = kn["oc_tile"], kn["tile_h"], kn["tile_w"]
        segments = []
        for k0 in range(0, k, kt):
            kk = min(kt, k - k0)
            pm, pm_addr = self._pm_chunk(folded, k0, kk)
            tiles = []
            for buf, g, y0, nh, x0, nw in self._grid(tin, (0, ho), (0, wo), th, tw):
                r0, rows, ptop, pbot = _in_window(y0, nh, psh, ppt, pkh, hc)
                c0, cols, pleft, pright = _in_window(x0, nw, psw, ppl, pkw, wc)
                ld, cv = self._conv_tile(conv, tin, folded, bool(kn["format"]), buf, g,
                                         k0, kk, r0, rows, c0, cols, 1, buf, pm_addr)
                op = make(pads=(ptop, pbot, pleft, pright), in_mem=1, in_addr=buf,
                          in_pix_stride=kk, in_row_stride=cols * kk, out_mem=2,
                          out_addr=buf, out_pix_stride=kk, out_row_stride=nw * kk,
                          out_h=nh, out_w=nw, chans=kk)
                sv = self._save(tout, buf, g, y0, nh, x0, nw, k0, kk, fm_mem=2)
                tiles.append(_Tile([ld], [cv, op], [sv]))
            segments.append(([pm], tiles))
        insns = self._schedule(segments, "CONV", kn["pipeline"], self.cfg.PM_BYTES // 2)
        macs = in_shape[0] * k * hc * wc * kh * kw * (1 if conv.is_depthwise else c)
        return LayerProgram(name, f"{conv.op_name}+{pool.op_name}", cg.encode_stream(insns),
                            len(insns), int(macs),
                            self.shape_text(conv, f"then {pool.op_name} k{pkh}x{pkw}",
                                            last=pool), kn)

    def conv_add(self, conv: ConvLayer, add: AddLayer, user: dict | None) -> LayerProgram:
        """conv+add: per conv output tile, LOAD the conv input window and the other operand's
        tile (FM 2), CONV into FM 1, ELTADD in place in FM 1, SAVE."""
        tin, tout = self.tensors[conv.input], self.tensors[add.output]
        idx = add.inputs.index(conv.output)
        tb = self.tensors[add.inputs[1 - idx]]
        in_shape = self._in_shape(conv.input)
        c, k, ho, wo, kh, kw = _conv_geometry(conv, in_shape)
        name = f"{conv.name}+{add.name}"
        if tb.hwc != (ho, wo, k) or tout.hwc != (ho, wo, k):
            raise MappingError(f"{name}: the add operands differ in shape")
        try:
            shifts = [fold_add(add)[x] for x in ("shift_a", "shift_b")]
        except XGraphError as e:
            raise MappingError(str(e)) from None
        kn = validate_knobs(fused_knob_space("conv+add", [conv, add], in_shape, self.cfg), user,
                             name)
        rq = add.requant

        def tail(buf, g, y0, nh, x0, nw, k0, kk):
            lb = self._load(tb, 2, buf, g, y0, nh, x0, nw, k0, kk)
            (ma, aa), (mb, ba) = [(1, buf), (2, buf)][:: 1 if idx == 0 else -1]
            op = cg.EltAdd(in_mem=ma, in_addr=aa, in_pix_stride=kk, in_row_stride=nw * kk,
                           out_mem=1, out_addr=buf, out_pix_stride=kk, out_row_stride=nw * kk,
                           out_h=nh, out_w=nw, chans=kk, b_mem=mb, b_addr=ba, b_pix_stride=kk,
                           b_row_stride=nw * kk, shift_a=shifts[0], shift_b=shifts[1],
                           shift=int(rq.shift), clip_lo=int(rq.qmin), clip_hi=int(rq.qmax))
            return [lb], [op], [self._save(tout, buf, g, y0, nh, x0, nw, k0, kk)]
        segments = self._conv_segments(conv, tin, kn, tail, (0, ho), (0, wo))
        insns = self._schedule(segments, "CONV", kn["pipeline"], self.cfg.PM_BYTES // 2)
        macs = in_shape[0] * k * ho * wo * kh * kw * (1 if conv.is_depthwise else c)
        return LayerProgram(name, f"{conv.op_name}+add", cg.encode_stream(insns), len(insns),
                            int(macs),
                            self.shape_text(conv, "then add", last=add), kn)

    def conv_horizontal(self, convs: list[ConvLayer], user: dict | None) -> LayerProgram:
        """Horizontal fusion: convs of one geometry on the same input; every input tile is
        loaded once and feeds one CONV per conv (all weights resident in the PM)."""
        tin = self.tensors[convs[0].input]
        in_shape = self._in_shape(convs[0].input)
        name = "+".join(ly.name for ly in convs)
        kn = validate_knobs(fused_knob_space("horizontal", convs, in_shape, self.cfg), user,
                             name)
        c, _, ho, wo, kh, kw = _conv_geometry(convs[0], in_shape)
        th, tw = kn["tile_h"], kn["tile_w"]
        pms, members, pm_at, out_at = [], [], 0, 0
        for ly in convs:
            folded = self._conv_params(ly, c)
            k = ly.weight.shape[0]
            ld, addr = self._pm_chunk(folded, 0, k, pm_addr=pm_at)
            pm_at += ld.rows * ld.cols * ld.chans
            pms.append(ld)
            members.append((ly, folded, k, addr, out_at, self.tensors[ly.output]))
            out_at += th * tw * k
        if pm_at > self.cfg.PM_BYTES:
            raise MappingError(f"{name}: the parameters of the fused convs ({pm_at} bytes) "
                               f"exceed the PM ({self.cfg.PM_BYTES})")
        tiles = []
        for buf, g, y0, nh, x0, nw in self._grid(tin, (0, ho), (0, wo), th, tw):
            ld, computes, saves = None, [], []
            for ly, folded, k, addr, off, tout in members:
                ld_m, cv = self._conv_tile(ly, tin, folded, False, buf, g, 0, k, y0, nh,
                                           x0, nw, 1, buf + off, addr)
                ld = ld or ld_m
                computes.append(cv)
                saves.append(self._save(tout, buf + off, g, y0, nh, x0, nw, 0, k))
            tiles.append(_Tile([ld], computes, saves))
        insns = self._schedule([(pms, tiles)], "CONV", kn["pipeline"])
        macs = sum(in_shape[0] * k * ho * wo * kh * kw * c for _, _, k, _, _, _ in members)
        return LayerProgram(name, f"{len(convs)}x{convs[0].op_name} (horizontal)",
                            cg.encode_stream(insns), len(insns), int(macs),
                            self.shape_text(convs[0], f"({len(convs)} convs of this window)"),
                            kn)
