"""Real data through the whole chain: a CNN trained on scikit-learn's digits, quantized with
each target's scheme, compiled for every target and run on the simulator on all 360 test
images, against onnxruntime running the same QDQ model (tvm_accel.datasets)."""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
import pytest

from tvm_accel.datasets import accuracy as acc
from tvm_accel.datasets import digits


@pytest.fixture(scope="module")
def data() -> digits.Digits:
    return digits.load_digits()


@functools.cache
def _qdq(kind: str, variant: str):
    return acc.quantized_model(kind, variant)


def test_split_is_deterministic_with_360_test_images(data):
    again = digits.load_digits()
    assert data.x_test.shape == (360, 1, 8, 8) and data.x_train.shape == (1437, 1, 8, 8)
    np.testing.assert_array_equal(data.x_test, again.x_test)
    np.testing.assert_array_equal(data.y_train, again.y_train)
    assert data.x_train.dtype == np.float32 and 0.0 <= data.x_test.min() < data.x_test.max() <= 1
    assert set(np.unique(data.y_test)) == set(range(10))


def test_cached_weights_classify_digits_at_97_percent(data):
    w = digits.trained_weights()
    assert set(w) == {f"{layer}.{p}" for layer in digits.LAYERS for p in ("weight", "bias")}
    top1 = digits.accuracy(digits.forward(w, data.x_test), data.y_test)
    print(f"float top-1 {top1:.2f}%")
    assert top1 >= 97.0


def test_onnx_export_matches_the_numpy_forward_in_onnxruntime(data):
    w = digits.trained_weights()
    model = acc.with_batch(digits.to_onnx(w), len(data.x_test))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y = sess.run(None, {digits.INPUT_NAME: data.x_test})[0]
    ref = digits.forward(w, data.x_test)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-4)
    np.testing.assert_array_equal(y.argmax(1), ref.argmax(1))


def test_training_is_deterministic_and_learns(data):
    a = digits.train(data, epochs=1)
    b = digits.train(data, epochs=1)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    before = digits.accuracy(digits.forward(digits.init_weights(), data.x_test), data.y_test)
    after = digits.accuracy(digits.forward(a, data.x_test), data.y_test)
    assert after > before + 10


@pytest.mark.slow
def test_training_from_scratch_reaches_97_percent(data):
    w = digits.train(data)
    assert digits.accuracy(digits.forward(w, data.x_test), data.y_test) >= 97.0


def test_near_dead_filter_keeps_its_bias_and_tiny_weights():
    w = digits.trained_weights()
    dead = digits.with_near_dead_filter(w, "conv1", 3)
    assert np.all(dead["conv1.weight"][3] == np.float32(1e-12))
    np.testing.assert_array_equal(dead["conv1.bias"], w["conv1.bias"])
    np.testing.assert_array_equal(np.delete(dead["conv1.weight"], 3, 0),
                                  np.delete(w["conv1.weight"], 3, 0))
    assert not np.all(w["conv1.weight"][3] == np.float32(1e-12))  # the original is untouched


def _check(r: acc.TargetResult, affected: tuple[str, ...] = ()) -> None:
    print(f"{r.variant} {r.label}: top-1 {r.accuracy:.2f}% vs onnxruntime {r.ort_accuracy:.2f}%, "
          f"{r.differ} images differ, CPU layers {r.cpu_layers or 'none'}; compile "
          f"{r.compile_seconds:.1f} s, run {r.run_seconds:.2f} s")
    assert r.meets_acceptance(affected), (
        f"{r.label}: top-1 {r.accuracy:.2f}% is {r.accuracy - r.ort_accuracy:+.2f} points from "
        f"onnxruntime's {r.ort_accuracy:.2f}% ({r.differ} of 360 images differ)")


def _check_layers(r: acc.TargetResult, data: digits.Digits, model=None) -> None:
    rep = acc.compare_on_test_images(model or r.model, r.kind, r.config, data)
    print(rep.format())
    assert {row.layer for row in rep.layers} >= set(digits.LAYERS)
    assert acc.disagreeing_layers(rep) == [], "each layer within 1 LSB on 99% of its elements"


@pytest.mark.parametrize("kind, config", acc.TARGETS, ids=[c or k for k, c in acc.TARGETS])
def test_every_target_keeps_onnxruntimes_accuracy_on_360_digits(data, kind, config):
    r = acc.evaluate(kind, config, "plain", data, model=_qdq(kind, "plain"))
    assert r.cpu_layers == {}, "every conv and the dense layer run on the accelerator"
    assert r.ort_accuracy >= 97.0
    _check(r)
    _check_layers(r, data)


@pytest.mark.parametrize("kind, config", acc.TARGETS, ids=[c or k for k, c in acc.TARGETS])
def test_near_dead_filter_is_within_tolerance_or_reported_on_the_cpu(data, kind, config):
    r = acc.evaluate(kind, config, "near-dead", data, model=_qdq(kind, "near-dead"))
    assert r.ort_accuracy >= 95.0
    _check(r, affected=("conv1",))
    _check_layers(r, data)


def test_marsellus_mixed_precision_conv_keeps_onnxruntimes_accuracy(data):
    q = _qdq("marsellus", "mixed")
    r = acc.evaluate("marsellus", None, "mixed", data, model=q)
    bits = {rec.name: rec.detail.get("bits") for rec in r.report.numerics}
    assert bits["conv2"] == {"w": 4, "i": 8, "o": 4} and bits["conv3"]["i"] == 4
    assert r.cpu_layers == {}
    _check(r)
    same = acc.evaluate("marsellus", None, "mixed", data, model=q,
                        precision={"layers": acc.MIXED_BITS})
    np.testing.assert_array_equal(same.logits, r.logits)  # --precision-config says the same
    # per layer on the clipped-range twin (onnxruntime returns no 4-bit tensors to numpy)
    clipped = acc.quantized_model("marsellus", "mixed", data, native_int4=False)
    np.testing.assert_array_equal(acc.ort_logits(clipped, data.x_test), r.ort_logits)
    _check_layers(r, data, clipped)
