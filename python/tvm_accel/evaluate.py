"""Dataset accuracy of a compiled package (``tvmc run --inputs data.npz --labels ...``).

Samples come stacked along a leading axis, as for ``tvmc quantize --calibration``: a model that
takes ``[B, 3, 32, 32]`` gets ``[N, 3, 32, 32]`` with N a multiple of B (one sample per image
for the usual batch-1 model). Each batch of B samples is one run of the package on the
simulator; the outputs come back stacked the same way. With labels, top-1 / top-5 accuracy of
the first output; with a reference ONNX model (normally the QDQ model the package was compiled
from), onnxruntime runs the same samples and the result counts the samples whose top-1 class
differs.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tvm_accel.errors import AccelError


class DatasetError(AccelError):
    """Samples, labels or a reference model that do not fit the package."""


#: name of the labels array inside an inputs ``.npz`` (unless the model has an input so named)
LABELS_KEY = "labels"


@dataclass
class EvalResult:
    """:func:`evaluate`'s result: accuracies in [0, 1] (None where not computable)."""

    n: int
    top1: float | None
    top5: float | None
    #: onnxruntime's top-1 accuracy on the reference model (needs labels and a reference)
    ref_top1: float | None
    #: samples whose top-1 class differs from onnxruntime's (needs a reference)
    top1_disagree: int | None
    #: the package's outputs, stacked along the leading axis, one array per model output
    outputs: list[np.ndarray]
    seconds: float = 0.0
    ref_top5: float | None = None
    #: worker processes (or farm servers) the samples ran on
    jobs: int = 1
    #: whether they ran on a farm (``--rpc-tracker``)
    farm: bool = False

    def format(self, reference: str = "onnxruntime") -> str:
        """Summary lines for the CLI."""
        on = f" on {self.jobs} farm servers" if self.farm else \
            f" on {self.jobs} processes" if self.jobs > 1 else ""
        lines = [f"{self.n} samples in {self.seconds:.1f} s{on}"]
        if self.top1 is not None:
            top5 = "" if self.top5 is None else f", top-5 {100 * self.top5:.2f}%"
            lines.append(f"accuracy: top-1 {100 * self.top1:.2f}%{top5}")
        if self.top1_disagree is not None:
            acc = "" if self.ref_top1 is None else f" (its top-1 {100 * self.ref_top1:.2f}%" + (
                "" if self.ref_top5 is None else f", top-5 {100 * self.ref_top5:.2f}%") + ")"
            lines.append(f"vs {reference}{acc}: top-1 class differs on {self.top1_disagree} of "
                         f"{self.n} samples")
        return "\n".join(lines)


def stacked_samples(data: Mapping[str, np.ndarray], specs: list, where: str
                    ) -> tuple[dict[str, np.ndarray], int]:
    """The arrays of ``data`` for the model inputs ``specs`` (objects with ``name``, ``shape``,
    ``dtype``), each ``[N, *shape[1:]]``, and N; a one-line error for a missing input, another
    shape, a sample count that is not a multiple of the batch or that differs between inputs."""
    out: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for spec in specs:
        if spec.name not in data:
            raise DatasetError(f"{where}: no array named '{spec.name}' (have: "
                             f"{', '.join(data) or 'none'}); give one array per model input")
        arr = np.asarray(data[spec.name])
        shape = list(spec.shape)
        if arr.ndim != len(shape) or list(arr.shape[1:]) != shape[1:] or not arr.shape[0]:
            raise DatasetError(f"{where}: input '{spec.name}' has shape {list(arr.shape)}; the "
                             f"model takes {shape}: give [N, {', '.join(map(str, shape[1:]))}] "
                             "for N samples")
        if arr.dtype.kind not in "biuf" or (arr.dtype.kind == "f"
                                            and not np.isfinite(arr).all()):
            raise DatasetError(f"{where}: input '{spec.name}' is not finite real numbers")
        if arr.shape[0] % shape[0]:
            raise DatasetError(f"{where}: input '{spec.name}' holds {arr.shape[0]} samples, not "
                             f"a multiple of the model's batch {shape[0]}")
        out[spec.name] = arr.astype(spec.dtype)
        counts[spec.name] = arr.shape[0]
    if len(set(counts.values())) > 1:
        raise DatasetError(f"{where}: the inputs hold different numbers of samples ("
                         + ", ".join(f"{k}: {v}" for k, v in counts.items()) + ")")
    return out, next(iter(counts.values()), 0)


def read_labels(labels: Any, n: int, where: str = "labels") -> np.ndarray:
    """Class labels as an int64 ``[n]`` array (from a ``.npy`` path or an array); one-line
    errors for another count or non-integer values."""
    if isinstance(labels, (str, os.PathLike)):
        where = os.fspath(labels)
        try:
            labels = np.load(where, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise DatasetError(f"{where}: cannot read the labels: {e} (save an integer array "
                             "with np.save)") from None
        if not isinstance(labels, np.ndarray):
            raise DatasetError(f"{where}: holds several arrays; give one .npy of class indices")
    arr = np.asarray(labels)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "biuf"
                                       or not np.array_equal(arr, np.round(arr)))):
        raise DatasetError(f"{where}: labels must be one integer class index per sample, got "
                         f"{arr.dtype} of shape {list(arr.shape)}")
    if arr.shape[0] != n:
        raise DatasetError(f"{where}: {arr.shape[0]} labels for {n} samples; give one label per "
                         "sample")
    return arr.astype(np.int64)


def top_k(scores: np.ndarray, labels: np.ndarray, k: int) -> float | None:
    """Share of rows of ``scores`` ``[N, C]`` whose label is among the k highest (None if the
    model has fewer than k classes). Ties go to the lower class index, as ``argmax``."""
    if scores.shape[1] < k:
        return None
    if np.any((labels < 0) | (labels >= scores.shape[1])):
        bad = int(labels[(labels < 0) | (labels >= scores.shape[1])][0])
        raise DatasetError(f"labels: class {bad} is outside the model's {scores.shape[1]} "
                         "classes")
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return float(np.mean(np.any(order == labels[:, None], axis=1)))


def _scores(out: np.ndarray, n: int) -> np.ndarray:
    return np.asarray(out, dtype=np.float64).reshape(n, -1)


def _batches(arrays: dict[str, np.ndarray], specs: list, n: int):
    b = int(specs[0].shape[0]) if specs else 1
    for start in range(0, n, b):
        yield [arrays[s.name][start:start + b] for s in specs]


def _reference_session(reference: Any, specs: list):
    """onnxruntime session of the reference model, its inputs checked against the package's."""
    from tvm_accel.compare import ort_session
    from tvm_accel.errors import ModelError
    from tvm_accel.frontend import _check, _read_model

    try:
        model, where = _read_model(os.fspath(reference) if isinstance(reference, os.PathLike)
                                   else reference)
        _check(model, where)
    except ModelError as e:
        raise DatasetError(str(e)) from None
    inits = {t.name for t in model.graph.initializer}
    theirs = {i.name: [d.dim_value or None for d in i.type.tensor_type.shape.dim]
              for i in model.graph.input if i.name not in inits}
    for s in specs:
        dims = theirs.get(s.name)
        if dims is None or len(dims) != len(s.shape) or any(
                d not in (None, want) for d, want in zip(dims, s.shape, strict=True)):
            raise DatasetError(f"{where}: the reference takes {s.name!r} as "
                               f"{dims if dims is not None else 'nothing'}, the package as "
                               f"{list(s.shape)}; give the model the package was compiled "
                               "from")
    return ort_session(model), where


def _reference_outputs(sess, specs: list, arrays: dict[str, np.ndarray], n: int,
                       progress: Callable[[int, int], None] | None) -> np.ndarray:
    """onnxruntime's first output for every sample (stacked)."""
    outs = []
    for i, batch in enumerate(_batches(arrays, specs, n)):
        outs.append(sess.run(None, {s.name: x for s, x in zip(specs, batch, strict=True)})[0])
        if progress:
            progress(i + 1, -1)
    return np.concatenate(outs)


def evaluate(package_path: Any, inputs: Any, labels: Any = None, reference: Any = None, *,
             progress: Callable[[int, int], None] | None = None,
             jobs: int | None = 1, farm: Any = None) -> EvalResult:
    """Run the package at ``package_path`` on every sample of ``inputs`` (a ``.npz`` path or a
    mapping input name -> ``[N, ...]`` array; a ``labels`` array in it serves as ``labels``)
    and score the first output against ``labels`` (a ``.npy`` path or an array of N class
    indices) and against onnxruntime running ``reference`` (an ONNX path or ModelProto).
    ``progress(done, total)`` is called after each batch (total -1: the reference's).

    ``jobs`` > 1 spreads the batches over that many worker processes (see
    :func:`_run_batches`); ``None`` picks by the first batch's time: this machine's CPUs when
    the rest would take longer than :data:`WORTH_SPAWNING` seconds in one process, else one
    process (a forked worker starts in milliseconds, a spawned one in about a second and a
    half, so the bar is lower where processes fork); with ``farm`` (a
    :class:`tvm_accel.farm.Farm`) they run on its servers instead, ``jobs`` of them at once.
    Either way the outputs are identical to a one-process run, in input order."""
    from tvm_accel.frontend import read_npz
    from tvm_accel.package import load_package

    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise DatasetError(f"jobs must be a positive integer, got {jobs!r}")
    where = "inputs"
    if isinstance(inputs, (str, os.PathLike)):
        where = os.fspath(inputs)
        inputs = read_npz(where, where, "inputs", DatasetError)
    pkg = load_package(os.fspath(package_path))
    specs = pkg.meta.inputs
    data = dict(inputs)
    if labels is None and LABELS_KEY in data and LABELS_KEY not in {s.name for s in specs}:
        labels = data[LABELS_KEY]
    arrays, n = stacked_samples(data, specs, where)
    label_arr = None if labels is None else read_labels(labels, n)
    ref_sess = None if reference is None else _reference_session(reference, specs)[0]
    t0 = time.perf_counter()
    batches = list(_batches(arrays, specs, n))
    if farm is not None:
        from tvm_accel import farm as _farm
        from tvm_accel import simlib

        per_batch = _farm.run_batches(farm, os.fspath(package_path), batches,
                                      simlib.current_cycle_budget(), jobs, progress)
        used = min(jobs or farm.servers, farm.servers, len(batches))
    else:
        per_batch, used = _run_batches(pkg, os.fspath(package_path), batches, jobs, progress)
    seconds = time.perf_counter() - t0
    outputs = [np.concatenate(parts) for parts in zip(*per_batch, strict=True)]
    scores = _scores(outputs[0], n)
    result = EvalResult(n, None, None, None, None, outputs, seconds,
                        jobs=used, farm=farm is not None)
    if label_arr is not None:
        result.top1, result.top5 = top_k(scores, label_arr, 1), top_k(scores, label_arr, 5)
    if ref_sess is not None:
        ref = _scores(_reference_outputs(ref_sess, specs, arrays, n, progress), n)
        if ref.shape != scores.shape:
            raise DatasetError(f"reference: its first output has {ref.shape[1]} values per "
                             f"sample, the package's {scores.shape[1]}; give the model the "
                             "package was compiled from")
        result.top1_disagree = int(np.count_nonzero(np.argmax(ref, axis=1)
                                                    != np.argmax(scores, axis=1)))
        if label_arr is not None:
            result.ref_top1, result.ref_top5 = top_k(ref, label_arr, 1), top_k(ref, label_arr, 5)
    return result


def default_jobs() -> int:
    """The CPUs this process may run on (``--jobs`` default)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: seconds of one-process work above which ``jobs=None`` starts worker processes: spawned
#: ones import TVM and load the package (~1.5 s each), forked ones start in milliseconds
WORTH_SPAWNING = 5.0
WORTH_FORKING = 0.5


def worker_start_method() -> str:
    """``fork`` where the OS has it (a worker inherits the loaded package: it starts in
    milliseconds instead of importing TVM again), else ``spawn``. Forking a process that has
    run TVM code is safe here because the forked worker runs TVM's parallel loops inline
    (``TVM_NUM_THREADS=1``, read on every launch): it never touches the thread pool it
    inherited without its threads, and the simulator is plain C called through ctypes."""
    import multiprocessing

    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _run_batches(pkg, package_path: str, batches: list[list[np.ndarray]], jobs: int | None,
                 progress: Callable[[int, int], None] | None
                 ) -> tuple[list[list[np.ndarray]], int]:
    """The package's outputs for every batch, in order, and the processes used. One job runs
    them here. More: ``jobs - 1`` workers (forked with this process's loaded VM, or spawned
    and loading the package once: :func:`worker_start_method`), running under this process's
    cycle budget, take chunks of consecutive batches (:data:`CHUNKS_PER_JOB` per process)
    from the front while this process, already warm, takes them from the back (a chunk no
    worker has started is cancelled and run here), so a worker's start-up is not lost time.
    ``None``: the first batch runs here and decides (see :func:`evaluate`)."""
    import tvm

    from tvm_accel import simlib
    from tvm_accel.package import outputs_to_numpy

    total = len(batches)
    results: list[list[np.ndarray] | None] = [None] * total
    done = 0
    vm = None

    def store(i: int, outs: list[np.ndarray]) -> None:
        nonlocal done
        results[i] = outs
        done += 1
        if progress:
            progress(done, total)

    def here(i: int) -> None:
        nonlocal vm
        vm = vm or pkg.vm()
        store(i, outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(x) for x in batches[i]])))

    first = 0
    if jobs is None:
        t0 = time.perf_counter()
        here(0)
        first = 1
        rest = (time.perf_counter() - t0) * (total - 1)
        worth = WORTH_FORKING if worker_start_method() == "fork" else WORTH_SPAWNING
        jobs = default_jobs() if rest > worth else 1
    jobs = min(jobs, total - first)
    if jobs <= 1:
        for i in range(first, total):
            here(i)
        return [r for r in results if r is not None], 1
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = worker_start_method()
    if method == "fork":
        vm = vm or pkg.vm()
        _WORKER["vm"] = vm  # inherited by the workers, forked at the first submit
    try:
        with ProcessPoolExecutor(jobs - 1, mp_context=multiprocessing.get_context(method),
                                 initializer=_worker_init,
                                 initargs=(None if method == "fork" else package_path,
                                           simlib.current_cycle_budget())) as pool:
            size = max(1, (total - first) // (jobs * CHUNKS_PER_JOB))
            chunks = [range(s, min(s + size, total)) for s in range(first, total, size)]
            futures = [pool.submit(_worker_run, [batches[i] for i in ch]) for ch in chunks]
            for ch, fut in zip(reversed(chunks), reversed(futures), strict=True):
                if fut.cancel():
                    for i in ch:
                        here(i)
            for ch, fut in zip(chunks, futures, strict=True):
                if results[ch.start] is None:
                    for i, outs in zip(ch, fut.result(), strict=True):
                        store(i, outs)
    finally:
        if method == "fork":
            _WORKER.pop("vm", None)
    return [r for r in results if r is not None], jobs


_WORKER: dict[str, Any] = {}
#: chunks of batches per process: workers take them from the front, the caller from the back
CHUNKS_PER_JOB = 8


def _worker_init(package_path: str | None, max_cycles: int | None) -> None:
    """A spawned worker loads the package; a forked one (``package_path`` None) has the
    caller's VM already and runs TVM's parallel loops inline (:func:`worker_start_method`)."""
    if package_path is None:
        os.environ["TVM_NUM_THREADS"] = "1"
    else:
        from tvm_accel.package import load_package

        _WORKER["vm"] = load_package(package_path).vm()
    _WORKER["max_cycles"] = max_cycles


def _worker_run(chunk: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """The outputs of a chunk of consecutive batches (one task: the pool's per-task cost,
    ~0.3 ms, is paid once per chunk, not per 5 ms batch)."""
    import tvm

    from tvm_accel import simlib
    from tvm_accel.package import outputs_to_numpy

    try:
        with simlib.cycle_budget(_WORKER["max_cycles"]):
            return [outputs_to_numpy(_WORKER["vm"]["main"](*[tvm.runtime.tensor(x)
                                                             for x in batch]))
                    for batch in chunk]
    except Exception as e:  # comes back to the caller pickled: keep its type where it can
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:
            raise RuntimeError(str(e)) from None
        raise


class ProgressBar:
    """A one-line progress bar on stderr for :func:`evaluate` (redrawn on a terminal at most
    ten times a second; elsewhere silent, the summary says how long it took)."""

    def __init__(self, what: str = "samples", stream=None):
        self.stream = stream or sys.stderr
        self.what = what
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.last = 0.0
        self.total = 0

    def __call__(self, done: int, total: int) -> None:
        if not self.tty:
            return
        label = "onnxruntime" if total < 0 else self.what
        total = self.total if total < 0 else total
        self.total = total
        now = time.perf_counter()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        width = 30
        fill = int(width * done / max(total, 1))
        self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total} {label}")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()
