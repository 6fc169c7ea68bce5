"""The MARSELLUS program: what the strategy hands to the code generator and the runtime.

A :class:`MarsProgram` is the layers' command lists (``codegen`` commands) in order, the static
memory map of the function's tensors (:class:`TensorPlacement` in L2 or L3) and the initial L2
/ L3 images (weights and NormQuant records). :func:`build_blob` / :func:`load_blob` serialize
it with the config it was compiled for; ``runtime.execute_program`` runs it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from tvm_accel.blob import Blob, pack_blob, unpack_target_blob
from tvm_accel.errors import BlobError, DecodeError
from tvm_marsellus.codegen import Command, End, decode_stream, encode_stream
from tvm_marsellus.hw_config import MarsellusConfig, config_from_dict
from tvm_marsellus.layout import activation_bytes

BLOB_TARGET = "marsellus"


@dataclass
class TensorPlacement:
    """Where a program input/output/scratch tensor lives in L2 or L3.

    ``layout`` "hwc" (bit-packed HWC, ``bits`` per element) or "rbe" (bit-plane layout, shape
    (H, W, K)).
    """

    name: str
    shape: tuple[int, ...]
    mem: str = "L2"
    offset: int = 0
    layout: str = "hwc"
    bits: int = 8
    signed: bool = True

    @property
    def nbytes(self) -> int:
        if self.layout == "rbe":
            h, w, k = self.shape
            return activation_bytes(h, w, k, self.bits)
        return -(-math.prod(self.shape) * self.bits // 8)


@dataclass
class LayerProgram:
    """Commands of one layer; ``engine`` is "rbe", "cluster" or "mixed"."""

    name: str
    op: str
    engine: str
    commands: list[Command]
    macs: int = 0
    meta: dict = field(default_factory=dict)
    #: ``encode_stream(commands)`` computed once by :func:`load_blob` (a blob's programs are
    #: cached and never changed), so a run does not encode the commands again; None otherwise
    encoded: bytes | None = field(default=None, repr=False, compare=False)

    def stream(self) -> bytes:
        """The layer's commands with an END, as one simulator run takes them."""
        return self.encoded if self.encoded is not None else encode_stream(self.commands)


@dataclass
class MarsProgram:
    """What the compiler fills: layers in order, the memory map and the initial L2/L3 images
    (weights and NormQuant parameters, placed from offset 0)."""

    layers: list[LayerProgram]
    tensors: dict[str, TensorPlacement] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    l2_image: bytes = b""
    l3_image: bytes = b""
    l2_bytes: int = 0
    l3_bytes: int = 0
    #: runs of the program over a batch that does not fit L2 / L3 at once: the tensors hold
    #: ``batch / passes`` images, the host feeds each run its slice (``strategy.batch``)
    passes: int = 1

    def stream(self) -> bytes:
        """Every layer's commands back to back, one END at the end."""
        return encode_stream([c for ly in self.layers for c in ly.commands])

    def check(self, cfg: MarsellusConfig) -> None:
        """Memory-map consistency against a config (BlobError naming the tensor)."""
        if not 0 <= self.l2_bytes <= cfg.L2_BYTES or len(self.l2_image) > max(self.l2_bytes, 0):
            raise BlobError(f"marsellus program: L2 use {self.l2_bytes} bytes (image "
                            f"{len(self.l2_image)}) exceeds L2 of {cfg.L2_BYTES}")
        if not 0 <= self.l3_bytes <= cfg.L3_BYTES or len(self.l3_image) > max(self.l3_bytes, 0):
            raise BlobError(f"marsellus program: L3 use {self.l3_bytes} bytes (image "
                            f"{len(self.l3_image)}) exceeds L3 of {cfg.L3_BYTES}")
        if self.passes < 1:
            raise BlobError(f"marsellus program: {self.passes} batch passes")
        for t in self.tensors.values():
            size = {"L2": self.l2_bytes, "L3": self.l3_bytes}.get(t.mem)
            if size is None or t.layout not in ("hwc", "rbe") or t.bits not in range(1, 9):
                raise BlobError(f"marsellus program: tensor {t.name} has an invalid placement "
                                f"({t.mem}, {t.layout}, {t.bits} bits)")
            if t.offset < 0 or t.offset + t.nbytes > size:
                raise BlobError(f"marsellus program: tensor {t.name} [{t.offset}, "
                                f"{t.offset + t.nbytes}) lies outside {t.mem} ({size} bytes)")
        for n in self.inputs + self.outputs:
            if n not in self.tensors:
                raise BlobError(f"marsellus program: input/output {n} has no placement")


def build_blob(program: MarsProgram, cfg: MarsellusConfig, name: str = "") -> bytes:
    """Serialize a program. Sections: ``HWCF`` (config JSON), ``META`` (memory map, layer table),
    ``CMDS`` (the encoded stream), ``L2IM`` / ``L3IM`` (initial memory images)."""
    program.check(cfg)
    layers, off = [], 0
    for ly in program.layers:
        n = len(ly.commands)
        layers.append({"name": ly.name, "op": ly.op, "engine": ly.engine, "cmd_offset": off,
                       "n_cmds": n, "macs": ly.macs, "meta": ly.meta})
        off += n
    tensors = {t.name: {"shape": list(t.shape), "mem": t.mem, "offset": t.offset,
                        "layout": t.layout, "bits": t.bits, "signed": t.signed}
               for t in program.tensors.values()}
    meta = {"name": name, "inputs": program.inputs, "outputs": program.outputs,
            "tensors": tensors, "layers": layers, "l2_bytes": program.l2_bytes,
            "l3_bytes": program.l3_bytes, "passes": program.passes}
    cfg_json = dict(cfg.to_json(), name=cfg.name)
    return pack_blob(Blob(BLOB_TARGET, cfg.fingerprint, {
        "HWCF": json.dumps(cfg_json).encode(),
        "META": json.dumps(meta).encode(),
        "CMDS": program.stream(),
        "L2IM": bytes(program.l2_image),
        "L3IM": bytes(program.l3_image),
    }))


def load_blob(data: bytes, expect_config: MarsellusConfig | None = None
              ) -> tuple[MarsProgram, MarsellusConfig, str]:
    """Validate a MARSELLUS blob and rebuild ``(MarsProgram, config, name)``; errors are
    :class:`BlobError`."""
    blob, cfg, meta = unpack_target_blob(data, BLOB_TARGET, config_from_dict, expect_config)
    try:
        cmds = decode_stream(blob.section("CMDS"))
    except DecodeError as e:
        raise BlobError(f"marsellus blob: CMDS section does not decode ({e})") from None
    if not cmds or not isinstance(cmds[-1], End) or any(isinstance(c, End) for c in cmds[:-1]):
        raise BlobError("marsellus blob: CMDS section must end with exactly one END")
    try:
        layers = []
        for ly in meta["layers"]:
            lo, n = int(ly["cmd_offset"]), int(ly["n_cmds"])
            if lo < 0 or n < 0 or lo + n > len(cmds) - 1:
                raise BlobError(f"marsellus blob: layer {ly['name']} commands [{lo}, {lo + n}) "
                                f"lie outside the CMDS section ({len(cmds) - 1} commands)")
            layers.append(LayerProgram(name=str(ly["name"]), op=str(ly["op"]),
                                       engine=str(ly["engine"]), commands=cmds[lo:lo + n],
                                       macs=int(ly["macs"]), meta=dict(ly["meta"]),
                                       encoded=encode_stream(cmds[lo:lo + n])))
        tensors = {str(k): TensorPlacement(name=str(k), shape=tuple(int(s) for s in t["shape"]),
                                           mem=str(t["mem"]), offset=int(t["offset"]),
                                           layout=str(t["layout"]), bits=int(t["bits"]),
                                           signed=bool(t["signed"]))
                   for k, t in meta["tensors"].items()}
        prog = MarsProgram(layers=layers, tensors=tensors,
                           inputs=[str(x) for x in meta["inputs"]],
                           outputs=[str(x) for x in meta["outputs"]],
                           l2_image=blob.section("L2IM"), l3_image=blob.section("L3IM"),
                           l2_bytes=int(meta["l2_bytes"]), l3_bytes=int(meta["l3_bytes"]),
                           passes=int(meta.get("passes", 1)))
        name = str(meta.get("name", ""))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, BlobError):
            raise
        raise BlobError(f"marsellus blob: META section is malformed ({e!r}); recompile the "
                        "model") from None
    prog.check(cfg)
    return prog, cfg, name


__all__ = ["BLOB_TARGET", "LayerProgram", "MarsProgram", "TensorPlacement", "build_blob",
           "load_blob"]
