"""Compute commands of one tile (part of the emit stage): the RBE job with the cluster's
marshaling around it, the cluster kernels (CONV / DWCONV / FC with partial sums, ADD, pools)
and the RBE residual add."""

from __future__ import annotations

import numpy as np

import tvm_marsellus.codegen as cg
from tvm_accel.errors import MappingError
from tvm_marsellus.hw_config import RBE_CHANNELS
from tvm_marsellus.layout import weight_bytes
from tvm_marsellus.strategy.layers import TensorInfo, _al, _clip_mode, _rng, cluster_bits
from tvm_marsellus.strategy.tiling import _Layer


class Kernels:
    """Planner stage (within emit): the compute commands of one tile."""

    def _computes(self, lay: _Layer, n: int, ho0: int, hh: int, wo0: int, ww: int, k0: int,
                  kk: int, buf, wslot: int, chunk: tuple = (0, 1, 0, None)
                  ) -> tuple[list, int]:
        """Compute commands of one tile (``chunk`` = index, count, channels and L1 NormQuant
        address of its input-channel chunk under Kin tiling) and the index of the last one
        reading input/weights. A cluster layer writing the RBE layout puts its (last chunk's)
        HWC result in ``t4`` and marshals it into the output tile."""
        cmds, free_at = self._kernels(lay, n, ho0, hh, wo0, ww, k0, kk, buf, wslot, chunk)
        if lay.marshals_out and chunk[0] == chunk[1] - 1:
            t = lay.tout
            cmds[-1].out_addr = buf("t4")
            cmds.append(cg.ClusterKernel(
                kernel="HWC2RBE", in_signed=0, out_signed=0, in_bits=t.cbits, out_bits=t.bits,
                in_addr=buf("t4"), out_addr=buf("out"), h_in=hh, w_in=ww, c_in=kk, c_out=kk,
                h_out=hh, w_out=ww))
        return cmds, free_at

    def _kernels(self, lay: _Layer, n: int, ho0: int, hh: int, wo0: int, ww: int, k0: int,
                 kk: int, buf, wslot: int, chunk: tuple = (0, 1, 0, None)
                 ) -> tuple[list, int]:
        """The commands of :meth:`_computes` before a cluster layer's output marshaling."""
        ly, g, tin, tout = lay.layer, lay.geo, lay.tin, lay.tout
        if lay.stacked:
            cmds = self._rbe_add(lay, hh, ww, kk, buf, wslot)
            return cmds, -(-kk // RBE_CHANNELS) - 1
        if lay.kind == "add":
            return [self._add(lay, hh, ww, buf)], 0
        if lay.kind == "mul":
            return [self._mul(lay, hh, ww, buf)], 0
        lo, hi, ptop, pbot = g.in_rows(ho0, hh)
        clo, chi, pleft, pright = g.in_cols(wo0, ww)
        rows, cols = hi - lo, chi - clo
        if lay.kind == "lut":
            return [self._lut(lay, hh, ww, buf, wslot)], 0
        if lay.kind == "pool":
            return [self._pool(lay, rows, hh, cols, ww, (ptop, pleft, pbot, pright), buf)], 0
        relu, _ = _clip_mode(ly, tout, None if lay.engine == "rbe" and tout.layout == "rbe"
                             else (tout.bits if lay.engine == "rbe" else tout.cbits))
        wbytes = _al(weight_bytes(kk, g.c, g.kh, ly.weight_bits)) if lay.engine == "rbe" \
            else _al(kk * g.kh * g.kw * (g.c if lay.kind != "dw" else 1)
                     * cluster_bits(ly.weight_bits) / 8)
        nq = wslot + wbytes
        shift = int(ly.requant.shift)
        if lay.engine != "rbe":
            kern = {"conv": "CONV", "dw": "DWCONV", "fc": "FC"}[lay.kind]
            j, nch, cc, nq_last = chunk
            if nch > 1:  # Kin tiling: 32-bit partial sums in L1, NormQuant after the last chunk
                c = cg.ClusterKernel(
                    kernel=kern, relu=int(relu) if j == nch - 1 else 0,
                    out_signed=int(tout.stored_signed), in_signed=int(tin.stored_signed),
                    in_bits=tin.cbits, w_bits=cluster_bits(ly.weight_bits), out_bits=tout.cbits,
                    shift=shift if j == nch - 1 else 0, in_addr=buf("in"), out_addr=buf("out"),
                    w_addr=wslot, nq_addr=nq_last if j == nch - 1 else 0, h_in=rows, w_in=cols,
                    c_in=cc, c_out=kk, h_out=hh, w_out=ww, kh=g.kh, kw=g.kw, sh=g.sh, sw=g.sw,
                    pad_top=ptop, pad_bottom=pbot, pad_left=pleft, pad_right=pright,
                    pad_value=int(ly.input_zero_point) + tin.offset_value, psum_in=int(j > 0),
                    psum_out=int(j < nch - 1), psum_addr=buf("psum"))
                return [c], 0
            c = cg.ClusterKernel(
                kernel=kern, relu=int(relu), out_signed=int(tout.stored_signed),
                in_signed=int(tin.stored_signed), in_bits=tin.cbits,
                w_bits=cluster_bits(ly.weight_bits), out_bits=tout.cbits, shift=shift,
                in_addr=buf("in"), out_addr=buf("out"), w_addr=wslot, nq_addr=nq,
                h_in=rows, w_in=cols, c_in=g.c, c_out=kk, h_out=hh, w_out=ww, kh=g.kh,
                kw=g.kw, sh=g.sh, sw=g.sw, pad_top=ptop, pad_bottom=pbot, pad_left=pleft,
                pad_right=pright, pad_value=int(ly.input_zero_point) + tin.offset_value)
            return [c], 0
        cmds = []
        x = buf("in")
        if tin.layout == "hwc":
            src = x
            if tin.stored_signed:
                cmds.append(cg.ClusterKernel(
                    kernel="ADD", in_signed=1, b_signed=1, out_signed=0, in_bits=tin.cbits,
                    out_bits=tin.cbits, in_addr=x, w_addr=x, out_addr=buf("t1"), kappa_a=1,
                    kappa_b=0, lambda_=1 << (tin.bits - 1), h_in=rows, w_in=cols, c_in=g.c,
                    c_out=g.c, h_out=rows, w_out=cols))
                src = buf("t1")
            cmds.append(cg.ClusterKernel(
                kernel="HWC2RBE", in_signed=0, out_signed=0, in_bits=tin.cbits,
                out_bits=tin.bits, in_addr=src, out_addr=buf("t2"), h_in=rows, w_in=cols,
                c_in=g.c, c_out=g.c, h_out=rows, w_out=cols))
            x = buf("t2")
        off_in = (1 << (tin.bits - 1)) if tin.signed else 0
        y = buf("out") if tout.layout == "rbe" else buf("t3")
        common = dict(in_bits=tin.bits, w_bits=ly.weight_bits, out_bits=tout.bits,
                      kernel=g.kh, stride=g.sh, relu=int(relu),
                      out_signed=int(tout.stored_signed), shift=shift,
                      pad_value=int(ly.input_zero_point) + off_in)
        if lay.pair:  # column pairs (and a plain job over the last columns)
            cmds += lay.pair_jobs(x, wslot, y, rows, hh, ptop, pbot, **common)
        else:
            cmds.append(cg.RbeJob(
                x_ptr=x, w_ptr=wslot, nq_ptr=nq, y_ptr=y, h_in=rows, w_in=cols, h_out=hh,
                w_out=ww, k_in=g.c, k_out=kk, pad_top=ptop, pad_bottom=pbot, pad_left=pleft,
                pad_right=pright, **common))
        free_at = len(cmds) - 1
        if tout.layout == "hwc":
            cmds.append(_rbe2hwc(tout, y, buf("out"), hh, ww, kk))
        return cmds, free_at

    def _rbe_add(self, lay: _Layer, hh: int, ww: int, kk: int, buf, wslot: int) -> list:
        """An add on the RBE: one 1x1 job per 32-channel tile j, reading the pair ``[a tile j,
        b tile j]`` of every stacked pixel as 64 input channels (pixel stride: the stacked
        pixel) and writing tile j of the output pixels (pixel stride: the output pixel), all
        with the weights and NormQuant of :meth:`_add_weights`; then ``CL.RBE2HWC`` if the
        output is HWC."""
        ly, tout, tin = lay.layer, lay.tout, lay.tin
        relu, _ = _clip_mode(ly, tout, None if tout.layout == "rbe" else tout.bits)
        wk = min(kk, RBE_CHANNELS)
        nq = wslot + _al(weight_bytes(wk, lay.k_in, 1, lay.w_bits))
        y = buf("out") if tout.layout == "rbe" else buf("t3")
        tb_in, tb_out = tin.bits * 4, tout.bits * 4
        nt = -(-kk // RBE_CHANNELS)
        cmds: list = [cg.RbeJob(
            x_ptr=buf("in") + j * 2 * tb_in, w_ptr=wslot, nq_ptr=nq, y_ptr=y + j * tb_out,
            h_in=hh, w_in=ww, h_out=hh, w_out=ww, k_in=lay.k_in,
            k_out=min(RBE_CHANNELS, kk - j * RBE_CHANNELS), in_bits=tin.bits,
            w_bits=lay.w_bits, out_bits=tout.bits, kernel=1, relu=int(relu),
            out_signed=int(tout.stored_signed), w_unsigned=1, shift=int(ly.requant.shift),
            x_pix_stride=2 * nt * tb_in if nt > 1 else 0,
            y_pix_stride=nt * tb_out if nt > 1 else 0) for j in range(nt)]
        if tout.layout == "hwc":
            cmds.append(_rbe2hwc(tout, y, buf("out"), hh, ww, kk))
        return cmds

    def _add(self, lay: _Layer, hh: int, ww: int, buf) -> cg.ClusterKernel:
        ly, g = lay.layer, lay.geo
        a, b = lay.tins
        if a.cbits != b.cbits:
            raise MappingError(f"layer {ly.name}: operands of {a.bits} and {b.bits} bits need "
                               "one cluster width")
        rq = ly.requant
        relu, _ = _clip_mode(ly, lay.tout, lay.tout.cbits)
        lam = int(np.ravel(rq.round_add)[0]) + ((rq.zero_point + lay.tout.offset_value)
                                                 << rq.shift) \
            - (ly.a_zero_point + a.offset_value) * ly.a_multiplier \
            - (ly.b_zero_point + b.offset_value) * ly.b_multiplier
        if not -(1 << 31) <= lam < 1 << 31 or max(ly.a_multiplier, ly.b_multiplier) > 0xFFFF \
                or min(ly.a_multiplier, ly.b_multiplier) < 0 or not 0 <= rq.shift <= 31:
            raise MappingError(f"layer {ly.name}: add recipe does not fit the cluster ADD")
        row_a = _al(hh * ww * a.pix_bytes())
        return cg.ClusterKernel(
            kernel="ADD", relu=int(relu), in_signed=int(a.stored_signed),
            b_signed=int(b.stored_signed), out_signed=int(lay.tout.stored_signed),
            in_bits=a.cbits, out_bits=lay.tout.cbits,
            shift=int(rq.shift), in_addr=buf("in"), w_addr=buf("in") + row_a,
            out_addr=buf("out"), kappa_a=int(ly.a_multiplier), kappa_b=int(ly.b_multiplier),
            lambda_=lam, h_in=hh, w_in=ww, c_in=g.c, c_out=g.c, h_out=hh, w_out=ww)

    def _mul(self, lay: _Layer, hh: int, ww: int, buf) -> cg.ClusterKernel:
        """CL.MUL over one tile: ``NormQuant((A - za) * (B[c] - zb))`` with ``B`` the
        per-channel vector after the tile (zero points in the stored domain: ``pad_value``
        holds A's, ``kappa_b`` B's as 16-bit two's complement)."""
        ly, g, tout = lay.layer, lay.geo, lay.tout
        a, b = lay.tins
        if a.cbits != 8 or b.cbits != 8:
            raise MappingError(f"layer {ly.name}: product of {a.bits}- and {b.bits}-bit "
                               "operands (the cluster MUL reads bytes)")
        rq = ly.requant
        relu, _ = _clip_mode(ly, tout, tout.cbits)
        kap = int(np.ravel(rq.multiplier)[0])
        lam = int(np.ravel(rq.round_add)[0]) + ((rq.zero_point + tout.offset_value) << rq.shift)
        if rq.pre_shift or not 0 < kap <= 0xFFFF or not 0 <= rq.shift <= 31 or \
                not -(1 << 31) <= lam < 1 << 31:
            raise MappingError(f"layer {ly.name}: product recipe is not one NormQuant")
        row_a = _al(hh * ww * a.pix_bytes())
        return cg.ClusterKernel(
            kernel="MUL", relu=int(relu), in_signed=int(a.stored_signed),
            b_signed=int(b.stored_signed), out_signed=int(tout.stored_signed), in_bits=8,
            out_bits=tout.cbits, shift=int(rq.shift), in_addr=buf("in"),
            w_addr=buf("in") + row_a, out_addr=buf("out"), kappa_a=kap,
            kappa_b=(ly.b_zero_point + b.offset_value) & 0xFFFF, lambda_=lam,
            pad_value=ly.a_zero_point + a.offset_value, h_in=hh, w_in=ww, c_in=g.c,
            c_out=g.c, h_out=hh, w_out=ww)

    def _lut(self, lay: _Layer, hh: int, ww: int, buf, wslot: int) -> cg.ClusterKernel:
        """CL.LUT over one tile: each byte replaced by its entry in the table at ``wslot``
        (``lambda_`` = the channel stride: 0 for one shared row, 256 for a row per channel)."""
        ly, tin, tout = lay.layer, lay.tin, lay.tout
        if tin.cbits != 8 or tout.cbits != 8:
            raise MappingError(f"layer {ly.name}: table lookup of {tin.bits}-bit codes (the "
                               "cluster LUT indexes whole bytes)")
        return cg.ClusterKernel(
            kernel="LUT", in_signed=int(tin.stored_signed), out_signed=int(tout.stored_signed),
            in_bits=8, out_bits=8, in_addr=buf("in"), out_addr=buf("out"), w_addr=wslot,
            lambda_=256 if ly.table.shape[0] > 1 else 0, h_in=hh, w_in=ww, c_in=lay.geo.c,
            c_out=lay.geo.c, h_out=hh, w_out=ww)

    def _pool(self, lay: _Layer, rows: int, hh: int, cols: int, ww: int,
              pads: tuple[int, int, int, int], buf) -> cg.ClusterKernel:
        ly, g, tin, tout = lay.layer, lay.geo, lay.tin, lay.tout
        ptop, pleft, pbot, pright = pads
        common = dict(in_signed=int(tin.stored_signed), out_signed=int(tout.stored_signed),
                      in_bits=tin.cbits, out_bits=tout.cbits, in_addr=buf("in"),
                      out_addr=buf("out"), h_in=rows, w_in=cols, c_in=g.c, c_out=g.c, h_out=hh,
                      w_out=ww, kh=g.kh, kw=g.kw, sh=g.sh, sw=g.sw, pad_top=ptop,
                      pad_bottom=pbot, pad_left=pleft, pad_right=pright)
        if ly.kind == "max":
            if ly.requant is not None:
                raise MappingError(f"layer {ly.name}: max pool that requantizes")
            lo = _rng(8, tin.stored_signed)[0]
            return cg.ClusterKernel(kernel="MAXPOOL", pad_value=lo, **common)
        rq = ly.requant
        relu, _ = _clip_mode(ly, tout, tout.cbits)
        m = np.unique(np.ravel(rq.multiplier))
        if m.size != 1 or rq.pre_shift or not 0 < int(m[0]) <= 0xFFFF:
            raise MappingError(f"layer {ly.name}: average pool recipe is not one 16-bit kappa")
        kap = int(m[0])
        izp = ly.input_zero_point + tin.offset_value
        lam = int(np.ravel(rq.round_add)[0]) + ((rq.zero_point + tout.offset_value)
                                                 << rq.shift) - kap * ly.window * izp
        if not -(1 << 31) <= lam < 1 << 31:
            raise MappingError(f"layer {ly.name}: AVGPOOL lambda leaves 32 bits")
        return cg.ClusterKernel(kernel="AVGPOOL", relu=int(relu), kappa_a=kap, lambda_=lam,
                                shift=int(rq.shift), pad_value=int(izp),
                                **common)


def _rbe2hwc(tout: TensorInfo, src: int, dst: int, hh: int, ww: int, kk: int
             ) -> cg.ClusterKernel:
    """Marshaling of an RBE output tile (bit planes at ``src``) to HWC at ``dst``."""
    return cg.ClusterKernel(
        kernel="RBE2HWC", in_signed=int(tout.stored_signed), out_signed=int(tout.stored_signed),
        in_bits=tout.bits, out_bits=tout.cbits, in_addr=src, out_addr=dst, h_in=hh, w_in=ww,
        c_in=kk, c_out=kk, h_out=hh, w_out=ww)
