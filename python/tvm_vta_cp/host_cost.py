"""Host cost model of the VTA target: modelled cycles of the host passes around the calls.

Two kinds of host pass, each with its own throughput in bytes (read plus written) per
accelerator cycle (``VTAConfig.HOST_COPY_BYTES_PER_CYCLE`` / ``HOST_GATHER_BYTES_PER_CYCLE``):

- *copy*: contiguous runs moved with a fixed stride: the NCHWnc padding + blocking of a tensor
  and its inverse (``block`` / ``unblock``), the image-pack ``unpack`` (whole output rows of a
  piece), its inverse ``repack`` (``propagate``) and a ``relayout`` between two calls that is
  only those;
- *gather*: an index list per element: the stencil unroll / im2col (``im2col``), the image pack
  with its replicated halo (``pack``) and a ``relayout`` that includes one of them.

Calibration (the CP paper, section 6.1 and Table 3, row 1: input (2, 1, 161, 700), weight
(32, 1, 5, 20), stride 2): the operator speed-up x104.199 is "663 ms versus the reference", so
the reference operator takes 669.4 ms; the transformation speed-up x0.070 and the combined
x35.411 then give 0.875 ms for the reference's padding + blocking and 12.50 ms for the CP
rewrite. Our byte count of the reference's passes (input blocked from 1 to 16 channels, output
unblocked: 7.28 MB) in 0.875 ms is 8.3 GB/s = 25 bytes per cycle at 333 MHz (copy). The CP
rewrite's data footprint is x2.330 the reference's (10.70 MB of rewritten input, read and
written once) plus the output unblocking at the copy rate: the remaining 12.09 ms for 21.4 MB is
1.77 GB/s = 5.3 bytes per cycle (gather). The paper's other statements agree: its rewrites take
1-60 ms, the padding + blocking is one to two orders of magnitude faster.
"""

from __future__ import annotations

from tvm_vta_cp.hw_config import VTAConfig

__all__ = ["COPY", "GATHER", "KIND_OF_OP", "cycles", "host_metadata", "pass_cycles"]

COPY, GATHER = "copy", "gather"
#: the kind of each host op (``relayout`` is decided per pass: a gather when it rewrites)
KIND_OF_OP = {"block": COPY, "unblock": COPY, "unpack": COPY, "repack": COPY,
              "im2col": GATHER, "pack": GATHER}


def cycles(cfg: VTAConfig, copy_bytes: float = 0, gather_bytes: float = 0) -> float:
    """Modelled host cycles of ``copy_bytes`` moved by copies and ``gather_bytes`` by gathers."""
    return (copy_bytes / cfg.HOST_COPY_BYTES_PER_CYCLE
            + gather_bytes / cfg.HOST_GATHER_BYTES_PER_CYCLE)


def pass_cycles(cfg: VTAConfig, op: str, read: int, written: int, kind: str | None = None
                ) -> float:
    """Modelled cycles of one host pass ``op`` (its kind from :data:`KIND_OF_OP` unless
    given) reading ``read`` and writing ``written`` bytes."""
    kind = kind or KIND_OF_OP[op]
    if kind not in (COPY, GATHER):
        raise ValueError(f"unknown host pass kind {kind!r}")
    n = read + written
    return cycles(cfg, copy_bytes=n) if kind == COPY else cycles(cfg, gather_bytes=n)


def host_metadata(cfg: VTAConfig, h: dict) -> dict:
    """Complete a host function's package metadata (``op``, ``read``, ``written``, optionally
    ``kind``) in place with its modelled ``cycles`` and ``model_us``; returns it."""
    if "kind" not in h:
        h["kind"] = KIND_OF_OP[h["op"]]
    h["cycles"] = pass_cycles(cfg, h["op"], int(h["read"]), int(h["written"]), h["kind"])
    h["model_us"] = h["cycles"] / cfg.CLOCK_MHZ
    return h
