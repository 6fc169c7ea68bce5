"""MISC streams: element-wise add and multiply, max/average pool, nearest upsample and concat by
placement."""

from __future__ import annotations

from tvm_accel.errors import MappingError
from tvm_accel.knobs import validate_knobs
from tvm_accel.layers import (
    AddLayer,
    ConcatLayer,
    MulLayer,
    PoolLayer,
    UpsampleLayer,
)
from tvm_dpu import codegen as cg
from tvm_dpu.program import LayerProgram, TensorPlacement
from tvm_dpu.strategy.dependencies import _Tile
from tvm_dpu.strategy.emit import Emitter, _pool_maker
from tvm_dpu.strategy.knobs import knob_space
from tvm_dpu.strategy.tiling import _in_window
from tvm_dpu.xgraph import XGraphError, fold_add


class MiscEmitter(Emitter):
    """Element-wise add, pools, upsample and concat on the MISC unit."""

    def add(self, layer: AddLayer, user: dict | None) -> LayerProgram:
        cfg = self.cfg
        ta, tb = (self.tensors[x] for x in layer.inputs)
        tout = self.tensors[layer.output]
        if ta.shape != tb.shape or ta.shape != tout.shape or len(ta.shape) != 4:
            raise MappingError(f"layer {layer.name}: operands differ in shape")
        try:
            shifts = [fold_add(layer)[k] for k in ("shift_a", "shift_b")]
        except XGraphError as e:
            raise MappingError(str(e)) from None
        rq = layer.requant
        h, w, c = ta.hwc
        in_shape = (ta.shape[0], c, h, w)
        kn = validate_knobs(knob_space(layer, in_shape, cfg), user, layer.name)
        th, tw = kn["tile_h"], kn["tile_w"]
        tiles = []
        for buf, g, y0, nh, x0, nw in self._grid(ta, (0, h), (0, w), th, tw):
            la = self._load(ta, 0, buf, g, y0, nh, x0, nw, 0, c)
            lb = self._load(tb, 2, buf, g, y0, nh, x0, nw, 0, c)
            op = cg.EltAdd(in_mem=0, in_addr=buf, in_pix_stride=c, in_row_stride=nw * c,
                           out_mem=1, out_addr=buf, out_pix_stride=c,
                           out_row_stride=nw * c, out_h=nh, out_w=nw, chans=c,
                           b_mem=2, b_addr=buf, b_pix_stride=c, b_row_stride=nw * c,
                           shift_a=shifts[0], shift_b=shifts[1], shift=int(rq.shift),
                           clip_lo=int(rq.qmin), clip_hi=int(rq.qmax))
            sv = self._save(tout, buf, g, y0, nh, x0, nw, 0, c)
            tiles.append(_Tile([la, lb], [op], [sv]))
        insns = self._schedule([([], tiles)], "MISC", kn["pipeline"])
        return LayerProgram(layer.name, "add", cg.encode_stream(insns), len(insns), 0,
                            self.shape_text(layer), kn)

    def mul(self, layer: MulLayer, user: dict | None) -> LayerProgram:
        """ELTMUL tile by tile; a per-channel vector B (N, C, 1, 1), the squeeze-excitation gate,
        is LOADed once per tile as one pixel and read with zero strides."""
        names = list(layer.inputs)
        if self.tensors[names[0]].hwc[:2] == (1, 1) and self.tensors[names[1]].hwc[:2] != (1, 1):
            names.reverse()
        ta, tb = (self.tensors[x] for x in names)
        tout = self.tensors[layer.output]
        gate = tb.hwc != ta.hwc
        if ta.hwc != tout.hwc or (gate and tb.hwc != (1, 1, ta.hwc[2])):
            raise MappingError(f"layer {layer.name}: operands are not a map and a map or "
                               "per-channel vector of its shape")
        if layer.a_zero_point or layer.b_zero_point or layer.requant.zero_point:
            raise MappingError(f"layer {layer.name}: ELTMUL needs zero points 0")
        rq = layer.requant
        h, w, c = ta.hwc
        in_shape = (ta.shape[0], c, h, w)
        kn = validate_knobs(knob_space(layer, in_shape, self.cfg), user, layer.name)
        tiles = []
        for buf, g, y0, nh, x0, nw in self._grid(ta, (0, h), (0, w), kn["tile_h"], kn["tile_w"]):
            la = self._load(ta, 0, buf, g, y0, nh, x0, nw, 0, c)
            lb = (self._load(tb, 2, buf, g, 0, 1, 0, 1, 0, c) if gate
                  else self._load(tb, 2, buf, g, y0, nh, x0, nw, 0, c))
            bps, brs = (0, 0) if gate else (c, nw * c)
            op = cg.EltMul(in_mem=0, in_addr=buf, in_pix_stride=c, in_row_stride=nw * c,
                           out_mem=1, out_addr=buf, out_pix_stride=c,
                           out_row_stride=nw * c, out_h=nh, out_w=nw, chans=c,
                           b_mem=2, b_addr=buf, b_pix_stride=bps, b_row_stride=brs,
                           shift=int(rq.shift), clip_lo=int(rq.qmin), clip_hi=int(rq.qmax))
            sv = self._save(tout, buf, g, y0, nh, x0, nw, 0, c)
            tiles.append(_Tile([la, lb], [op], [sv]))
        insns = self._schedule([([], tiles)], "MISC", kn["pipeline"])
        return LayerProgram(layer.name, "multiply", cg.encode_stream(insns), len(insns), 0,
                            f"{list(in_shape)}", kn)

    def _misc_tiles(self, tin: TensorPlacement, tout: TensorPlacement, layer, kn, make,
                    window=((1, 1), (1, 1), (0, 0, 0, 0)), up=(1, 1), ch0=0):
        """Tiles LOAD (input window) -> MISC ``make(...)`` -> SAVE (output tile, channel offset
        ``ch0`` of the output: concat by placement)."""
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = window
        h, w, c = tin.hwc
        ho, wo = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
        th, tw = kn["tile_h"], kn["tile_w"]
        tiles = []
        for buf, g, y0, nh, x0, nw in self._grid(tin, (0, ho), (0, wo), th, tw):
            r0, rows, ptop, pbot = _in_window(y0, nh, sh, pt, kh, h)
            c0, cols, pleft, pright = _in_window(x0, nw, sw, pl, kw, w)
            ld = self._load(tin, 0, buf, g, r0, rows, c0, cols, 0, c)
            oh, ow = nh * up[0], nw * up[1]
            op = make(in_mem=0, in_addr=buf, in_pix_stride=c, in_row_stride=cols * c,
                      out_mem=1, out_addr=buf, out_pix_stride=c, out_row_stride=ow * c,
                      out_h=oh, out_w=ow, chans=c,
                      pads=(ptop, pbot, pleft, pright))
            sv = self._save(tout, buf, g, y0 * up[0], oh, x0 * up[1], ow, ch0, c)
            tiles.append(_Tile([ld], [op], [sv]))
        return tiles

    def pool(self, layer: PoolLayer, user: dict | None) -> LayerProgram:
        tin, tout = self.tensors[layer.input], self.tensors[layer.output]
        h, w, c = tin.hwc
        in_shape = (tin.shape[0], c, h, w)
        kn = validate_knobs(knob_space(layer, in_shape, self.cfg), user, layer.name)
        kh, kw = layer.kernel
        make = _pool_maker(layer)
        tiles = self._misc_tiles(tin, tout, layer, kn, make,
                                 (layer.kernel, layer.strides, layer.padding))
        insns = self._schedule([([], tiles)], "MISC", kn["pipeline"])
        return LayerProgram(layer.name, layer.op_name, cg.encode_stream(insns), len(insns), 0,
                            self.shape_text(layer), kn)

    def upsample(self, layer: UpsampleLayer, user: dict | None) -> LayerProgram:
        tin, tout = self.tensors[layer.input], self.tensors[layer.output]
        h, w, c = tin.hwc
        in_shape = (tin.shape[0], c, h, w)
        if layer.requant is not None:
            raise MappingError(f"layer {layer.name}: a rescaling upsample is not supported")
        kn = validate_knobs(knob_space(layer, in_shape, self.cfg), user, layer.name)
        fh, fw = layer.scale

        def make(pads, **kw_):
            return cg.Upsample(**kw_, factor_h=fh, factor_w=fw)
        tiles = self._misc_tiles(tin, tout, layer, kn, make, up=(fh, fw))
        insns = self._schedule([([], tiles)], "MISC", kn["pipeline"])
        return LayerProgram(layer.name, "upsample", cg.encode_stream(insns), len(insns), 0,
                            self.shape_text(layer), kn)

    def concat(self, layer: ConcatLayer, user: dict | None) -> LayerProgram:
        """Concat by placement: every input is copied tile by tile into its channel range of
        the output (SAVE with the output's pixel stride and a channel offset)."""
        tout = self.tensors[layer.output]
        if layer.axis != 1 or any(rq is not None for rq in layer.requants):
            raise MappingError(f"layer {layer.name}: only channel concat of identically "
                               "quantized inputs is supported")
        segments, ch0, kn0 = [], 0, None
        for name in layer.inputs:
            tin = self.tensors[name]
            h, w, c = tin.hwc
            kn = validate_knobs(knob_space(PoolLayer(layer.name, name, layer.output, "max",
                                                      (1, 1), (1, 1), (0, 0, 0, 0)),
                                            (tin.shape[0], c, h, w), self.cfg),
                                 user, layer.name)
            kn0 = kn0 or kn

            def make(pads, **kw_):
                return cg.Copy(**kw_)
            segments.append(([], self._misc_tiles(tin, tout, layer, kn, make, ch0=ch0)))
            ch0 += c
        insns = self._schedule(segments, "MISC", kn0["pipeline"])
        return LayerProgram(layer.name, "concat", cg.encode_stream(insns), len(insns), 0,
                            self.shape_text(layer), kn0)


    # --- fused groups (tvm_dpu.fusion templates) -------------------------------------------------
