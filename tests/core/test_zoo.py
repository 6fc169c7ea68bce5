"""Model zoo: the builders make valid, deterministic ONNX models and quantize them (cached)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from helpers import models
from tvm_accel import quantize, zoo


def _ops(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]


def _run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {m.graph.input[0].name: x})[0]


def test_resnet20_has_the_cifar_structure():
    m = zoo.resnet20()
    onnx.checker.check_model(m)
    ops = _ops(m)
    # 1 stem conv + 9 blocks x 2 convs + 2 projection shortcuts, 9 residual adds, 1 FC
    assert ops.count("Conv") == 21 and ops.count("Add") == 9 and ops.count("Gemm") == 1
    assert ops.count("GlobalAveragePool") == 1 and ops.count("BatchNormalization") == 0
    assert zoo.input_shape(m) == (1, 3, 32, 32)
    widths = {int(t.dims[0]) for t in m.graph.initializer if t.name.endswith(".weight")
              and len(t.dims) == 4}
    assert widths == {16, 32, 64}
    y = _run(m, zoo.random_input(m)[0])
    assert y.shape == (1, 10) and np.all(np.isfinite(y))


def test_resnet18_has_the_imagenet_structure():
    m = zoo.resnet18()
    ops = _ops(m)
    assert ops.count("Conv") == 20 and ops.count("Add") == 8 and ops.count("MaxPool") == 1
    assert zoo.input_shape(m) == (1, 3, 224, 224)
    stem = next(n for n in m.graph.node if n.name == "conv1")
    attrs = {a.name: list(a.ints) for a in stem.attribute}
    assert attrs["kernel_shape"] == [7, 7] and attrs["strides"] == [2, 2]
    fc = next(t for t in m.graph.initializer if t.name == "fc.weight")
    assert list(fc.dims) == [1000, 512]


def test_builders_are_deterministic_and_seeded():
    a = zoo.resnet20(seed=3).SerializeToString(deterministic=True)
    assert a == zoo.resnet20(seed=3).SerializeToString(deterministic=True)
    assert a != zoo.resnet20(seed=4).SerializeToString(deterministic=True)


@pytest.mark.parametrize("build,shape_in,shape_out", [
    (lambda: models.single_conv(16, 24, 3, 2, hw=9, relu=True), (1, 16, 9, 9), (1, 24, 5, 5)),
    (lambda: models.single_conv(8, 8, 1, 1, batch=2, hw=4, bias=False), (2, 8, 4, 4), (2, 8, 4, 4)),
    (lambda: models.single_dense(64, 32, batch=3), (3, 64), (3, 32)),
    (lambda: models.conv_residual(16, 8), (1, 16, 8, 8), (1, 16, 8, 8)),
    (lambda: models.conv_pool("max", 8, 8), (1, 8, 8, 8), (1, 8, 4, 4)),
    (lambda: models.conv_pool("gap", 8, 8), (1, 8, 8, 8), (1, 8, 1, 1)),
    (lambda: models.conv_concat(8, 8), (1, 8, 8, 8), (1, 8, 8, 8)),
    (lambda: models.conv_flatten_dense(8, 4, 10), (1, 8, 4, 4), (1, 10)),
    (lambda: models.conv_unary("Sigmoid"), (1, 8, 8, 8), (1, 8, 8, 8)),
    (lambda: zoo.tiny_cnn(), (1, 3, 32, 32), (1, 10)),
])
def test_small_builders_have_the_requested_shapes(build, shape_in, shape_out):
    m = build()
    onnx.checker.check_model(m)
    assert zoo.input_shape(m) == shape_in
    assert _run(m, zoo.random_input(m)[0]).shape == shape_out


@pytest.mark.parametrize("act,per_channel", [("int8", True), ("uint8", False)])
def test_quantize_makes_a_qdq_model_close_to_the_float_one(act, per_channel, tmp_path,
                                                           monkeypatch):
    monkeypatch.setenv("TVM_ACCEL_CACHE", str(tmp_path))
    m = zoo.resnet20()
    q = quantize.ort_quantize(m, act, per_channel)
    ops = _ops(q)
    assert ops.count("QuantizeLinear") > 20 and ops.count("Conv") == 21
    qlinear = [n for n in q.graph.node if n.op_type == "QuantizeLinear"]
    dtype = {"int8": onnx.TensorProto.INT8, "uint8": onnx.TensorProto.UINT8}[act]
    zps = {t.name: t for t in q.graph.initializer}
    assert all(zps[n.input[2]].data_type == dtype for n in qlinear)
    wscale = zps["layer1.0.conv1.weight_scale"]
    assert (list(wscale.dims) == [16]) == per_channel
    x = zoo.random_input(m, seed=9)[0]
    yf, yq = _run(m, x), _run(q, x)
    rel = np.linalg.norm(yf - yq) / np.linalg.norm(yf)
    print(f"resnet20 {act} per_channel={per_channel}: relative error vs float {rel:.3f}")
    assert rel < 0.5


def test_quantized_models_are_cached_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_ACCEL_CACHE", str(tmp_path))
    m = models.single_conv(8, 8, 3, hw=6)
    q1 = quantize.ort_quantize(m)
    files = list(tmp_path.glob("*.onnx"))
    assert len(files) == 1 and files[0].name.startswith("single_conv-")
    q2 = quantize.ort_quantize(m)
    assert q1.SerializeToString() == q2.SerializeToString()
    quantize.ort_quantize(m, "uint8")
    quantize.ort_quantize(models.single_conv(8, 8, 3, hw=6, seed=1))
    assert len(list(tmp_path.glob("*.onnx"))) == 3  # other options / weights: other entries
    files[0].write_bytes(b"truncated")  # a broken entry is rebuilt, not returned
    assert quantize.ort_quantize(m).SerializeToString() == q1.SerializeToString()


def test_the_suite_quantizes_into_its_own_cache(zoo_cache):
    """conftest: a temporary cache unless TVM_ACCEL_CACHE names one; never ~/.cache silently."""
    assert quantize.cache_dir() == Path(zoo_cache)


def test_resnet18_quantizes_and_is_cached():
    # uses the run's cache (conftest: temporary unless $TVM_ACCEL_CACHE is set): quantized once
    q = models.quantized("resnet18")
    assert _ops(q).count("Conv") == 20 and _ops(q).count("DequantizeLinear") > 60
    t = time.perf_counter()
    q2 = models.quantized("resnet18")
    assert time.perf_counter() - t < 5
    assert q2.SerializeToString() == q.SerializeToString()
    y = _run(q, zoo.random_input(q)[0])
    assert y.shape == (1, 1000) and np.all(np.isfinite(y))


def test_unknown_names_and_options_are_rejected():
    with pytest.raises(ValueError, match="unknown zoo model"):
        quantize.quantized("no_such_model")
    with pytest.raises(ValueError, match="activation_type"):
        quantize.ort_quantize(models.single_dense(), "int4")
    with pytest.raises(ValueError, match="pool kind"):
        models.conv_pool("min")
