"""Top-1 accuracy of the digits CNN (:mod:`tvm_accel.datasets.digits`) through the whole chain:
float model -> ``tvmc quantize`` (each target's scheme, calibrated on the training images) ->
compile for a target -> the simulator on every test image, against onnxruntime running the same
QDQ model.

The model is compiled once per target with the batch dimension set to the number of test images
(:func:`with_batch`), so one simulator run classifies them all. Variants (:data:`VARIANTS`):
``plain``; ``near-dead`` (one conv1 filter set to 1e-12, whose weight scale onnxruntime shrinks
until its bias fits int32); ``mixed`` (MARSELLUS: 4-bit weights and output of one conv,
:data:`MIXED_BITS`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from tvm_accel.datasets import digits

#: quantization scheme and activation type per target kind (``tvmc quantize`` options)
SCHEMES = {"vta": ("per-channel", "int8"), "dpu": ("power-of-two", "int8"),
           "marsellus": ("per-channel", "uint8")}
#: the targets every variant runs on: (kind, hardware config)
TARGETS: tuple[tuple[str, str | None], ...] = (
    ("vta", "vta_1x16x16"), ("vta", "vta_8x8x8"), ("dpu", None), ("marsellus", None))
VARIANTS = ("plain", "near-dead", "mixed")
#: the conv1 filter of the ``near-dead`` variant (the one whose loss costs least float accuracy)
NEAR_DEAD_CHANNEL = 3
#: the ``mixed`` variant's precision (``apply_mixed_precision`` / ``--precision-config`` form)
MIXED_BITS = {"conv2": {"w": 4, "o": 4}}
#: accuracy a target may lose against onnxruntime's QDQ model, in points
TOLERANCE = 0.5


def variant_weights(variant: str, weights: digits.Weights | None = None) -> digits.Weights:
    """The float weights of ``variant`` (the trained ones, or ``weights``)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} ({', '.join(VARIANTS)})")
    w = weights if weights is not None else digits.trained_weights()
    return digits.with_near_dead_filter(w, "conv1", NEAR_DEAD_CHANNEL) \
        if variant == "near-dead" else w


def quantized_model(kind: str, variant: str = "plain", data: digits.Digits | None = None,
                    weights: digits.Weights | None = None,
                    native_int4: bool = True) -> onnx.ModelProto:
    """The batch-1 QDQ model of ``variant`` for target ``kind``: :func:`quantize_model` with the
    target's scheme (:data:`SCHEMES`), calibrated on every training image; ``mixed`` then narrows
    it with :data:`MIXED_BITS` (INT4/UINT4 Q/DQ, or with ``native_int4=False`` the same values
    as clipped ranges in 8-bit containers, whose tensors onnxruntime hands to numpy)."""
    from tvm_accel.quantize import apply_mixed_precision, quantize_model

    data = data or digits.load_digits()
    scheme, act = SCHEMES[kind]
    float_model = digits.to_onnx(variant_weights(variant, weights))
    q = quantize_model(float_model, {digits.INPUT_NAME: data.x_train}, scheme=scheme,
                       activation_type=act)
    return apply_mixed_precision(q, MIXED_BITS, native_int4) if variant == "mixed" else q


def with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """A copy of ``model`` whose input and output take ``batch`` images (the digits models have
    no shape constants, so only the graph's inputs and outputs change)."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    for v in (*m.graph.input, *m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = batch
    del m.graph.value_info[:]
    return m


def ort_logits(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """onnxruntime's output of ``model`` on the images ``x`` (one batch of all of them)."""
    import onnxruntime

    sess = onnxruntime.InferenceSession(with_batch(model, len(x)).SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    return sess.run(None, {digits.INPUT_NAME: x})[0]


def compile_for(model: onnx.ModelProto, kind: str, config: str | None, batch: int,
                precision: Any = None) -> tuple[Any, Any]:
    """``(executable, CompileReport)`` of ``model`` with batch ``batch`` for target ``kind``."""
    from tvm_accel.frontend import load_onnx
    from tvm_accel.pipeline import compile_model
    from tvm_accel.target import get_target

    mod, _ = load_onnx(with_batch(model, batch))
    return compile_model(mod, get_target(kind), config, precision=precision)


def run_logits(executable: Any, x: np.ndarray) -> np.ndarray:
    """The compiled model's output on the images ``x`` (one call of its batch)."""
    import tvm
    from tvm import relax

    from tvm_accel.package import outputs_to_numpy

    vm = relax.VirtualMachine(executable, tvm.cpu())
    return outputs_to_numpy(vm["main"](tvm.runtime.tensor(np.ascontiguousarray(x))))[0]


def compare_on_test_images(model: onnx.ModelProto, kind: str, config: str | None = None,
                           data: digits.Digits | None = None) -> Any:
    """:func:`tvm_accel.compare.compare_layers` of the QDQ ``model`` on ``kind`` over every test
    image (one batch): each layer's integer output against onnxruntime's."""
    from tvm_accel.compare import compare_layers

    data = data or digits.load_digits()
    return compare_layers(with_batch(model, len(data.x_test)), kind,
                          {digits.INPUT_NAME: data.x_test}, config=config)


def disagreeing_layers(report: Any, share: float = 0.99) -> list[str]:
    """The layers of a ``CompareReport`` whose own output (onnxruntime fed with our inputs of
    the layer) is not within 1 LSB of onnxruntime's on at least ``share`` of its elements (a
    layer qualifies when no element is off by more than 1, or at most ``1 - share`` differ)."""
    return [r.layer for r in report.layers
            if r.local_max_lsb is not None and r.local_max_lsb > 1
            and (r.local_share_differ or 0.0) > 1.0 - share]


@dataclass
class TargetResult:
    """One target on one variant, on every test image."""

    kind: str
    config: str | None
    variant: str
    #: top-1 in percent: the target, and onnxruntime on the same QDQ model
    accuracy: float
    ort_accuracy: float
    #: test images whose top-1 differs from onnxruntime's
    differ: int
    #: layers with weights (conv, dense) left on the CPU, with the reason
    cpu_layers: dict[str, str]
    compile_seconds: float
    run_seconds: float
    logits: np.ndarray = field(repr=False)
    ort_logits: np.ndarray = field(repr=False)
    model: onnx.ModelProto = field(repr=False)
    report: Any = field(repr=False, default=None)

    @property
    def label(self) -> str:
        """``vta_8x8x8``, ``dpu``, ``marsellus`` ..."""
        return self.config or self.kind

    def meets_acceptance(self, affected: tuple[str, ...] = (),
                         tolerance: float = TOLERANCE) -> bool:
        """Top-1 within ``tolerance`` points of onnxruntime's, or one of the ``affected`` layers
        reported on the CPU with a reason (the compiler declined what it cannot compute)."""
        return abs(self.accuracy - self.ort_accuracy) <= tolerance or \
            any(self.cpu_layers.get(layer) for layer in affected)


def evaluate(kind: str, config: str | None = None, variant: str = "plain",
             data: digits.Digits | None = None, weights: digits.Weights | None = None,
             model: onnx.ModelProto | None = None, precision: Any = None) -> TargetResult:
    """Quantize ``variant`` for ``kind`` (or take the QDQ ``model``), compile it for the target
    with ``config`` and ``precision``, classify every test image on the simulator and compare
    with onnxruntime on the QDQ model."""
    data = data or digits.load_digits()
    q = model if model is not None else quantized_model(kind, variant, data, weights)
    t = time.perf_counter()
    ex, report = compile_for(q, kind, config, len(data.x_test), precision)
    compiled = time.perf_counter()
    logits = run_logits(ex, data.x_test)
    ran = time.perf_counter()
    ref = ort_logits(q, data.x_test)
    cpu = {r.layer: r.reason for r in report.offloads
           if r.op in ("conv2d", "dense") and r.placement != kind}
    return TargetResult(kind, config, variant, digits.accuracy(logits, data.y_test),
                        digits.accuracy(ref, data.y_test),
                        int(np.sum(logits.argmax(1) != ref.argmax(1))), cpu,
                        compiled - t, ran - compiled, logits, ref, q, report)
