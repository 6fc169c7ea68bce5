"""Transpose and dilated convolutions on MARSELLUS as phase convs (``strategy/phases``,
``deconv``, ``dilated``): dense stride-1 convs on the RBE or the cores whose inputs and outputs
DMA views gather and scatter, bit-exact against the integer reference and the CPU graph."""

from dataclasses import replace

import numpy as np
import pytest

from helpers import models
from tvm_accel.errors import MappingError
from tvm_accel.layers import (
    ConvLayer,
    DeconvLayer,
    LayerGraph,
    conv_output_shape,
    deconv_output_shape,
)
from tvm_marsellus import codegen as cg
from tvm_marsellus import numerics, strategy
from tvm_marsellus.strategy.deconv import deconv_phases, rbe_embedding
from tvm_marsellus.strategy.dilated import dilated_phases, live_taps
from tvm_marsellus.strategy.phases import PhaseConv

from .test_marsellus_strategy import CFG, T, _rng, check


def _requant(rng, k, sums, obits=8, relu=False):
    lo, hi = _rng(obits, True)
    scale = rng.uniform(0.5, 1.5, k) * (hi - lo) / (sums * 30 + 1)
    return numerics.requant_recipe(scale, sums * 255 + 300, lo // 3, 0 if relu else lo, hi)


def _deconv(rng, cin, cout, k, s, p, op, groups=1, izp=3, wbits=8, name="dc", inp="x",
            out="y"):
    lo, hi = _rng(wbits, True)
    w = rng.integers(lo, hi + 1, (cin, cout // groups, k, k))
    sums = np.full(cout, np.abs(w).sum() // cout + 1)
    return DeconvLayer(name, inp, out, w, rng.integers(-300, 300, cout), izp, (s, s),
                       (p,) * 4 if isinstance(p, int) else p, (op, op), _requant(rng, cout, sums),
                       groups=groups)


def _dilated(rng, cin, cout, k, d, pad, groups=1, s=1, name="dl", inp="x", out="y"):
    w = rng.integers(-128, 128, (cout, cin // groups, k, k))
    sums = np.abs(w).reshape(cout, -1).sum(1)
    return ConvLayer(name, inp, out, w, rng.integers(-300, 300, cout), -2, (s, s), (pad,) * 4,
                     _requant(rng, cout, sums), groups=groups, dilation=(d, d))


def _run_deconv(rng, ly, hw, batch=1, knobs=None, cfg=None):
    xs = (batch, ly.weight.shape[0], hw, hw)
    tensors = {"x": T("x", xs), "y": T("y", deconv_output_shape(ly, xs))}
    if cfg is None:
        return check(rng, [ly], tensors, ["x"], ["y"], knobs)[0]
    return _check_cfg(rng, [ly], tensors, cfg, knobs)


def _check_cfg(rng, layers, tensors, cfg, knobs=None):
    from tvm_accel.layers import reference_execute
    from tvm_marsellus.runtime import execute_program

    g = LayerGraph(tensors, layers, ["x"], ["y"])
    xs = {"x": rng.integers(-128, 128, tensors["x"].shape).astype(np.int8)}
    prog = strategy.plan(g, cfg, knobs)
    outs, _ = execute_program(prog, xs, cfg, whole_stream=True)
    np.testing.assert_array_equal(outs["y"], reference_execute(g, xs)["y"])
    return prog


@pytest.mark.parametrize("cin, cout, k, s, p, op, hw, groups", [
    (16, 16, 4, 2, 1, 0, 6, 1),    # a decoder's 4x4 / 2: four 2x2 phases, 3x3 RBE jobs
    (8, 24, 3, 2, 1, 1, 5, 1),     # 3x3 / 2 with output padding: 2x2, 2x1, 1x2, 1x1 phases
    (16, 8, 2, 2, 0, 0, 5, 1),     # 2x2 / 2: four 1x1 phases, no overlap
    (16, 16, 2, 2, 1, 0, 6, 1),    # padding cropping the phases' first row / column
    (40, 40, 3, 1, 1, 0, 6, 1),    # stride 1: one phase, the flipped kernel
    (8, 8, 3, 2, 1, 1, 6, 8),      # depthwise: DWCONV phases on the cores
    (16, 16, 5, 3, 2, 1, 4, 1),    # stride 3: nine phases of 2x2 / 2x1 / 1x1 taps
    (8, 16, 4, 2, (2, 1, 0, 1), 0, 5, 1),  # asymmetric padding
])
def test_transpose_conv_phases_are_bit_exact_and_one_layer(cin, cout, k, s, p, op, hw, groups):
    rng = np.random.default_rng(k * 10 + s)
    ly = _deconv(rng, cin, cout, k, s, p, op, groups)
    prog = _run_deconv(rng, ly, hw)
    (lp,) = prog.layers
    assert (lp.name, lp.op) == ("dc", "conv2d_transpose")
    assert len(lp.meta["phases"]) == s * s
    # useful MACs: every input pixel meets every tap once, minus the taps cropped away
    assert lp.macs <= hw * hw * cin // groups * cout * k * k


def test_a_4x4_stride_2_transpose_conv_runs_four_3x3_jobs_on_the_rbe():
    """Each 2x2 sub-kernel is embedded in a 3x3 RBE kernel with zero taps; the stores
    scatter every phase's tile into every second row and column of the HWC output."""
    rng = np.random.default_rng(1)
    ly = _deconv(rng, 32, 32, 4, 2, 1, 0)
    subs = deconv_phases(ly, LayerGraph({"x": T("x", (1, 32, 8, 8))}, [ly], ["x"], ["y"]))
    assert [s.kernel for s in subs] == [(3, 3)] * 4
    assert all(max(s.padding) < 3 and s.useful_taps == 4 for s in subs)
    prog = _run_deconv(rng, ly, 8)
    (lp,) = prog.layers
    assert lp.engine == "rbe" and prog.tensors["y"].layout == "hwc"
    jobs = [c for c in lp.commands if isinstance(c, cg.RbeJob)]
    assert jobs and all(j.kernel == 3 and j.stride == 1 for j in jobs)
    scatters = [c for c in lp.commands if isinstance(c, cg.Dma) and c.src_mem == "L1"
                and c.dst_row_stride == 2 * 32]
    assert scatters and all(c.dst_plane_stride == 2 * 16 * 32 for c in scatters)
    assert lp.macs == 8 * 8 * 32 * 32 * 16


def test_rbe_embedding_keeps_the_padding_below_the_kernel():
    assert rbe_embedding(2, 0, 8, 8, 3) == (1, 1, 1)
    assert rbe_embedding(1, -1, 5, 6, 1) == (0, -1, 0)  # a crop is a negative padding
    assert rbe_embedding(2, 2, 8, 8, 3) == (0, 2, 0)
    assert rbe_embedding(2, 3, 8, 8, 3) is None


@pytest.mark.parametrize("knobs", [{"dc": {"tile_h": 1}}, {"dc": {"tile_h": 2, "tile_w": 3}},
                                   {"dc": {"engine": "cluster", "tile_k": 8}}])
def test_knobs_of_a_transpose_conv_hold_for_each_phase(knobs):
    rng = np.random.default_rng(5)
    ly = _deconv(rng, 32, 24, 4, 2, 1, 0)
    (lp,) = _run_deconv(rng, ly, 6, batch=2, knobs=knobs).layers
    for ph in lp.meta["phases"].values():
        assert all(ph[k] == v for k, v in knobs["dc"].items() if k != "engine")
        assert ph["engine"] == knobs["dc"].get("engine", ph["engine"])


def test_a_transpose_conv_whose_output_lives_in_l3_is_bit_exact():
    rng = np.random.default_rng(6)
    ly = _deconv(rng, 32, 32, 4, 2, 1, 0)
    prog = _run_deconv(rng, ly, 16, cfg=replace(CFG, L2_BYTES=40 * 1024))
    assert prog.tensors["y"].mem == "L3"


def test_a_decoder_chain_reads_the_scattered_output():
    """conv -> transpose conv -> conv: the phases' output is read by the next layer after the
    last phase is stored."""
    from .test_marsellus_strategy import conv

    rng = np.random.default_rng(7)
    a = conv(rng, "enc", "x", "e", 16, 32, 3, s=2)
    d = _deconv(rng, 32, 16, 4, 2, 1, 0, izp=0, inp="e", out="d")
    b = conv(rng, "head", "d", "y", 16, 16, 1)
    tensors = {"x": T("x", (1, 16, 8, 8)), "e": T("e", (1, 32, 4, 4)),
               "d": T("d", (1, 16, 8, 8)), "y": T("y", (1, 16, 8, 8))}
    prog, _ = check(rng, [a, d, b], tensors, ["x"], ["y"])
    assert [lp.name for lp in prog.layers] == ["enc", "dc", "head"]


@pytest.mark.parametrize("cin, cout, k, d, pad, hw, groups", [
    (16, 16, 3, 2, 2, 9, 1),    # d = 2: four phases, 3x3 RBE jobs on 5x5 / 4x4 sub-images
    (32, 32, 3, 6, 6, 14, 1),   # an ASPP branch: 36 phases
    (16, 16, 3, 2, 2, 8, 16),   # depthwise: DWCONV phases
    (32, 16, 3, 3, 1, 10, 1),   # padding below the dilation: cropped phases
    (16, 16, 5, 2, 4, 9, 1),    # 5x5 on the cores
])
def test_dilated_conv_phases_are_bit_exact(cin, cout, k, d, pad, hw, groups):
    rng = np.random.default_rng(d * 7 + k)
    ly = _dilated(rng, cin, cout, k, d, pad, groups)
    xs = (1, cin, hw, hw)
    tensors = {"x": T("x", xs), "y": T("y", conv_output_shape(ly, xs))}
    prog, _ = check(rng, [ly], tensors, ["x"], ["y"])
    (lp,) = prog.layers
    assert (lp.name, lp.op, len(lp.meta["phases"])) == ("dl", "conv2d", d * d)
    engines = {ph["engine"] for ph in lp.meta["phases"].values()}
    # a 3x3 phase is an RBE job (the engine rule may still give a tiny one to the cores)
    assert "rbe" in engines if k == 3 and groups == 1 else engines == {"cluster"}


def test_dilated_phases_share_one_copy_of_the_weights():
    rng = np.random.default_rng(2)
    ly = _dilated(rng, 32, 32, 3, 2, 2)
    tensors = {"x": T("x", (1, 32, 8, 8)), "y": T("y", (1, 32, 8, 8))}
    prog, _ = check(rng, [ly], tensors, ["x"], ["y"])
    dense = replace(ly, dilation=(1, 1), padding=(1, 1, 1, 1))
    one, _ = check(rng, [dense], tensors, ["x"], ["y"])
    assert len(prog.l2_image) == len(one.l2_image)


def test_a_dilation_beyond_the_input_leaves_a_1x1_conv():
    """ASPP's dilation 12 over an 8x8 map: the outer taps read padding only for every output,
    so what is left is the kernel's centre, an ordinary 1x1 conv."""
    assert list(live_taps(3, 12, 12, 8, 8)) == [1]
    assert list(live_taps(3, 2, 2, 8, 8)) == [0, 1, 2]
    rng = np.random.default_rng(3)
    ly = _dilated(rng, 16, 16, 3, 12, 12)
    g = LayerGraph({"x": T("x", (1, 16, 8, 8)), "y": T("y", (1, 16, 8, 8))}, [ly], ["x"], ["y"])
    (sub,) = dilated_phases(ly, g)
    assert not isinstance(sub, PhaseConv) and sub.kernel == (1, 1) and sub.padding == (0,) * 4
    prog, _ = check(rng, [ly], g.tensors, ["x"], ["y"])
    (lp,) = prog.layers
    assert "phases" not in lp.meta
    assert {(c.kh, c.kw) for c in lp.commands if isinstance(c, cg.ClusterKernel)
            and c.kernel == "CONV"} | {(c.kernel,) * 2 for c in lp.commands
                                       if isinstance(c, cg.RbeJob)} == {(1, 1)}


def test_dilated_phases_read_an_l3_input():
    rng = np.random.default_rng(4)
    ly = _dilated(rng, 32, 32, 3, 2, 2)
    tensors = {"x": T("x", (1, 32, 24, 24)), "y": T("y", (1, 32, 24, 24))}
    prog = _check_cfg(rng, [ly], tensors, replace(CFG, L2_BYTES=24 * 1024))
    assert prog.tensors["x"].mem == "L3"


def test_what_has_no_phase_form_is_a_mapping_error():
    rng = np.random.default_rng(5)
    g = LayerGraph({"x": T("x", (1, 8, 8, 8))}, [], ["x"], ["y"])
    with pytest.raises(MappingError, match="needs stride 1"):
        dilated_phases(_dilated(rng, 8, 8, 3, 2, 2, s=2), g)
    with pytest.raises(MappingError, match="dilated transpose conv"):
        deconv_phases(replace(_deconv(rng, 8, 8, 3, 2, 1, 0), dilation=(2, 2)), g)


@pytest.mark.parametrize("k, stride, pad, opad, relu", [
    (4, 2, 1, 0, True), (3, 2, 1, 1, False), (2, 2, 0, 0, True), (3, 2, 0, 0, False),
    (4, 2, 2, 1, False),
])
def test_onnx_transpose_convs_are_offloaded_bit_exact(compare, k, stride, pad, opad, relu):
    r = compare(models.quantized("single_deconv", cin=16, cout=16, k=k, stride=stride, pad=pad,
                                 output_padding=opad, relu=relu))
    assert [(o.op, o.placement) for o in r.report.offloads] == [
        ("conv2d_transpose", "marsellus")]
    r.assert_bit_exact()


def test_the_encoder_decoder_runs_its_transpose_convs_on_marsellus(compare):
    r = compare(models.quantized("encoder_decoder"))
    placed = {o.layer: o.placement for o in r.report.offloads}
    assert placed["dec1"] == placed["dec2"] == "marsellus"
    assert set(r.engines()) >= {"dec1", "dec2"}
    r.assert_bit_exact()


@pytest.mark.parametrize("dilation", [2, 6])
def test_onnx_dilated_convs_are_offloaded_bit_exact(compare, dilation):
    r = compare(models.quantized("single_dilated_conv", dilation=dilation))
    assert {o.layer: o.placement for o in r.report.offloads}["dilated"] == "marsellus"
    assert r.engines()["dilated"] == "rbe"
    r.assert_bit_exact()


def test_an_aspp_head_runs_its_dilated_branches_on_marsellus(compare):
    r = compare(models.quantized("aspp_head", dilations=(2, 6)))
    placed = {o.layer: o.placement for o in r.report.offloads}
    assert placed["aspp_d2"] == placed["aspp_d6"] == "marsellus"
    r.assert_bit_exact()


def test_phase_views_of_4_bit_tensors_at_batch_2_are_bit_exact():
    """4-bit HWC views (two channels a byte) and bit-plane inputs at 4 bits, two images: a
    transpose conv, then a dilated conv reading its scattered output."""
    rng = np.random.default_rng(9)
    dc = _deconv(rng, 32, 16, 4, 2, 1, 0, izp=0, wbits=4, inp="x", out="d")
    dc.requant = _requant(rng, 16, np.full(16, 60), obits=4)
    dl = _dilated(rng, 16, 16, 3, 2, 2, inp="d", out="y")
    dl.requant = _requant(rng, 16, np.abs(dl.weight).reshape(16, -1).sum(1), obits=4)
    dl.input_zero_point = 0
    tensors = {"x": T("x", (2, 32, 5, 5), 4), "d": T("d", (2, 16, 10, 10), 4),
               "y": T("y", (2, 16, 10, 10), 4)}
    prog, _ = check(rng, [dc, dl], tensors, ["x"], ["y"])
    assert [lp.name for lp in prog.layers] == ["dc", "dl"]
    assert prog.tensors["d"].layout == "hwc" and prog.tensors["d"].bits == 4


def test_a_phase_on_the_cores_drops_the_rbe_embeddings_zero_taps():
    rng = np.random.default_rng(11)
    ly = _deconv(rng, 32, 32, 4, 2, 1, 0)
    (lp,) = _run_deconv(rng, ly, 6, knobs={"dc": {"engine": "cluster"}}).layers
    convs = [c for c in lp.commands if isinstance(c, cg.ClusterKernel) and c.kernel == "CONV"]
    assert convs and {(c.kh, c.kw) for c in convs} == {(2, 2)}
    assert lp.macs == 6 * 6 * 32 * 32 * 16


def test_dilated_phases_gather_a_bit_plane_input():
    """conv -> dilated conv, both on the RBE: the phases gather whole bit-plane pixels of the
    intermediate tensor (never leaves the RBE layout)."""
    from .test_marsellus_strategy import conv

    rng = np.random.default_rng(12)
    a = conv(rng, "a", "x", "f", 32, 64, 3)
    dl = _dilated(rng, 64, 32, 3, 2, 2, inp="f", out="y")
    dl.input_zero_point = 0
    tensors = {"x": T("x", (1, 32, 10, 10)), "f": T("f", (1, 64, 10, 10)),
               "y": T("y", (1, 32, 10, 10))}
    prog, _ = check(rng, [a, dl], tensors, ["x"], ["y"], {"a": {"engine": "rbe"},
                                                           "dl": {"engine": "rbe"}})
    assert prog.tensors["f"].layout == "rbe"
    assert {ph["engine"] for ph in prog.layers[1].meta["phases"].values()} == {"rbe"}
