"""Regenerate the demo's bundled models (python/tvm_accel/models/).

Both are the same CNN built with onnx.helper from seeded weights (tvm_accel.zoo.tiny_cnn) and
quantized with onnxruntime's quantize_static (QDQ):

- tiny_cnn_int8.onnx: int8 activations, per-channel int8 weights (VTA);
- tiny_cnn_pow2.onnx: symmetric power-of-two scales, batch 4 (DPU: fix-point requantization,
  one image per PE).
"""

from pathlib import Path

import onnx

from tvm_accel import quantize, zoo

models = Path(__file__).resolve().parents[1] / "python" / "tvm_accel" / "models"
for name, model in (
    ("tiny_cnn_int8.onnx", quantize.ort_quantize(zoo.tiny_cnn(seed=0), activation_type="int8",
                                                 per_channel=True)),
    ("tiny_cnn_pow2.onnx", quantize.ort_quantize(zoo.tiny_cnn(seed=0, batch=4),
                                                 power_of_two=True)),
):
    onnx.save(model, models / name)
    print(f"wrote {models / name} ({(models / name).stat().st_size} bytes)")
