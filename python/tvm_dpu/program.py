"""What the DPU strategy hands to codegen: DDR placements of tensors, per-layer instruction
streams and the whole function's program (the blob's contents)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TensorPlacement:
    """A tensor in DDR: ``region`` + ``offset``, ``n_alloc`` images of ``h x w x c`` bytes.

    ``pix_stride`` > 0 makes it a channel slice of a wider tensor (a concat input placed in its
    concat's output): pixels are ``pix_stride`` bytes apart and images ``h x w x pix_stride``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    region: str
    offset: int
    n_alloc: int
    pix_stride: int = 0

    @property
    def hwc(self) -> tuple[int, int, int]:
        s = self.shape
        return (s[2], s[3], s[1]) if len(s) == 4 else (1, 1, s[1])

    @property
    def pstride(self) -> int:
        return self.pix_stride or self.hwc[2]

    @property
    def img_stride(self) -> int:
        h, w, _ = self.hwc
        return h * w * self.pstride

    @property
    def nbytes(self) -> int:
        """Bytes from ``offset`` to the end of the last image's last pixel."""
        h, w, c = self.hwc
        return (self.n_alloc * h * w - 1) * self.pstride + c


@dataclass
class LayerProgram:
    name: str
    op: str
    insns: bytes
    n_insns: int
    macs: int
    shape: str
    knobs: dict = field(default_factory=dict)
    #: None: the layer's own stream (ending in END); k: part of the function's stream k, whose
    #: layers are consecutive and whose last layer ends in END
    #: (:func:`tvm_dpu.strategy.merge.merge_streams`)
    stream: int | None = None


@dataclass
class DPUProgram:
    tensors: dict[str, TensorPlacement]
    inputs: list[str]
    outputs: list[str]
    region_sizes: dict[str, int]
    params: bytes
    layers: list[LayerProgram]
    fusion: object = None  # FusionReport of the compile (not serialized)
