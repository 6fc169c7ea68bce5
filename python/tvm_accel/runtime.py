"""Runtime pieces shared by every target's ``<package>.run`` packed function.

A target supplies ``load_blob(bytes) -> (program, config, name)`` and
``run_blob(blob, inputs, decoded=None) -> outputs`` (``decoded``: the blob's decode when the
caller has it); this module caches decoded blobs, checks the inputs against the blob's memory
map, and registers the ``call_dps_packed`` entry that writes the outputs into the buffers the
Relax VM allocated.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm_ffi

from tvm_accel.errors import BlobError


class BlobCache:
    """Validated ``(program, config, name)`` of blobs, keyed by size and checksum.

    A runtime decodes its blob on every call (a VM constant, handed over as a fresh copy each
    time). The last blob of each size is also kept as a private copy: a call whose blob
    equals it byte for byte (a compare, ~4x cheaper than the CRC-32 of a 0.5 MB blob) gets
    its decode without the checksum; any other blob takes the checksum path."""

    def __init__(self, load: Callable[[bytes], tuple], capacity: int = 64):
        self._load = load
        self._capacity = capacity
        self._hits: dict[tuple[int, int], tuple] = {}
        self._last: dict[int, tuple[np.ndarray, tuple]] = {}

    def decode(self, data: np.ndarray) -> tuple:
        last = self._last.get(data.size)
        if last is not None and last[0].dtype == data.dtype and last[0].shape == data.shape \
                and np.array_equal(last[0], data):
            return last[1]
        key = (data.size, zlib.crc32(data))  # type: ignore[arg-type]  # numpy: a buffer
        hit = self._hits.get(key)
        if hit is None:
            hit = self._load(data.tobytes())
            if len(self._hits) >= self._capacity:
                self._hits.clear()
                self._last.clear()
            self._hits[key] = hit
        self._last[data.size] = (np.array(data, copy=True), hit)
        return hit


def check_inputs(program, inputs: list[np.ndarray], target: str, name: str,
                 io: Callable[[Any], tuple[tuple[int, ...], str]] | None = None) -> dict:
    """Inputs by tensor name, after checking count, shape and dtype against the blob. ``io``
    gives the ``(shape, dtype)`` a placement expects at the call when that is not its logical
    shape and dtype (VTA's host-blocked tensors)."""
    if len(inputs) != len(program.inputs):
        raise BlobError(f"{target} function {name} takes {len(program.inputs)} inputs, got "
                        f"{len(inputs)}")
    feed = {}
    for tname, arr in zip(program.inputs, inputs, strict=True):
        p = program.tensors[tname]
        shape, dtype = io(p) if io is not None else (tuple(p.shape), p.dtype)
        if tuple(arr.shape) != tuple(shape) or str(arr.dtype) != dtype:
            raise BlobError(f"{target} function {name}: input {tname} is "
                            f"{arr.dtype}{list(arr.shape)}, the blob expects "
                            f"{dtype}{list(shape)}")
        feed[tname] = arr
    return feed


def register_run(func_name: str, cache: BlobCache,
                 run_blob: Callable[..., list[np.ndarray]]) -> None:
    """Register the packed function ``(blob, *inputs, *outputs)`` behind call_dps_packed. The
    blob (a VM constant) is read in place through DLPack, not copied, and decoded once per
    call: ``run_blob(blob, inputs, decoded)`` gets the decode."""

    def _run(blob, *args):
        data = np.from_dlpack(blob)
        decoded = cache.decode(data)
        n_in = len(decoded[0].inputs)
        results = run_blob(data, [a.numpy() for a in args[:n_in]], decoded)
        outs = args[n_in:]
        if len(outs) != len(results):
            raise BlobError(f"{func_name}: the function expects {len(results)} output buffers, "
                            f"got {len(outs)}")
        for t, r in zip(outs, results, strict=True):
            t.copyfrom(np.ascontiguousarray(r.astype(str(t.dtype))))

    tvm_ffi.register_global_func(func_name, _run, override=True)
