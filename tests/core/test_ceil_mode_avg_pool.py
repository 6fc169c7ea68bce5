"""An average pool whose windows have different divisors (ceil mode with the last windows
overhanging the input, or padding left out of the count) is integer in the canonical graph:
one plain pool per region of equal divisor, concatenated back (issue 24, item 3)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import Compared

from helpers import models
from tvm_accel.canonicalize.avg_pools import _divisor_runs
from tvm_accel.quantize import ort_quantize
from tvm_accel.zoo import INPUT_NAME, Builder

SCHEMES = {"dpu": ("int8", False, True), "marsellus": ("uint8", True, False)}


def conv_avg_pool(hw: int, k: int, stride: int, pad: int, include_pad: int,
                  scheme: tuple) -> onnx.ModelProto:
    b = Builder(0)
    y = b.conv(INPUT_NAME, 8, 16, 3, name="conv", relu=True)
    y = b.node("AveragePool", [y], "pool", kernel_shape=[k, k], strides=[stride, stride],
               pads=[pad] * 4, ceil_mode=1, count_include_pad=include_pad)
    act, per_channel, pow2 = scheme
    return ort_quantize(b.model("ceil_avg_pool", INPUT_NAME, (1, 8, hw, hw), [y]), act,
                        per_channel, power_of_two=pow2)


def test_divisor_runs_follow_onnxruntime_clipping():
    assert _divisor_runs(8, 4, 3, 2, 0, 0, False) == [(0, 3, 3), (3, 4, 2)]
    assert _divisor_runs(7, 4, 2, 2, 1, 1, False) == [(0, 1, 1), (1, 4, 2)]
    assert _divisor_runs(7, 4, 2, 2, 1, 1, True) == [(0, 4, 2)]  # the padding counts
    assert _divisor_runs(9, 4, 3, 3, 1, 1, True) == [(0, 3, 3), (3, 4, 2)]


@pytest.mark.parametrize("target", sorted(SCHEMES))
@pytest.mark.parametrize("hw, k, stride, pad, include_pad", [
    (8, 3, 2, 0, 0), (7, 2, 2, 0, 0), (9, 3, 2, 1, 0), (7, 2, 2, 1, 0), (10, 4, 3, 1, 1)])
def test_overhanging_average_pool_is_integer_bit_exact_and_matches_onnxruntime(
        target, hw, k, stride, pad, include_pad):
    m = conv_avg_pool(hw, k, stride, pad, include_pad, SCHEMES[target])
    r = Compared(target, m)
    rec = next(x for x in r.report.numerics if x.onnx_name == "pool")
    assert rec.integer and rec.op == "avg_pool2d"
    assert len({d for row in rec.detail["divisors"] for d in row}) > 1
    placed = {o.layer: o.placement for o in r.report.offloads}
    assert placed["pool"] == target
    assert all(placed[p] == target for p in rec.detail["part_layers"])
    r.assert_bit_exact()
    for fused in (False, True) if not include_pad else (False,):
        expect = ort_run(m, r.inputs[0], fused)
        assert r.outputs[0].shape == expect.shape
        assert np.abs(r.outputs[0] - expect).max() <= models.output_step(m) * 1.001


def ort_run(m: onnx.ModelProto, x: np.ndarray, fused: bool) -> np.ndarray:
    """onnxruntime's output: its AveragePool kernel (the ONNX operator) or, ``fused``, its
    default graph optimisations (DQ -> AveragePool -> Q becomes QLinearAveragePool, which
    divides an overhanging window by the window with its overhang when ``count_include_pad``
    is 1, unlike the operator: 4 instead of 3 for a 4-wide window one past the padding)."""
    so = ort.SessionOptions()
    if not fused:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {m.graph.input[0].name: x})[0]


def test_overhanging_average_pool_without_a_target_pool_is_integer_on_the_cpu():
    """VTA has no pool pattern: the regions run on the CPU, integer (no float round trip)."""
    m = conv_avg_pool(9, 3, 2, 1, 0, ("int8", False, True))
    r = Compared("vta", m)
    rec = next(x for x in r.report.numerics if x.onnx_name == "pool")
    assert rec.integer and rec.detail["divisors"] == [[4, 6, 4], [6, 9, 6], [4, 6, 4]]
    r.assert_bit_exact()
    expect = ort_run(m, r.inputs[0], fused=True)
    assert np.abs(r.outputs[0] - expect).max() <= models.output_step(m) * 1.001
