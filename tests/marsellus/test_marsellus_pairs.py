"""Column pairs: a 3x3 stride-1 RBE conv over 16 channels runs over pixel pairs (the odd
pixel's channels in the idle upper 16 lanes of the even pixel's bit-plane words, 32 input and
32 output channels per job), bit-exact against the CPU reference and faster than the plain
job, which leaves half of every BinConv idle."""

from dataclasses import replace

import numpy as np
import pytest

from tvm_accel.layers import LayerGraph, reference_execute
from tvm_marsellus import codegen as cg
from tvm_marsellus import strategy
from tvm_marsellus.layout import pair_columns_weights
from tvm_marsellus.runtime import execute_program

from .test_marsellus_strategy import CFG, T, check, conv


def _chain(rng, cin, hw, bits, signed, knobs=None, n=1, cfg=None):
    """x -> c0 (3x3, cin -> 16) -> y0 -> c1 (3x3) -> y1 -> c2 (3x3, cin -> 16) -> y2 -> c3 (1x1)
    -> z, the convs pinned to the RBE; y0..y2 in bit planes."""
    dt = "int8" if signed else "uint8"
    knobs = {**{c: {"engine": "rbe"} for c in ("c0", "c1", "c2", "c3")}, **(knobs or {})}
    zp = -1 if signed else 1
    layers = [conv(rng, "c0", "x", "y0", cin, 16, 3, wbits=4, obits=bits, osigned=signed),
              conv(rng, "c1", "y0", "y1", 16, 16, 3, wbits=6, obits=bits, osigned=signed,
                   izp=zp),
              conv(rng, "c2", "y1", "y2", 16, 16, 3, wbits=3, obits=bits, osigned=signed,
                   izp=zp),
              conv(rng, "c3", "y2", "z", 16, 24, 1, obits=8, osigned=True, izp=zp)]
    ts = {"x": T("x", (n, cin, hw, hw), bits, dt), "z": T("z", (n, 24, hw, hw))}
    ts.update({y: T(y, (n, 16, hw, hw), bits, dt) for y in ("y0", "y1", "y2")})
    if cfg is None:
        return check(rng, layers, ts, ["x"], ["z"], knobs)
    g = LayerGraph(ts, layers, ["x"], ["z"])
    xs = {"x": rng.integers(-8, 8, ts["x"].shape).astype(dt)}
    prog = strategy.plan(g, cfg, knobs)
    outs, _ = execute_program(prog, xs, cfg, whole_stream=True)
    np.testing.assert_array_equal(outs["z"], reference_execute(g, xs)["z"])
    return prog, None


def _jobs(layer):
    return [c for c in layer.commands if isinstance(c, cg.RbeJob)]


@pytest.mark.parametrize("cin, bits, signed, n", [(16, 4, True, 1), (8, 2, False, 2),
                                                  (16, 8, False, 1), (16, 3, True, 1)])
def test_16_channel_convs_run_over_column_pairs_bit_exact(cin, bits, signed, n):
    rng = np.random.default_rng(cin + bits)
    prog, stats = _chain(rng, cin, 16, bits, signed, n=n)
    lay = {ly.name: ly for ly in prog.layers}
    for name in ("c1", "c2"):  # 16 channels both sides, bit planes both sides
        assert lay[name].meta["pair_columns"], name
        pix = bits * 4  # one 32-channel word per bit plane and pixel
        for j in _jobs(lay[name]):
            assert (j.k_in, j.k_out, j.w_out, j.x_pix_stride) == (32, 32, 8, 2 * pix)
    assert not lay["c3"].meta["pair_columns"]  # a 1x1
    rng = np.random.default_rng(cin + bits)
    plain, plain_stats = _chain(rng, cin, 16, bits, signed, n=n,
                                knobs={"pair_columns": False})
    assert not any(ly.meta["pair_columns"] for ly in plain.layers)
    assert stats.rbe_busy < plain_stats.rbe_busy


def test_odd_width_stays_plain():
    prog, _ = _chain(np.random.default_rng(5), 16, 15, 4, True)
    assert not any(ly.meta["pair_columns"] for ly in prog.layers)


def test_pair_weights_give_the_plain_conv_on_both_pixels_of_a_pair():
    """The pair conv over the pair tensor equals the plain conv on every pixel (float check of
    the tap arrangement, padding one column each side)."""
    rng = np.random.default_rng(0)
    w = rng.integers(-4, 4, (16, 16, 3, 3))
    x = rng.integers(0, 8, (16, 6, 8))
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    plain = np.einsum("ocyx,chwyx->ohw", w, np.lib.stride_tricks.sliding_window_view(
        xp, (3, 3), axis=(1, 2)))
    pairs = np.concatenate([x[:, :, 0::2], x[:, :, 1::2]], axis=0)  # (32, H, W / 2)
    pp = np.pad(pairs, ((0, 0), (1, 1), (1, 1)))
    out = np.einsum("ocyx,chwyx->ohw", pair_columns_weights(w),
                    np.lib.stride_tricks.sliding_window_view(pp, (3, 3), axis=(1, 2)))
    np.testing.assert_array_equal(out[:16], plain[:, :, 0::2])
    np.testing.assert_array_equal(out[16:], plain[:, :, 1::2])


def test_32_wide_conv_runs_15_pairs_and_a_plain_job_over_the_last_columns():
    """16 pairs would fill 6 patch columns of 3 (two pairs wasted): 15 pairs (5 patch columns)
    and a plain job over columns 30..31 are faster; bit-exact, output rows written back whole."""
    prog, stats = _chain(np.random.default_rng(3), 16, 32, 4, True)
    c1 = next(ly for ly in prog.layers if ly.name == "c1")
    jobs = _jobs(c1)
    pair, plain = jobs[0], jobs[1]
    assert (pair.k_in, pair.w_out, pair.pad_right) == (32, 15, 0)
    assert (plain.k_in, plain.k_out, plain.w_in, plain.w_out, plain.pad_left) == (16, 16, 3, 2, 0)
    assert plain.x_ptr - pair.x_ptr == 29 * 4 * 4  # input column 29, 4-bit pixels of 16 bytes
    assert len(jobs) == 2 * c1.meta["tiles"]
    _, plain_stats = _chain(np.random.default_rng(3), 16, 32, 4, True,
                            knobs={"pair_columns": False})
    assert stats.rbe_busy < plain_stats.rbe_busy


def test_pair_convs_read_and_write_l3_tensors_bit_exact():
    """With L2 too small for the tensors, the pair convs' windows come through the L2 bounce
    slot (the odd halves copied from there) and their tiles drain to L3 as laid out in L1."""
    prog, _ = _chain(np.random.default_rng(3), 16, 32, 4, True,
                     cfg=replace(CFG, L2_BYTES=24 * 1024))
    assert {prog.tensors[n].mem for n in ("y0", "y1", "y2")} == {"L3"}
    assert [ly.meta["pair_columns"] for ly in prog.layers] == [False, True, True, False]
