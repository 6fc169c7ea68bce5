"""onnxruntime's static quantizer (QDQ, MinMax calibration, int8 weights) after its
quantization pre-processing (shape inference, graph optimisation: BatchNormalization folded
into the Conv before it), with a seeded random calibration set and an on-disk cache
(``$TVM_ACCEL_CACHE`` or ``~/.cache/tvm_accel/zoo``, keyed by a hash of the float model and the
options), so ResNet-18 is quantized once per machine.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from tvm_accel import zoo
from tvm_accel.quantize.power_of_two import _POW2_VERSION, make_power_of_two


def random_calibration(model: onnx.ModelProto, seed: int = 0, n: int = 4,
                       shapes: Mapping[str, Sequence[int]] | None = None
                       ) -> list[dict[str, np.ndarray]]:
    """``n`` seeded samples for every graph input of ``model`` (standard normal float32, drawn
    sample by sample, input by input, from one generator): the random calibration set of
    :func:`ort_quantize`. For a single-input model the arrays are those of :func:`random_input`.
    ``shapes`` overrides the shape of an input (e.g. one with a dynamic dimension)."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    shapes = dict(shapes or {})
    specs = [(v.name, tuple(shapes.get(v.name) or
                            (int(d.dim_value) for d in v.type.tensor_type.shape.dim)))
             for v in model.graph.input if v.name not in inits]
    return [{name: rng.standard_normal(shape).astype(np.float32) for name, shape in specs}
            for _ in range(n)]


def cache_dir() -> Path:
    """Where quantized models are cached: ``$TVM_ACCEL_CACHE`` or ``~/.cache/tvm_accel/zoo``."""
    env = os.environ.get("TVM_ACCEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tvm_accel" / "zoo"


#: bump when :func:`pre_process` changes what it gives (the cache key holds it)
_PRE_PROCESS_VERSION = 2


def pre_process(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime's quantization pre-processing (``quant_pre_process``: shape inference, basic
    graph optimisations such as folding a BatchNormalization into the Conv before it) on a copy
    of ``model``; a node the optimiser renamed (``fc/MatMulAddFusion``) gets its name back, as
    precision configs and knobs use them. No symbolic shape inference: shapes are static."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "float.onnx", Path(tmp) / "pre.onnx"
        onnx.save(model, str(src))
        quant_pre_process(str(src), str(out), skip_symbolic_shape=True)
        pre = onnx.load(str(out))
    names = {n.name for n in model.graph.node if n.name}
    old = {(n.op_type, o): n.name for n in model.graph.node if n.name for o in n.output}
    by_output = {o: n.name for n in model.graph.node if n.name for o in n.output}
    taken = {n.name for n in pre.graph.node}
    for n in pre.graph.node:
        if n.name in names:
            continue
        name = next((old[n.op_type, o] for o in n.output if (n.op_type, o) in old), None)
        if name is None:  # "<source node>/<fusion>": the longest original name it extends
            name = max((m for m in names if n.name.startswith(m + "/")), key=len, default=None)
        if name is None and not n.name:  # a function inlined (HardSwish -> HardSigmoid, Mul):
            name = next((by_output[o] for o in n.output if o in by_output), None)  # its output
        if name is not None and name not in taken:
            taken.add(name)
            n.name = name
    pre.graph.name = model.graph.name
    return pre


def ort_quantize(model: onnx.ModelProto, activation_type: str = "int8",
             per_channel: bool | None = None, calib_samples: int = 4, seed: int = 0,
             symmetric_weights: bool = True, symmetric_activations: bool = False,
             cache: bool = True, power_of_two: bool = False,
             calibration: Sequence[Mapping[str, np.ndarray]] | None = None) -> onnx.ModelProto:
    """Quantize a float model to QDQ with onnxruntime's static quantizer, after
    :func:`pre_process` (a BatchNormalization after a Conv is folded into it, for every
    scheme).

    ``activation_type`` is ``"int8"`` or ``"uint8"`` (weights are always int8, symmetric unless
    ``symmetric_weights=False``); ``per_channel`` selects per-output-channel weight scales
    (default: True, or False with ``power_of_two``).
    ``symmetric_activations`` forces activation zero points to 0 (int8) / 128 (uint8), which
    keeps ReLU/Clip nodes in the graph instead of folding them into the output range.
    Calibration (MinMax) runs on ``calibration`` when given (a sequence of samples, each a
    mapping from every graph input name to an array of the input's shape and dtype; the
    caller validates them, see :mod:`tvm_accel.quantize`), else on ``calib_samples`` seeded
    standard-normal inputs (:func:`random_calibration`). With ``cache`` the result is stored
    under :func:`cache_dir` keyed by a hash of the float model, the options, the calibration
    data and the onnxruntime version.

    ``power_of_two=True`` makes a fix-point model for hardware that requantizes by shifting
    (a DPU): activations and weights symmetric, then :func:`make_power_of_two` rounds every
    scale up to a power of two, re-quantizes weights and biases for the new scales and fuses
    each ReLU/Clip into the conv/dense/add that feeds it (see there).
    """
    import onnxruntime
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    act = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}.get(activation_type)
    if act is None:
        raise ValueError(f"activation_type must be 'int8' or 'uint8', not {activation_type!r}")
    if per_channel is None:
        per_channel = not power_of_two
    if power_of_two:
        symmetric_weights = symmetric_activations = True
    key = hashlib.sha256(model.SerializeToString(deterministic=True))
    opts: tuple = (activation_type, per_channel, calib_samples, seed, symmetric_weights,
            symmetric_activations, onnxruntime.__version__, f"pre-v{_PRE_PROCESS_VERSION}")
    if power_of_two:
        opts += (f"power_of_two-v{_POW2_VERSION}",)
    key.update(repr(opts).encode())
    if calibration is not None:
        for sample in calibration:
            for name in sorted(sample):
                a = np.ascontiguousarray(sample[name])
                key.update(repr((name, a.dtype.str, a.shape)).encode())
                key.update(a.tobytes())
    path = cache_dir() / f"{model.graph.name}-{key.hexdigest()[:16]}.onnx"
    if cache and path.exists():
        try:
            return onnx.load(str(path))
        except Exception:  # a truncated cache entry: rebuild it
            path.unlink(missing_ok=True)

    samples = (list(calibration) if calibration is not None
               else random_calibration(model, seed, calib_samples))

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(samples)

        def get_next(self):
            return next(self._it, None)

    model = pre_process(model)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "float.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, str(src))  # quantize_static mutates a ModelProto it is given
        quantize_static(str(src), str(out), _Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=act, weight_type=QuantType.QInt8,
                        per_channel=per_channel,
                        extra_options={"WeightSymmetric": symmetric_weights,
                                       "ActivationSymmetric": symmetric_activations})
        qmodel = onnx.load(str(out))
    qmodel.graph.name = model.graph.name
    if power_of_two:
        qmodel = make_power_of_two(qmodel, model)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
        onnx.save(qmodel, str(tmp_path))
        os.replace(tmp_path, path)  # atomic: concurrent test runs never see half a file
    return qmodel


def quantized(name: str, activation_type: str = "int8", per_channel: bool | None = None,
              power_of_two: bool = False, **kwargs) -> onnx.ModelProto:
    """Build zoo model ``name`` with ``kwargs`` and quantize it (cached)."""
    if name not in zoo.MODELS:
        raise ValueError(f"unknown zoo model {name!r} ({', '.join(zoo.MODELS)})")
    return ort_quantize(zoo.MODELS[name](**kwargs), activation_type, per_channel,
                    power_of_two=power_of_two)
