"""Whole models on the DPU (batch 4 over the 4 PEs, power-of-two QDQ), bit-exact against the
CPU reference. Inputs are smaller than the benchmark's (benchmarks/dpu_models.py runs them at
full size) to keep the suite fast; the layer mix is the same."""

import pytest

from tvm_accel import quantize, zoo

MODELS = [
    ("resnet50", {"hw": 64}),
    ("vgg16", {"hw": 32}),
    ("googlenet", {"hw": 64}),
    ("yolov3_tiny", {"hw": 96}),
]


@pytest.mark.parametrize("name, kwargs", MODELS, ids=[m[0] for m in MODELS])
def test_whole_model_is_bit_exact_on_the_dpu(compare, name, kwargs):
    model = quantize.ort_quantize(zoo.MODELS[name](batch=4, **kwargs), power_of_two=True)
    r = compare(model)
    ops = {o.op for o in r.offloaded}
    assert "conv2d" in ops
    if name == "googlenet":
        assert "concat" in ops
    if name == "yolov3_tiny":
        assert {"upsample", "concat"} <= ops
    r.assert_bit_exact()
