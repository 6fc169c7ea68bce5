"""Model zoo for the DPU-style target: ResNet-50, VGG-16, GoogLeNet, a YOLOv3-tiny-like detector,
an encoder-decoder with ConvTranspose, single-op builders, and power-of-two quantization."""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from helpers import models
from tvm_accel import quantize, zoo


def _ops(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]


def _run(m: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {m.graph.input[0].name: x})


def _attrs(m: onnx.ModelProto, name: str) -> dict:
    node = next(n for n in m.graph.node if n.name == name)
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# --- structure -------------------------------------------------------------------------------
def test_resnet50_has_bottleneck_stages_3_4_6_3_and_quantizes_once():
    m = zoo.resnet50()
    ops = _ops(m)
    # stem + 16 bottlenecks x 3 convs + 4 projection shortcuts; 16 residual adds
    assert ops.count("Conv") == 53 and ops.count("Add") == 16 and ops.count("MaxPool") == 1
    assert zoo.input_shape(m) == (1, 3, 224, 224)
    blocks = {n.name.split(".")[0] + "." + n.name.split(".")[1] for n in m.graph.node
              if n.name.startswith("layer") and n.op_type == "Add"}
    assert sorted(blocks) == sorted(f"layer{s}.{i}" for s, k in zip((1, 2, 3, 4), (3, 4, 6, 3),
                                                                     strict=True)
                                    for i in range(k))
    assert _attrs(m, "layer2.0.conv2")["strides"] == [2, 2]      # v1.5: stride on the 3x3
    fc = next(t for t in m.graph.initializer if t.name == "fc.weight")
    assert list(fc.dims) == [1000, 2048]
    # quantized through the default cache: only the first run of the machine pays for it
    q = quantize.ort_quantize(m)
    p2 = quantize.ort_quantize(m, power_of_two=True)
    t = time.perf_counter()
    assert quantize.ort_quantize(m, power_of_two=True).SerializeToString() == p2.SerializeToString()
    assert time.perf_counter() - t < 5
    assert _ops(q).count("Conv") == 53 and _ops(p2).count("Conv") == 53
    x = zoo.random_input(m, seed=4)[0]
    yf, yq, y2 = _run(m, x)[0], _run(q, x)[0], _run(p2, x)[0]
    print(f"ResNet-50 relative error vs float: per-channel QDQ {_rel(yq, yf):.3f}, "
          f"power-of-two {_rel(y2, yf):.3f}")
    assert y2.shape == (1, 1000) and _rel(y2, yf) < 0.5


def test_vgg16_has_13_convs_5_pools_3_fcs():
    m = zoo.vgg16(hw=32, width=0.25, fc=64, num_classes=10)
    ops = _ops(m)
    assert ops.count("Conv") == 13 and ops.count("MaxPool") == 5 and ops.count("Gemm") == 3
    widths = [int(t.dims[0]) for t in m.graph.initializer
              if t.name.endswith(".weight") and len(t.dims) == 4]
    assert widths == [16, 16, 32, 32, 64, 64, 64, 128, 128, 128, 128, 128, 128]
    fc6 = next(t for t in m.graph.initializer if t.name == "fc6.weight")
    assert list(fc6.dims) == [16, 128]           # fc scaled by width too; 128 x 1 x 1 input
    assert _run(m, zoo.random_input(m)[0])[0].shape == (1, 10)
    assert list(next(t for t in zoo.vgg16(hw=64, width=0.125).graph.initializer
                     if t.name == "fc6.weight").dims) == [512, 64 * 4]


def test_googlenet_has_nine_inception_modules():
    m = zoo.googlenet(hw=64, width=0.25)
    ops = _ops(m)
    # stem 3 convs + 9 modules x 6 convs; 9 concats; 2 stem + 2 between stages + 9 branch pools
    assert ops.count("Conv") == 57 and ops.count("Concat") == 9 and ops.count("MaxPool") == 13
    cat = next(n for n in m.graph.node if n.name == "inception3a.concat")
    assert len(cat.input) == 4
    assert _attrs(m, "inception3a.b3b")["kernel_shape"] == [5, 5]
    assert _attrs(m, "inception3a.pool")["strides"] == [1, 1]
    full = zoo.googlenet(hw=32)          # real widths: inception 5b outputs 1024 channels
    assert list(next(t for t in full.graph.initializer if t.name == "fc.weight").dims) == [
        1000, 1024]
    assert _run(m, zoo.random_input(m)[0])[0].shape == (1, 1000)


def test_yolov3_tiny_has_two_heads_with_upsample_and_route():
    m = zoo.yolov3_tiny(hw=64, width=0.25, num_classes=3)
    ops = _ops(m)
    assert ops.count("Conv") == 13 and ops.count("MaxPool") == 6
    assert ops.count("Resize") == 1 and ops.count("Concat") == 1
    assert _attrs(m, "pool5")["strides"] == [1, 1] and _attrs(m, "pool5")["pads"] == [0, 0, 1, 1]
    assert _attrs(m, "upsample")["mode"] == b"nearest"
    h1, h2 = _run(m, zoo.random_input(m)[0])
    assert h1.shape == (1, 24, 2, 2) and h2.shape == (1, 24, 4, 4)
    full = zoo.yolov3_tiny()
    assert zoo.input_shape(full) == (1, 3, 416, 416)
    assert [d.dim_value for d in full.graph.output[1].type.tensor_type.shape.dim] == [
        1, 255, 26, 26]
    assert "LeakyRelu" in _ops(zoo.yolov3_tiny(hw=32, width=0.25, leaky=True))


def test_encoder_decoder_upsamples_with_strided_transpose_convs():
    m = zoo.encoder_decoder(hw=16, c=8, batch=2)
    ops = _ops(m)
    assert ops.count("ConvTranspose") == 2 and ops.count("Concat") == 1
    assert _attrs(m, "dec1")["strides"] == [2, 2] and _attrs(m, "dec2")["output_padding"] == [
        1, 1]
    (y,) = _run(m, zoo.random_input(m)[0])
    assert y.shape == (2, 3, 16, 16)


@pytest.mark.parametrize("build,shape_in,shape_out", [
    (lambda: models.single_pool("max", 5, 3, 2, 1, hw=7), (1, 5, 7, 7), (1, 5, 4, 4)),
    (lambda: models.single_pool("max", 4, 2, 1, [0, 0, 1, 1], hw=5), (1, 4, 5, 5), (1, 4, 5, 5)),
    (lambda: models.single_pool("avg", 4, 3, 1, 1, hw=6, batch=2), (2, 4, 6, 6), (2, 4, 6, 6)),
    (lambda: models.single_pool("gap", 3, hw=5), (1, 3, 5, 5), (1, 3, 1, 1)),
    (lambda: models.single_upsample(3, 4, 3), (1, 3, 4, 4), (1, 3, 12, 12)),
    (lambda: models.single_deconv(4, 6, 3, 2, 1, 1, hw=5), (1, 4, 5, 5), (1, 6, 10, 10)),
    (lambda: models.single_deconv(4, 6, 4, 2, 1, groups=2, batch=3, hw=3), (3, 4, 3, 3),
     (3, 6, 6, 6)),
    (lambda: models.single_conv(7, 7, 5, 2, hw=9, groups=7), (1, 7, 9, 9), (1, 7, 5, 5)),
])
def test_single_op_builders_have_the_requested_shapes(build, shape_in, shape_out):
    m = build()
    onnx.checker.check_model(m)
    assert zoo.input_shape(m) == shape_in
    assert _run(m, zoo.random_input(m)[0])[0].shape == shape_out


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="multiple of 32"):
        zoo.vgg16(hw=48)
    with pytest.raises(ValueError, match="pool kind"):
        models.single_pool("median")


# --- power-of-two quantization ---------------------------------------------------------------
def _check_power_of_two(q: onnx.ModelProto):
    """Every scale a power of two, zero points 0, weights symmetric, biases consistent."""
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    prod = {o: n for n in q.graph.node for o in n.output}
    for n in q.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        s = inits[n.input[1]]
        assert np.all(s > 0) and np.all(np.exp2(np.round(np.log2(s))) == s), n.name
        assert np.all(inits[n.input[2]] == 0), n.name
        data = inits.get(n.input[0])
        if data is not None and data.dtype == np.int8:
            assert data.min() >= -127 and data.max() <= 127
    for n in q.graph.node:
        if n.op_type in ("Conv", "ConvTranspose", "Gemm") and len(n.input) > 2:
            sx = inits[prod[n.input[0]].input[1]]
            sw = inits[prod[n.input[1]].input[1]]
            sb = inits[prod[n.input[2]].input[1]]
            np.testing.assert_array_equal(*np.broadcast_arrays(np.ravel(sb), np.ravel(sx * sw)))


@pytest.mark.parametrize("name,kwargs", [
    ("googlenet", dict(hw=32, width=0.25)),
    ("yolov3_tiny", dict(hw=64, width=0.25, num_classes=3)),
    ("encoder_decoder", dict(hw=16)),
    ("vgg16", dict(hw=32, width=0.125, fc=64)),
])
def test_power_of_two_quantization_is_a_valid_fix_point_model(name, kwargs, tmp_path,
                                                              monkeypatch):
    monkeypatch.setenv("TVM_ACCEL_CACHE", str(tmp_path))
    m = zoo.MODELS[name](**kwargs)
    q = quantize.ort_quantize(m, power_of_two=True)
    _check_power_of_two(q)
    # ReLUs are fused into the conv/deconv before them: no Q/DQ between the two
    prod = {o: n for n in q.graph.node for o in n.output}
    relus = [n for n in q.graph.node if n.op_type == "Relu"]
    assert relus and all(prod[r.input[0]].op_type in ("Conv", "ConvTranspose", "Gemm", "Add")
                         for r in relus)
    ref = quantize.ort_quantize(m, per_channel=False)        # the same model with calibrated scales
    x = zoo.random_input(m, seed=7)[0]
    for yf, y2, yq in zip(_run(m, x), _run(q, x), _run(ref, x), strict=True):
        e2, eq = _rel(y2, yf), _rel(yq, yf)
        print(f"{name}: relative error vs float: power-of-two {e2:.3f}, per-tensor QDQ {eq:.3f}")
        assert e2 < 0.35
    assert len(list(tmp_path.glob("*.onnx"))) == 2      # cached apart from the ordinary one


def test_make_power_of_two_requantizes_weights_and_biases_from_the_float_model():
    m = models.single_conv(8, 8, 3, hw=6, relu=True)
    q = quantize.ort_quantize(m, per_channel=False, symmetric_activations=True, cache=False)
    p = quantize.make_power_of_two(q, m)
    inits = {t.name: numpy_helper.to_array(t) for t in p.graph.initializer}
    wf = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "conv.weight"))
    bf = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "conv.bias"))
    sw, sx = inits["conv.weight_scale"], inits["input_scale"]
    assert sw == quantize.pow2_ceil(numpy_helper.to_array(
        next(t for t in q.graph.initializer if t.name == "conv.weight_scale")))
    np.testing.assert_array_equal(inits["conv.weight_quantized"],
                                  np.clip(np.rint(wf / sw), -127, 127).astype(np.int8))
    np.testing.assert_array_equal(inits["conv.bias_quantized"],
                                  np.rint(bf / (sx * sw)).astype(np.int32))
    assert _ops(p).count("QuantizeLinear") == _ops(q).count("QuantizeLinear") - 1   # fused
    # without the float model the dequantized int8 values are the source: same scales
    p2 = quantize.make_power_of_two(q)
    assert {t.name for t in p2.graph.initializer} == set(inits)
    np.testing.assert_array_equal(numpy_helper.to_array(next(
        t for t in p2.graph.initializer if t.name == "conv.weight_scale")), sw)
    assert quantize.pow2_ceil([0.3, 0.25, 0.0]).tolist() == [0.5, 0.25, 0.0]
