"""Concat on MARSELLUS without a host copy (``strategy/concat``, ``views``): each input lives in
its channel slice of the output, written there by its producer and read from there by its other
readers; inputs that cannot (rescaled, function inputs / outputs, twice) are copied into their
slice by a 1x1 cluster AVGPOOL. Bit-exact against the integer reference and the CPU graph."""

from dataclasses import replace

import numpy as np
import pytest

from helpers import models
from tvm_accel.errors import MappingError
from tvm_accel.layers import ConcatLayer, LayerGraph
from tvm_marsellus import codegen as cg
from tvm_marsellus import numerics
from tvm_marsellus.strategy.concat import expand_concats

from .test_marsellus_phases import _check_cfg, _deconv
from .test_marsellus_strategy import CFG, T, check, conv


def _rescale(zp=0):
    return numerics.requant_recipe(np.array([0.8]), np.array([255]), zp, -128, 127)


def test_two_producers_write_their_slices_and_no_layer_copies():
    rng = np.random.default_rng(0)
    a = conv(rng, "a", "x", "ya", 16, 16, 3)
    b = conv(rng, "b", "x", "yb", 16, 24, 1)
    cat = ConcatLayer("cat", ("ya", "yb"), "y", (0, 0), (None, None))
    tensors = {"x": T("x", (1, 16, 6, 6)), "ya": T("ya", (1, 16, 6, 6)),
               "yb": T("yb", (1, 24, 6, 6)), "y": T("y", (1, 40, 6, 6))}
    prog, _ = check(rng, [a, b, cat], tensors, ["x"], ["y"])
    assert [lp.name for lp in prog.layers] == ["a", "b"]
    assert "ya" not in prog.tensors and "yb" not in prog.tensors
    # b's stores write 24 channels (24 bytes) of every 40-byte pixel, from channel 16 on
    y = prog.tensors["y"]
    stores = [c for c in prog.layers[1].commands if isinstance(c, cg.Dma) and c.src_mem == "L1"]
    assert stores and all(c.length % 24 == 0 and c.dst_row_stride == 40 for c in stores)
    assert min(c.dst for c in stores) == y.offset + 16


def test_a_rescaled_input_is_copied_into_its_slice_on_the_cores():
    rng = np.random.default_rng(1)
    a = conv(rng, "a", "x", "ya", 16, 16, 3)
    b = conv(rng, "b", "x", "yb", 16, 16, 3)
    cat = ConcatLayer("cat", ("ya", "yb"), "y", (0, -3), (None, _rescale(2)))
    tensors = {"x": T("x", (1, 16, 6, 6)), "ya": T("ya", (1, 16, 6, 6)),
               "yb": T("yb", (1, 16, 6, 6)), "y": T("y", (1, 32, 6, 6))}
    prog, _ = check(rng, [a, b, cat], tensors, ["x"], ["y"])
    assert [(lp.name, lp.op) for lp in prog.layers] == [("a", "conv2d"), ("b", "conv2d"),
                                                        ("cat", "concat")]
    pools = [c for c in prog.layers[2].commands if isinstance(c, cg.ClusterKernel)]
    assert pools and all(c.kernel == "AVGPOOL" and (c.kh, c.kw) == (1, 1) for c in pools)
    assert "yb" in prog.tensors and "ya" not in prog.tensors


def test_function_inputs_outputs_and_repeated_inputs_are_copied():
    """The host packs and reads whole tensors, and a tensor has one home: the function input,
    the function output and the second use of a tensor are copied into their slices."""
    rng = np.random.default_rng(2)
    a = conv(rng, "a", "x", "ya", 8, 8, 3)
    cat = ConcatLayer("cat", ("x", "ya", "ya"), "y", (0, 0, 0), (None, None, None))
    tensors = {"x": T("x", (1, 8, 5, 5)), "ya": T("ya", (1, 8, 5, 5)),
               "y": T("y", (1, 24, 5, 5))}
    g, slices, _ = expand_concats(LayerGraph(tensors, [a, cat], ["x"], ["y", "ya"]))
    assert slices == {"cat_in0": ("y", 0), "cat_in1": ("y", 8), "cat_in2": ("y", 16)}
    prog, _ = check(rng, [a, cat], tensors, ["x"], ["y", "ya"])
    assert [lp.name for lp in prog.layers] == ["a", "cat"]
    g, slices, _ = expand_concats(LayerGraph(tensors, [a, cat], ["x"], ["y"]))
    assert slices == {"cat_in0": ("y", 0), "ya": ("y", 8), "cat_in2": ("y", 16)}
    check(rng, [a, cat], tensors, ["x"], ["y"])


def test_a_slice_is_read_by_its_other_readers_through_the_view():
    """An encoder feature both concatenated and read by the next conv (a U-Net skip): the
    reader's loads take the slice's channels of every pixel, with row and column tiles and
    with Kin chunks."""
    rng = np.random.default_rng(3)
    for knobs in (None, {"c": {"tile_h": 2, "tile_w": 3}},
                  {"c": {"engine": "cluster", "tile_c": 16}}):
        e = conv(rng, "e", "x", "f", 16, 32, 3)
        c = conv(rng, "c", "f", "g", 32, 32, 3)
        d = conv(rng, "d", "g", "h", 32, 16, 1)
        cat = ConcatLayer("cat", ("h", "f"), "y", (0, 0), (None, None))
        tensors = {"x": T("x", (1, 16, 7, 7)), "f": T("f", (1, 32, 7, 7)),
                   "g": T("g", (1, 32, 7, 7)), "h": T("h", (1, 16, 7, 7)),
                   "y": T("y", (1, 48, 7, 7))}
        prog, _ = check(rng, [e, c, d, cat], tensors, ["x"], ["y"], knobs)
        assert "f" not in prog.tensors and prog.tensors["y"].layout == "hwc"


def test_a_transpose_conv_scatters_into_its_slice():
    rng = np.random.default_rng(4)
    dc = _deconv(rng, 32, 16, 4, 2, 1, 0, izp=0, inp="x", out="d")
    e = conv(rng, "e", "x2", "f", 8, 16, 3)
    cat = ConcatLayer("cat", ("d", "f"), "y", (0, 0), (None, None))
    tensors = {"x": T("x", (1, 32, 4, 4)), "x2": T("x2", (1, 8, 8, 8)),
               "d": T("d", (1, 16, 8, 8)), "f": T("f", (1, 16, 8, 8)),
               "y": T("y", (1, 32, 8, 8))}
    prog, _ = check(rng, [dc, e, cat], tensors, ["x", "x2"], ["y"])
    assert [lp.name for lp in prog.layers] == ["dc", "e"]


def test_a_concat_output_in_l3_is_bit_exact():
    rng = np.random.default_rng(5)
    a = conv(rng, "a", "x", "ya", 32, 32, 3)
    b = conv(rng, "b", "x", "yb", 32, 32, 3)
    cat = ConcatLayer("cat", ("ya", "yb"), "y", (0, 0), (None, _rescale()))
    tensors = {"x": T("x", (1, 32, 24, 24)), "ya": T("ya", (1, 32, 24, 24)),
               "yb": T("yb", (1, 32, 24, 24)), "y": T("y", (1, 64, 24, 24))}
    prog = _check_cfg(rng, [a, b, cat], tensors, replace(CFG, L2_BYTES=64 * 1024))
    assert prog.tensors["y"].mem == "L3"


def test_a_slice_that_splits_a_byte_is_a_mapping_error():
    rng = np.random.default_rng(6)
    a = conv(rng, "a", "x", "ya", 8, 3, 3, obits=4)
    cat = ConcatLayer("cat", ("ya", "x"), "y", (0, 0), (None, None))
    tensors = {"x": T("x", (1, 8, 4, 4), 4), "ya": T("ya", (1, 3, 4, 4), 4),
               "y": T("y", (1, 11, 4, 4), 4)}
    with pytest.raises(MappingError, match="splits a byte"):
        expand_concats(LayerGraph(tensors, [a, cat], ["x"], ["y"]))


@pytest.mark.parametrize("name, kwargs, concat", [
    ("conv_concat", {}, "concat"), ("encoder_decoder", {}, "skip"),
    ("aspp_head", {"dilations": (2, 6)}, "aspp_concat")])
def test_onnx_concats_run_on_marsellus_bit_exact(compare, name, kwargs, concat):
    r = compare(models.quantized(name, **kwargs))
    placed = {o.layer: o.placement for o in r.report.offloads}
    assert placed[concat] == "marsellus" and set(placed.values()) == {"marsellus"}
    r.assert_bit_exact()


def test_4_bit_slices_at_batch_2_are_bit_exact():
    """Two channels a byte: slices of 8 and 6 channels start on whole bytes."""
    rng = np.random.default_rng(8)
    a = conv(rng, "a", "x", "ya", 16, 8, 3, wbits=4, obits=4)
    b = conv(rng, "b", "x", "yb", 16, 6, 1, wbits=4, obits=4)
    c = conv(rng, "c", "y", "z", 14, 16, 3, wbits=4, obits=4)
    cat = ConcatLayer("cat", ("ya", "yb"), "y", (0, 0), (None, None))
    tensors = {"x": T("x", (2, 16, 6, 6), 4), "ya": T("ya", (2, 8, 6, 6), 4),
               "yb": T("yb", (2, 6, 6, 6), 4), "y": T("y", (2, 14, 6, 6), 4),
               "z": T("z", (2, 16, 6, 6), 4)}
    prog, _ = check(rng, [a, b, cat, c], tensors, ["x"], ["z"])
    assert [lp.name for lp in prog.layers] == ["a", "b", "c"]
    assert prog.tensors["y"].bits == 4 and prog.tensors["y"].layout == "hwc"


@pytest.mark.parametrize("name, kwargs", [
    ("encoder_decoder", {}), ("aspp_head", {}), ("single_upsample", {}),
    ("single_deconv", {"k": 4, "pad": 1}), ("single_dilated_conv", {"dilation": 6})])
def test_phase_convs_concat_and_upsample_stay_within_2_lsb_of_onnxruntime(compare, name, kwargs):
    """Issue 24's acceptance: the offloaded network within 2 output LSB of onnxruntime running
    the same QDQ model (the NormQuant recipes round differently from its float requantize)."""
    import onnx
    import onnxruntime as ort

    m = models.quantized(name, **kwargs)
    r = compare(m)
    assert {o.placement for o in r.report.offloads} == {"marsellus"}
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {m.graph.input[0].name: r.inputs[0]})
    dq = next(n for n in m.graph.node if n.output[0] == m.graph.output[0].name)
    scale = next(onnx.numpy_helper.to_array(i) for i in m.graph.initializer
                 if i.name == dq.input[1])
    assert np.abs(r.outputs[0].astype(np.float64) - y).max() / scale <= 2 + 1e-3
