"""Host <-> device tensor layout: NCHW / NC int8 arrays <-> the DPU's per-image H x W x C bytes
(channels innermost, the FM layout), ``n_alloc`` images per tensor."""

from __future__ import annotations

import numpy as np

from tvm_dpu.program import TensorPlacement


def pack_tensor(x: np.ndarray, p: TensorPlacement) -> np.ndarray:
    """NCHW / NC int8 -> ``n_alloc`` images of H x W x C bytes (extra images zero)."""
    h, w, c = p.hwc
    x4 = x.reshape(x.shape[0], c, h, w) if x.ndim == 4 else x.reshape(x.shape[0], c, 1, 1)
    out = np.zeros((p.n_alloc, h, w, c), dtype=np.int8)
    out[: x.shape[0]] = np.transpose(x4, (0, 2, 3, 1))
    return out.reshape(-1).view(np.uint8)


def unpack_tensor(raw: np.ndarray, p: TensorPlacement) -> np.ndarray:
    """The first ``shape[0]`` images of H x W x C bytes -> NCHW / NC int8."""
    h, w, c = p.hwc
    n = p.shape[0]
    y = raw[: n * h * w * c].view(np.int8).reshape(n, h, w, c)
    return np.ascontiguousarray(np.transpose(y, (0, 3, 1, 2)).reshape(p.shape))
