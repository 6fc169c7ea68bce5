"""MARSELLUS simulator: RBE and cluster kernels bit-exact vs numpy, DMA, semaphore sync and
overlap, timing calibration against the paper, errors and robustness on mutated streams."""

import functools
import itertools
import json
import sys
from dataclasses import replace

import numpy as np
import pytest

from helpers import fuzz
from tvm_accel.errors import SimulatorError
from tvm_marsellus import codegen as cg
from tvm_marsellus import layout, program
from tvm_marsellus.hw_config import MarsellusConfig, load_config
from tvm_marsellus.runtime import execute_program
from tvm_marsellus.simulator import rbe_job_phases, simulate, simulate_streams

CFG = load_config()


class L1:
    """A zeroed L1 image with a 4-byte-aligned bump allocator."""

    def __init__(self, cfg=CFG):
        self.mem = np.zeros(cfg.L1_BYTES, np.uint8)
        self.top = 0

    def put(self, data) -> int:
        data = np.asarray(data, np.uint8).reshape(-1)
        addr = self.top
        self.mem[addr:addr + data.size] = data
        self.top = (addr + data.size + 3) // 4 * 4
        return addr

    def alloc(self, n: int) -> int:
        return self.put(np.zeros(n, np.uint8))


def conv_ref(x, w, pads, padv, stride, ho, wo):
    """acc[ho, wo, o] = sum x_padded * w (w: O, I, kh, kw) in int64."""
    h, wd, _ = x.shape
    kh, kw = w.shape[2:]
    pt, pb, pl, pr = pads
    xp = np.full((h + pt + pb, wd + pl + pr, x.shape[2]), padv, np.int64)
    xp[pt:pt + h, pl:pl + wd] = x
    acc = np.zeros((ho, wo, w.shape[0]), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[ky:ky + (ho - 1) * stride + 1:stride, kx:kx + (wo - 1) * stride + 1:stride]
            acc += patch @ w[:, :, ky, kx].T.astype(np.int64)
    return acc


def run_rbe(rng, ib, wb, ob, k, s, ki, ko, h=5, relu=0, out_signed=1, w_unsigned=0, padv=0,
            pads=None, shift=None):
    pads = pads if pads is not None else ((1, 1, 1, 1) if k == 3 else (0, 0, 0, 0))
    x = rng.integers(0, 1 << ib, (h, h + 1, ki))
    lo, hi = (0, 1 << wb) if w_unsigned else (-(1 << (wb - 1)), 1 << (wb - 1))
    w = rng.integers(lo, hi, (ko, ki, k, k))
    ho = (h + pads[0] + pads[1] - k) // s + 1
    wo = (h + 1 + pads[2] + pads[3] - k) // s + 1
    acc = conv_ref(x, w, pads, padv, s, ho, wo)
    kappa = rng.integers(0, 1 << 16, ko)
    lam = rng.integers(-(1 << 24), 1 << 24, ko)
    if shift is None:  # put the outputs roughly in range so saturation is not everything
        shift = int(min(31, max(0, np.ceil(np.log2(np.abs(acc).max() * 65536 + 1)) - ob)))
    ref = cg.normquant(acc, kappa, lam, shift, ob, bool(out_signed), bool(relu))
    m = L1()
    job = cg.RbeJob(x_ptr=m.put(layout.pack_activations(x, ib)),
                    w_ptr=m.put(layout.pack_weights(w, wb, signed=not w_unsigned)),
                    nq_ptr=m.put(layout.pack_normquant(kappa, lam)),
                    y_ptr=m.alloc(layout.activation_bytes(ho, wo, ko, ob)),
                    h_in=h, w_in=h + 1, h_out=ho, w_out=wo, k_in=ki, k_out=ko, in_bits=ib,
                    w_bits=wb, out_bits=ob, kernel=k, stride=s, relu=relu,
                    out_signed=out_signed, w_unsigned=w_unsigned, shift=shift, pad_value=padv,
                    pad_top=pads[0], pad_bottom=pads[1], pad_left=pads[2], pad_right=pads[3])
    st = simulate(CFG, cg.encode_stream([job]), l1=m.mem)
    y = layout.unpack_activations(m.mem[job.y_ptr:], ho, wo, ko, ob, signed=bool(out_signed))
    return y, ref, st, job


BITS = (2, 3, 4, 5, 8)
CHANNELS = ((32, 32), (64, 96), (96, 64), (40, 33))


def test_rbe_is_bit_exact_for_every_precision_mode_stride_and_channel_count():
    rng = np.random.default_rng(0)
    for i, (wb, ib, ob) in enumerate(itertools.product(BITS, BITS, BITS)):
        k, s = (3, 1)[i % 2], 1 + (i // 2) % 2
        ki, ko = CHANNELS[(i // 4) % 4] if i % 5 == 0 else CHANNELS[(i // 4) % 2 * 3]
        y, ref, st, job = run_rbe(rng, ib, wb, ob, k, s, ki, ko)
        assert np.array_equal(y, ref), f"W={wb} I={ib} O={ob} {k}x{k} s{s} Kin={ki} Kout={ko}"
        assert st.rbe_macs == job.macs


def test_rbe_channel_grid_covers_both_modes_and_strides():
    rng = np.random.default_rng(1)
    for (ki, ko), k, s in itertools.product(CHANNELS, (3, 1), (1, 2)):
        y, ref, _, _ = run_rbe(rng, 4, 3, 8, k, s, ki, ko, h=4)
        assert np.array_equal(y, ref), f"{k}x{k} s{s} Kin={ki} Kout={ko}"


def test_rbe_relu_unsigned_outputs_unsigned_weights_and_pad_value():
    rng = np.random.default_rng(2)
    for relu, osg, wun, padv in [(1, 1, 0, 0), (0, 0, 0, 3), (1, 0, 1, 7), (0, 1, 1, 15)]:
        y, ref, _, _ = run_rbe(rng, 4, 4, 4, 3, 1, 32, 32, relu=relu, out_signed=osg,
                               w_unsigned=wun, padv=padv)
        assert np.array_equal(y, ref)
        if relu or not osg:
            assert y.min() >= 0


def test_rbe_pad_channels_are_written_as_zero_and_strides_place_tiles():
    rng = np.random.default_rng(3)
    m = L1()
    x = rng.integers(0, 4, (3, 3, 16))
    w = rng.integers(-2, 2, (5, 16, 1, 1))
    big = np.zeros((3, 5, 16), np.int64)
    big[:, 1:4] = x  # the tile sits inside a wider buffer: pixel stride 8 bytes, row 40
    xa = m.put(layout.pack_activations(big, 2))
    ya = m.alloc(4 * 6 * 8 * 4)
    m.mem[ya:ya + 4 * 6 * 8 * 4] = 0xAA
    job = cg.RbeJob(x_ptr=xa + 8, w_ptr=m.put(layout.pack_weights(w, 2)),
                    nq_ptr=m.put(layout.pack_normquant(np.ones(5), np.zeros(5))), y_ptr=ya,
                    h_in=3, w_in=3, h_out=3, w_out=3, k_in=16, k_out=5, in_bits=2, w_bits=2,
                    out_bits=8, kernel=1, out_signed=1, x_row_stride=40, y_pix_stride=64,
                    y_row_stride=4 * 64)
    simulate(CFG, cg.encode_stream([job]), l1=m.mem)
    acc = conv_ref(x, w, (0, 0, 0, 0), 0, 1, 3, 3)
    out = np.stack([layout.unpack_activations(m.mem[ya + r * 256 + c * 64:], 1, 1, 5, 8, True)[0, 0]
                    for r in range(3) for c in range(3)]).reshape(3, 3, 5)
    np.testing.assert_array_equal(out, cg.normquant(acc, 1, 0, 0, 8, True, False))
    words = m.mem[ya:ya + 32].view("<u4")
    assert (words >> 5).max() == 0  # channels 5..31 of the tile are zero
    assert m.mem[ya + 32:ya + 64].tolist() == [0xAA] * 32  # gap between pixels untouched


# --- cluster kernels -----------------------------------------------------------------------------
def run_cluster(kernel, m, **kw):
    cmd = cg.ClusterKernel(kernel=kernel, **kw)
    return simulate(CFG, cg.encode_stream([cmd]), l1=m.mem), cmd


@pytest.mark.parametrize("xb,wb,ob,k,s", [(8, 8, 8, 3, 1), (4, 2, 8, 3, 2), (2, 4, 4, 1, 1),
                                          (8, 2, 2, 5, 2)])
def test_cluster_conv_is_bit_exact(xb, wb, ob, k, s):
    rng = np.random.default_rng(xb * 10 + wb)
    h, ci, co = 6, 8, 12
    x = rng.integers(-(1 << (xb - 1)), 1 << (xb - 1), (h, h, ci))
    w = rng.integers(-(1 << (wb - 1)), 1 << (wb - 1), (co, ci, k, k))
    p = k // 2
    ho = (h + 2 * p - k) // s + 1
    kappa, lam = rng.integers(1, 300, co), rng.integers(-500, 500, co)
    ref = cg.normquant(conv_ref(x, w, (p,) * 4, -1, s, ho, ho), kappa, lam, 6, ob, True, True)
    m = L1()
    st, _ = run_cluster("CONV", m, in_bits=xb, w_bits=wb, out_bits=ob, relu=1, shift=6,
                        in_addr=m.put(layout.pack_hwc(x, xb)),
                        w_addr=m.put(layout.pack_hwc(w.transpose(0, 2, 3, 1), wb)),
                        nq_addr=m.put(layout.pack_normquant(kappa, lam)), out_addr=m.alloc(4096),
                        h_in=h, w_in=h, c_in=ci, c_out=co, h_out=ho, w_out=ho, kh=k, kw=k, sh=s,
                        sw=s, pad_top=p, pad_bottom=p, pad_left=p, pad_right=p, pad_value=-1)
    out = layout.unpack_hwc(m.mem[m.top - 4096:], (ho, ho, co), ob, True)
    np.testing.assert_array_equal(out, ref)
    assert st.cluster_macs == ho * ho * co * k * k * ci


def test_cluster_depthwise_fc_add_and_pools_are_bit_exact():
    rng = np.random.default_rng(5)
    m = L1()
    x = rng.integers(-128, 128, (5, 5, 8))
    xa = m.put(layout.pack_hwc(x, 8))
    # depthwise 3x3, pad 1
    wd = rng.integers(-8, 8, (8, 3, 3))
    kap, lam = rng.integers(1, 100, 8), rng.integers(-50, 50, 8)
    nqa = m.put(layout.pack_normquant(kap, lam))
    ya = m.alloc(200)
    run_cluster("DWCONV", m, in_bits=8, w_bits=4, out_bits=8, shift=4, in_addr=xa, out_addr=ya,
                w_addr=m.put(layout.pack_hwc(wd, 4)), nq_addr=nqa, h_in=5, w_in=5, c_in=8, c_out=8,
                h_out=5, w_out=5, kh=3, kw=3, pad_top=1, pad_bottom=1, pad_left=1, pad_right=1)
    xp = np.pad(x, ((1, 1), (1, 1), (0, 0)))
    acc = sum(xp[ky:ky + 5, kx:kx + 5] * wd[:, ky, kx] for ky in range(3) for kx in range(3))
    np.testing.assert_array_equal(layout.unpack_hwc(m.mem[ya:], (5, 5, 8), 8, True),
                                  cg.normquant(acc, kap, lam, 4, 8, True, False))
    # fully connected 200 -> 8
    wf = rng.integers(-128, 128, (8, 200))
    fa = m.alloc(8)
    run_cluster("FC", m, in_bits=8, w_bits=8, out_bits=8, shift=10, in_addr=xa, out_addr=fa,
                w_addr=m.put(layout.pack_hwc(wf, 8)), nq_addr=nqa, c_in=200, c_out=8)
    np.testing.assert_array_equal(layout.unpack_hwc(m.mem[fa:], (8,), 8, True),
                                  cg.normquant(wf @ x.reshape(-1), kap, lam, 10, 8, True, False))
    # add with requant: A signed int8, B unsigned 8-bit
    b = rng.integers(0, 256, (5, 5, 8))
    aa = m.alloc(200)
    run_cluster("ADD", m, in_bits=8, out_bits=8, b_signed=1, in_signed=1, in_addr=xa,
                w_addr=m.put(layout.pack_hwc(b - 128, 8)), out_addr=aa, kappa_a=3, kappa_b=5,
                lambda_=-7, shift=3, h_in=5, w_in=5, c_in=8, h_out=5, w_out=5, c_out=8)
    np.testing.assert_array_equal(layout.unpack_hwc(m.mem[aa:], (5, 5, 8), 8, True),
                                  np.clip((x * 3 + (b - 128) * 5 - 7) >> 3, -128, 127))
    # max pool 2x2 s2 and average pool 3x3 s1 pad 1 (padding counts as pad_value 0)
    pa = m.alloc(100)
    run_cluster("MAXPOOL", m, in_bits=8, out_bits=8, in_addr=xa, out_addr=pa, h_in=5, w_in=5,
                c_in=8, c_out=8, h_out=2, w_out=2, kh=2, kw=2, sh=2, sw=2)
    mx = x[:4, :4].reshape(2, 2, 2, 2, 8).max(axis=(1, 3))
    np.testing.assert_array_equal(layout.unpack_hwc(m.mem[pa:], (2, 2, 8), 8, True), mx)
    va = m.alloc(200)
    run_cluster("AVGPOOL", m, in_bits=8, out_bits=8, in_addr=xa, out_addr=va, h_in=5, w_in=5,
                c_in=8, c_out=8, h_out=5, w_out=5, kh=3, kw=3, pad_top=1, pad_bottom=1,
                pad_left=1, pad_right=1, kappa_a=57, lambda_=256, shift=9)
    s = sum(xp[ky:ky + 5, kx:kx + 5] for ky in range(3) for kx in range(3))
    np.testing.assert_array_equal(layout.unpack_hwc(m.mem[va:], (5, 5, 8), 8, True),
                                  np.clip((s * 57 + 256) >> 9, -128, 127))


@pytest.mark.parametrize("hwc_bits,plane_bits", [(8, 8), (8, 5), (4, 3), (2, 2)])
def test_marshaling_between_hwc_and_rbe_layouts_matches_the_pack_helpers(hwc_bits, plane_bits):
    rng = np.random.default_rng(hwc_bits + plane_bits)
    x = rng.integers(0, 1 << plane_bits, (3, 4, 40))
    m = L1()
    xa = m.put(layout.pack_hwc(x, hwc_bits))
    pa = m.alloc(layout.activation_bytes(3, 4, 40, plane_bits))
    run_cluster("HWC2RBE", m, in_bits=hwc_bits, out_bits=plane_bits, in_signed=0, in_addr=xa,
                out_addr=pa, h_in=3, w_in=4, c_in=40, h_out=3, w_out=4, c_out=40)
    np.testing.assert_array_equal(m.mem[pa:pa + layout.activation_bytes(3, 4, 40, plane_bits)],
                                  layout.pack_activations(x, plane_bits))
    back = m.alloc(3 * 4 * 40)
    run_cluster("RBE2HWC", m, in_bits=plane_bits, out_bits=hwc_bits, in_signed=0, in_addr=pa,
                out_addr=back, h_in=3, w_in=4, c_in=40, h_out=3, w_out=4, c_out=40)
    np.testing.assert_array_equal(layout.unpack_hwc(m.mem[back:], x.shape, hwc_bits, False), x)


# --- DMA and synchronisation ----------------------------------------------------------------------
def test_dma_moves_3d_strided_tiles_through_l3_l2_l1():
    l3 = np.arange(8192, dtype=np.uint32).astype(np.uint8)
    l2 = np.zeros(CFG.L2_BYTES, np.uint8)
    l1 = np.zeros(CFG.L1_BYTES, np.uint8)
    cmds = [cg.Dma(src_mem="L3", dst_mem="L2", src=0, dst=0, length=8192, signal=(0,)),
            cg.Dma(wait=(0,), signal=(1,), src_mem="L2", dst_mem="L1", src=3, dst=0, length=5,
                   rows=4, planes=2, src_row_stride=64, src_plane_stride=1024, dst_row_stride=8,
                   dst_plane_stride=40),
            cg.Dma(wait=(1,), src_mem="L1", dst_mem="L2", src=0, dst=9000, length=80)]
    st = simulate(CFG, cg.encode_stream(cmds), l1=l1, l2=l2, l3=l3)
    src = l3.reshape(8, 16, 64)[:2, :4, 3:8]
    tile = np.zeros((2, 5, 8), np.uint8)
    tile[:, :4, :5] = src
    np.testing.assert_array_equal(l1[:80].reshape(2, 5, 8), tile)
    np.testing.assert_array_equal(l2[9000:9080], l1[:80])
    assert (st.iodma_cmds, st.dma_in_cmds, st.dma_out_cmds) == (1, 1, 1)
    assert st.l3_read_bytes == 8192 and st.l1_write_bytes == 40 and st.l2_write_bytes == 8192 + 80
    assert st.iodma_busy == CFG.L3_LATENCY_CYCLES + 8192
    assert st.dma_in_busy == CFG.DMA_LATENCY_CYCLES + 5 + 7 * CFG.DMA_ROW_OVERHEAD_CYCLES
    assert st.cycles == st.iodma_busy + st.dma_in_busy + st.dma_out_busy  # fully serialized


def _tiled_rbe_program(double_buffer: bool, n_tiles: int = 6):
    """n_tiles 3x3 RBE jobs (Kin = Kout = 64, 8 bits) streaming inputs from L2 and outputs back."""
    rng = np.random.default_rng(9)
    m = L1()
    x = [rng.integers(0, 256, (5, 5, 64)) for _ in range(n_tiles)]
    w = rng.integers(-2, 2, (32, 64, 3, 3))
    kap, lam = rng.integers(0, 1 << 16, 32), rng.integers(-(1 << 12), 1 << 12, 32)
    l2 = np.zeros(CFG.L2_BYTES, np.uint8)
    xbytes = layout.activation_bytes(5, 5, 64, 8)
    ybytes = layout.activation_bytes(3, 3, 32, 8)
    for i, xi in enumerate(x):
        l2[i * xbytes:(i + 1) * xbytes] = layout.pack_activations(xi, 8)
    wa = m.put(layout.pack_weights(w, 2))
    nqa = m.put(layout.pack_normquant(kap, lam))
    nbuf = 2 if double_buffer else 1
    xbuf = [m.alloc(xbytes) for _ in range(nbuf)]
    ybuf = [m.alloc(ybytes) for _ in range(nbuf)]
    out0 = 512 * 1024
    # sems: 0/1 input buffer b full, 2/3 output buffer b full, 4/5 buffer pair b free
    cmds = [cg.Nop(engine="DMA_IN", signal=(4 + b,)) for b in range(nbuf)]
    for i in range(n_tiles):
        b = i % nbuf
        cmds.append(cg.Dma(wait=(4 + b,), signal=(b,), src_mem="L2", dst_mem="L1",
                           src=i * xbytes, dst=xbuf[b], length=xbytes))
        cmds.append(cg.RbeJob(wait=(b,), signal=(2 + b,), x_ptr=xbuf[b], w_ptr=wa, nq_ptr=nqa,
                              y_ptr=ybuf[b], h_in=5, w_in=5, h_out=3, w_out=3, k_in=64, k_out=32,
                              in_bits=8, w_bits=2, out_bits=8, shift=12, out_signed=1))
        cmds.append(cg.Dma(wait=(2 + b,), signal=(4 + b,), src_mem="L1", dst_mem="L2",
                           src=ybuf[b], dst=out0 + i * ybytes, length=ybytes))
    st = simulate(CFG, cg.encode_stream(cmds), l1=m.mem, l2=l2)
    for i, xi in enumerate(x):
        acc = conv_ref(xi, w, (0, 0, 0, 0), 0, 1, 3, 3)
        got = layout.unpack_activations(l2[out0 + i * ybytes:], 3, 3, 32, 8, signed=True)
        np.testing.assert_array_equal(got, cg.normquant(acc, kap, lam, 12, 8, True, False))
    return st


def test_double_buffering_overlaps_dma_with_rbe_compute():
    single = _tiled_rbe_program(False)
    double = _tiled_rbe_program(True)
    busy = double.dma_in_busy + double.rbe_busy + double.dma_out_busy
    assert single.cycles == pytest.approx(single.dma_in_busy + single.rbe_busy
                                          + single.dma_out_busy, rel=0.02)
    assert double.cycles < 0.85 * busy          # the engines ran concurrently
    assert double.cycles < single.cycles
    # with two buffers the RBE waits only for the first tile: compute-bound
    assert double.cycles < double.rbe_busy + double.dma_in_busy / 6 + double.dma_out_busy / 6 + 50


def test_job_queue_hides_the_setup_of_a_queued_rbe_job():
    job = cg.RbeJob(h_in=5, w_in=5, h_out=3, w_out=3, k_in=32, k_out=32, in_bits=2, w_bits=2,
                    out_bits=2, y_ptr=4096)
    st = simulate(CFG, cg.encode_stream([job, job, job]))
    assert st.rbe_setup == CFG.RBE_JOB_SETUP_CYCLES
    one = MarsellusConfig(**{**CFG.to_json(), "RBE_JOB_QUEUE_DEPTH": 1})
    st1 = simulate(one, cg.encode_stream([job, job, job]))
    assert st1.rbe_setup == 3 * CFG.RBE_JOB_SETUP_CYCLES
    assert st1.cycles == st.cycles + 2 * CFG.RBE_JOB_SETUP_CYCLES


def test_cluster_and_rbe_run_concurrently_when_not_synchronised():
    job = cg.RbeJob(h_in=5, w_in=5, h_out=3, w_out=3, k_in=64, k_out=64, y_ptr=8192)
    fc = cg.ClusterKernel(kernel="FC", w_bits=8, c_in=1024, c_out=16, w_addr=16384,
                          out_addr=40000, nq_addr=50000)
    alone = [simulate(CFG, cg.encode_stream([c])).cycles for c in (job, fc)]
    both = simulate(CFG, cg.encode_stream([job, fc]))
    assert both.cycles == max(alone)
    chained = simulate(CFG, cg.encode_stream([replace(job, signal=(0,)),
                                              replace(fc, wait=(0,))]))
    assert chained.cycles == sum(alone)
    assert chained.cluster_stall == alone[0]


def _two_layer_program():
    """HWC int8 input in L2 -> marshal to bit planes -> RBE 3x3 -> RBE 1x1 -> HWC output."""
    rng = np.random.default_rng(11)
    x = rng.integers(0, 16, (6, 6, 32))
    w1 = rng.integers(-4, 4, (64, 32, 3, 3))
    w2 = rng.integers(-2, 2, (32, 64, 1, 1))
    k1, l1_ = rng.integers(1, 64, 64), rng.integers(-100, 100, 64)
    k2, l2_ = rng.integers(1, 64, 32), rng.integers(-100, 100, 32)
    params = [layout.pack_weights(w1, 3), layout.pack_normquant(k1, l1_),
              layout.pack_weights(w2, 2), layout.pack_normquant(k2, l2_)]
    offs, image = [], b""
    for p in params:
        offs.append(len(image))
        image += p.tobytes() + bytes((-p.size) % 4)
    xin, yout = 65536, 98304
    L = {"x": 0, "xp": 4096, "w1": 8192, "nq1": 16384 + 4096, "h": 24576, "w2": 28672,
         "nq2": 32768, "y2": 36864, "yh": 40960}
    sizes = [p.size for p in params]
    cmds1 = [
        cg.Dma(src_mem="L2", dst_mem="L1", src=xin, dst=L["x"], length=6 * 6 * 32, signal=(0,)),
        cg.Dma(src_mem="L2", dst_mem="L1", src=offs[0], dst=L["w1"], length=sizes[0]),
        cg.Dma(src_mem="L2", dst_mem="L1", src=offs[1], dst=L["nq1"], length=sizes[1]),
        cg.Dma(src_mem="L2", dst_mem="L1", src=offs[2], dst=L["w2"], length=sizes[2]),
        cg.Dma(src_mem="L2", dst_mem="L1", src=offs[3], dst=L["nq2"], length=sizes[3],
               signal=(1,)),
        cg.ClusterKernel(wait=(0,), signal=(2,), kernel="HWC2RBE", in_bits=8, out_bits=4,
                         in_signed=0, in_addr=L["x"], out_addr=L["xp"], h_in=6, w_in=6,
                         c_in=32, h_out=6, w_out=6, c_out=32),
        cg.RbeJob(wait=(1, 2), signal=(3,), x_ptr=L["xp"], w_ptr=L["w1"], nq_ptr=L["nq1"],
                  y_ptr=L["h"], h_in=6, w_in=6, h_out=6, w_out=6, k_in=32, k_out=64, in_bits=4,
                  w_bits=3, out_bits=4, relu=1, shift=6, pad_top=1, pad_bottom=1, pad_left=1,
                  pad_right=1)]
    cmds2 = [
        cg.RbeJob(wait=(3,), signal=(4,), x_ptr=L["h"], w_ptr=L["w2"], nq_ptr=L["nq2"],
                  y_ptr=L["y2"], h_in=6, w_in=6, h_out=6, w_out=6, k_in=64, k_out=32,
                  in_bits=4, w_bits=2, out_bits=8, kernel=1, out_signed=1, shift=5),
        cg.ClusterKernel(wait=(4,), signal=(5,), kernel="RBE2HWC", in_bits=8, out_bits=8,
                         in_signed=1, in_addr=L["y2"], out_addr=L["yh"], h_in=6, w_in=6,
                         c_in=32, h_out=6, w_out=6, c_out=32),
        cg.Dma(wait=(5,), src_mem="L1", dst_mem="L2", src=L["yh"], dst=yout, length=6 * 6 * 32)]
    prog = program.MarsProgram(
        layers=[program.LayerProgram("conv3x3", "conv2d", "rbe", cmds1, macs=36 * 64 * 32 * 9),
                program.LayerProgram("conv1x1", "conv2d", "rbe", cmds2, macs=36 * 32 * 64)],
        tensors={"x": program.TensorPlacement("x", (6, 6, 32), "L2", xin, "hwc", 8, False),
                 "y": program.TensorPlacement("y", (6, 6, 32), "L2", yout, "hwc", 8, True)},
        inputs=["x"], outputs=["y"], l2_image=image, l2_bytes=131072)
    h = cg.normquant(conv_ref(x, w1, (1, 1, 1, 1), 0, 1, 6, 6), k1, l1_, 6, 4, False, True)
    ref = cg.normquant(conv_ref(h, w2, (0, 0, 0, 0), 0, 1, 6, 6), k2, l2_, 5, 8, True, False)
    return prog, x, ref


def test_a_program_runs_from_its_blob_bit_exact():
    prog, x, ref = _two_layer_program()
    data = program.build_blob(prog, CFG, "two_convs")
    loaded, cfg, _ = program.load_blob(data, expect_config=CFG)
    outs, [(_, st)] = execute_program(loaded, {"x": x}, cfg, whole_stream=True)
    np.testing.assert_array_equal(outs["y"], ref)
    assert st.rbe_macs == sum(ly.macs for ly in prog.layers)
    assert st.rbe_cmds == 2 and st.cluster_cmds == 2 and st.dma_in_cmds == 5
    with pytest.raises(SimulatorError, match="values outside 0..255"):
        execute_program(loaded, {"x": x - 1}, cfg, whole_stream=True)
    with pytest.raises(SimulatorError, match="was not given"):
        execute_program(loaded, {}, cfg, whole_stream=True)



def _layer_memories(prog, x):
    l2 = np.zeros(prog.l2_bytes, np.uint8)
    l2[:len(prog.l2_image)] = np.frombuffer(prog.l2_image, np.uint8)
    t = prog.tensors["x"]
    l2[t.offset:t.offset + t.nbytes] = layout.pack_tensor(t, x)
    return np.zeros(CFG.L1_BYTES, np.uint8), l2


def test_streams_in_one_hand_off_run_as_one_simulate_per_stream(tmp_path):
    prog, x, _ = _two_layer_program()
    streams = [prog.stream(), cg.encode_stream([  # the program, then its output back into L1
        cg.Dma(src_mem="L2", dst_mem="L1", src=prog.tensors["y"].offset, dst=65536,
               length=prog.tensors["y"].nbytes)])]
    l1, l2 = _layer_memories(prog, x)
    each, off = [], 3.0
    for i, s in enumerate(streams):
        each.append(simulate(CFG, s, l1=l1, l2=l2, trace_path=str(tmp_path / "each.json"),
                             trace_offset_us=off, trace_append=i > 0))
        off += each[-1].cycles / CFG.CLOCK_MHZ
    l1b, l2b = _layer_memories(prog, x)
    once = simulate_streams(CFG, streams, l1=l1b, l2=l2b, trace_path=str(tmp_path / "once.json"),
                            trace_offset_us=3.0)
    assert once == each and once[0].cycles > 0
    np.testing.assert_array_equal(l1b, l1)
    np.testing.assert_array_equal(l2b, l2)
    y = prog.tensors["y"]
    np.testing.assert_array_equal(l1b[65536:65536 + y.nbytes], l2b[y.offset:y.offset + y.nbytes])
    assert (tmp_path / "once.json").read_bytes() == (tmp_path / "each.json").read_bytes()


def test_a_faulting_stream_stops_the_sequence_with_its_message():
    prog, x, _ = _two_layer_program()
    first = prog.stream()
    bad = cg.encode_stream([cg.RbeJob(in_bits=9)])
    l1, l2 = _layer_memories(prog, x)
    simulate(CFG, first, l1=l1, l2=l2)
    l1b, l2b = _layer_memories(prog, x)
    with pytest.raises(SimulatorError, match=r"cmd 0 \(RBE\): field qa"):
        simulate_streams(CFG, [first, bad, first],
                         l1=l1b, l2=l2b)
    np.testing.assert_array_equal(l1b, l1)   # the first ran, the last did not
    np.testing.assert_array_equal(l2b, l2)

# --- timing calibration (paper Fig. 13 / Sec. II-B4 / Sec. III-C) ---------------------------------
def _fig13(mode, wb, ib, ob=8):
    k = 3 if mode == "3x3" else 1
    job = cg.RbeJob(h_in=3 + k - 1, w_in=3 + k - 1, h_out=3, w_out=3, k_in=64, k_out=64,
                    in_bits=ib, w_bits=wb, out_bits=ob, kernel=k)
    ph = rbe_job_phases(CFG, job)
    return 2 * job.macs, ph


def test_rbe_compute_peak_is_1610_ops_per_cycle_in_3x3_w2():
    for ib in (2, 4):
        ops, ph = _fig13("3x3", 2, ib)
        assert ops / ph["compute"] == pytest.approx(1610, rel=0.01)


def test_rbe_3x3_w2_i4_loop_reaches_571_gops_at_420_mhz():
    ops, ph = _fig13("3x3", 2, 4)
    assert ops / (ph["load"] + ph["compute"]) * 0.42 == pytest.approx(571, rel=0.02)
    # highest 1x1-bit throughput ~7100 Gop/s at W=8, I=4
    ops, ph = _fig13("3x3", 8, 4)
    assert ops * 32 / (ph["load"] + ph["compute"]) * 0.42 == pytest.approx(7100, rel=0.02)


def test_rbe_8x8_full_job_is_near_91_gops():
    ops, ph = _fig13("3x3", 8, 8, 8)
    assert ops / sum(ph.values()) * 0.42 == pytest.approx(91, rel=0.15)


def test_rbe_trends_of_fig13():
    def loop(mode, wb, ib):
        ops, ph = _fig13(mode, wb, ib)
        return ops / (ph["load"] + ph["compute"]), ph["load"] / (ph["load"] + ph["compute"])

    # I = 8 halves the W x I throughput of I = 4 (contributions split in two iterations)
    assert loop("3x3", 4, 8)[0] / loop("3x3", 4, 4)[0] == pytest.approx(0.5, abs=0.03)
    # 3x3: fewer weight bits -> faster; 1x1: W does not matter
    assert loop("3x3", 2, 4)[0] > loop("3x3", 4, 4)[0] > loop("3x3", 8, 4)[0]
    assert loop("1x1", 2, 4)[0] == loop("1x1", 8, 4)[0]
    # 1x1 is hit harder by LOAD and is slower than 3x3
    assert loop("1x1", 4, 4)[1] > loop("3x3", 4, 4)[1]
    assert loop("1x1", 4, 4)[0] < loop("3x3", 8, 4)[0]
    # binary throughput is higher with I >= 4 (all BinConvs used)
    assert loop("1x1", 4, 4)[0] * 16 > 1.5 * loop("1x1", 4, 2)[0] * 8


def test_pointwise_conv_on_one_input_channel_is_faster_on_the_cluster():
    """Sec. III-C3: a Conv1x1 on a single input channel is ~2x faster on the cluster than on
    the RBE (9x9x64 output, 8 bits)."""
    rbe = simulate(CFG, cg.encode_stream([cg.RbeJob(h_in=9, w_in=9, h_out=9, w_out=9, k_in=1,
                                                    k_out=64, kernel=1, y_ptr=4096)]))
    cl = simulate(CFG, cg.encode_stream([cg.ClusterKernel(
        kernel="CONV", w_bits=8, h_in=9, w_in=9, c_in=1, c_out=64, h_out=9, w_out=9,
        out_addr=4096, w_addr=16384, nq_addr=20000)]))
    assert 1.5 < rbe.cycles / cl.cycles < 3.0


def _matmul_gops(bits):
    fc = cg.ClusterKernel(kernel="CONV", in_bits=bits, w_bits=bits, out_bits=8, h_in=4,
                          w_in=4, c_in=1024, c_out=64, h_out=4, w_out=4, w_addr=32768,
                          out_addr=16384, nq_addr=120000)
    st = simulate(CFG, cg.encode_stream([fc]))
    return st.gops(CFG)


def test_cluster_matmul_throughput_matches_the_paper():
    g8 = _matmul_gops(8)
    assert g8 == pytest.approx(25.45 * 1.67, rel=0.06)       # MAC&LOAD, 420 MHz
    assert _matmul_gops(4) / (25.45) == pytest.approx(3.2, rel=0.08)
    assert _matmul_gops(2) / (25.45) == pytest.approx(6.3, rel=0.08)


# --- errors --------------------------------------------------------------------------------------
def _err(cmds, match, **kw):
    with pytest.raises(SimulatorError, match=match):
        simulate(CFG, cmds if isinstance(cmds, bytes) else cg.encode_stream(cmds), **kw)


def test_bad_streams_fail_with_one_line_messages_naming_command_and_field():
    _err([cg.RbeJob(in_bits=9)], r"cmd 0 \(RBE\): field qa \(input bits\): 9 is outside 2..8")
    _err([cg.RbeJob(y_ptr=CFG.L1_BYTES - 4)], r"cmd 0 \(RBE\): output \(y_ptr\) .* exceeds L1")
    _err([cg.RbeJob(h_out=4)], "img_size_out")
    _err([cg.RbeJob(pad_value=5, in_bits=2)], "pad_value")
    _err([cg.Nop(), cg.Dma(src_mem="L1", dst_mem="L3", length=4)], r"cmd 1 \(DMA\).*not a DMA path")
    _err([cg.Dma(length=16, src=CFG.L2_BYTES - 8)], r"source .* exceeds L2")
    _err([cg.Dma(src_mem="L3", dst_mem="L2", length=16)], "exceeds L3 size 0",
         l3=np.zeros(0, np.uint8))
    _err([cg.ClusterKernel(kernel="DWCONV", w_bits=8, c_in=4, c_out=8)], "c_in/c_out")
    _err([cg.ClusterKernel(in_bits=3)], "XpulpNN")
    _err(cg.encode(cg.RbeJob()), "must end with END")
    _err(cg.encode(cg.End()) + cg.encode_stream([]), r"END before the last command")
    _err(b"\0" * 10, "not a multiple of 64")


def test_deadlock_and_cycle_budget_are_reported():
    _err([cg.Dma(wait=(3,), length=4)], r"deadlock: DMA_IN at cmd 0 \(DMA\) waits on sem 3")
    _err([cg.RbeJob(wait=(1,), signal=(0,)), cg.Dma(wait=(0,), signal=(1,), length=4)],
         "deadlock: DMA_IN .* sem 0; RBE .* sem 1")
    _err([cg.RbeJob(h_in=5, w_in=5, h_out=3, w_out=3)], "cycle budget of 50 exceeded",
         max_cycles=50)


def test_memory_arguments_are_checked():
    with pytest.raises(SimulatorError, match="dtype uint8"):
        simulate(CFG, cg.encode_stream([]), l1=np.zeros(4, np.int32))
    with pytest.raises(SimulatorError, match="the config's L2"):
        simulate(CFG, cg.encode_stream([]), l2=np.zeros(CFG.L2_BYTES + 1, np.uint8))


def test_trace_has_one_track_per_engine(tmp_path):
    path = tmp_path / "t.json"
    _tiled_rbe_program  # noqa: B018 (documentation: same shape as the overlap test)
    cmds = [cg.Dma(length=64, signal=(0,)), cg.RbeJob(wait=(0,), y_ptr=4096, h_in=3, w_in=3,
                                                       h_out=3, w_out=3, kernel=1)]
    simulate(CFG, cg.encode_stream(cmds), trace_path=str(path))
    simulate(CFG, cg.encode_stream(cmds), trace_path=str(path), trace_append=True,
             trace_offset_us=10.0)
    ev = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    assert names == {"IODMA", "DMA_IN", "DMA_OUT", "RBE", "CLUSTER"}
    rbe = [e for e in ev if e.get("ph") == "X" and e["name"] == "RBE"]
    assert len(rbe) == 2 and rbe[1]["ts"] > 10 and "compute" in rbe[0]["args"]


# --- fuzzing -------------------------------------------------------------------------------------
FUZZ_CASES = 800


def _base_streams():
    rng = np.random.default_rng(4)
    cmds = [cg.Nop(engine="DMA_IN", signal=(4,)), cg.Nop(engine="DMA_IN", signal=(4,)),
            cg.Dma(src_mem="L3", dst_mem="L2", length=256, signal=(6,)),
            cg.Dma(wait=(4, 6), signal=(0,), src_mem="L2", dst_mem="L1", length=64, rows=4,
                   src_row_stride=64, dst_row_stride=64),
            cg.RbeJob(wait=(0,), signal=(1,), x_ptr=0, w_ptr=1024, nq_ptr=4096, y_ptr=8192,
                      h_in=5, w_in=5, h_out=3, w_out=3, k_in=32, k_out=40, in_bits=4, w_bits=2,
                      out_bits=4, pad_top=1, shift=3),
            cg.ClusterKernel(wait=(1,), signal=(2,), kernel="CONV", w_bits=4, in_addr=8192,
                             out_addr=16384, w_addr=20000, nq_addr=24000, h_in=4, w_in=4,
                             c_in=8, c_out=8, h_out=4, w_out=4, kh=3, kw=3, pad_top=1,
                             pad_bottom=1, pad_left=1, pad_right=1),
            cg.ClusterKernel(kernel="CONV", w_bits=4, in_addr=8192, out_addr=16384,
                             w_addr=20000, h_in=4, w_in=4, c_in=8, c_out=8, h_out=4, w_out=4,
                             psum_in=1, psum_out=1, psum_addr=36000),
            cg.ClusterKernel(kernel="AVGPOOL", in_addr=16384, out_addr=30000, h_in=4, w_in=4,
                             c_in=8, c_out=8, h_out=2, w_out=2, kh=2, kw=2, sh=2, sw=2,
                             kappa_a=64, shift=8),
            cg.ClusterKernel(kernel="HWC2RBE", in_bits=8, out_bits=3, in_addr=16384,
                             out_addr=32000, h_in=4, w_in=4, c_in=8, h_out=4, w_out=4, c_out=8),
            cg.Dma(wait=(2,), signal=(4,), src_mem="L1", dst_mem="L2", src=16384, dst=4096,
                   length=128)]
    l1 = rng.integers(0, 256, 40000).astype(np.uint8)
    return [(cg.encode_stream(cmds), l1)]


def _random_commands(rng: np.random.Generator, b: bytearray) -> bytearray:
    """Random commands with a valid opcode."""
    n = len(b) // cg.CMD_BYTES
    for _ in range(rng.integers(1, 3)):
        i = int(rng.integers(0, n))
        b[64 * i:64 * i + 64] = bytes([int(rng.integers(1, 5)), 0, 0, 0]) + rng.bytes(60)
    return b


def _duplicate_or_drop(rng: np.random.Generator, b: bytearray) -> bytearray:
    """One command duplicated or dropped."""
    n = len(b) // cg.CMD_BYTES
    ins = [bytes(b[64 * i:64 * i + 64]) for i in range(n)]
    i, j = (int(x) for x in rng.integers(0, n, 2))
    if rng.integers(0, 2):
        ins.insert(i, ins[j])
    else:
        del ins[i]
    return bytearray(b"".join(ins))


def _small_field(rng: np.random.Generator, b: bytearray) -> bytearray:
    """Small field values only (keeps the commands decodable more often)."""
    i = int(rng.integers(0, len(b) // cg.CMD_BYTES))
    w = int(rng.integers(2, 16))
    b[64 * i + 4 * w:64 * i + 4 * w + 4] = int(rng.integers(0, 1 << 12)).to_bytes(4, "little")
    return b


MUTATORS = [fuzz.flip_bits, fuzz.random_words(4), fuzz.truncate(cg.CMD_BYTES), _random_commands,
            _duplicate_or_drop, _small_field]


@functools.cache
def _fuzz_base():
    return _base_streams()[0]


def _fuzz_case(seed: int, rng: np.random.Generator) -> None:
    stream, l1 = _fuzz_base()
    mem = np.zeros(CFG.L1_BYTES, np.uint8)
    mem[:l1.size] = l1
    mem = fuzz.maybe_truncate(rng, mem).copy()
    simulate(CFG, fuzz.mutate(rng, stream, MUTATORS), l1=mem, l3=np.zeros(4096, np.uint8),
             l2=np.zeros(65536, np.uint8), max_cycles=200_000)


def test_base_stream_of_the_fuzzer_is_valid():
    stream, l1 = _base_streams()[0]
    mem = np.zeros(CFG.L1_BYTES, np.uint8)
    mem[:l1.size] = l1
    st = simulate(CFG, stream, l1=mem, l3=np.zeros(4096, np.uint8), l2=np.zeros(65536, np.uint8),
                  max_cycles=200_000)
    assert st.rbe_cmds == 1 and st.cluster_cmds == 4


def test_mutated_streams_fail_cleanly_or_run():
    """Mutated streams end in success or SimulatorError; a crash names the seed."""
    ok, _ = fuzz.run_worker(__file__, FUZZ_CASES)
    assert 0 < ok < FUZZ_CASES  # both outcomes are exercised


if __name__ == "__main__":
    fuzz.worker_main(_fuzz_case, sys.argv)
