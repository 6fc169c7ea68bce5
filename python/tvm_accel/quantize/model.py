"""Quantize a float ONNX model file into a QDQ model the targets offload (``tvmc quantize``).

Underneath: onnxruntime's static quantizer (``quantize_static``, QDQ format, MinMax
calibration, int8 symmetric weights) through :func:`tvm_accel.quantize.ort.ort_quantize`, and
for the ``power-of-two`` scheme :func:`tvm_accel.quantize.power_of_two.make_power_of_two`.

Schemes (:data:`SCHEMES`):

- ``per-channel`` (default): one weight scale per output channel; VTA and MARSELLUS offload it.
- ``per-tensor``: one weight scale per tensor.
- ``power-of-two``: symmetric int8 activations and weights, per-tensor, every scale rounded up to
  a power of two and ReLU/Clip fused into the layer before it (what Vitis AI's quantizer makes):
  the form the DPU needs, as it requantizes by shifting.

Calibration data (``calibration``): a ``.npz`` file (or the equivalent mapping) with one array
per model input, named after the input. Samples are stacked along the input's first (batch)
axis: for an input of shape ``(B, ...)`` the array has shape ``(N * B, ...)`` and holds ``N``
samples (a batch-1 image model takes ``(N, 3, H, W)``); every input must hold the same number
of samples. An input with a dynamic first axis takes each row as one batch-1 sample. Arrays are
real numbers of the input's kind (float for float inputs), finite; other dimensions must match
the model's static ones. Without calibration data, ``samples`` seeded standard-normal inputs are
used and a :class:`CalibrationWarning` says that the scales are then not representative.

Every user error (unreadable or non-ONNX model, a model that is already quantized, a bad
``.npz``, an unknown scheme or activation type) raises an :class:`~tvm_accel.errors.AccelError`
subclass with a one-line message naming the file or option, so ``tvmc`` prints one line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from tvm_accel.errors import AccelError, ModelError
from tvm_accel.frontend import read_npz
from tvm_accel.quantize.ort import ort_quantize, random_calibration

#: weight-scale schemes, see the module docstring
SCHEMES = ("per-channel", "per-tensor", "power-of-two")
#: activation types of onnxruntime's quantizer (weights are always int8)
ACTIVATION_TYPES = ("int8", "uint8")
#: random calibration samples when no data is given
DEFAULT_SAMPLES = 4
#: ``metadata_props`` key of the quantized model: JSON of scheme, activation type, calibration
#: source (file, ``random`` or ``data``), number of samples and seed
PROVENANCE_KEY = "tvm_accel.quantize"
#: operators that mark a model as quantized already
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                           "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"})
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                onnx.TensorProto.BFLOAT16}


class CalibrationWarning(UserWarning):
    """Calibration ran on random data: the scales do not reflect real inputs."""


class CalibrationError(AccelError):
    """The calibration data does not fit the model (missing input, shape, dtype, NaN...)."""


def is_quantized(model: onnx.ModelProto) -> bool:
    """True if ``model`` holds a Q/DQ pair or another quantized operator (:data:`QUANTIZED_OPS`)."""
    return any(n.op_type in QUANTIZED_OPS for n in model.graph.node)


def quantized_nodes(model: onnx.ModelProto) -> Counter:
    """Operators of a QDQ model that compute on quantized values (an input comes from a
    ``DequantizeLinear``), counted by op type: what the summary of ``tvmc quantize`` reports."""
    dq_out = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return Counter(n.op_type for n in model.graph.node
                   if n.op_type not in QUANTIZED_OPS and any(i in dq_out for i in n.input))


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]


def _dims(vi: onnx.ValueInfoProto) -> list[int | None]:
    """Static dims of an input, None for a dynamic one."""
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in vi.type.tensor_type.shape.dim]


def _show(dims: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _np_dtype(vi: onnx.ValueInfoProto) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))


def load_model(model: onnx.ModelProto | str | os.PathLike) -> tuple[onnx.ModelProto, str]:
    """``(model, where)`` for a path or a ModelProto; checked with ``onnx.checker``.

    Raises :class:`~tvm_accel.errors.ModelError` for a missing, unreadable or invalid file, and
    for a model that is quantized already."""
    from tvm_accel.frontend import _check, _read_model

    m, where = _read_model(os.fspath(model) if isinstance(model, os.PathLike) else model)
    _check(m, where)
    if is_quantized(m):
        ops = sorted({n.op_type for n in m.graph.node if n.op_type in QUANTIZED_OPS})
        raise ModelError(f"{where}: already quantized (has {', '.join(ops)}); "
                         "'tvmc quantize' takes the float model")
    if not _graph_inputs(m):
        raise ModelError(f"{where}: the model has no inputs to calibrate")
    return m, where


def calibration_samples(model: onnx.ModelProto,
                        data: str | os.PathLike | Mapping[str, np.ndarray],
                        samples: int | None = None) -> list[dict[str, np.ndarray]]:
    """Split calibration arrays (a ``.npz`` path or a mapping input name -> array) into samples.

    Each array holds its input's samples stacked along the first axis (see the module
    docstring); the result is a list of ``{input name: array of the input's shape}``, at most
    ``samples`` long (default: all). Raises :class:`CalibrationError` (one line naming the file
    and the input) for a missing input, a wrong rank, shape or dtype, NaN or infinity, or
    inputs with different sample counts."""
    where = f"--calibration {os.fspath(data)}" if isinstance(data, (str, os.PathLike)) \
        else "calibration data"
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        arrays = read_npz(path, f"--calibration {path}", "calibration data", CalibrationError)
    else:
        arrays = dict(data)
    if samples is not None and samples < 1:
        raise CalibrationError(f"--samples {samples}: give at least 1 calibration sample")
    split: dict[str, list[np.ndarray]] = {}
    for vi in _graph_inputs(model):
        name, dims, dtype = vi.name, _dims(vi), _np_dtype(vi)
        if name not in arrays:
            raise CalibrationError(f"{where}: no array named '{name}' (have: "
                                   f"{', '.join(arrays) or 'none'}); name each array after its "
                                   "model input")
        a = np.asarray(arrays[name])
        want = "float" if dtype.kind == "f" else "integer" if dtype.kind in "iu" else "bool"
        ok = {"float": "f", "integer": "iu", "bool": "b"}[want]
        if a.dtype.kind not in ok:
            raise CalibrationError(f"{where}: input '{name}' has dtype {a.dtype}, the model "
                                   f"expects {dtype} ({want} numbers)")
        if a.ndim != len(dims) or any(d is not None and d != s
                                      for d, s in zip(dims[1:], a.shape[1:], strict=False)):
            stack = (f" (N samples stacked along the first axis: "
                     f"[{'N' if dims[0] in (None, 1) else f'N*{dims[0]}'}, "
                     f"{_show(dims[1:])[1:]})" if len(dims) > 1 else "")
            raise CalibrationError(f"{where}: input '{name}' has shape {list(a.shape)}, the "
                                   f"model expects {_show(dims)}{stack}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise CalibrationError(f"{where}: input '{name}' contains NaN or infinity")
        a = a.astype(dtype, copy=False)
        if not dims:
            split[name] = [a]
            continue
        batch = dims[0] or 1
        if a.shape[0] == 0 or a.shape[0] % batch:
            raise CalibrationError(f"{where}: input '{name}' has {a.shape[0]} rows along the "
                                   f"first axis, not a positive multiple of the model's batch "
                                   f"{batch}")
        split[name] = [a[i:i + batch] for i in range(0, a.shape[0], batch)]
    counts = {n: len(v) for n, v in split.items()}
    if len(set(counts.values())) > 1:
        have = ", ".join(f"'{n}' {c}" for n, c in counts.items())
        raise CalibrationError(f"{where}: inputs hold different numbers of samples ({have}); "
                               "give every input the same number")
    n = min(next(iter(counts.values())), samples or 1 << 62)
    return [{name: v[i] for name, v in split.items()} for i in range(n)]


def _random_shapes(model: onnx.ModelProto, where: str) -> dict[str, list[int]]:
    """Shapes of random calibration inputs (a dynamic first axis becomes 1)."""
    shapes = {}
    for vi in _graph_inputs(model):
        dims = _dims(vi)
        if vi.type.tensor_type.elem_type not in _FLOAT_TYPES:
            raise CalibrationError(f"{where}: input '{vi.name}' is {_np_dtype(vi)}; random "
                                   "calibration data is float only: give --calibration "
                                   "inputs.npz")
        if any(d is None for d in dims[1:]):
            raise CalibrationError(f"{where}: input '{vi.name}' has dynamic dimensions "
                                   f"{_show(dims)}; give --calibration inputs.npz")
        shapes[vi.name] = [dims[0] or 1, *(d for d in dims[1:] if d is not None)] if dims else []
    return shapes


@contextlib.contextmanager
def _quiet_onnxruntime() -> Iterator[None]:
    """Silence onnxruntime while it quantizes: the quantizer's advice ("consider
    pre-processing...", logged on the root logger) and the native logger's warnings (e.g.
    "Removing initializer ..." of the calibration session); errors still raise. The native
    severity has no getter, so it goes back to onnxruntime's default (warning) afterwards."""
    import onnxruntime

    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    onnxruntime.set_default_logger_severity(3)
    try:
        yield
    finally:
        onnxruntime.set_default_logger_severity(2)
        logging.disable(previous)


def quantize_model(model: onnx.ModelProto | str | os.PathLike,
                   calibration: str | os.PathLike | Mapping[str, np.ndarray]
                   | Sequence[Mapping[str, np.ndarray]] | None = None,
                   scheme: str = "per-channel", activation_type: str = "int8",
                   samples: int | None = None, seed: int = 0) -> onnx.ModelProto:
    """Quantize a float ONNX model to QDQ with onnxruntime's static quantizer.

    Args:
        model: the float model, a path or an ``onnx.ModelProto``.
        calibration: calibration data: a ``.npz`` path or a mapping input name -> array, each
            array holding its input's samples stacked along the first (batch) axis (see the
            module docstring), or an already split sequence of samples
            ``[{input name: array}, ...]``; None: ``samples`` seeded standard-normal samples
            and a :class:`CalibrationWarning`.
        scheme: ``per-channel``, ``per-tensor`` or ``power-of-two`` (:data:`SCHEMES`).
        activation_type: ``int8`` or ``uint8`` (``power-of-two`` needs ``int8``).
        samples: calibration samples used: at most this many of the given data, or this many
            random ones (default :data:`DEFAULT_SAMPLES`).
        seed: seed of the random calibration data.

    Returns:
        The QDQ model (weights int8, biases int32), checked with ``onnx.checker``; its
        ``metadata_props`` record how it was made under :data:`PROVENANCE_KEY`.

    Raises:
        ModelError: unreadable, invalid or already quantized model; nothing to quantize;
            onnxruntime cannot run the model.
        CalibrationError: calibration data that does not fit the model.
        AccelError: unknown scheme or activation type, ``samples < 1``.
    """

    if scheme not in SCHEMES:
        raise AccelError(f"--scheme {scheme}: unknown scheme (available: {', '.join(SCHEMES)})")
    if activation_type not in ACTIVATION_TYPES:
        raise AccelError(f"--activation-type {activation_type}: unknown type (available: "
                         f"{', '.join(ACTIVATION_TYPES)})")
    if scheme == "power-of-two" and activation_type != "int8":
        raise AccelError(f"--activation-type {activation_type}: the power-of-two scheme is "
                         "symmetric int8 (fix-point hardware); use --activation-type int8")
    if samples is not None and samples < 1:
        raise AccelError(f"--samples {samples}: give at least 1 calibration sample")
    m, where = load_model(model)
    if calibration is None:
        data = random_calibration(m, seed, samples or DEFAULT_SAMPLES,
                                      _random_shapes(m, where))
        warnings.warn(f"no --calibration data: calibrating {where} on {len(data)} random "
                      f"sample(s) (seed {seed}), so the scales are not representative of real "
                      "inputs; pass --calibration inputs.npz", CalibrationWarning, stacklevel=2)
    elif isinstance(calibration, (str, os.PathLike, Mapping)):
        data = calibration_samples(m, calibration, samples)
    else:
        data = [s for sample in calibration
                for s in calibration_samples(m, sample)][:samples or None]
        if not data:
            raise CalibrationError("calibration data: no samples")
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    ort_errors = (ort_state.Fail, ort_state.InvalidArgument, ort_state.InvalidGraph,
                  ort_state.NotImplemented, ort_state.RuntimeException)
    try:
        with _quiet_onnxruntime():
            q = ort_quantize(m, activation_type, per_channel=scheme == "per-channel",
                             calib_samples=len(data), seed=seed, cache=False,
                             power_of_two=scheme == "power-of-two", calibration=data)
    except ort_errors as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"{where}: onnxruntime cannot run the model to calibrate it: {msg}"
                         ) from None
    except ValueError as e:  # make_power_of_two: a bias whose layer scales cannot be found
        raise ModelError(f"{where}: cannot make power-of-two scales: {e}") from None
    if not quantized_nodes(q):
        ops = ", ".join(sorted({n.op_type for n in m.graph.node}))
        raise ModelError(f"{where}: nothing to quantize (operators: {ops}); onnxruntime's "
                         "quantizer handles Conv, Gemm, MatMul, Add, pools, ...")
    source = (os.fspath(calibration) if isinstance(calibration, (str, os.PathLike))
              else "random" if calibration is None else "data")
    onnx.helper.set_model_props(q, {**{p.key: p.value for p in q.metadata_props},
                                    PROVENANCE_KEY: json.dumps({
                                        "scheme": scheme, "activation_type": activation_type,
                                        "calibration": source, "samples": len(data),
                                        "seed": seed if calibration is None else None})})
    return q


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Write ``model`` to ``path`` (one-line :class:`AccelError` naming ``-o`` on failure)."""
    path = os.fspath(path)
    try:
        onnx.save(model, path)
    except OSError as e:
        raise AccelError(f"-o {path}: cannot write: {e.strerror or e}") from None


def default_output(model_path: str | os.PathLike) -> str:
    """``model.onnx`` -> ``model_q.onnx`` (same directory)."""
    p = Path(model_path)
    return str(p.with_name(f"{p.stem}_q.onnx"))
