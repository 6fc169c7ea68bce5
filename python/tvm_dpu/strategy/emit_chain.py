"""Streams of on-chip chains: band by band, halo rows kept in FM, weights resident or streamed
through the PM halves."""

from __future__ import annotations

import dataclasses

from tvm_accel.errors import MappingError
from tvm_accel.knobs import validate_knobs
from tvm_accel.layers import (
    AddLayer,
    ConvLayer,
    PoolLayer,
    conv_output_shape,
    pool_output_shape,
)
from tvm_dpu import codegen as cg
from tvm_dpu.program import LayerProgram
from tvm_dpu.strategy.chains import (
    _chain_chunk,
    _chain_inputs,
    _chain_knob_space,
    _chain_plan,
    _chain_streams_weights,
    _ChainPlan,
    _pieces,
)
from tvm_dpu.strategy.dependencies import _Tile
from tvm_dpu.strategy.emit import Emitter, _pool_maker
from tvm_dpu.strategy.emit_conv import ConvEmitter
from tvm_dpu.strategy.tiling import _in_window
from tvm_dpu.xgraph import XGraphError, clip_fields, fold_add


class ChainEmitter(ConvEmitter):
    """On-chip chains, built on the conv emitter's weight chunks."""

    def chain(self, layers: list, user: dict | None) -> LayerProgram:
        """An on-chip chain (DPUV3INT8): convs each reading the previous one's output, optionally
        closed by an add or a pool, run band by band (:func:`~tvm_dpu.strategy.chains._chain_plan`).
        When the PM holds
        all the chain's weights they are LOADed once (the first conv's at the head, the others
        behind the first input band, so they overlap the first CONVs); otherwise (e.g. a
        ResNet-50 res4 / res5 bottleneck, 1.1 / 4.5 MB) they **stream**: every conv's weights
        are cut into output-channel chunks that fit half the PM, LOADed into the two halves in
        turn (double buffering: chunk i+2 waits for the CONV of chunk i) once per step, each
        chunk's CONV writing its channel slice of the output band. Per step: LOAD the new rows
        of the chain's input (and of the add's other operand when that is not the input), one
        CONV per conv (or chunk) computing its new rows from its producer's window into its
        own, MAXPOOL / AVGPOOL likewise on MISC, each window's halo rows COPYed to the top of
        its next buffer, ELTADD in place, SAVE the last layer's rows. Only the chain's input,
        the add's other operand, its output (and streamed weights) move over DDR."""
        name = "+".join(ly.name for ly in layers)
        x = layers[0].input
        shapes = {t: tuple(int(v) for v in self.g.tensors[t].shape)
                  for ly in layers for t in [*_chain_inputs([ly])[0], ly.output]}
        if any(len(sh) != 4 for sh in shapes.values()):
            raise MappingError(f"{name}: an on-chip chain needs NCHW tensors")
        for ly in layers:
            if isinstance(ly, AddLayer):
                if len({shapes[t] for t in (*ly.inputs, ly.output)}) != 1:
                    raise MappingError(f"{name}: the add operands differ in shape")
            elif isinstance(ly, PoolLayer):
                if (ly is layers[0] or max(ly.kernel) > 15 or max(ly.strides) > 7
                        or max(ly.padding) > 15
                        or pool_output_shape(ly, shapes[ly.input]) != shapes[ly.output]):
                    raise MappingError(f"{name}: {ly.name} cannot run in an on-chip chain")
            elif (ly.is_dense or ly.kernel[0] > 15 or ly.kernel[1] > 15
                  or conv_output_shape(ly, shapes[ly.input]) != shapes[ly.output]):
                raise MappingError(f"{name}: {ly.name} cannot run in an on-chip chain")
        kn = validate_knobs(_chain_knob_space(layers, shapes[x], self.cfg), user, name)
        try:
            cp = _chain_plan(layers, shapes, kn["tile_h"], self.cfg)
        except ValueError as e:
            raise MappingError(f"{name}: {e}") from None
        convs = [ly for ly in layers if isinstance(ly, ConvLayer)]
        stream = _chain_streams_weights(convs, shapes, self.cfg)
        pms, params, pm_at, chunks = [], {}, 0, {}
        for ly in layers:
            if isinstance(ly, ConvLayer) and stream:
                folded = self._conv_params(ly, shapes[ly.input][1])
                k, kt = ly.weight.shape[0], _chain_chunk(ly, shapes[ly.input][1], self.cfg)
                chunks[ly.name] = [(k0, min(kt, k - k0),
                                    self._pm_chunk(folded, k0, min(kt, k - k0), pm_addr=0)[0])
                                   for k0 in range(0, k, kt)]
                params[ly.name] = (folded, None)
            elif isinstance(ly, ConvLayer):
                folded = self._conv_params(ly, shapes[ly.input][1])
                ld, addr = self._pm_chunk(folded, 0, ly.weight.shape[0], pm_addr=pm_at)
                pm_at += ld.rows * ld.cols * ld.chans
                pms.append(ld)
                params[ly.name] = (folded, addr)
            elif isinstance(ly, PoolLayer):
                params[ly.name] = _pool_maker(ly)
            else:
                try:
                    params[ly.name] = fold_add(ly)
                except XGraphError as e:
                    raise MappingError(str(e)) from None
        if pm_at > self.cfg.PM_BYTES:
            raise MappingError(f"{name}: the chain's parameters ({pm_at} bytes) exceed the PM")
        keys: dict[int, tuple[list, list]] = {}
        tout = self.tensors[layers[-1].output]
        nb = len(cp.e[-1])
        groups = tout.n_alloc // self.P
        half = self.cfg.PM_BYTES // 2
        seq = [chunks[ly.name][ci][2] for _ in range(groups) for j in range(nb)
               for i, ly in enumerate(layers) if ly.name in chunks and cp.reads[i][j] is not None
               for ci in range(len(chunks[ly.name]))]
        stream_loads = [dataclasses.replace(ld, dst_addr=(u % 2) * half)
                        for u, ld in enumerate(seq)]
        tiles, step, uses, prev = [], 0, [0], None
        for g in range(groups):
            for j in range(nb):
                part = self._chain_step(cp, params, keys, g, j, step % 2, chunks,
                                        (uses, stream_loads))
                if prev is not None and len(prev) > 1:
                    # streamed weights: this step's input bands are LOADed during the previous
                    # step (after its first CONV), not behind its last weight chunks
                    bands = [ld for ld in part[0].loads if not ld.to_pm]
                    part[0].loads = [ld for ld in part[0].loads if ld.to_pm]
                    prev[1].loads += bands
                tiles += part
                prev = part
                step += 1
        tiles[0].loads += pms[1:]  # later convs' weights load behind the first input band
        # streamed: the first chunk in each PM half leads (in one merged stream they load
        # during the previous group's tail, ahead of the input bands that wait for its SAVEs)
        tiles[0].loads[:0] = stream_loads[:2]
        insns = self._schedule([(pms[:1], tiles)], "CONV", kn["pipeline"], fm_keys=keys)
        n = shapes[x][0]
        macs = sum(n * ly.weight.shape[0] * shapes[ly.output][2] * shapes[ly.output][3]
                   * ly.kernel[0] * ly.kernel[1] * (1 if ly.is_depthwise else shapes[ly.input][1])
                   for ly in layers if isinstance(ly, ConvLayer))
        ops = "+".join(ly.op_name for ly in layers)
        return LayerProgram(name, f"{ops} (on-chip chain)", cg.encode_stream(insns), len(insns),
                            int(macs), self.shape_text(None, f"({len(layers)} layers, bands of "
                                                       f"{kn['tile_h']} rows)", layers[0],
                                                       layers[-1]), kn)

    def _chain_step(self, cp: _ChainPlan, params: dict, keys: dict, g: int, j: int,
                    q: int, chunks: dict | None = None, streamed: tuple | None = None
                    ) -> list[_Tile]:
        """The instructions of step ``j`` of image group ``g`` of a chain, in ping-pong half
        ``q``; records each instruction's FM buffers in ``keys``: a window's buffer is two
        buffers for the dependencies, its halo rows and its new rows, so the COPY of the halo
        and the producer of the new rows do not wait for each other. The halo COPY of step
        ``j + 1`` is issued right after the producer of step ``j`` (it reads the rows just
        made), ahead of the MISC work of step ``j`` that the next CONVs do not need.
        Streamed weights (``chunks``, ``streamed`` = (use counter, the chain's PM LOADs in use
        order)): use ``u`` reads PM half ``u % 2``; the LOAD of use ``u + 2`` follows the CONV
        of use ``u`` in program order (it starts a new tile), so it waits for that CONV to be
        done with the half (write after read)."""
        return _ChainStep(self, cp, params, keys, g, j, q, chunks, streamed).run()


class _ChainStep:
    """The instructions of one step of a chain (see :meth:`ChainEmitter._chain_step`), built
    in order: the LOADs of the input bands and their halo COPYs, then per member its CONVs
    (one per streamed weight chunk), pool or closing add, then the SAVEs of the output rows."""

    def __init__(self, em: Emitter, cp: _ChainPlan, params: dict, keys: dict, g: int, j: int,
                 q: int, chunks: dict | None, streamed: tuple | None):
        self.em, self.cp, self.params, self.keys = em, cp, params, keys
        self.g, self.j, self.q, self.chunks, self.streamed = g, j, q, chunks, streamed
        self.loads, self.computes, self.saves = [], [], []
        self.out = [_Tile(self.loads, self.computes, [])]
        self.nb = len(cp.e[-1])
        self.last, self.sliced = len(cp.layers) - 1, False
        self.edge = j in (0, self.nb - 1)  # a boundary step: its input / output in pieces

    def at(self, t: str, row: int) -> tuple[int, int]:
        w = self.cp.windows[t]
        mem, base = self.cp.place[(t, self.q)]
        return mem, base + (row - w.a[self.j]) * w.row_bytes

    def rows_keys(self, t: str, r0: int, r1: int, jj: int, qq: int) -> list:
        w = self.cp.windows[t]
        return ([(t, qq, "halo")] if r0 < w.s[jj] else []) + \
            ([(t, qq, "new")] if r1 > w.s[jj] else [])

    def next_halo(self, t: str) -> None:
        cp, j, q = self.cp, self.j, self.q
        w = cp.windows[t]
        if j + 1 >= self.nb or w.a[j + 1] >= w.s[j + 1]:
            return
        h, wd, c = w.hwc
        mem_s, base_s = cp.place[(t, q)]
        mem_d, base_d = cp.place[(t, 1 - q)]
        op = cg.Copy(in_mem=mem_s, in_addr=base_s + (w.a[j + 1] - w.a[j]) * w.row_bytes,
                     in_pix_stride=c, in_row_stride=wd * c, out_mem=mem_d,
                     out_addr=base_d, out_pix_stride=c, out_row_stride=wd * c,
                     out_h=w.s[j + 1] - w.a[j + 1], out_w=wd, chans=c)
        self.keys[id(op)] = (self.rows_keys(t, w.a[j + 1], w.s[j + 1], j, q),
                             [(t, 1 - q, "halo")])
        self.computes.append(op)

    def eltadd(self, i: int, s0: int, cnt: int, ch0: int, nch: int | None) -> cg.EltAdd:
        """The closing add of rows ``s0 .. s0+cnt``, channels ``ch0 .. ch0+nch`` (all: None),
        in place in the window of the member before it."""
        cp, j, q = self.cp, self.j, self.q
        ly = cp.layers[i]
        chained = cp.layers[i - 1].output
        (ma, aa), (mb, ba) = self.at(ly.inputs[0], s0), self.at(ly.inputs[1], s0)
        mo, ao = self.at(chained, s0)
        _, wd, c = cp.windows[chained].hwc
        rq = ly.requant
        op = cg.EltAdd(in_mem=ma, in_addr=aa + ch0, in_pix_stride=c, in_row_stride=wd * c,
                       out_mem=mo, out_addr=ao + ch0, out_pix_stride=c,
                       out_row_stride=wd * c, out_h=cnt, out_w=wd,
                       chans=c if nch is None else nch, b_mem=mb, b_addr=ba + ch0,
                       b_pix_stride=c, b_row_stride=wd * c,
                       shift_a=self.params[ly.name]["shift_a"],
                       shift_b=self.params[ly.name]["shift_b"], shift=int(rq.shift),
                       clip_lo=int(rq.qmin), clip_hi=int(rq.qmax))
        if nch is None:  # a row piece: its rows are its own buffer for the SAVE of them
            self.keys[id(op)] = ([k for t in ly.inputs
                                  for k in self.rows_keys(t, s0, s0 + cnt, j, q)],
                                 [(chained, q, "new", "rows", s0)])
        else:  # a channel slice is its own buffer: the next chunk's CONV does not wait
            part = [(chained, q, "new", ch0)]
            self.keys[id(op)] = ([k for t in ly.inputs if t != chained
                                  for k in self.rows_keys(t, s0, s0 + cnt, j, q)] + part, part)
        return op

    def save_rows(self, r0: int, r1: int, ch0: int, nch: int | None) -> list:
        """SAVEs of the chain's output rows ``r0 .. r1``, channels ``ch0 .. ch0+nch``."""
        cp, j, q = self.cp, self.j, self.q
        w, out_ = cp.windows[cp.final], []
        _, wd, c = w.hwc
        for s0, e0 in _pieces(r0, r1, self.edge):
            mem, addr = self.at(cp.final, s0)
            sv = self.em._save(self.em.tensors[cp.layers[-1].output], addr + ch0, self.g, s0,
                               e0 - s0, 0, wd, ch0, c if nch is None else nch, fm_mem=mem)
            sv.fm_pix_stride, sv.fm_row_stride = c, wd * c
            if nch is not None:
                reads = [(cp.final, q, "new", ch0)]
            elif isinstance(cp.layers[self.last], AddLayer):  # after the ELTADD of its rows
                reads = [*self.rows_keys(cp.final, s0, e0, j, q), (cp.final, q, "new", "rows", s0)]
            else:
                reads = self.rows_keys(cp.final, s0, e0, j, q)
            self.keys[id(sv)] = (reads, [])
            out_.append(sv)
        return out_

    def load_inputs(self) -> None:
        """LOADs of the new rows of the windows read from DDR, then their halo COPYs."""
        cp, j, q = self.cp, self.j, self.q
        for t, w in cp.windows.items():
            if w.producer is None and w.e[j] > w.s[j]:
                h, wd, c = w.hwc
                for r0, r1 in _pieces(w.s[j], w.e[j], self.edge):
                    mem, addr = self.at(t, r0)
                    ld = self.em._load(self.em.tensors[t], mem, addr, self.g, r0, r1 - r0, 0, wd,
                                       0, c)
                    self.keys[id(ld)] = ([], [(t, q, "new")])
                    self.loads.append(ld)
        for t, w in cp.windows.items():
            if w.producer is None:
                self.next_halo(t)

    def add(self, i: int, s0: int, cnt: int) -> None:
        if not self.sliced:
            for a, b in _pieces(s0, s0 + cnt, self.edge):
                self.computes.append(self.eltadd(i, a, b - a, 0, None))

    def pool(self, ly: PoolLayer, rd: tuple, s0: int, cnt: int) -> None:
        cp = self.cp
        r0, nr, ptop, pbot = rd
        _, wi, ci = cp.windows[ly.input].hwc
        _, wo, c = cp.windows[ly.output].hwc
        _, _, pleft, pright = _in_window(0, wo, ly.strides[1], ly.padding[1], ly.kernel[1], wi)
        (mi, ai), (mo, ao) = self.at(ly.input, r0), self.at(ly.output, s0)
        op = self.params[ly.name](pads=(ptop, pbot, pleft, pright), in_mem=mi, in_addr=ai,
                                  in_pix_stride=ci, in_row_stride=wi * ci, out_mem=mo,
                                  out_addr=ao, out_pix_stride=c, out_row_stride=wo * c,
                                  out_h=cnt, out_w=wo, chans=c)
        self.keys[id(op)] = (self.rows_keys(ly.input, r0, r0 + nr, self.j, self.q),
                             [(ly.output, self.q, "new")])
        self.computes.append(op)
        if ly.output in cp.windows and ly.output != cp.final:
            self.next_halo(ly.output)

    def conv(self, i: int, ly: ConvLayer, rd: tuple, s0: int, cnt: int) -> None:
        """The CONVs of a member (one per streamed weight chunk); the chunks of the conv a
        closing add works on in place are each added and SAVEd as soon as their CONV is done
        (a short tail for the next group)."""
        cp, j, q, chunks, last = self.cp, self.j, self.q, self.chunks, self.last
        folded, pm_addr = self.params[ly.name]
        r0, nr, ptop, pbot = rd
        _, wi, ci = cp.windows[ly.input].hwc
        _, wo, k = cp.windows[ly.output].hwc
        _, _, pleft, pright = _in_window(0, wo, ly.strides[1], ly.padding[1], ly.kernel[1], wi)
        mi, ai = self.at(ly.input, r0)
        mo, ao = self.at(ly.output, s0)
        rq = ly.requant
        streamed = chunks and ly.name in chunks
        parts = [(0, k, None)]
        if streamed:  # streamed weights: one chunk per PM half in turn
            parts = [(k0, kk, None) for k0, kk, _ in chunks[ly.name]]
        closes = (isinstance(cp.layers[last], AddLayer) and i == last - 1
                  and cp.e[last][j] > cp.s[last][j])
        for k0, kk, addr in parts:
            use = None
            if streamed:
                use = self.streamed[0][0]
                self.streamed[0][0] += 1
                addr = self.streamed[1][use].dst_addr
            dw = ly.is_depthwise
            cv = cg.Conv(in_mem=mi, in_addr=ai + (k0 if dw else 0), in_pix_stride=ci,
                         in_row_stride=wi * ci, ic=kk if dw else ci, out_mem=mo,
                         out_addr=ao + k0, out_pix_stride=k, out_row_stride=wo * k,
                         out_h=cnt, out_w=wo, oc=kk, kernel_h=ly.kernel[0],
                         kernel_w=ly.kernel[1], stride_h=ly.strides[0],
                         stride_w=ly.strides[1], pad_top=ptop, pad_bottom=pbot,
                         pad_left=pleft, pad_right=pright,
                         pad_value=folded["pad_value"],
                         param_addr=pm_addr if addr is None else addr,
                         shift=int(rq.shift), depthwise=dw, **clip_fields(ly))
            self.keys[id(cv)] = (self.rows_keys(ly.input, r0, r0 + nr, j, q),
                                 [(ly.output, q, "new", k0) if closes and len(parts) > 1
                                  else (ly.output, q, "new")])
            self.computes.append(cv)
            if closes and len(parts) > 1:  # add and SAVE this chunk's channels now
                self.sliced = True
                self.computes.append(self.eltadd(last, s0, cnt, k0, kk))
                self.out[-1].saves.extend(self.save_rows(s0, s0 + cnt, k0, kk))
            if use is not None and use + 2 < len(self.streamed[1]):
                self.computes = []
                self.out.append(_Tile([self.streamed[1][use + 2]], self.computes, []))
        if ly.output in cp.windows and ly.output != cp.final:
            self.next_halo(ly.output)

    def run(self) -> list[_Tile]:
        cp, j, last = self.cp, self.j, self.last
        self.load_inputs()
        for i, ly in enumerate(cp.layers):
            rd = cp.reads[i][j]
            if rd is None:
                continue
            s0, cnt = cp.s[i][j], cp.e[i][j] - cp.s[i][j]
            if isinstance(ly, AddLayer):
                self.add(i, s0, cnt)
            elif isinstance(ly, PoolLayer):
                self.pool(ly, rd, s0, cnt)
            else:
                self.conv(i, ly, rd, s0, cnt)
        if cp.e[last][j] > cp.s[last][j] and not self.sliced:
            self.saves += self.save_rows(cp.s[last][j], cp.e[last][j], 0, None)
        self.out[-1].saves.extend(self.saves)
        return self.out
