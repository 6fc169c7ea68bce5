"""MARSELLUS pattern table: named checks whose docstrings are the CPU-fallback reasons."""

import numpy as np
import onnx
from onnx import helper

from helpers import models
from tvm_accel import quantize, zoo
from tvm_accel.partition import check_reason


def test_every_check_has_a_reason_and_the_table_covers_the_cluster_ops():
    from tvm_marsellus.patterns import pattern_table

    table = pattern_table()
    assert [p.op for p in table] == ["conv2d", "conv2d_transpose", "dense", "add",
                                     *["concat"] * 7, "upsample", "upsample", "max_pool2d",
                                     "avg_pool2d", "global_avg_pool2d", "lut", "multiply"]
    for p in table:
        assert p.name.startswith("marsellus.")
        for chk in p.checks:
            assert chk.__doc__ and check_reason(chk) != chk.__name__


def _dilated_conv(stride: int) -> onnx.ModelProto:
    b = zoo.Builder(0)
    w = b.init("w", np.random.default_rng(0).normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32))
    out = "y"
    b.nodes.append(helper.make_node("Conv", ["input", w], [out], kernel_shape=[3, 3],
                                    dilations=[2, 2], pads=[2, 2, 2, 2], strides=[stride] * 2))
    return b.model("dilated", "input", (1, 8, 8, 8), [out])


def test_a_strided_dilated_conv_falls_back_with_its_reason(compare):
    r = compare(quantize.ort_quantize(_dilated_conv(2)))
    conv = [o for o in r.report.offloads if o.op == "conv2d"]
    assert conv and conv[0].placement == "cpu" and "dilated convolution with a stride" in \
        conv[0].reason
    r.assert_bit_exact()
    r = compare(quantize.ort_quantize(_dilated_conv(1)))
    assert [o.placement for o in r.report.offloads if o.op == "conv2d"] == ["marsellus"]
    r.assert_bit_exact()


def test_recipes_are_reported_with_their_error(compare):
    r = compare(models.quantized("single_conv", cin=32, cout=32, k=3, pad=1, hw=6))
    errs = [e for e in r.report.numerics if getattr(e, "max_rel_error", None) is not None]
    assert errs and all(e.max_rel_error < 1e-2 for e in errs)
    r.assert_bit_exact()
