"""Regenerate the demo's bundled model (python/tvm_accel/models/tiny_cnn_int8.onnx).

The model is built with onnx.helper from seeded weights (tvm_accel.zoo.tiny_cnn) and quantized
with onnxruntime's quantize_static (QDQ, int8 activations, per-channel int8 weights).
"""

from pathlib import Path

import onnx

from tvm_accel import zoo

out = Path(__file__).resolve().parents[1] / "python" / "tvm_accel" / "models" / "tiny_cnn_int8.onnx"
model = zoo.quantize(zoo.tiny_cnn(seed=0), activation_type="int8", per_channel=True)
onnx.save(model, out)
print(f"wrote {out} ({out.stat().st_size} bytes)")
