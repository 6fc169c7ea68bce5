"""Windows beyond the RBE on the cluster: 8-bit kernel / stride / padding fields of the cluster
kernels (low nibbles in word 10, high nibbles in word 14) and padding not smaller than the
kernel. The five DeepBench layers that used to fall back to the CPU (5x20 stride-2 speech
kernels over one channel, batch 1 / 2 / 4; 1x1 stride-2 convs with padding 3 over 7x7, batch 1
/ 2) run on MARSELLUS at reduced sizes, bit-exact."""

import math

import numpy as np
import pytest

from helpers import models
from tvm_accel.errors import SimulatorError
from tvm_accel.layers import ConvLayer, conv_output_shape
from tvm_marsellus import codegen as cg
from tvm_marsellus import layout, numerics
from tvm_marsellus.simulator import simulate
from tvm_marsellus.strategy.layers import Geometry, TensorInfo, _window, rbe_reasons

from .test_marsellus_simulator import L1, conv_ref
from .test_marsellus_strategy import CFG, T, check


def test_window_fields_are_8_bit_over_words_10_and_14():
    cmd = cg.ClusterKernel(kernel="CONV", w_bits=8, kh=5, kw=20, sh=2, sw=17, pad_top=3,
                           pad_bottom=200, pad_left=16, pad_right=255)
    raw = cg.encode(cmd)
    w10, w14 = (int.from_bytes(raw[4 * i:4 * i + 4], "little") for i in (10, 14))
    assert [(w10 >> 4 * i) & 15 for i in range(8)] == [5, 4, 2, 1, 3, 8, 0, 15]
    assert [(w14 >> 4 * i) & 15 for i in range(8)] == [0, 1, 0, 1, 0, 12, 1, 15]
    assert cg.decode(raw) == cmd and cg.parse_line(cg.format_cmd(cmd)) == cmd
    # a stream without word 14 keeps its 4-bit meaning
    small = cg.ClusterKernel(kernel="CONV", w_bits=8, kh=3, kw=3, pad_top=1)
    assert cg.encode(small)[56:60] == bytes(4)
    with pytest.raises(cg.EncodeError, match="kw: 256 does not fit 8 unsigned bits"):
        cg.encode(cg.ClusterKernel(kernel="CONV", w_bits=8, kw=256))
    with pytest.raises(cg.DecodeError, match="reserved bits of word 15"):
        cg.decode(raw[:60] + b"\1\0\0\0")
    with pytest.raises(SimulatorError, match="reserved word 15"):
        simulate(CFG, cg.encode_stream([cmd])[:60] + b"\1\0\0\0" + cg.encode(cg.End()))
    # the simulator reads the high nibbles: a 20-wide window over 19 columns is refused
    bad = cg.ClusterKernel(kernel="CONV", w_bits=8, h_in=5, w_in=19, c_in=1, c_out=1, h_out=1,
                           w_out=1, kh=5, kw=20)
    with pytest.raises(SimulatorError, match="outputs need a larger input"):
        simulate(CFG, cg.encode_stream([bad]))


def _sim_conv(x, w, pads, s, padv=-3):
    """One CL.CONV of ``w`` (O, I, kh, kw) on ``x`` (H, W, C), 8-bit, against numpy."""
    rng = np.random.default_rng(0)
    h, wd, ci = x.shape
    co, _, kh, kw = w.shape
    pt, pb, pl, pr = pads
    ho, wo = (h + pt + pb - kh) // s[0] + 1, (wd + pl + pr - kw) // s[1] + 1
    kappa, lam = rng.integers(1, 300, co), rng.integers(-5000, 5000, co)
    acc = conv_ref(x, w, pads, padv, 1, (ho - 1) * s[0] + 1, (wo - 1) * s[1] + 1)
    ref = cg.normquant(acc[::s[0], ::s[1]], kappa, lam, 9, 8, True, False)
    m = L1()
    out = m.alloc(ho * wo * co)
    st = simulate(CFG, cg.encode_stream([cg.ClusterKernel(
        kernel="CONV", w_bits=8, shift=9, in_addr=m.put(layout.pack_hwc(x, 8)),
        w_addr=m.put(layout.pack_hwc(w.transpose(0, 2, 3, 1), 8)),
        nq_addr=m.put(layout.pack_normquant(kappa, lam)), out_addr=out, h_in=h, w_in=wd, c_in=ci,
        c_out=co, h_out=ho, w_out=wo, kh=kh, kw=kw, sh=s[0], sw=s[1], pad_top=pt,
        pad_bottom=pb, pad_left=pl, pad_right=pr, pad_value=padv)]), l1=m.mem)
    np.testing.assert_array_equal(layout.unpack_hwc(m.mem[out:], (ho, wo, co), 8, True), ref)
    return ref, st


def test_cluster_conv_runs_a_20x5_kernel_and_padding_beyond_the_kernel():
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (11, 45, 1))
    w = rng.integers(-128, 128, (8, 1, 5, 20))
    _, st = _sim_conv(x, w, (0, 0, 0, 0), (2, 2))
    assert st.cluster_macs == 4 * 13 * 8 * 100
    # 1x1 stride 2 with padding 3 (and 17: high nibble): the border outputs see padding only
    x = rng.integers(-128, 128, (7, 7, 16))
    w = rng.integers(-128, 128, (4, 16, 1, 1))
    for p in (3, 17):
        ref, _ = _sim_conv(x, w, (p, p, p, p), (2, 2))
        assert (ref[0] == ref[-1]).all() and (ref[:, 0] == ref[0, 0]).all()


def test_cluster_conv_skips_the_matmul_of_outputs_whose_window_is_padding_only():
    # 7x7, 1x1 stride 2, padding 3 (and 17): 3 x 3 of the 7 x 7 (21 x 21) outputs read the
    # input; the others are the bias-only value, computed once, and cost their NormQuant only
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (7, 7, 16))
    w = rng.integers(-128, 128, (4, 16, 1, 1))
    cycles = {}
    for p in (3, 17):
        _, st = _sim_conv(x, w, (p, p, p, p), (2, 2))
        assert st.cluster_macs == 3 * 3 * 4 * 16
        cycles[p] = st.cluster_busy

    def nq(outs: int) -> int:
        return math.ceil(outs * 4 * CFG.CL_NQ_CYCLES_PER_OUTPUT / CFG.CLUSTER_CORES)

    assert cycles[17] - cycles[3] == nq(21 * 21) - nq(7 * 7)
    geo = Geometry(7, 7, 16, 7, 7, 4, 1, 1, 2, 2, (3, 3, 3, 3))
    assert geo.window_fraction() == pytest.approx(9 / 49)


def _layer(rng, cin, cout, kernel, strides, pads, name="conv", inp="x", out="y"):
    kh, kw = kernel
    w = rng.integers(-128, 128, (cout, cin, kh, kw))
    b = rng.integers(-(1 << 12), 1 << 12, cout)
    sums = np.abs(w).reshape(cout, -1).sum(1)
    rq = numerics.requant_recipe(127.0 / (0.05 * (sums * 128 + np.abs(b)) + 1),
                                 sums * 128 + np.abs(b), 0, -128, 127)
    return ConvLayer(name, inp, out, w, b, 0, strides, pads, rq)


def _run(rng, layer, x_shape, knobs=None):
    out = conv_output_shape(layer, x_shape)
    tensors = {"x": T("x", x_shape), "y": T("y", out)}
    prog, _ = check(rng, [layer], tensors, ["x"], ["y"], knobs and {layer.name: knobs})
    return prog


@pytest.mark.parametrize("batch, knobs", [(1, None), (2, {"tile_h": 2, "tile_w": 5}),
                                          (4, {"tile_h": 3, "tile_k": 16})])
def test_deepbench_5x20_speech_layers_run_on_the_cluster(batch, knobs):
    """DeepBench layers 0-2 (1 x 161 x 700 -> 32, 5x20 kernel, stride 2; batch 1, 2, 4) at
    a reduced spatial size, with the default and forced row / column / channel tiles."""
    rng = np.random.default_rng(batch)
    ly = _layer(rng, 1, 32, (5, 20), (2, 2), (0, 0, 0, 0))
    prog = _run(rng, ly, (batch, 1, 15, 61), knobs)
    (lp,) = prog.layers
    assert lp.engine == "cluster"
    convs = [c for c in lp.commands if isinstance(c, cg.ClusterKernel)]
    assert convs and all((c.kh, c.kw, c.sh, c.sw) == (5, 20, 2, 2) for c in convs)


@pytest.mark.parametrize("batch, pads, knobs", [
    (1, (3, 3, 3, 3), None),
    (2, (3, 3, 3, 3), {"tile_h": 1, "tile_w": 1}),
    (1, (4, 0, 5, 2), {"tile_h": 1, "tile_w": 2}),
])
def test_deepbench_1x1_stride2_pad3_layers_run_on_the_cluster(batch, pads, knobs):
    """DeepBench layers 49 / 58 (2048 x 7 x 7 -> 512, 1x1, stride 2, padding 3; batch 1, 2)
    with fewer channels: outputs whose window is padding only get the bias-only value; with
    one-row / one-column tiles some tiles lie wholly in the top, bottom, left or right
    padding (and an asymmetric padding beyond the kernel on two sides)."""
    rng = np.random.default_rng(7 + batch)
    ly = _layer(rng, 96, 40, (1, 1), (2, 2), pads)
    assert any("not smaller than the kernel" in r for r in rbe_reasons(
        ly, TensorInfo("x", 1, 7, 7, 96, 8, True),
        TensorInfo("y", 1, 7, 7, 40, 8, True), CFG))
    prog = _run(rng, ly, (batch, 96, 7, 7), knobs)
    (lp,) = prog.layers
    assert lp.engine == "cluster"
    if knobs:
        convs = [c for c in lp.commands if isinstance(c, cg.ClusterKernel)]
        # tiles wholly in padding load one pixel that no tap reads
        assert any(c.h_in == 1 and c.pad_top >= 1 and c.pad_bottom == 0 for c in convs)
        assert any(c.w_in == 1 and c.pad_left >= 1 for c in convs)


def test_window_of_an_empty_tile_reads_no_input():
    """:func:`_window`: a window in the padding before or after the tensor loads one
    element, and every tap of the kernel command falls before it."""
    for r0, ext, size in [(-3, 1, 7), (9, 1, 7), (7, 3, 7), (-5, 4, 4)]:
        lo, hi, before, after = _window(r0, ext, size)
        assert (hi - lo, after) == (1, 0) and 0 <= lo < size
        assert ext <= 1 + before and all(t - before < 0 for t in range(ext))
    assert _window(-1, 3, 7) == (0, 2, 1, 0)
    assert _window(5, 4, 7) == (5, 7, 0, 2)


def test_onnx_models_with_these_windows_are_offloaded_bit_exact(compare):
    """Through ONNX QDQ, canonicalize and the pattern table: both layer kinds are offloaded
    (no pattern refuses them) and match the CPU reference."""
    for k, stride, pad, hw, cin in [((5, 20), 2, 0, (13, 48), 1), (1, 2, 3, 7, 64)]:
        r = compare(models.quantized("single_conv", cin=cin, cout=32, k=k, stride=stride,
                                  pad=pad, hw=hw))
        assert [o.op for o in r.offloaded] == ["conv2d"]
        assert list(r.engines().values()) == ["cluster"]
        r.assert_bit_exact()


def test_a_layer_graph_with_both_kinds_in_sequence():
    """A 5x20 stride-2 conv feeding a 1x1 stride-2 conv with padding 3: one program."""
    rng = np.random.default_rng(3)
    a = _layer(rng, 1, 16, (5, 20), (2, 2), (0, 0, 0, 0), "a")
    b = _layer(rng, 16, 24, (1, 1), (2, 2), (3, 3, 3, 3), "b", "y", "z")
    ya = conv_output_shape(a, (1, 1, 13, 48))
    tensors = {"x": T("x", (1, 1, 13, 48)), "y": T("y", ya),
               "z": T("z", conv_output_shape(b, ya))}
    prog, _ = check(rng, [a, b], tensors, ["x"], ["z"])
    assert [ly.engine for ly in prog.layers] == ["cluster", "cluster"]
