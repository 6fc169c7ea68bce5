"""Behaviour of the C DPU simulator (sim/dpu) through its Python binding.

Programs are written with ``tvm_dpu.codegen`` (dataclasses or assembly) and checked against small
numpy references that implement the semantics of the codegen module docstring: conv with int32
wrapping accumulation and round-half-up shift, pools, element-wise add, up-sampling, copies, the
format unit, circular FM addressing and the DPON/DPBY token FIFOs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys

import numpy as np
import pytest

from helpers import fuzz
from tvm_accel.errors import SimulatorError
from tvm_dpu.asm import ISA
from tvm_dpu.codegen import (
    INSN_BYTES,
    LAYOUTS,
    MISC_AVGPOOL,
    MISC_MAXPOOL,
    REGION_INPUT,
    REGION_OUTPUT,
    REGION_PARAM,
    REGION_SWAP,
    Conv,
    Copy,
    EltAdd,
    EltMul,
    End,
    Load,
    Pool,
    Save,
    Upsample,
    decode,
    encode,
    encode_stream,
    field_offsets,
)
from tvm_dpu.hw_config import load_config
from tvm_dpu.simulator import DPUStats, decode_fields, simulate
from tvm_dpu.timeline import trace_to_png

Q = 1 << 20


def regions(q=Q):
    return {"INPUT": (0, q), "OUTPUT": (q, q), "PARAM": (2 * q, q), "INSN": (3 * q, 4096),
            "SWAP": (3 * q + 4096, q)}


def i8(rng, *shape):
    return rng.integers(-128, 128, size=shape).astype(np.int8)


def wrap32(x):
    return (np.asarray(x, np.int64) + 2**31) % 2**32 - 2**31


def rnd(shift):
    return (1 << (shift - 1)) if shift else 0


class Prog:
    """A program under construction plus the DDR image it runs on (regions of q bytes)."""

    def __init__(self, cfg, q=Q):
        self.cfg, self.n = cfg, cfg.NUM_PE
        self.regions = regions(q)
        self.ddr = np.zeros(max(b + s for b, s in self.regions.values()), np.uint8)
        self.top = dict.fromkeys(self.regions, 0)
        self.insns: list = []

    def alloc(self, region, nbytes):
        off = -(-self.top[region] // 64) * 64
        self.top[region] = off + nbytes
        assert self.top[region] <= self.regions[region][1]
        return off

    def put(self, region, data):
        b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        off = self.alloc(region, b.size)
        base = self.regions[region][0] + off
        self.ddr[base:base + b.size] = b
        return off

    def view(self, region, off, nbytes):
        base = self.regions[region][0] + off
        return self.ddr[base:base + nbytes]

    def load_images(self, x, mem=0, addr=0, pix=None, row=None, pads=(0, 0, 0, 0), pad_value=0,
                    fmt=0, **deps):
        """x: (NUM_PE, H, W, C) int8; PE p receives x[p]."""
        n, h, w, c = x.shape
        assert n == self.n
        off = self.put("INPUT", x)
        pix = c * max(fmt, 1) if pix is None else pix
        row = pix * (w + pads[2] + pads[3]) if row is None else row
        self.insns.append(Load(
            fm_mem=mem, dst_addr=addr, region=REGION_INPUT, ddr_offset=off, rows=h, cols=w,
            chans=c, ddr_pix_stride=c, ddr_row_stride=w * c, fm_pix_stride=pix, fm_row_stride=row,
            pad_top=pads[0], pad_bottom=pads[1], pad_left=pads[2], pad_right=pads[3],
            pad_value=pad_value, img_stride=h * w * c, fmt=fmt, **deps))

    def load_params(self, w, b, pm_addr=0, **deps):
        """Weights then int32 biases, as a CONV reads them; the last LOAD carries ``deps``."""
        data = np.concatenate([np.ascontiguousarray(w).reshape(-1).view(np.uint8),
                               np.asarray(b, "<i4").view(np.uint8)])
        off = self.put("PARAM", data)
        full, tail = divmod(data.size, 4095)
        chunks = []
        for start in range(0, full, 4095):
            rows = min(4095, full - start)
            chunks.append((start * 4095, rows, 4095))
        if tail:
            chunks.append((full * 4095, 1, tail))
        for k, (o, rows, chans) in enumerate(chunks):
            self.insns.append(Load(
                to_pm=True, dst_addr=pm_addr + o, region=REGION_PARAM, ddr_offset=off + o,
                rows=rows, cols=1, chans=chans, ddr_pix_stride=chans, ddr_row_stride=chans,
                **(deps if k == len(chunks) - 1 else {})))

    def save_images(self, mem, addr, h, w, c, pix=None, row=None, region="OUTPUT", **deps):
        """SAVE of an (h, w, c) FM tensor of every PE; returns a reader of (NUM_PE, h, w, c)."""
        pix = c if pix is None else pix
        row = pix * w if row is None else row
        off = self.alloc(region, self.n * h * w * c)
        self.insns.append(Save(
            fm_mem=mem, src_addr=addr, region=REGION_OUTPUT if region == "OUTPUT" else REGION_SWAP,
            ddr_offset=off, rows=h, cols=w, chans=c, fm_pix_stride=pix, fm_row_stride=row,
            ddr_pix_stride=c, ddr_row_stride=w * c, img_stride=h * w * c, **deps))
        return lambda: self.view(region, off, self.n * h * w * c).view(np.int8).reshape(
            self.n, h, w, c).copy()

    def stream(self):
        return encode_stream(self.insns + [End()])

    def run(self, **kw):
        return simulate(self.cfg, self.stream(), self.ddr, regions=self.regions, **kw)


# --- numpy references ------------------------------------------------------------------------


def window(x, oh, ow, kh, kw, sh, sw, pt, pl, pad_value):
    """Padded window (n, Hw, Ww, C) and the instruction's pad_bottom / pad_right."""
    n, h, w, c = x.shape
    hw, ww = (oh - 1) * sh + kh, (ow - 1) * sw + kw
    hin, win = min(h, hw - pt), min(w, ww - pl)
    xp = np.full((n, hw, ww, c), pad_value, np.int64)
    xp[:, pt:pt + hin, pl:pl + win] = x[:, :hin, :win]
    valid = np.zeros((hw, ww), np.int64)
    valid[pt:pt + hin, pl:pl + win] = 1
    return xp, valid, hw - pt - hin, ww - pl - win


def taps(xp, oh, ow, kh, kw, sh, sw, d=1):
    for ky in range(kh):
        for kx in range(kw):
            y, x = ky * d, kx * d
            yield ky, kx, xp[:, y:y + (oh - 1) * sh + 1:sh, x:x + (ow - 1) * sw + 1:sw]


def conv_ref(x, w, b, oh, ow, stride=(1, 1), pt=0, pl=0, pad_value=0, shift=0,
             clip=(-128, 127), depthwise=False, dilation=1):
    kh, kw = w.shape[1:3]
    d = dilation
    xp, valid, _, _ = window(x, oh, ow, (kh - 1) * d + 1, (kw - 1) * d + 1, *stride, pt, pl,
                             pad_value)
    acc = np.zeros((x.shape[0], oh, ow, w.shape[0]), np.int64)
    for ky, kx, patch in taps(xp, oh, ow, kh, kw, *stride, d):
        if depthwise:
            acc += patch * w[:, ky, kx].astype(np.int64)
        else:
            acc += np.einsum("nhwc,oc->nhwo", patch, w[:, ky, kx].astype(np.int64))
    s = wrap32(acc) + np.asarray(b, np.int64) + rnd(shift)
    macs = sum(int(p.sum()) for _, _, p in taps(valid[None, :, :, None], oh, ow, kh, kw, *stride,
                                                  d))
    macs *= w.shape[0] * (1 if depthwise else x.shape[3]) * x.shape[0]
    return np.clip(s >> shift, *clip).astype(np.int8), macs


def conv_insn(H, W, ic, oc, k, s, p, pad_value=0, shift=0, clip=(-128, 127), dilation=1,
              **kw):
    """CONV of an (H, W, ic) tensor in FM0:0 to FM1:0 with PyTorch-style symmetric padding p."""
    kh, kwid = (k, k) if isinstance(k, int) else k
    sh, sw = (s, s) if isinstance(s, int) else s
    sph, spw = (kh - 1) * dilation + 1, (kwid - 1) * dilation + 1
    oh, ow = (H + 2 * p - sph) // sh + 1, (W + 2 * p - spw) // sw + 1
    _, _, pb, pr = window(np.zeros((1, H, W, 1), np.int8), oh, ow, sph, spw, sh, sw, p, p, 0)
    fields = dict(in_mem=0, in_addr=0, in_pix_stride=ic, in_row_stride=W * ic, ic=ic, out_mem=1,
                  out_addr=0, out_pix_stride=oc, out_row_stride=ow * oc, out_h=oh, out_w=ow,
                  oc=oc, kernel_h=kh, kernel_w=kwid, stride_h=sh, stride_w=sw, pad_top=p,
                  pad_bottom=max(pb, 0), pad_left=p, pad_right=max(pr, 0), pad_value=pad_value,
                  shift=shift, clip_lo=clip[0], clip_hi=clip[1], dilation=dilation)
    fields.update(kw)
    return Conv(**fields), oh, ow


# --- CONV ------------------------------------------------------------------------------------

CONV_CASES = [
    # H, W, ic, oc, kernel, stride, pad, shift, clip, pad_value
    (5, 7, 3, 5, 1, 1, 0, 0, (-128, 127), 0),
    (9, 6, 17, 19, 3, 1, 1, 9, (-128, 127), 0),
    (10, 11, 16, 32, 3, 2, 1, 10, (0, 127), 0),
    (8, 8, 5, 7, 5, 1, 2, 8, (-20, 90), -3),
    (13, 12, 33, 4, 5, 2, 0, 11, (-128, 127), 0),
    (15, 14, 3, 16, 7, 2, 3, 9, (0, 127), 0),
    (9, 10, 8, 9, 7, 1, 0, 12, (-128, 127), 5),
    (6, 9, 6, 11, (1, 3), (2, 1), 1, 7, (-128, 127), 0),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[f"k{c[4]}s{c[5]}p{c[6]}ic{c[2]}oc{c[3]}"
                                                  for c in CONV_CASES])
def test_conv_matches_reference_on_every_pe(cfg, case):
    H, W, ic, oc, k, s, p, shift, clip, pv = case
    rng = np.random.default_rng(H * W + ic)
    insn, oh, ow = conv_insn(H, W, ic, oc, k, s, p, pv, shift, clip, dpon="LOAD", dpby="SAVE")
    x = i8(rng, cfg.NUM_PE, H, W, ic)
    w = i8(rng, oc, insn.kernel_h, insn.kernel_w, ic)
    b = rng.integers(-3000, 3000, oc)
    prog = Prog(cfg)
    prog.load_images(x)
    prog.load_params(w, b, pm_addr=0x777, dpby="CONV")
    prog.insns.append(dataclasses.replace(insn, param_addr=0x777))
    out = prog.save_images(1, 0, oh, ow, oc, dpon="CONV")
    st = prog.run()
    ref, macs = conv_ref(x, w, b, oh, ow, (insn.stride_h, insn.stride_w), p, p, pv, shift, clip)
    np.testing.assert_array_equal(out(), ref)
    assert len({out()[i].tobytes() for i in range(cfg.NUM_PE)}) == cfg.NUM_PE  # SIMD, 4 images
    assert st.macs == macs
    assert st.padded_macs == cfg.NUM_PE * oh * ow * oc * ic * insn.kernel_h * insn.kernel_w
    assert st.conv_insns == 1 and st.pm_read_bytes == w.size + 4 * oc


def test_conv_on_eight_pes_and_depthwise():
    cfg = load_config("dpu_8pe")
    rng = np.random.default_rng(8)
    H, W, C = 7, 9, 24
    insn, oh, ow = conv_insn(H, W, C, C, 3, 2, 1, 0, 6, depthwise=True, dpon="LOAD", dpby="SAVE")
    x = i8(rng, 8, H, W, C)
    w = i8(rng, C, 3, 3)
    b = rng.integers(-500, 500, C)
    prog = Prog(cfg)
    prog.load_images(x)
    prog.load_params(w, b, dpby="CONV")
    prog.insns.append(insn)
    out = prog.save_images(1, 0, oh, ow, C, dpon="CONV")
    st = prog.run()
    ref, macs = conv_ref(x, w, b, oh, ow, (2, 2), 1, 1, 0, 6, depthwise=True)
    np.testing.assert_array_equal(out(), ref)
    assert st.macs == macs
    steps = -(-oh // 8) * ow * -(-C // 16) * 9  # depthwise: no input-channel factor
    assert st.conv_busy == steps + cfg.CONV_LATENCY_CYCLES


DILATED_CASES = [
    # H, W, ic, oc, kernel, stride, pad, dilation, depthwise
    (12, 11, 17, 19, 3, 1, 2, 2, False),
    (16, 16, 8, 20, 3, 1, 6, 6, False),
    (20, 18, 16, 16, 3, 1, 12, 12, True),
    (15, 13, 5, 7, (3, 2), 2, 3, 3, False),
]


@pytest.mark.parametrize("case", DILATED_CASES, ids=[f"d{c[7]}{'dw' if c[8] else ''}s{c[5]}"
                                                     for c in DILATED_CASES])
def test_dilated_conv_reads_every_dilation_th_pixel(cfg, case):
    H, W, ic, oc, k, s, p, d, dw = case
    rng = np.random.default_rng(H * W + d)
    insn, oh, ow = conv_insn(H, W, ic, oc, k, s, p, -2, 8, (-100, 127), dilation=d,
                             depthwise=dw, dpon="LOAD", dpby="SAVE")
    x = i8(rng, cfg.NUM_PE, H, W, ic)
    w = i8(rng, oc, insn.kernel_h, insn.kernel_w) if dw else \
        i8(rng, oc, insn.kernel_h, insn.kernel_w, ic)
    b = rng.integers(-3000, 3000, oc)
    prog = Prog(cfg)
    prog.load_images(x)
    prog.load_params(w, b, dpby="CONV")
    prog.insns.append(insn)
    out = prog.save_images(1, 0, oh, ow, oc, dpon="CONV")
    st = prog.run()
    ref, macs = conv_ref(x, w, b, oh, ow, (insn.stride_h, insn.stride_w), p, p, -2, 8,
                         (-100, 127), depthwise=dw, dilation=d)
    np.testing.assert_array_equal(out(), ref)
    assert st.macs == macs  # taps on padding do not count
    # the CONV steps of the dense kernel: dilation only spaces the input pixels it reads
    steps = (-(-oh // 8) * ow * -(-oc // 16) * (1 if dw else -(-ic // 16))
             * insn.kernel_h * insn.kernel_w)
    assert st.conv_busy == steps + cfg.CONV_LATENCY_CYCLES


def test_requant_rounds_half_up_relu_and_clip_exactly(cfg):
    """1x1 conv of x = 1 with w = 1: s = 1 + bias + round, y = clip(s >> shift)."""
    targets = np.array([-7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 255, 256, -257,
                        2**31, -(2**31) + 1, 2**31 - 2, 100000])  # biases fit in int32
    oc = len(targets)
    results = {}
    for shift, clip in [(0, (-128, 127)), (1, (-128, 127)), (2, (0, 127)), (31, (-128, 127)),
                        (3, (-10, 10))]:
        prog = Prog(cfg)
        prog.load_images(np.ones((cfg.NUM_PE, 1, 1, 1), np.int8))
        prog.load_params(np.ones((oc, 1, 1, 1), np.int8), targets - 1, dpby="CONV")
        insn, _, _ = conv_insn(1, 1, 1, oc, 1, 1, 0, 0, shift, clip, dpon="LOAD", dpby="SAVE")
        prog.insns.append(insn)
        out = prog.save_images(1, 0, 1, 1, oc, dpon="CONV")
        prog.run()
        got = out()[0, 0, 0].astype(np.int64)
        np.testing.assert_array_equal(got, np.clip((targets + rnd(shift)) >> shift, *clip))
        results[shift] = got
    # round half up: -2.5 -> -2, 2.5 -> 3, -3 -> -3 (shift 1 of -5, 5, -6)
    assert list(results[1][:15]) == [-3, -3, -2, -2, -1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4]
    assert list(results[2][:8]) == [0] * 8  # ReLU via clip_lo = 0
    assert results[31][18] == 1 and results[31][19] == -1  # 1 + (2^31 - 1): 64-bit, no wrap


@pytest.mark.parametrize("shift, clip", [(0, (-128, 127)), (2, (-5, 100))])
def test_leaky_relu_maps_the_int8_conv_result_then_clips(cfg, shift, clip):
    """CONV with ``leaky``: c = clip(s >> shift, -128, 127), then c or (26 c + 128) >> 8, then
    clip_lo..clip_hi (1x1 conv of x = 1 with w = 1, so s is the bias + 1 + round)."""
    from tvm_dpu.numerics import leaky_relu

    targets = np.arange(-300, 300) << shift
    oc = len(targets)
    prog = Prog(cfg)
    prog.load_images(np.ones((cfg.NUM_PE, 1, 1, 1), np.int8))
    prog.load_params(np.ones((oc, 1, 1, 1), np.int8), targets - 1, dpby="CONV")
    insn, _, _ = conv_insn(1, 1, 1, oc, 1, 1, 0, 0, shift, clip, leaky=True, dpon="LOAD",
                           dpby="SAVE")
    prog.insns.append(insn)
    out = prog.save_images(1, 0, 1, 1, oc, dpon="CONV")
    prog.run()
    c = np.clip((targets + rnd(shift)) >> shift, -128, 127)
    np.testing.assert_array_equal(out()[0, 0, 0], np.clip(leaky_relu(c), *clip))
    assert decode(encode(insn)).leaky and not decode(encode(dataclasses.replace(
        insn, leaky=False))).leaky


def test_int32_accumulator_wraps_modulo_2_32(cfg):
    ic, k = 4095, 7  # 49 x 4095 x 128^2 > 2^31
    prog = Prog(cfg)
    x = np.full((cfg.NUM_PE, k, k, ic), -128, np.int8)
    w = np.full((1, k, k, ic), -128, np.int8)
    prog.load_images(x)
    prog.load_params(w, [0], dpby="CONV")
    insn, _, _ = conv_insn(k, k, ic, 1, k, 1, 0, 0, 24, dpon="LOAD", dpby="SAVE")
    prog.insns.append(insn)
    out = prog.save_images(1, 0, 1, 1, 1, dpon="CONV")
    prog.run()
    acc = 49 * 4095 * 128 * 128
    assert acc >= 2**31
    expect = (int(wrap32(acc)) + (1 << 23)) >> 24
    assert expect == -60
    assert (out() == expect).all()


# --- MISC ------------------------------------------------------------------------------------


def pool_ref(x, oh, ow, k, s, pt, pl, pad_value, op, shift=0, mult=1, clip=(-128, 127)):
    xp, _, _, _ = window(x, oh, ow, k, k, s, s, pt, pl, pad_value)
    pats = [p for _, _, p in taps(xp, oh, ow, k, k, s, s)]
    if op == MISC_MAXPOOL:
        y = np.max(pats, axis=0)
    else:
        y = (np.sum(pats, axis=0) * mult + rnd(shift)) >> shift
    return np.clip(y, *clip).astype(np.int8)


POOL_CASES = [
    # op, H, W, C, k, s, pad, pad_value, shift, mult, clip
    (MISC_MAXPOOL, 9, 9, 20, 3, 2, 1, -128, 0, 1, (-128, 127)),
    (MISC_MAXPOOL, 8, 6, 5, 2, 2, 0, 0, 0, 1, (0, 60)),
    (MISC_AVGPOOL, 8, 8, 17, 2, 2, 0, 0, 2, 1, (-128, 127)),
    (MISC_AVGPOOL, 7, 9, 16, 3, 1, 1, 0, 9, 57, (-128, 127)),
    (MISC_AVGPOOL, 7, 7, 33, 7, 1, 0, 0, 10, 21, (0, 127)),  # global 7x7, 1/49 ~ 21/1024
]


@pytest.mark.parametrize("case", POOL_CASES, ids=["max3s2", "max2relu", "avg2", "avg3pad",
                                                  "avg7global"])
def test_pool_matches_reference(cfg, case):
    op, H, W, C, k, s, p, pv, shift, mult, clip = case
    rng = np.random.default_rng(H + C)
    x = i8(rng, cfg.NUM_PE, H, W, C)
    oh, ow = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    _, _, pb, pr = window(x, oh, ow, k, k, s, s, p, p, 0)
    prog = Prog(cfg)
    prog.load_images(x, mem=1, addr=0x100, dpby="MISC")
    prog.insns.append(Pool(op=op, dpon="LOAD", dpby="SAVE", in_mem=1, in_addr=0x100,
                           in_pix_stride=C, in_row_stride=W * C, out_mem=2, out_addr=3,
                           out_pix_stride=C, out_row_stride=ow * C, out_h=oh, out_w=ow, chans=C,
                           kernel_h=k, kernel_w=k, stride_h=s, stride_w=s, pad_top=p,
                           pad_bottom=max(pb, 0), pad_left=p, pad_right=max(pr, 0),
                           pad_value=pv, shift=shift, mult=mult, clip_lo=clip[0],
                           clip_hi=clip[1]))
    out = prog.save_images(2, 3, oh, ow, C, dpon="MISC")
    st = prog.run()
    np.testing.assert_array_equal(out(), pool_ref(x, oh, ow, k, s, p, p, pv, op, shift, mult,
                                                  clip))
    steps = -(-oh // cfg.MISC_ROW_PAR) * ow * -(-C // cfg.MISC_CH_PAR) * k * k
    assert st.misc_busy == steps + cfg.MISC_LATENCY_CYCLES


@pytest.mark.parametrize("sa, sb, shift, clip", [(0, 0, 0, (-128, 127)), (1, 0, 1, (-128, 127)),
                                                 (-1, 2, 2, (-128, 127)), (3, -2, 0, (0, 127)),
                                                 (-32, 31, 31, (-128, 127)), (5, 5, 4, (0, 50))])
def test_eltadd_aligns_each_input_then_shifts_and_clips(cfg, sa, sb, shift, clip):
    rng = np.random.default_rng(abs(sa) + 7 * abs(sb))
    H, W, C = 5, 6, 19
    a, b = i8(rng, cfg.NUM_PE, H, W, C), i8(rng, cfg.NUM_PE, H, W, C)
    prog = Prog(cfg)
    prog.load_images(a, mem=0, addr=0x40)
    prog.load_images(b, mem=2, addr=0x1000, pix=32, dpby="MISC")  # B with a wider pixel stride
    prog.insns.append(EltAdd(dpon="LOAD", dpby="SAVE", in_mem=0, in_addr=0x40, in_pix_stride=C,
                             in_row_stride=W * C, b_mem=2, b_addr=0x1000, b_pix_stride=32,
                             b_row_stride=32 * W, out_mem=1, out_addr=0, out_pix_stride=C,
                             out_row_stride=W * C, out_h=H, out_w=W, chans=C, shift_a=sa,
                             shift_b=sb, shift=shift, clip_lo=clip[0], clip_hi=clip[1]))
    out = prog.save_images(1, 0, H, W, C, dpon="MISC")
    prog.run()

    def al(v, s):
        v = v.astype(np.int64)
        return v << s if s >= 0 else v >> -s

    ref = np.clip((al(a, sa) + al(b, sb) + rnd(shift)) >> shift, *clip)
    np.testing.assert_array_equal(out(), ref)


@pytest.mark.parametrize("gate, shift, clip", [(True, 7, (-128, 127)), (True, 0, (-128, 127)),
                                               (False, 4, (0, 127)), (True, 31, (-128, 127)),
                                               (False, 9, (-20, 30))])
def test_eltmul_multiplies_then_shifts_and_clips_b_repeating_with_zero_strides(cfg, gate, shift,
                                                                               clip):
    rng = np.random.default_rng(shift)
    H, W, C = 5, 6, 19
    a = i8(rng, cfg.NUM_PE, H, W, C)
    b = i8(rng, cfg.NUM_PE, 1, 1, C) if gate else i8(rng, cfg.NUM_PE, H, W, C)
    prog = Prog(cfg)
    prog.load_images(a, mem=0, addr=0x40)
    prog.load_images(b, mem=2, addr=0x1000, dpby="MISC")
    bps, brs = (0, 0) if gate else (C, W * C)
    prog.insns.append(EltMul(dpon="LOAD", dpby="SAVE", in_mem=0, in_addr=0x40, in_pix_stride=C,
                             in_row_stride=W * C, b_mem=2, b_addr=0x1000, b_pix_stride=bps,
                             b_row_stride=brs, out_mem=1, out_addr=0, out_pix_stride=C,
                             out_row_stride=W * C, out_h=H, out_w=W, chans=C, shift=shift,
                             clip_lo=clip[0], clip_hi=clip[1]))
    out = prog.save_images(1, 0, H, W, C, dpon="MISC")
    st = prog.run()
    ref = np.clip((a.astype(np.int64) * b + rnd(shift)) >> shift, *clip)
    np.testing.assert_array_equal(out(), ref)
    steps = -(-H // cfg.MISC_ROW_PAR) * W * -(-C // cfg.MISC_CH_PAR)
    assert st.misc_busy == steps + cfg.MISC_LATENCY_CYCLES


def test_upsample_nearest_with_integer_factors(cfg):
    rng = np.random.default_rng(5)
    for fh, fw, oh, ow in [(2, 2, 6, 8), (3, 1, 7, 4), (1, 4, 3, 10)]:
        ih, iw, C = -(-oh // fh), -(-ow // fw), 6
        x = i8(rng, cfg.NUM_PE, ih, iw, C)
        prog = Prog(cfg)
        prog.load_images(x, dpby="MISC")
        prog.insns.append(Upsample(dpon="LOAD", dpby="SAVE", in_pix_stride=C,
                                   in_row_stride=iw * C, out_mem=1, out_pix_stride=C,
                                   out_row_stride=ow * C, out_h=oh, out_w=ow, chans=C,
                                   factor_h=fh, factor_w=fw))
        out = prog.save_images(1, 0, oh, ow, C, dpon="MISC")
        prog.run()
        ref = x.repeat(fh, axis=1).repeat(fw, axis=2)[:, :oh, :ow]
        np.testing.assert_array_equal(out(), ref)


def test_copy_shuffles_sub_kernel_outputs_and_concatenates_by_placement(cfg):
    """Four (h, w) sub-images interleaved into (2h, 2w) (transpose-conv shuffle), then two
    tensors placed side by side in channels (concat)."""
    rng = np.random.default_rng(6)
    h, w, C = 3, 4, 5
    subs = [i8(rng, cfg.NUM_PE, h, w, C) for _ in range(4)]
    prog = Prog(cfg)
    for i, s in enumerate(subs):
        prog.load_images(s, mem=0, addr=0x2000 * i, dpby="MISC" if i == 3 else 0)
    for i in range(4):
        a, b = divmod(i, 2)
        prog.insns.append(Copy(dpon="LOAD" if i == 0 else 0, dpby="SAVE" if i == 3 else 0,
                               in_mem=0, in_addr=0x2000 * i,
                               in_pix_stride=C, in_row_stride=w * C, out_mem=1,
                               out_addr=a * (2 * w * C) + b * C, out_pix_stride=2 * C,
                               out_row_stride=2 * (2 * w * C), out_h=h, out_w=w, chans=C))
    # concat along channels: sub 0 (C channels) and sub 1 (C channels) into 2C-channel pixels
    for i in range(2):
        prog.insns.append(Copy(dpby="SAVE" if i == 1 else 0, in_mem=0, in_addr=0x2000 * i,
                               in_pix_stride=C, in_row_stride=w * C, out_mem=2, out_addr=i * C,
                               out_pix_stride=2 * C, out_row_stride=w * 2 * C, out_h=h, out_w=w,
                               chans=C))
    shuffled = prog.save_images(1, 0, 2 * h, 2 * w, C, dpon="MISC")
    concat = prog.save_images(2, 0, h, w, 2 * C, dpon="MISC")
    prog.run()
    ref = np.zeros((cfg.NUM_PE, 2 * h, 2 * w, C), np.int8)
    for i, s in enumerate(subs):
        a, b = divmod(i, 2)
        ref[:, a::2, b::2] = s
    np.testing.assert_array_equal(shuffled(), ref)
    np.testing.assert_array_equal(concat(), np.concatenate(subs[:2], axis=3))


# --- memories ----------------------------------------------------------------------------------


def test_fm_addresses_wrap_around_the_circular_memory(cfg):
    M = cfg.fm_memory_bytes
    rng = np.random.default_rng(9)
    H, W, C = 4, 8, 16  # 512 bytes
    x = i8(rng, cfg.NUM_PE, H, W, C)
    prog = Prog(cfg)
    prog.load_images(x, mem=0, addr=M - 100, dpby="CONV")  # the tensor wraps after 100 bytes
    eye = np.eye(C, dtype=np.int8).reshape(C, 1, 1, C)
    prog.load_params(eye, np.zeros(C), pm_addr=cfg.PM_BYTES - 50)  # parameters wrap in PM
    insn, _, _ = conv_insn(H, W, C, C, 1, 1, 0, dpon="LOAD", dpby="SAVE",
                           in_addr=M - 100, out_addr=M - 37, param_addr=cfg.PM_BYTES - 50)
    prog.insns.append(insn)
    through_conv = prog.save_images(1, M - 37, H, W, C, dpon="CONV")
    head = prog.save_images(0, 0, 1, 1, H * W * C - 100)  # bytes that wrapped to address 0
    tail = prog.save_images(0, M - 100, 1, 1, 100)
    prog.run()
    np.testing.assert_array_equal(through_conv(), x)
    flat = x.reshape(cfg.NUM_PE, -1)
    np.testing.assert_array_equal(head().reshape(cfg.NUM_PE, -1), flat[:, 100:])
    np.testing.assert_array_equal(tail().reshape(cfg.NUM_PE, -1), flat[:, :100])


def test_load_pads_the_block_with_pad_value(cfg):
    rng = np.random.default_rng(10)
    x = i8(rng, cfg.NUM_PE, 3, 4, 5)
    prog = Prog(cfg)
    prog.load_images(x, mem=2, addr=0x10, pads=(1, 2, 3, 1), pad_value=-7)
    out = prog.save_images(2, 0x10, 6, 8, 5)
    st = prog.run()
    ref = np.pad(x, ((0, 0), (1, 2), (3, 1), (0, 0)), constant_values=-7)
    np.testing.assert_array_equal(out(), ref)
    assert st.ddr_read_bytes == x.size and st.fm_write_bytes == ref.size


def test_format_unit_packs_w_neighbours_so_a_7x7_rgb_conv_runs_as_7x1(cfg):
    rng = np.random.default_rng(11)
    H, W, C, OC, F = 16, 16, 3, 16, 7
    x = i8(rng, cfg.NUM_PE, H, W, C)
    w = i8(rng, OC, 7, 7, C)
    b = rng.integers(-1000, 1000, OC)
    oh = ow = (H + 6 - 7) // 2 + 1
    ref, _ = conv_ref(x, w, b, oh, ow, (2, 2), 3, 3, 0, 10)

    # plain 7x7 conv on the 3-channel image
    plain = Prog(cfg)
    plain.load_images(x)
    plain.load_params(w, b, dpby="CONV")
    insn, _, _ = conv_insn(H, W, C, OC, 7, 2, 3, 0, 10, dpon="LOAD", dpby="SAVE")
    plain.insns.append(insn)
    out_plain = plain.save_images(1, 0, oh, ow, OC, dpon="CONV")
    st_plain = plain.run()

    # format unit: padded rows, pixels of 7 x 3 = 21 channels, then a 7x1 conv
    fmt = Prog(cfg)
    fmt.load_images(x, pads=(3, 3, 3, 3), fmt=F)
    formatted = fmt.save_images(0, 0, H + 6, W + 6, F * C)
    fmt.load_params(w.reshape(OC, 7, 1, 7 * C), b, dpby="CONV")
    fmt.insns.append(Conv(dpon="LOAD", dpby="SAVE", in_pix_stride=F * C,
                          in_row_stride=(W + 6) * F * C, ic=F * C, out_mem=1, out_pix_stride=OC,
                          out_row_stride=ow * OC, out_h=oh, out_w=ow, oc=OC, kernel_h=7,
                          kernel_w=1, stride_h=2, stride_w=2, shift=10))
    out_fmt = fmt.save_images(1, 0, oh, ow, OC, dpon="CONV")
    st_fmt = fmt.run()

    padded = np.pad(x, ((0, 0), (3, 3), (3, 3 + F), (0, 0)))
    expect = np.concatenate([padded[:, :, j:j + W + 6] for j in range(F)], axis=3)
    np.testing.assert_array_equal(formatted(), expect)
    np.testing.assert_array_equal(out_plain(), ref)
    np.testing.assert_array_equal(out_fmt(), ref)
    lat = cfg.CONV_LATENCY_CYCLES  # 7 x 2 input-channel steps instead of 49 x 1
    assert (st_fmt.conv_busy - lat) * 7 == (st_plain.conv_busy - lat) * 2


# --- timing and dependencies -----------------------------------------------------------------


def test_cycle_model_of_a_serial_program(cfg):
    """LOAD FM, LOAD PM -> CONV -> MAXPOOL -> SAVE, each waiting for the previous one."""
    N, bpc = cfg.NUM_PE, cfg.DDR_BYTES_PER_CYCLE
    H, W, C, OC = 8, 8, 24, 16  # parameters: 3520 bytes, one LOAD to PM
    rng = np.random.default_rng(12)
    prog = Prog(cfg)
    prog.load_images(i8(rng, N, H, W, C))
    prog.load_params(i8(rng, OC, 3, 3, C), np.zeros(OC), dpby="CONV")
    insn, oh, ow = conv_insn(H, W, C, OC, 3, 1, 1, dpon="LOAD", dpby="MISC")
    prog.insns.append(insn)
    prog.insns.append(Pool(op=MISC_MAXPOOL, dpon="CONV", dpby="SAVE", in_mem=1,
                           in_pix_stride=OC, in_row_stride=ow * OC, out_mem=2,
                           out_pix_stride=OC, out_row_stride=4 * OC, out_h=4, out_w=4, chans=OC,
                           kernel_h=2, kernel_w=2, stride_h=2, stride_w=2))
    prog.save_images(2, 0, 4, 4, OC, dpon="MISC")
    st = prog.run()
    lat = cfg.LOAD_LATENCY_CYCLES
    load_fm = lat + -(-N * H * W * C // bpc)
    load_pm = lat + -(-(OC * 9 * C + 4 * OC) // bpc)
    conv = cfg.CONV_LATENCY_CYCLES + -(-oh // 8) * ow * -(-OC // 16) * -(-C // 16) * 9
    pool = cfg.MISC_LATENCY_CYCLES + -(-4 // cfg.MISC_ROW_PAR) * 4 * -(-OC // 16) * 4
    save = cfg.SAVE_LATENCY_CYCLES + -(-N * 4 * 4 * OC // bpc)
    assert (st.load_busy, st.conv_busy, st.misc_busy, st.save_busy) == (
        load_fm + load_pm, conv, pool, save)
    assert st.cycles == load_fm + load_pm + conv + pool + save
    assert (st.conv_stall, st.misc_stall, st.save_stall) == (
        load_fm + load_pm, load_fm + load_pm + conv, load_fm + load_pm + conv + pool)
    assert st.conv_stall_on_load == st.conv_stall and st.misc_stall_on_conv == st.misc_stall
    assert st.save_stall_on_misc == st.save_stall and st.tokens == 3
    assert (st.load_insns, st.conv_insns, st.misc_insns, st.save_insns) == (2, 1, 1, 1)


def test_conv_that_depends_on_load_waits_for_it(cfg, tmp_path):
    """Same program with and without DPON: the CONV start moves to the LOAD's completion."""
    rng = np.random.default_rng(13)
    x = i8(rng, cfg.NUM_PE, 4, 4, 16)
    starts = {}
    for deps in (True, False):
        prog = Prog(cfg)
        prog.load_images(x, dpby="CONV" if deps else 0)
        insn, _, _ = conv_insn(4, 4, 16, 16, 1, 1, 0, dpon="LOAD" if deps else 0,
                               in_addr=0x8000)
        prog.insns.append(insn)
        path = str(tmp_path / f"t{deps}.json")
        st = prog.run(trace_path=path)
        ev = {e["name"]: e for e in json.loads(open(path).read())["traceEvents"]
              if e["ph"] == "X"}
        starts[deps] = ev["CONV"]["ts"] * cfg.CLOCK_MHZ
        assert ev["LOAD FM"]["ts"] == 0
        if deps:
            assert starts[deps] == pytest.approx(st.load_busy)
            assert st.cycles == st.load_busy + st.conv_busy
    assert starts[False] == 0


def pipelined_conv(cfg, tiles=6, th=4, W=16, C=32, OC=32, seed=14):
    """3x3 'valid' conv H-split in tiles of th output rows (th + 2 input rows each, overlapping),
    double-buffered: LOAD tile i+1 and SAVE tile i-1 run while CONV computes tile i."""
    rng = np.random.default_rng(seed)
    H = tiles * th + 2
    x = i8(rng, cfg.NUM_PE, H, W, C)
    w = i8(rng, OC, 3, 3, C)
    b = rng.integers(-2000, 2000, OC)
    prog = Prog(cfg)
    xoff = prog.put("INPUT", x)
    prog.load_params(w, b)
    ow = W - 2
    yoff = prog.alloc("OUTPUT", cfg.NUM_PE * (H - 2) * ow * OC)
    T = tiles
    for i in range(T):
        buf = i % 2
        prog.insns.append(Load(
            dpon="CONV" if i >= 2 else 0, dpby="CONV", fm_mem=0, dst_addr=buf * 0x8000,
            region=REGION_INPUT, ddr_offset=xoff + i * th * W * C, rows=th + 2, cols=W, chans=C,
            ddr_pix_stride=C, ddr_row_stride=W * C, fm_pix_stride=C, fm_row_stride=W * C,
            img_stride=H * W * C))
        insn, _, _ = conv_insn(th + 2, W, C, OC, 3, 1, 0, shift=12, in_addr=buf * 0x8000,
                               out_addr=buf * 0x8000)
        prog.insns.append(dataclasses.replace(
            insn, dpon={"LOAD"} | ({"SAVE"} if i >= 2 else set()),
            dpby={"SAVE"} | ({"LOAD"} if i < T - 2 else set())))
        prog.insns.append(Save(
            dpon="CONV", dpby="CONV" if i < T - 2 else 0, fm_mem=1, src_addr=buf * 0x8000,
            region=REGION_OUTPUT, ddr_offset=yoff + i * th * ow * OC, rows=th, cols=ow,
            chans=OC, fm_pix_stride=OC, fm_row_stride=ow * OC, ddr_pix_stride=OC,
            ddr_row_stride=ow * OC, img_stride=(H - 2) * ow * OC))
    ref, _ = conv_ref(x, w, b, H - 2, ow, shift=12)
    return prog, ref, lambda: prog.view("OUTPUT", yoff, ref.size).view(np.int8).reshape(
        ref.shape)


def test_overlapping_load_conv_save_is_faster_than_the_sum_of_busy_times(cfg):
    prog, ref, out = pipelined_conv(cfg)
    st = prog.run()
    np.testing.assert_array_equal(out(), ref)
    assert st.cycles < st.load_busy + st.conv_busy + st.save_busy
    assert st.cycles >= max(st.load_busy, st.conv_busy, st.save_busy)
    for u in ("load", "save", "conv", "misc"):
        assert getattr(st, f"{u}_busy") + getattr(st, f"{u}_stall") <= st.cycles
    assert st.load_insns == sum(isinstance(i, Load) for i in prog.insns) == 6 + 2  # + 2 PM
    assert (st.conv_insns, st.save_insns) == (6, 6)
    # LOAD->CONV 6, CONV->SAVE 6, CONV->LOAD 4 and SAVE->CONV 4 (buffer reuse, not the last 2)
    assert st.tokens == 20


def test_assembly_program_runs_like_the_encoded_one(cfg):
    prog, ref, out = pipelined_conv(cfg, tiles=3)
    text = "\n".join(ISA(cfg).disassemble(prog.stream()))
    assert "CONV DPON=LOAD|SAVE DPBY=SAVE" in text or "CONV DPON=LOAD DPBY=SAVE|LOAD" in text
    st = simulate(cfg, ISA(cfg).assemble(text), prog.ddr, regions=prog.regions)
    np.testing.assert_array_equal(out(), ref)
    assert st.conv_insns == 3


def nop(unit, dpon=0, dpby=0):
    cls = {"LOAD": Load, "SAVE": Save, "CONV": Conv, "MISC": Copy}[unit]
    return cls(dpon=dpon, dpby=dpby)


def run_raw(cfg, insns, ddr_size=4096, **kw):
    return simulate(cfg, encode_stream(insns), np.zeros(ddr_size, np.uint8),
                    regions=regions(1024), **kw)


def test_noop_bubbles_take_one_cycle_and_pass_tokens(cfg):
    st = run_raw(cfg, [nop("LOAD", dpby="CONV"), nop("CONV", dpon="LOAD", dpby="MISC|SAVE"),
                       nop("MISC", dpon="CONV"), nop("SAVE", dpon="CONV"), End()])
    assert st.cycles == 3 and st.tokens == 3
    assert (st.load_busy, st.conv_busy, st.misc_busy, st.save_busy) == (1, 1, 1, 1)


def test_deadlock_names_each_blocked_unit_its_instruction_and_fifo(cfg):
    with pytest.raises(SimulatorError, match=r"deadlock: LOAD blocked at insn 0 \(LOAD FM\) "
                       r"waiting on FIFO CONV->LOAD; SAVE done; CONV blocked at insn 1 \(CONV\) "
                       r"waiting on FIFO LOAD->CONV; MISC done") as ei:
        run_raw(cfg, [nop("LOAD", dpon="CONV", dpby="CONV"),
                      nop("CONV", dpon="LOAD", dpby="LOAD"), End()])
    assert ei.value.kind == "protocol"
    with pytest.raises(SimulatorError, match=r"deadlock: LOAD done; SAVE blocked at insn 3 "
                       r"\(SAVE\) waiting on FIFO CONV->SAVE and MISC->SAVE; "
                       r"CONV blocked at insn 2 \(CONV\) waiting on FIFO LOAD->CONV; MISC done"):
        run_raw(cfg, [nop("LOAD", dpby="CONV"), nop("CONV", dpon="LOAD"),
                      nop("CONV", dpon="LOAD"), nop("SAVE", dpon="MISC|CONV"), End()])


def test_unbalanced_dependencies_are_reported_at_the_end(cfg):
    with pytest.raises(SimulatorError, match=r"unbalanced dependencies: 1 token left in FIFO "
                       r"LOAD->MISC, 2 tokens left in FIFO CONV->SAVE") as ei:
        run_raw(cfg, [nop("LOAD", dpby="CONV|MISC"), nop("CONV", dpon="LOAD", dpby="SAVE"),
                      nop("CONV", dpby="SAVE"), End()])
    assert ei.value.kind == "protocol"


def test_own_unit_in_dpon_or_dpby_is_an_error(cfg):
    with pytest.raises(SimulatorError, match=r"insn 1 \(CONV\): field DPON lists CONV itself"):
        run_raw(cfg, [nop("LOAD"), nop("CONV", dpon="CONV"), End()])
    with pytest.raises(SimulatorError, match=r"insn 0 \(COPY\): field DPBY lists MISC itself"):
        run_raw(cfg, [nop("MISC", dpby="MISC|LOAD"), End()])


def test_end_must_close_the_stream(cfg):
    with pytest.raises(SimulatorError, match="no END instruction at the end of the stream of 1"):
        run_raw(cfg, [nop("LOAD")])
    with pytest.raises(SimulatorError, match="no END instruction"):
        run_raw(cfg, [])
    with pytest.raises(SimulatorError, match=r"insn 0 \(END\): END must be the last instruction, "
                       r"1 more follow"):
        run_raw(cfg, [End(), nop("SAVE")])
    raw = (15 | 2 << 8).to_bytes(INSN_BYTES, "little")
    with pytest.raises(SimulatorError, match=r"insn 0 \(END\): fields DPON/DPBY must be empty"):
        simulate(cfg, raw, np.zeros(16, np.uint8))


# --- errors ----------------------------------------------------------------------------------

M0 = 256 * 1024
BAD = [
    (Load(fm_mem=0, dst_addr=M0, rows=1, cols=1, chans=1),
     r"insn 0 \(LOAD FM\): field dst_addr = 0x40000 exceeds the FM memory size 0x40000", "bounds"),
    (Load(fm_mem=3, rows=1, cols=1, chans=1),
     r"field fm_mem = 3 names a missing FM memory \(the FM has 3\)", "bounds"),
    (Load(ddr_offset=1000, rows=1, cols=1, chans=30),
     r"DDR range \[0x3e8, 0x406\) \(field ddr_offset 0x3e8.* exceeds region INPUT of 1024",
     "bounds"),
    (Load(img_stride=300, rows=1, cols=1, chans=200),
     r"img_stride 0x12c x 4 images.* exceeds region INPUT", "bounds"),
    (Load(region=6, rows=1, cols=1, chans=1), r"field region = 6 is not a DDR region", "decode"),
    (Save(region=REGION_PARAM, rows=1, cols=1, chans=1),
     r"field region = PARAM: a SAVE may only write regions OUTPUT and SWAP", "bounds"),
    (Load(to_pm=True, region=REGION_PARAM, rows=1, cols=1, chans=4, pad_top=1),
     r"insn 0 \(LOAD PM\): field pad_top = 1 must be 0 for a LOAD to PM", "decode"),
    (Load(to_pm=True, dst_addr=1 << 20, rows=1, cols=1, chans=4),
     r"field dst_addr = 0x100000 exceeds the PM size", "bounds"),
    (Load(rows=1, cols=1, chans=16, fmt=3, fm_pix_stride=48),
     r"field chans = 16: the format unit takes at most 8 channels", "decode"),
    (Load(rows=1, cols=1, chans=3, fmt=9), r"field fmt = 9 exceeds FORMAT_MAX_FACTOR = 8",
     "decode"),
    (Load(rows=1, cols=4, chans=8, fm_pix_stride=4, ddr_pix_stride=8),
     r"field fm_pix_stride = 4 is smaller than a pixel of 8 bytes", "bounds"),
    (Load(rows=2, cols=4, chans=8, fm_pix_stride=8, fm_row_stride=16, ddr_pix_stride=8),
     r"field fm_row_stride = 16 is smaller than a row of 32 bytes", "bounds"),
    (Conv(ic=4095, oc=1, out_h=100, out_w=1, in_pix_stride=4095, in_row_stride=4095,
          out_pix_stride=1, out_row_stride=1),
     r"in_addr tensor of 100x1 pixels spans 409500 bytes, more than the FM memory", "bounds"),
    (Conv(ic=16, oc=16, out_h=1, out_w=2, in_pix_stride=16, out_pix_stride=8),
     r"insn 0 \(CONV\): field out_pix_stride = 8 is smaller than a pixel of 16 bytes", "bounds"),
    (Conv(ic=64, oc=256, out_h=1, out_w=1, kernel_h=9, kernel_w=9, in_pix_stride=64,
          in_row_stride=576),
     r"parameters of 1328128 bytes \(weights \+ int32 bias\) .* exceed the PM of 1048576",
     "bounds"),
    (Conv(ic=1, oc=1, out_h=1, out_w=1, param_addr=1 << 20),
     r"field param_addr = 0x100000 exceeds the PM size", "bounds"),
    (Conv(ic=8, oc=4, out_h=1, out_w=1, depthwise=True),
     r"insn 0 \(CONV DW\): field ic = 8 must equal oc = 4 for a depthwise CONV", "decode"),
    (Conv(ic=1, oc=1, out_h=1, out_w=1, clip_lo=5, clip_hi=4),
     r"field clip_lo = 5 is greater than clip_hi = 4", "decode"),
    (Conv(ic=1, oc=1, out_h=1, out_w=1, kernel_h=0), r"field kernel_h = 0", "decode"),
    (Conv(ic=1, oc=1, out_h=2, out_w=1, kernel_h=3, pad_top=2, pad_bottom=2),
     r"fields pad_top \+ pad_bottom = 4 leave no input row in the window of 4 rows", "decode"),
    (Conv(ic=1, oc=1, out_h=1, out_w=1, dilation=0),
     r"insn 0 \(CONV\): field dilation = 0, a dilation is at least 1", "decode"),
    (Conv(ic=1, oc=1, out_h=1, out_w=1, kernel_h=2, dilation=15, pad_top=15, pad_bottom=1),
     r"fields pad_top \+ pad_bottom = 16 leave no input row in the window of 16 rows", "decode"),
    (Conv(ic=64, oc=1, out_h=1, out_w=1, kernel_h=15, kernel_w=15, dilation=15,
          in_pix_stride=64, in_row_stride=64 * 211),
     r"in_addr tensor of 211x211 pixels spans .* more than the FM memory", "bounds"),
    (Pool(op=MISC_AVGPOOL, chans=1, out_h=1, out_w=1, stride_w=0),
     r"insn 0 \(AVGPOOL\): field stride_w = 0", "decode"),
    (EltAdd(chans=4, out_h=1, out_w=1, b_mem=3), r"field b_mem = 3 names a missing FM memory",
     "bounds"),
    (EltMul(chans=4, out_h=1, out_w=1, clip_lo=1, clip_hi=0),
     r"insn 0 \(ELTMUL\): field clip_lo = 1 is greater than clip_hi = 0", "decode"),
    (EltMul(chans=4, out_h=2, out_w=2, in_pix_stride=4, in_row_stride=8, out_pix_stride=4,
            out_row_stride=8, b_pix_stride=2, b_row_stride=8),
     r"insn 0 \(ELTMUL\): field b_pix_stride = 2 is smaller than a pixel", "bounds"),
    (EltMul(chans=4, out_h=1, out_w=1, b_addr=(1 << 20) - 1),
     r"field b_addr = 0xfffff exceeds the FM memory size", "bounds"),
    (Upsample(chans=4, out_h=2, out_w=2, factor_h=0), r"field factor_h = 0", "decode"),
    (Copy(chans=4, out_h=1, out_w=1, out_addr=(1 << 20) - 1),
     r"insn 0 \(COPY\): field out_addr = 0xfffff exceeds the FM memory size", "bounds"),
]


@pytest.mark.parametrize("insn, pattern, kind", BAD, ids=[f"{i}-{b[2]}" for i, b in
                                                          enumerate(BAD)])
def test_out_of_range_fields_raise_simulator_error_naming_the_field(cfg, insn, pattern, kind):
    with pytest.raises(SimulatorError, match=pattern) as ei:
        run_raw(cfg, [insn, End()])
    assert ei.value.kind == kind


def test_regions_beyond_the_ddr_buffer_are_reported(cfg):
    insn = Save(region=REGION_SWAP, ddr_offset=8, rows=1, cols=1, chans=16)
    with pytest.raises(SimulatorError, match=r"insn 0 \(SAVE\): DDR range \[0x1008, 0x1018\) of "
                       r"region SWAP \(base 0x1000\) exceeds the DDR buffer of 4096 bytes"):
        simulate(cfg, encode_stream([insn, End()]), np.zeros(4096, np.uint8),
                 regions={"SWAP": (4096, 1024)})
    # the default layout (config region sizes) works on a large enough buffer
    lay = cfg.region_layout()
    st = simulate(cfg, encode_stream([dataclasses.replace(insn, ddr_offset=0), End()]),
                  np.zeros(lay["SWAP"][0] + 4 * 16, np.uint8))
    assert st.ddr_write_bytes == 4 * 16


def test_decode_errors_for_unknown_opcode_op_and_reserved_bits(cfg):
    end = encode(End())
    dram = np.zeros(16, np.uint8)
    with pytest.raises(SimulatorError, match="insn 0: unknown opcode 0") as ei:
        simulate(cfg, bytes(INSN_BYTES) + end, dram)
    assert ei.value.kind == "decode"
    with pytest.raises(SimulatorError, match=r"insn 0 \(MISC\): unknown MISC op 6"):
        simulate(cfg, (4 | 6 << 12).to_bytes(INSN_BYTES, "little") + end, dram)
    word = int.from_bytes(encode(Save()), "little") | 1 << 255
    with pytest.raises(SimulatorError, match=r"insn 0 \(SAVE\): reserved bits \[209, 256\)"):
        simulate(cfg, word.to_bytes(INSN_BYTES, "little") + end, dram)


MISC_OPS = ["MAXPOOL", "AVGPOOL", "ELTADD", "UPSAMPLE", "COPY", "ELTMUL"]


def random_word(rng, kind):
    """A word with random values in every field of ``kind`` and its expected field list."""
    opcode = {"LOAD": 1, "SAVE": 2, "CONV": 3, "END": 15}.get(kind, 4)
    values = [opcode, int(rng.integers(0, 16)), int(rng.integers(0, 16))]
    if kind == "END":
        values[1:] = [0, 0]
    for name, _, w, signed in field_offsets(kind)[3:]:
        v = MISC_OPS.index(kind) if name == "op" else int(rng.integers(0, 1 << w))
        values.append(v - (1 << w) if signed and v >= 1 << (w - 1) else v)
    word = sum((v & ((1 << w) - 1)) << lo for (_, lo, w, _), v in
               zip(field_offsets(kind), values, strict=True))
    return word.to_bytes(INSN_BYTES, "little"), values


@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_c_decoder_agrees_with_the_python_layout(kind):
    rng = np.random.default_rng(len(kind))
    for _ in range(40):
        raw, values = random_word(rng, kind)
        assert decode_fields(raw) == values
        assert encode(decode(raw)) == raw


def test_cycle_budget_stops_long_programs(cfg):
    insn, _, _ = conv_insn(64, 64, 64, 64, 3, 1, 1)
    prog = [insn, End()]
    with pytest.raises(SimulatorError, match=r"insn 0 \(CONV\): cycle budget of 5000 cycles "
                       r"exceeded") as ei:
        run_raw(cfg, prog, max_cycles=5000)
    assert ei.value.kind == "budget"
    st = run_raw(cfg, prog, max_cycles=10**6)
    assert st.cycles == 8 * 64 * 4 * 4 * 9 + cfg.CONV_LATENCY_CYCLES


# --- trace and timeline ----------------------------------------------------------------------


def test_trace_has_four_unit_tracks_and_renders_a_png(cfg, tmp_path):
    prog, ref, out = pipelined_conv(cfg, tiles=4)
    prog.insns[-1:] = [prog.insns[-1], Pool(op=MISC_MAXPOOL, in_mem=1, in_pix_stride=32,
                                            in_row_stride=14 * 32, out_mem=2, out_pix_stride=32,
                                            out_row_stride=7 * 32, out_h=2, out_w=7, chans=32,
                                            kernel_h=2, kernel_w=2, stride_h=2, stride_w=2)]
    path = str(tmp_path / "trace.json")
    st = prog.run(trace_path=path)
    ev = json.loads(open(path).read())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert names == {0: "LOAD", 1: "SAVE", 2: "CONV", 3: "MISC"}
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == len(prog.insns)
    assert {e["tid"] for e in xs} == {0, 1, 2, 3}
    assert {e["name"] for e in xs} == {"LOAD PM", "LOAD FM", "CONV", "SAVE", "MAXPOOL"}
    end = max(e["ts"] + e["dur"] for e in xs)
    assert end == pytest.approx(st.time_us(cfg), rel=1e-9)
    conv = next(e for e in xs if e["name"] == "CONV")
    assert conv["dur"] == pytest.approx(conv["args"]["cycles"] / cfg.CLOCK_MHZ)
    assert conv["args"]["dpon"] == "LOAD" and conv["args"]["macs"] > 0
    # a second run appended after the first
    prog.run(trace_path=path, trace_offset_us=end, trace_append=True)
    xs2 = [e for e in json.loads(open(path).read())["traceEvents"] if e["ph"] == "X"]
    assert len(xs2) == 2 * len(xs)
    assert min(e["ts"] for e in xs2[len(xs):]) == pytest.approx(end)
    png = trace_to_png(path, tmp_path / "timeline.png", title="pipelined conv")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


# --- binding ---------------------------------------------------------------------------------


def test_binding_validates_arguments_and_config(cfg):
    fin = encode(End())
    with pytest.raises(SimulatorError, match="dtype uint8"):
        simulate(cfg, fin, np.zeros(16, np.int8))
    with pytest.raises(SimulatorError, match="C-contiguous"):
        simulate(cfg, fin, np.zeros(32, np.uint8)[::2])
    ro = np.zeros(16, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(SimulatorError, match="writable"):
        simulate(cfg, fin, ro)
    with pytest.raises(SimulatorError, match="not a multiple of 32"):
        simulate(cfg, fin + b"\0", np.zeros(16, np.uint8))
    with pytest.raises(SimulatorError, match="unknown DDR region 'HEAP'"):
        simulate(cfg, fin, np.zeros(16, np.uint8), regions={"HEAP": (0, 1)})
    with pytest.raises(SimulatorError, match="max_cycles must be a positive integer"):
        simulate(cfg, fin, np.zeros(16, np.uint8), max_cycles=0)
    with pytest.raises(SimulatorError, match="config: field CONV_ROW_PAR: 16 is outside 1..8"):
        simulate(dataclasses.replace(cfg, CONV_ROW_PAR=16), fin, np.zeros(16, np.uint8))
    with pytest.raises(SimulatorError, match="config: field DDR_BYTES_PER_CYCLE"):
        simulate(dataclasses.replace(cfg, DDR_BYTES_PER_CYCLE=float("nan")), fin,
                 np.zeros(16, np.uint8))
    assert simulate(cfg, bytearray(fin), np.zeros(0, np.uint8)).cycles == 0


def test_stats_add_sums_every_field():
    n = len(dataclasses.fields(DPUStats))
    a, b = DPUStats(*range(1, n + 1)), DPUStats(*range(100, 100 + n))
    s = a + b
    assert [getattr(s, f.name) for f in dataclasses.fields(s)] == [
        x + y for x, y in zip(range(1, n + 1), range(100, 100 + n), strict=True)]
    assert sum([a, b], DPUStats()) == s


# --- fuzzing ---------------------------------------------------------------------------------

FUZZ_CASES = 600
FUZZ_Q = 1 << 14


def _base_programs(cfg):
    """A few valid (stream, ddr, regions) triples to mutate."""
    out = []
    prog, _, _ = pipelined_conv(cfg, tiles=3, th=2, W=6, C=8, OC=8)
    out.append((prog.stream(), prog.ddr.copy(), prog.regions))
    rng = np.random.default_rng(7)
    prog = Prog(cfg, q=FUZZ_Q)
    prog.load_images(i8(rng, cfg.NUM_PE, 4, 4, 3), pads=(1, 1, 1, 1), fmt=3)
    prog.load_images(i8(rng, cfg.NUM_PE, 4, 4, 8), mem=2, dpby="MISC")
    prog.insns.append(Pool(op=MISC_AVGPOOL, dpon="LOAD", in_mem=2, in_pix_stride=8,
                           in_row_stride=32, out_mem=1, out_pix_stride=8, out_row_stride=16,
                           out_h=2, out_w=2, chans=8, kernel_h=2, kernel_w=2, stride_h=2,
                           stride_w=2, shift=2))
    prog.insns.append(EltAdd(in_mem=2, in_pix_stride=8, in_row_stride=32, b_mem=2,
                             b_pix_stride=8, b_row_stride=32, out_mem=1, out_addr=512,
                             out_pix_stride=8, out_row_stride=32, out_h=4, out_w=4, chans=8,
                             shift_a=1, shift=1))
    prog.insns.append(EltMul(in_mem=2, in_pix_stride=8, in_row_stride=32, b_mem=2,
                             b_addr=40, out_mem=1, out_addr=512, out_pix_stride=8,
                             out_row_stride=32, out_h=4, out_w=4, chans=8, shift=3))
    prog.insns.append(Upsample(in_mem=1, in_pix_stride=8, in_row_stride=16, out_mem=0,
                               out_addr=4096, out_pix_stride=8, out_row_stride=32, out_h=4,
                               out_w=4, chans=8, factor_h=2, factor_w=2, dpby="SAVE"))
    prog.insns.append(Copy(in_mem=1, in_addr=512, in_pix_stride=8, in_row_stride=32, out_mem=2,
                           out_addr=4096, out_pix_stride=16, out_row_stride=128, out_h=4,
                           out_w=4, chans=8, dpby="CONV"))
    prog.load_params(i8(rng, 8, 3, 3, 8), rng.integers(-9, 9, 8))
    prog.insns.append(Conv(dpon="MISC", in_mem=0, in_addr=4096, in_pix_stride=8,
                           in_row_stride=32, ic=8, out_mem=1, out_pix_stride=8,
                           out_row_stride=32, out_h=4, out_w=4, oc=8, kernel_h=3, kernel_w=3,
                           pad_top=1, pad_bottom=1, pad_left=1, pad_right=1, shift=6))
    prog.insns.append(Conv(in_mem=0, in_addr=4096, in_pix_stride=8, in_row_stride=32, ic=8,
                           out_mem=1, out_addr=1024, out_pix_stride=8, out_row_stride=32,
                           out_h=4, out_w=4, oc=8, kernel_h=3, kernel_w=3, pad_top=2,
                           pad_bottom=2, pad_left=2, pad_right=2, shift=6, dilation=2))
    prog.save_images(0, 4096, 4, 4, 8, dpon="MISC")
    out.append((prog.stream(), prog.ddr.copy(), prog.regions))
    return out


def _rewrite_dpon_dpby(rng: np.random.Generator, b: bytearray) -> bytearray:
    """DPON/DPBY nibbles rewritten (protocol errors, deadlocks)."""
    n = len(b) // INSN_BYTES
    for _ in range(rng.integers(1, 4)):
        i = int(rng.integers(0, n))
        b[INSN_BYTES * i] = (b[INSN_BYTES * i] & 0x0F) | int(rng.integers(0, 16)) << 4
        b[INSN_BYTES * i + 1] = (b[INSN_BYTES * i + 1] & 0xF0) | int(rng.integers(0, 16))
    return b


MUTATORS = [fuzz.flip_bits, fuzz.random_words(8), fuzz.truncate(INSN_BYTES),
            fuzz.random_stream(INSN_BYTES), fuzz.reorder(INSN_BYTES), _rewrite_dpon_dpby,
            fuzz.byte_ff]
FUZZ_CONFIGS = ["dpu_default", "dpu_8pe"]


@functools.cache
def _fuzz_bases(name: str):
    return _base_programs(load_config(name))


def _fuzz_case(seed: int, rng: np.random.Generator) -> None:
    name = FUZZ_CONFIGS[seed % 2]
    cfg = load_config(name)
    stream, ddr, regs = _fuzz_bases(name)[int(rng.integers(0, len(_fuzz_bases(name))))]
    stream = fuzz.mutate(rng, stream, MUTATORS)
    ddr = fuzz.maybe_truncate(rng, ddr)
    simulate(cfg, stream, ddr.copy(), max_cycles=20_000, regions=regs)


def test_base_programs_of_the_fuzzer_are_valid():
    for name in ("dpu_default", "dpu_8pe"):
        cfg = load_config(name)
        for stream, ddr, regs in _base_programs(cfg):
            simulate(cfg, stream, ddr.copy(), max_cycles=20_000, regions=regs)


def test_fuzzed_streams_fail_cleanly_or_run():
    """Mutated streams end in success or SimulatorError; a crash names the seed."""
    ok, err = fuzz.run_worker(__file__, FUZZ_CASES)
    assert ok + err == FUZZ_CASES and ok > 0 and err > 0


if __name__ == "__main__":
    fuzz.worker_main(_fuzz_case, sys.argv)
