"""DPU strategy without TVM: layer graphs -> plan -> simulator, bit-exact against
``reference_execute``; tiling (H/W split, weight tiling), FM/PM fit, knobs, pipelining."""

import dataclasses

import numpy as np
import pytest

from tvm_accel.errors import MappingError
from tvm_accel.layers import AddLayer, ConvLayer, LayerGraph, Requant, Tensor, reference_execute
from tvm_dpu import codegen as cg
from tvm_dpu.hw_config import config_from_dict, load_config
from tvm_dpu.runtime import execute_program
from tvm_dpu.strategy import plan
from tvm_dpu.strategy.knobs import knob_space
from tvm_dpu.strategy.tiling import _param_bytes, _pm_bytes


def _rq(k, shift, zp=0, lo=-128, hi=127):
    return Requant(0, np.ones(k, dtype=np.int64), np.full(k, (1 << shift) >> 1, dtype=np.int64),
                   shift, zp, lo, hi)


def _conv(rng, name, x, y, c, k, ksz=3, stride=1, pad=1, zx=0, zp=0, shift=7, dw=False,
          relu=False, dilation=1):
    w = rng.integers(-128, 128, size=(k, 1 if dw else c, ksz, ksz))
    return ConvLayer(name=name, input=x, output=y, weight=w,
                     bias=rng.integers(-2000, 2000, size=k), input_zero_point=zx,
                     strides=(stride, stride), padding=(pad,) * 4,
                     requant=_rq(k, shift, zp, 0 if relu else -128), groups=c if dw else 1,
                     dilation=(dilation, dilation))


def _graph(layers, shapes, inputs, outputs):
    return LayerGraph({n: Tensor(n, s, "int8") for n, s in shapes.items()}, layers, inputs,
                      outputs)


def _run(graph, cfg, knobs=None, seed=0):
    rng = np.random.default_rng(seed)
    feed = {n: rng.integers(-128, 128, size=graph.tensors[n].shape).astype(np.int8)
            for n in graph.inputs}
    prog = plan(graph, cfg, knobs)
    out, stats = execute_program(prog, feed, cfg)
    ref = reference_execute(graph, feed)
    for n in graph.outputs:
        np.testing.assert_array_equal(out[n], ref[n])
    return prog, stats


def _single(c=16, k=24, hw=20, batch=1, **kw):
    rng = np.random.default_rng(1)
    ly = _conv(rng, "conv", "x", "y", c, k, **kw)
    span = (kw.get("ksz", 3) - 1) * kw.get("dilation", 1) + 1
    ho = (hw + 2 * kw.get("pad", 1) - span) // kw.get("stride", 1) + 1
    return _graph([ly], {"x": (batch, c, hw, hw), "y": (batch, k, ho, ho)}, ["x"], ["y"])


def _small_cfg(**fields):
    d = dict(load_config().to_json())
    d.update(fields)
    return config_from_dict(d, name="small")


@pytest.mark.parametrize("kn", [{"tile_h": 8}, {"tile_h": 16, "tile_w": 7},
                                {"tile_h": 20, "tile_w": 1}, {"pipeline": False}])
def test_every_tiling_is_bit_exact_with_input_and_output_zero_points(cfg, kn):
    _run(_single(hw=20, zx=3, zp=-5, batch=3), cfg, {"conv": kn})


def test_strided_odd_kernel_with_overlapping_windows_is_bit_exact(cfg):
    _run(_single(c=5, k=7, hw=23, ksz=5, stride=2, pad=2), cfg, {"conv": {"tile_h": 8,
                                                                           "tile_w": 3}})


@pytest.mark.parametrize("d, kn", [(2, {"tile_h": 8, "tile_w": 5}), (6, {"tile_h": 8}),
                                   (12, {"tile_h": 8, "tile_w": 7}), (12, {"tile_w": 1})])
def test_dilated_conv_tiles_read_the_dilated_window_bit_exact(cfg, d, kn):
    prog, _ = _run(_single(hw=20, pad=d, dilation=d, zx=3, zp=-5, batch=3), cfg, {"conv": kn})
    convs = [i for ly in prog.layers for i in cg.decode_stream(ly.insns)
             if isinstance(i, cg.Conv) and i.out_h]
    assert len(convs) > 1 and all(i.dilation == d for i in convs)  # split in tiles


def test_strided_dilated_and_depthwise_dilated_convs_are_bit_exact(cfg):
    _run(_single(c=5, k=7, hw=23, ksz=3, stride=2, pad=4, dilation=3), cfg,
         {"conv": {"tile_h": 8, "tile_w": 4}})
    rng = np.random.default_rng(4)
    ly = _conv(rng, "dw", "x", "y", 32, 32, dw=True, pad=6, dilation=6, zx=-2)
    g = _graph([ly], {"x": (2, 32, 18, 18), "y": (2, 32, 18, 18)}, ["x"], ["y"])
    _run(g, _small_cfg(PM_BYTES=2048), {"dw": {"oc_tile": 16, "tile_h": 8, "tile_w": 9}})


def test_dilated_conv_never_uses_the_format_unit(cfg):
    rng = np.random.default_rng(5)
    ly = _conv(rng, "rgb", "x", "y", 3, 16, pad=2, dilation=2)
    space = knob_space(ly, (1, 3, 16, 16), cfg)
    assert space["format"].options == (False,)


def test_depthwise_with_weight_tiling_is_bit_exact():
    small = _small_cfg(PM_BYTES=2048)
    rng = np.random.default_rng(2)
    ly = _conv(rng, "dw", "x", "y", 96, 96, dw=True)
    g = _graph([ly], {"x": (2, 96, 10, 10), "y": (2, 96, 10, 10)}, ["x"], ["y"])
    _run(g, small, {"dw": {"oc_tile": 32}})


def _block(c=64, hw=16, batch=4):
    rng = np.random.default_rng(3)
    c1 = _conv(rng, "conv1", "x", "t1", c, c, relu=True, shift=10)
    c2 = _conv(rng, "conv2", "t1", "t2", c, c, shift=10)
    add = AddLayer("add", ("t2", "x"), "y", 0, 0, 2, 1, _rq(1, 1, lo=0))
    s = (batch, c, hw, hw)
    return _graph([c1, c2, add], {"x": s, "t1": s, "t2": s, "y": s}, ["x"], ["y"])


def test_resnet_block_with_eltwise_add_is_bit_exact(cfg):
    prog, stats = _run(_block(), cfg, {"@fusion": {"enabled": False}})
    ops = [ly.op for ly in prog.layers]
    assert ops == ["conv2d", "conv2d", "add"]
    assert prog.layers[2].knobs["tile_h"] % cfg.MISC_ROW_PAR == 0
    # the whole block on chip is a candidate (here the search measures conv1 | conv2+add a bit
    # faster: in one merged stream conv2+add's head hides behind conv1's tail)
    chosen, st_f = _run(_block(), cfg)
    assert sum(s.cycles for _, s in st_f) <= sum(s.cycles for _, s in stats)
    assert "conv1+conv2+add" in {c[0] for c in chosen.fusion.candidates}
    fused, _ = _run(_block(), cfg, {"@fusion": {"conv1+conv2+add": True}})
    assert [ly.op for ly in fused.layers] == ["conv2d+conv2d+add (on-chip chain)"]
    assert "t1" not in fused.tensors and "t2" not in fused.tensors


def test_unsupported_layers_raise_mapping_errors(cfg):
    g = _single()
    bad = dataclasses.replace(g.layers[0], requant=Requant(0, np.full(24, 3), np.zeros(24), 2,
                                                           0, -128, 127))
    with pytest.raises(MappingError, match="shift"):
        plan(_graph([bad], {n: t.shape for n, t in g.tensors.items()}, ["x"], ["y"]), cfg)


# --- MISC layers: pool, upsample, concat by placement --------------------------------------------
from tvm_accel.layers import ConcatLayer, PoolLayer, UpsampleLayer  # noqa: E402


@pytest.mark.parametrize("kind, k, s, pad, kn", [
    ("max", 3, 2, 1, {}), ("max", 2, 2, 0, {"tile_h": 2, "tile_w": 3}),
    ("avg", 2, 2, 0, {}), ("avg", 4, 1, 1, {"pipeline": False}),
])
def test_pool_on_misc_is_bit_exact(cfg, kind, k, s, pad, kn):
    rq = None if kind == "max" else _rq(1, 2 if k == 2 else 4)
    ly = PoolLayer("pool", "x", "y", kind, (k, k), (s, s), (pad,) * 4, 0, rq)
    ho = (13 + 2 * pad - k) // s + 1
    g = _graph([ly], {"x": (3, 24, 13, 13), "y": (3, 24, ho, ho)}, ["x"], ["y"])
    prog, _ = _run(g, cfg, {"pool": kn})
    assert any(isinstance(i, cg.Pool) for i in cg.decode_stream(prog.layers[0].insns))


def test_upsample_on_misc_is_bit_exact(cfg):
    ly = UpsampleLayer("up", "x", "y", (2, 3))
    g = _graph([ly], {"x": (2, 16, 5, 7), "y": (2, 16, 10, 21)}, ["x"], ["y"])
    _run(g, cfg, {"up": {"tile_h": 2}})


def test_concat_by_placement_is_bit_exact(cfg):
    ly = ConcatLayer("cat", ("a", "b"), "y", (0, 0), (None, None))
    g = _graph([ly], {"a": (2, 8, 6, 6), "b": (2, 24, 6, 6), "y": (2, 32, 6, 6)}, ["a", "b"],
               ["y"])
    prog, _ = _run(g, cfg)
    saves = [i for i in cg.decode_stream(prog.layers[0].insns) if isinstance(i, cg.Save)]
    assert {i.ddr_pix_stride for i in saves} == {32}


def test_xgraph_folds_zero_points_into_the_bias():
    from tvm_dpu.xgraph import build_xgraph

    g = _single(c=4, k=8, hw=6, zx=3, zp=-5, shift=4)
    xg = build_xgraph(g)
    (node,) = xg.nodes
    ly = g.layers[0]
    expect = ly.bias - 3 * ly.weight.sum(axis=(1, 2, 3)) + (-5 << 4)
    np.testing.assert_array_equal(node.params["bias"], expect)
    assert node.params["weight"].shape == (8, 3, 3, 4) and node.params["pad_value"] == 3
    assert "conv2d(x)" in str(xg)


@pytest.mark.parametrize("k, s, pad, opad, kn", [
    (3, 2, 1, 1, {}), (4, 2, 1, 0, {}), (2, 2, 0, 0, {"pipeline": False}), (5, 3, 2, 0, {}),
    (3, 2, 1, 1, {"form": "upsample"}), (4, 2, 1, 0, {"form": "upsample"}),
    (2, 2, 0, 0, {"form": "upsample", "pipeline": False}), (5, 3, 2, 0, {"form": "upsample"}),
])
def test_deconv_as_subconvs_or_upsample_plus_conv_is_bit_exact(cfg, k, s, pad, opad, kn):
    from tvm_accel.layers import DeconvLayer, deconv_output_shape

    rng = np.random.default_rng(4)
    ly = DeconvLayer("de", "x", "y", rng.integers(-128, 128, size=(12, 20, k, k)),
                     rng.integers(-500, 500, size=20), 2, (s, s), (pad,) * 4, (opad, opad),
                     _rq(20, 9, zp=3))
    out = deconv_output_shape(ly, (2, 12, 7, 6))
    g = _graph([ly], {"x": (2, 12, 7, 6), "y": out}, ["x"], ["y"])
    prog, _ = _run(g, cfg, {"de": kn})
    assert prog.layers[0].op == "conv2d_transpose"
    assert prog.layers[0].knobs["form"] == kn.get("form", "subconv")
    with pytest.raises(MappingError, match="form"):
        plan(g, cfg, {"de": {"form": "zero_stuffing"}})


@pytest.mark.parametrize("c, ksz, stride, pad", [(3, 7, 2, 3), (3, 3, 1, 1), (8, 5, 2, 2),
                                                 (1, 2, 1, 0)])
def test_format_unit_im2col_for_few_input_channels_is_bit_exact_and_faster(cfg, c, ksz, stride,
                                                                            pad):
    g = _single(c=c, k=32, hw=33, ksz=ksz, stride=stride, pad=pad, zx=-3)
    assert knob_space(g.layers[0], (1, c, 33, 33), cfg).default()["format"] is True
    prog, st_fmt = _run(g, cfg, {"conv": {"tile_w": 7}})
    assert any(i.fmt == ksz for i in cg.decode_stream(prog.layers[0].insns)
               if isinstance(i, cg.Load) and not i.to_pm)
    _, st_plain = _run(g, cfg, {"conv": {"format": False}})
    _, st_fmt_full = _run(g, cfg)
    assert st_fmt_full[0][1].conv_busy < st_plain[0][1].conv_busy


def test_weight_chunks_double_buffer_in_the_pm_halves():
    small = _small_cfg(PM_BYTES=16384)
    g = _single(c=32, k=128, hw=12)  # 128 x 3 x 3 x 32 = 36 KiB of weights
    d = knob_space(g.layers[0], (1, 32, 12, 12), small).default()
    assert _pm_bytes(_param_bytes(g.layers[0], d["oc_tile"], 32)) <= 8192
    prog, st = _run(g, small)
    insns = cg.decode_stream(prog.layers[0].insns)
    pm = [i for i in insns if isinstance(i, cg.Load) and i.to_pm]
    assert len(pm) >= 4 and {i.dst_addr for i in pm} == {0, 8192}
    assert {i.param_addr for i in insns if isinstance(i, cg.Conv)} == {0, 8192}


def test_padding_wider_than_the_kernel_is_bit_exact():
    """DeepBench's 1x1 stride-2 conv with padding 3 on 7x7: border outputs read padding only
    (bias alone); the CONV's pad fields cover them inside tiles that hold real rows."""
    cfg = load_config()
    rng = np.random.default_rng(4)
    ly = _conv(rng, "conv", "x", "y", 32, 48, ksz=1, stride=2, pad=3, zx=5, shift=9)
    g = _graph([ly], {"x": (4, 32, 7, 7), "y": (4, 48, 7, 7)}, ["x"], ["y"])
    prog, _ = _run(g, cfg)
    assert prog.layers[0].knobs["tile_w"] == 7  # the clipped input window fits: no W-split
    with pytest.raises(MappingError, match="padding only"):
        plan(g, cfg, {"conv": {"tile_w": 1}})  # the first column reads padding only


def test_strided_1x1_loads_only_the_rows_and_columns_it_reads():
    """A projection shortcut (1x1, stride 2): the LOAD takes every other row and column (DDR
    strides doubled) and the CONV runs with stride 1: a quarter of the input bytes."""
    cfg = load_config()
    rng = np.random.default_rng(6)
    ly = _conv(rng, "conv", "x", "y", 64, 128, ksz=1, stride=2, pad=0, zx=3, shift=9)
    g = _graph([ly], {"x": (4, 64, 28, 28), "y": (4, 128, 14, 14)}, ["x"], ["y"])
    prog, st = _run(g, cfg)
    insns = cg.decode_stream(prog.layers[0].insns)
    loads = [i for i in insns if isinstance(i, cg.Load) and not i.to_pm]
    assert {(i.ddr_pix_stride, i.ddr_row_stride) for i in loads} == {(2 * 64, 2 * 28 * 64)}
    assert all(i.stride_h == i.stride_w == 1 for i in insns if isinstance(i, cg.Conv))
    pm = sum(i.rows * i.cols * i.chans for i in insns if isinstance(i, cg.Load) and i.to_pm)
    assert st[0][1].ddr_read_bytes == 4 * 14 * 14 * 64 + pm


def test_single_tile_layer_keeps_its_input_while_weight_chunks_stream():
    """One tile per image group and several weight chunks (a res5 1x1 conv): the input tile is
    LOADed once and every chunk's CONV reads it (input-stationary), outputs ping-pong."""
    cfg = load_config()
    rng = np.random.default_rng(7)
    ly = _conv(rng, "conv", "x", "y", 2048, 512, ksz=1, pad=0, shift=13)  # 1 MB of weights
    g = _graph([ly], {"x": (4, 2048, 7, 7), "y": (4, 512, 7, 7)}, ["x"], ["y"])
    prog, st = _run(g, cfg)
    insns = cg.decode_stream(prog.layers[0].insns)
    chunks = [i for i in insns if isinstance(i, cg.Load) and i.to_pm]
    assert len(chunks) > 1
    assert sum(isinstance(i, cg.Load) and not i.to_pm for i in insns) == 1
    convs = [i for i in insns if isinstance(i, cg.Conv)]
    assert len({c.in_addr for c in convs}) == 1 and len({c.out_addr for c in convs}) == 2
