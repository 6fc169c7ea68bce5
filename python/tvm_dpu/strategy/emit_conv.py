"""Conv, dense and transpose-conv streams: tiles over output rows/columns and output-channel
chunks of the weights in the PM."""

from __future__ import annotations

import numpy as np

from tvm_accel.errors import MappingError
from tvm_accel.knobs import validate_knobs
from tvm_accel.layers import (
    ConvLayer,
    DeconvLayer,
    deconv_subconvs,
)
from tvm_dpu import codegen as cg
from tvm_dpu.program import LayerProgram, TensorPlacement
from tvm_dpu.strategy.dependencies import _Tile
from tvm_dpu.strategy.emit import Emitter
from tvm_dpu.strategy.knobs import knob_space
from tvm_dpu.strategy.tiling import (
    _conv_geometry,
    _in_window,
    _pm_block,
    _subsamples,
    conv_dilation,
    conv_span,
)
from tvm_dpu.xgraph import XGraphError, clip_fields, fold_conv


class ConvEmitter(Emitter):
    """Convs, dense layers and transpose convs."""

    def conv(self, layer: ConvLayer, user: dict | None) -> LayerProgram:
        tin, tout = self.tensors[layer.input], self.tensors[layer.output]
        in_shape = (tin.shape[0], tin.hwc[2], tin.hwc[0], tin.hwc[1])
        c, k, ho, wo, kh, kw = _conv_geometry(layer, in_shape)
        kn = validate_knobs(knob_space(layer, in_shape, self.cfg), user, layer.name)

        def tail(buf, g, y0, nh, x0, nw, k0, kk):
            return [], [], [self._save(tout, buf, g, y0, nh, x0, nw, k0, kk)]
        segments = self._conv_segments(layer, tin, kn, tail, (0, ho), (0, wo))
        insns = self._schedule(segments, "CONV", kn["pipeline"], self.cfg.PM_BYTES // 2)
        n = tin.shape[0]
        dw = layer.is_depthwise
        macs = n * k * ho * wo * kh * kw * (1 if dw else c)
        op = "dense" if layer.is_dense else ("depthwise_conv2d" if dw else "conv2d")
        return LayerProgram(layer.name, op, cg.encode_stream(insns), len(insns), int(macs),
                            self.shape_text(layer),
                            kn)

    def _conv_params(self, layer: ConvLayer, in_c: int) -> dict:
        """Folded hardware parameters of a conv (``xgraph.fold_conv``), checked for the engine."""
        try:
            folded = fold_conv(layer)
        except XGraphError as e:
            raise MappingError(str(e)) from None
        if layer.groups != 1 and not (layer.is_depthwise and layer.groups == in_c
                                      == layer.weight.shape[0]):
            raise MappingError(f"layer {layer.name}: grouped conv is not supported")
        return folded

    def _pm_chunk(self, folded: dict, k0: int, kk: int,
                  pm_addr: int | None = None) -> tuple[cg.Load, int]:
        """PM LOAD of output channels ``k0 .. k0+kk`` (int8 weights then int32 biases); without
        ``pm_addr``, chunks that fit half the PM alternate between the halves (double
        buffering), larger ones start at 0."""
        cfg = self.cfg
        block = (folded["weight"][k0:k0 + kk].astype(np.int8).tobytes()
                 + folded["bias"][k0:k0 + kk].astype("<i4").tobytes())
        rows_pm, cols_pm, chans_pm = _pm_block(len(block))
        block += bytes(rows_pm * cols_pm * chans_pm - len(block))
        poff = self._param(block)
        if pm_addr is None:
            pm_addr = 0
            if len(block) <= cfg.PM_BYTES // 2:
                pm_addr = (self._pm_seq % 2) * (cfg.PM_BYTES // 2)
                self._pm_seq += 1
        ld = cg.Load(to_pm=True, dst_addr=pm_addr, region=cg.REGION_PARAM, ddr_offset=poff,
                     rows=rows_pm, cols=cols_pm, chans=chans_pm, ddr_pix_stride=chans_pm,
                     ddr_row_stride=cols_pm * chans_pm)
        return ld, pm_addr

    def _conv_tile(self, layer: ConvLayer, tin: TensorPlacement, folded: dict, fmt: bool,
                   buf: int, g: int, k0: int, kk: int, y0: int, nh: int, x0: int, nw: int,
                   out_mem: int, out_addr: int, pm_addr: int) -> tuple[cg.Load, cg.Conv]:
        """LOAD of the input window + CONV computing output rows ``y0 .. y0+nh``, columns
        ``x0 .. x0+nw`` and channels ``k0 .. k0+kk`` into ``out_mem`` at ``out_addr``."""
        h, w, c = tin.hwc
        kh, kw = layer.kernel
        (span_h, span_w), dil = conv_span(layer), conv_dilation(layer)
        sh, sw = layer.strides
        pt, pl, _, _ = layer.padding
        rq, zx, dw = layer.requant, folded["pad_value"], layer.is_depthwise
        sub = _subsamples(layer, fmt)
        if sub:  # a strided 1x1 conv reads every sh-th row / sw-th column: the LOAD skips the rest
            (r0, rows, ptop, pbot), (c0, cols, pleft, pright) = (y0 * sh, nh, 0, 0), \
                (x0 * sw, nw, 0, 0)
        else:
            r0, rows, ptop, pbot = _in_window(y0, nh, sh, pt, span_h, h)
            c0, cols, pleft, pright = _in_window(x0, nw, sw, pl, span_w, w)
        if rows < 1 or cols < 1:
            raise MappingError(f"layer {layer.name}: an output tile reads padding only")
        ic, ch0 = (kk, k0) if dw else (c, 0)
        ld = self._load(tin, 0, buf, g, r0, rows, c0, cols, ch0, ic)
        if sub:
            ld.ddr_pix_stride *= sw
            ld.ddr_row_stride *= sh
            sh = sw = 1
        geo = dict(in_pix_stride=ic, in_row_stride=cols * ic, ic=ic, kernel_w=kw, pad_top=ptop,
                   pad_bottom=pbot, pad_left=pleft, pad_right=pright)
        if fmt:  # LOAD pads and gathers kw pixels: a kh x 1 conv on kw*c
            width = pleft + cols + pright
            ld.pad_top, ld.pad_bottom = ptop, pbot
            ld.pad_left, ld.pad_right = pleft, pright
            ld.pad_value, ld.fmt = zx, kw
            ld.fm_pix_stride = kw * c
            ld.fm_row_stride = width * kw * c
            geo = dict(in_pix_stride=kw * c, in_row_stride=width * kw * c, ic=kw * c,
                       kernel_w=1, pad_top=0, pad_bottom=0, pad_left=0, pad_right=0)
        conv = cg.Conv(in_mem=0, in_addr=buf, out_mem=out_mem, out_addr=out_addr,
                       out_pix_stride=kk, out_row_stride=nw * kk, out_h=nh, out_w=nw, oc=kk,
                       kernel_h=kh, stride_h=sh, stride_w=sw, pad_value=zx, param_addr=pm_addr,
                       shift=int(rq.shift), depthwise=dw, dilation=dil, **clip_fields(layer),
                       **geo)
        return ld, conv

    def _conv_segments(self, layer: ConvLayer, tin: TensorPlacement, kn: dict, tail,
                       out_rows: tuple[int, int], out_cols: tuple[int, int]) -> list:
        """Segments (one per output-channel chunk) computing output rows ``out_rows`` =
        (start, count) and columns ``out_cols`` of ``layer`` into FM 1; ``tail(buf, g, y0, nh,
        x0, nw, k0, kk)`` returns each tile's extra LOADs, extra computes (after the CONV) and
        SAVEs."""
        k = layer.weight.shape[0]
        folded = self._conv_params(layer, tin.hwc[2])
        kt, th, tw = kn["oc_tile"], kn["tile_h"], kn["tile_w"]
        grid = list(self._grid(tin, out_rows, out_cols, th, tw))
        # one tile and several weight chunks (e.g. ResNet-50's res5 1x1 convs): the input tile
        # stays in FM (LOADed once, input-stationary), the chunks' outputs ping-pong
        stationary = len(grid) == 1 and k > kt and not layer.is_depthwise
        half = self.cfg.fm_memory_bytes // 2
        segments = []
        for i, k0 in enumerate(range(0, k, kt)):
            kk = min(kt, k - k0)
            pm, pm_addr = self._pm_chunk(folded, k0, kk)
            tiles = []
            for buf, g, y0, nh, x0, nw in grid:
                obuf = (i % 2) * half if stationary else buf
                ld, conv = self._conv_tile(layer, tin, folded, bool(kn.get("format")),
                                           buf, g, k0, kk, y0, nh, x0, nw, 1, obuf,
                                           pm_addr)
                loads, computes, saves = tail(obuf, g, y0, nh, x0, nw, k0, kk)
                first = [ld] if not stationary or i == 0 else []
                tiles.append(_Tile([*first, *loads], [conv, *computes], saves))
            segments.append(([pm], tiles))
        return segments

    def deconv(self, layer: DeconvLayer, user: dict | None) -> LayerProgram:
        """Transpose conv. ``form`` knob: ``"subconv"`` (default, the DPU paper's optimal
        implementation, Fig. 15) runs SH x SW stride-1 sub-convolutions (``deconv_subconvs``)
        whose SAVEs scatter every tile to every SH-th row / SW-th column of the output (the
        shuffle is DDR placement); ``"upsample"`` (Fig. 14) builds the zero-inserted input in
        DDR and runs one stride-1 conv with the flipped kernel (:meth:`_deconv_upsample`)."""
        tin, tout = self.tensors[layer.input], self.tensors[layer.output]
        in_shape = (tin.shape[0], tin.hwc[2], tin.hwc[0], tin.hwc[1])
        user = dict(user or {})
        form = user.pop("form", "subconv")
        unknown = sorted(set(user) - {"pipeline"})
        if form not in ("subconv", "upsample") or unknown:
            raise MappingError(f"layer {layer.name}: knobs are form (subconv | upsample) and "
                               f"pipeline; got form={form!r} {unknown or ''}".rstrip())
        pipe = bool(user.get("pipeline", True))
        if form == "upsample":
            return self._deconv_upsample(layer, pipe)
        try:
            subs = deconv_subconvs(layer, in_shape)
        except ValueError as e:
            raise MappingError(str(e)) from None
        ho, wo, k = tout.hwc
        ps = tout.pstride
        sh, sw = layer.strides
        segments, macs = [], 0
        for sc in subs:
            kn = validate_knobs(knob_space(sc.conv, in_shape, self.cfg), {"pipeline": pipe},
                                 layer.name, user_set=False)
            (qh, qw), (nh_t, nw_t), (oy, ox) = sc.crop, sc.count, sc.offset

            def tail(buf, g, y0, nh, x0, nw, k0, kk, qh=qh, qw=qw, oy=oy, ox=ox):
                r = oy + sh * (y0 - qh)
                col = ox + sw * (x0 - qw)
                return [], [], [cg.Save(fm_mem=1, src_addr=buf, region=self._region(tout),
                               ddr_offset=tout.offset + g * self.P * tout.img_stride
                               + (r * wo + col) * ps + k0,
                               rows=nh, cols=nw, chans=kk, fm_pix_stride=kk,
                               fm_row_stride=nw * kk, ddr_pix_stride=sw * ps,
                               ddr_row_stride=sh * wo * ps, img_stride=tout.img_stride)]
            segments += self._conv_segments(sc.conv, tin, kn, tail, (qh, nh_t), (qw, nw_t))
            skh, skw = sc.conv.kernel
            macs += tin.shape[0] * k * nh_t * nw_t * skh * skw * in_shape[1]
        insns = self._schedule(segments, "CONV", pipe, self.cfg.PM_BYTES // 2)
        return LayerProgram(layer.name, "conv2d_transpose", cg.encode_stream(insns), len(insns),
                            int(macs), self.shape_text(layer, f"({sh * sw} subconvs)"),
                            {"form": "subconv", "pipeline": pipe})

    def _deconv_upsample(self, layer: DeconvLayer, pipe: bool) -> LayerProgram:
        """Upsample + conv form of a transpose conv, one stream in three phases: SAVEs fill a
        SWAP tensor U of ``(H-1)*SH+1`` x ``(W-1)*SW+1`` pixels with the input zero point (from
        a constant block LOADed once from PARAM, the same for every PE), LOAD/SAVE pairs
        scatter the input pixels to every SH-th row / SW-th column of U, then a stride-1 conv
        of U with the spatially flipped kernel and padding ``K-1-pad`` computes the output; its
        first LOAD waits for the last SAVE (DDR read-after-write)."""
        tin, tout = self.tensors[layer.input], self.tensors[layer.output]
        n, h, w, c = tin.shape[0], *tin.hwc
        ho, wo, k = tout.hwc
        (kh, kw), (sh, sw) = layer.kernel, layer.strides
        pt, pl, _, _ = layer.padding
        if layer.groups != 1 or tuple(layer.dilation) != (1, 1) or pt > kh - 1 or pl > kw - 1:
            raise MappingError(f"layer {layer.name}: the upsample form needs groups 1, dilation "
                               "1 and padding below the kernel size")
        hu, wu = (h - 1) * sh + 1, (w - 1) * sw + 1
        ptc, plc = kh - 1 - pt, kw - 1 - pl
        pbc, prc = max(0, ho + kh - 1 - ptc - hu), max(0, wo + kw - 1 - plc - wu)
        u = self._scratch(f"{layer.name}_zero_insert", (n, c, hu, wu))
        zx = int(layer.input_zero_point)
        half = self.cfg.fm_memory_bytes // 2
        # phase 1: fill U with the zero point, bands of rows x the full width (or a W-chunk)
        cols_f = min(wu, max(1, half // c))
        rows_f = max(1, min(hu, half // (cols_f * c)))
        block = np.full(rows_f * cols_f * c, zx, dtype=np.int8).tobytes()
        const = cg.Load(fm_mem=1, dst_addr=0, region=cg.REGION_PARAM, ddr_offset=self._param(block),
                        rows=rows_f, cols=cols_f, chans=c, ddr_pix_stride=c,
                        ddr_row_stride=cols_f * c, fm_pix_stride=c, fm_row_stride=cols_f * c,
                        img_stride=0)
        fills = [self._save(u, 0, g, y0, min(rows_f, hu - y0), x0, min(cols_f, wu - x0), 0, c)
                 for g in range(u.n_alloc // self.P) for y0 in range(0, hu, rows_f)
                 for x0 in range(0, wu, cols_f)]
        tiles = [_Tile([const], [], fills)]
        # phase 2: scatter the input, bands of input rows
        cols_s = min(w, max(1, half // c))
        rows_s = max(1, min(h, half // (cols_s * c)))
        for buf, g, y0, nh, x0, nw in self._grid(tin, (0, h), (0, w), rows_s, cols_s):
            ld = self._load(tin, 0, buf, g, y0, nh, x0, nw, 0, c)
            sv = self._save(u, buf, g, y0 * sh, nh, x0 * sw, nw, 0, c, fm_mem=0)
            sv.ddr_pix_stride, sv.ddr_row_stride = sw * c, sh * wu * c
            tiles.append(_Tile([ld], [], [sv]))
        # phase 3: the stride-1 conv of U
        wt = layer.weight.astype(np.int64)[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
        conv = ConvLayer(name=layer.name, input=u.name, output=layer.output, weight=wt,
                         bias=layer.bias, input_zero_point=zx, strides=(1, 1),
                         padding=(ptc, plc, pbc, prc), requant=layer.requant)
        u_shape = (n, c, hu, wu)
        kn = validate_knobs(knob_space(conv, u_shape, self.cfg), {"pipeline": pipe}, layer.name,
                            user_set=False)

        def tail(buf, g, y0, nh, x0, nw, k0, kk):
            return [], [], [self._save(tout, buf, g, y0, nh, x0, nw, k0, kk)]
        conv_segs = self._conv_segments(conv, u, kn, tail, (0, ho), (0, wo))
        segments = [([], tiles), *[(pm, t, j == 0) for j, (pm, t) in enumerate(conv_segs)]]
        insns = self._schedule(segments, "CONV", pipe, self.cfg.PM_BYTES // 2)
        macs = n * c * h * w * k * kh * kw  # useful MACs: every input pixel x kernel
        return LayerProgram(layer.name, "conv2d_transpose", cg.encode_stream(insns), len(insns),
                            int(macs), self.shape_text(layer, "(upsample+conv)"),
                            {"form": "upsample", "pipeline": pipe})
