"""Quantization: float ONNX models -> QDQ models the targets offload.

Stages, one module each:

- :mod:`~tvm_accel.quantize.ort`: onnxruntime's static quantizer with a seeded calibration set
  and an on-disk cache (:func:`ort_quantize`; :func:`quantized` for a zoo network by name);
- :mod:`~tvm_accel.quantize.power_of_two`: the fix-point rewrite the DPU needs
  (:func:`make_power_of_two`);
- :mod:`~tvm_accel.quantize.mixed`: 2..8-bit mixed-precision models from a per-node bit
  assignment (:func:`apply_mixed_precision`, :func:`quantize_mixed`) and the mixed networks
  (:func:`resnet20_mixed`, :func:`resnet18_mixed`, :func:`mobilenet_tiny_mixed`);
- :mod:`~tvm_accel.quantize.model`: ``tvmc quantize`` on a model file with user calibration
  data (:func:`quantize_model`).

How the compiler reads sub-byte precision and precision configs (``--precision-config``) is
:mod:`tvm_accel.precision`: it belongs to the canonical graph, not to the quantizer.
"""

from tvm_accel.quantize.mixed import (
    MOBILENET_TINY_MIXED,
    RESNET18_4BIT,
    RESNET20_HAWQ,
    apply_mixed_precision,
    mobilenet_tiny_mixed,
    quantize_mixed,
    resnet18_mixed,
    resnet20_mixed,
)
from tvm_accel.quantize.model import (
    ACTIVATION_TYPES,
    DEFAULT_SAMPLES,
    PROVENANCE_KEY,
    QUANTIZED_OPS,
    SCHEMES,
    CalibrationError,
    CalibrationWarning,
    calibration_samples,
    default_output,
    is_quantized,
    load_model,
    quantize_model,
    quantized_nodes,
    save_model,
)
from tvm_accel.quantize.ort import cache_dir, ort_quantize, quantized, random_calibration
from tvm_accel.quantize.power_of_two import make_power_of_two, pow2_ceil

__all__ = ["ACTIVATION_TYPES", "DEFAULT_SAMPLES", "MOBILENET_TINY_MIXED", "PROVENANCE_KEY",
           "QUANTIZED_OPS", "RESNET18_4BIT", "RESNET20_HAWQ", "SCHEMES", "CalibrationError",
           "CalibrationWarning", "apply_mixed_precision", "cache_dir", "calibration_samples",
           "default_output", "is_quantized", "load_model", "make_power_of_two",
           "mobilenet_tiny_mixed", "ort_quantize", "pow2_ceil", "quantize_mixed",
           "quantize_model", "quantized", "quantized_nodes", "random_calibration",
           "resnet18_mixed", "resnet20_mixed", "save_model"]
