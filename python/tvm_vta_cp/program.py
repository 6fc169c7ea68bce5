"""The planned VTA program: what the strategy hands the codegen (and the blob carries back).

Plain data, so the codegen and the runtime need not import the strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.layout import packed_shape


@dataclass
class TensorPlacement:
    """Where an activation lives in DRAM, packed ``(ceil(N/BATCH), ceil(C/BLOCK), H + halo_t +
    halo_b, W + halo_l + halo_r, BATCH, BLOCK)`` int8; uint8 tensors are stored as value-128.

    A ``blocked`` function input or output crosses the call in that DRAM form (int8, halo and
    padded lanes included): a host function around the call writes (reads) the blocked layout in
    the same pass as its layout rewrite, so the runtime only copies the bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    halo: tuple[int, int, int, int]
    fill: int
    nbytes: int
    blocked: bool = False
    #: a channel-block slice of a wider tensor (a concat input its producer writes in place):
    #: the wider tensor's channel blocks, the stride between batch blocks (0: its own)
    channel_blocks: int = 0

    def io_shape(self, cfg: VTAConfig) -> tuple[int, ...]:
        """Shape of the array that crosses the call for this tensor."""
        return tuple(packed_shape(self, cfg)) if self.blocked else tuple(self.shape)

    @property
    def io_dtype(self) -> str:
        return "int8" if self.blocked else self.dtype


@dataclass
class LayerProgram:
    """One layer's instruction stream (``n_insns`` 128-bit instructions) and what it computes."""

    name: str
    op: str
    insns: bytes
    n_insns: int
    macs: int
    padded_macs: int
    shape: str
    knobs: dict = field(default_factory=dict)


@dataclass
class VTAProgram:
    """A function's layers, its DRAM memory map and the constant image (weights, micro-ops)."""

    dram_size: int
    const_image: list[tuple[int, bytes]]
    tensors: dict[str, TensorPlacement]
    inputs: list[str]
    outputs: list[str]
    layers: list[LayerProgram]
