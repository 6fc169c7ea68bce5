"""A ceil-mode max pool (SqueezeNet's) is the floor-mode pool with the extra bottom / right
padding its last windows read, so the DPU and MARSELLUS run it (issue 24, item 3)."""

import numpy as np
import onnxruntime as ort
import pytest
from conftest import Compared
from onnx import numpy_helper

from tvm_accel.frontend import load_onnx, random_inputs
from tvm_accel.quantize import ort_quantize
from tvm_accel.zoo import INPUT_NAME, Builder

SCHEMES = {"dpu": ("int8", False, True), "marsellus": ("uint8", True, False)}


def conv_ceil_pool(hw: int, k: int, stride: int, pad: int):
    b = Builder(0)
    y = b.conv(INPUT_NAME, 8, 16, 3, name="conv", relu=True)
    y = b.node("MaxPool", [y], "pool", kernel_shape=[k, k], strides=[stride, stride],
               pads=[pad] * 4, ceil_mode=1)
    return b.model("ceil_pool", INPUT_NAME, (1, 8, hw, hw), [y])


@pytest.mark.parametrize("target", sorted(SCHEMES))
@pytest.mark.parametrize("hw, k, stride, pad", [(8, 3, 2, 0), (7, 2, 2, 1), (10, 3, 3, 1)])
def test_ceil_mode_max_pool_is_offloaded_bit_exact_and_matches_onnxruntime(target, hw, k,
                                                                            stride, pad):
    act, per_channel, pow2 = SCHEMES[target]
    model = ort_quantize(conv_ceil_pool(hw, k, stride, pad), act, per_channel,
                         power_of_two=pow2)
    r = Compared(target, model)
    assert {o.layer: o.placement for o in r.report.offloads}["pool"] == target
    r.assert_bit_exact()
    _, info = load_onnx(model)
    expect = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(
        None, random_inputs(info, seed=0))[0]
    scale = next(numpy_helper.to_array(t) for t in model.graph.initializer
                 if t.name == next(n for n in model.graph.node
                                   if n.output[0] == model.graph.output[0].name).input[1])
    assert r.outputs[0].shape == expect.shape
    assert np.abs(r.outputs[0] - expect).max() <= float(scale) * 1.001  # 1 LSB (the conv)
