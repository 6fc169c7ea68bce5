"""The versioned program-blob container shared by every target (docs/architecture.md section 5).

Layout (little-endian)::

    magic      8 bytes   b"ACCLBLOB"
    version    u16       FORMAT_VERSION
    n_sections u16
    target     16 bytes  target kind, NUL padded ("vta", "dpu", "marsellus")
    fingerprint 16 bytes hardware-config digest
    crc32      u32       of everything after the header
    table      n_sections x (tag 4 bytes, offset u64, size u64), offsets from the blob start
    payload    section bytes

Sections are opaque to the core; each target names its own (e.g. ``META`` JSON, ``INSN``,
``CNST``, ``HWCF``). :func:`unpack_blob` checks magic, version, target, fingerprint, checksum
and every section bound before a target or the simulator sees the bytes.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tvm_accel.errors import BlobError, ConfigError

MAGIC = b"ACCLBLOB"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHH16s16sI")
_ENTRY = struct.Struct("<4sQQ")


@dataclass
class Blob:
    """A decoded blob: target kind, config fingerprint and named sections."""

    target: str
    fingerprint: bytes
    sections: dict[str, bytes]

    def section(self, tag: str) -> bytes:
        if tag not in self.sections:
            raise BlobError(f"{self.target} blob has no '{tag}' section (corrupt or from another "
                            "toolchain version); recompile the model")
        return self.sections[tag]

    def json_section(self, tag: str) -> dict:
        try:
            return json.loads(self.section(tag).decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BlobError(f"{self.target} blob: section '{tag}' is not valid JSON ({e}); "
                            "recompile the model") from None


def pack_blob(blob: Blob) -> bytes:
    """Serialize a blob (sections in insertion order)."""
    target = blob.target.encode()
    if len(target) > 16 or len(blob.fingerprint) != 16:
        raise ValueError("target name must be <= 16 bytes and the fingerprint 16 bytes")
    offset = _HEADER.size + _ENTRY.size * len(blob.sections)
    table, payload = [], []
    for tag, data in blob.sections.items():
        t = tag.encode()
        if len(t) != 4:
            raise ValueError(f"section tag {tag!r} must be 4 ASCII characters")
        table.append(_ENTRY.pack(t, offset, len(data)))
        payload.append(bytes(data))
        offset += len(data)
    body = b"".join(table) + b"".join(payload)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(blob.sections), target, blob.fingerprint,
                          zlib.crc32(body))
    return header + body


def unpack_blob(data: bytes, expect_target: str | None = None,
                expect_fingerprint: bytes | None = None) -> Blob:
    """Validate and decode a blob; every failure is a one-line :class:`BlobError`."""
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise BlobError(f"program blob truncated: {len(data)} bytes, header needs {_HEADER.size}")
    magic, version, n, target_b, fp, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BlobError(f"not a program blob (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise BlobError(f"program blob format version {version} is not supported (this toolchain "
                        f"reads version {FORMAT_VERSION}); recompile the model")
    target = target_b.rstrip(b"\0").decode(errors="replace")
    if expect_target is not None and target != expect_target:
        raise BlobError(f"program blob is for target '{target}', not '{expect_target}'")
    table_end = _HEADER.size + n * _ENTRY.size
    if table_end > len(data):
        raise BlobError(f"{target} blob truncated: section table needs {table_end} bytes, "
                        f"blob has {len(data)}")
    if zlib.crc32(data[_HEADER.size:]) != crc:
        raise BlobError(f"{target} blob checksum mismatch: the blob is corrupt or truncated")
    if expect_fingerprint is not None and fp != expect_fingerprint:
        raise BlobError(f"{target} blob was compiled for another hardware config (fingerprint "
                        f"{fp.hex()[:12]}, expected {expect_fingerprint.hex()[:12]}); recompile "
                        "with the config you run with")
    sections: dict[str, bytes] = {}
    for i in range(n):
        tag_b, off, size = _ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)
        tag = tag_b.decode(errors="replace")
        if off < table_end or off + size > len(data):
            raise BlobError(f"{target} blob section '{tag}' [{off}, {off + size}) lies outside "
                            f"the blob ({len(data)} bytes)")
        sections[tag] = data[off : off + size]
    return Blob(target, fp, sections)


def unpack_target_blob(data: bytes, target: str, config_from_dict: Callable[..., Any],
                       expect_config: Any = None) -> tuple[Blob, Any, dict]:
    """The checks every target's ``load_blob`` starts with: :func:`unpack_blob` for
    ``target``, the hardware config rebuilt from the ``HWCF`` section with the target's
    ``config_from_dict`` and matched against the fingerprint, and the ``META`` JSON section.
    Returns ``(blob, config, meta)``; every problem is a :class:`BlobError`."""
    blob = unpack_blob(data, expect_target=target,
                       expect_fingerprint=expect_config.fingerprint if expect_config else None)
    raw = blob.json_section("HWCF")
    if not isinstance(raw, dict):
        raise BlobError(f"{target} blob: HWCF section is not a JSON object; recompile the model")
    try:
        cfg = config_from_dict({k: v for k, v in raw.items() if k != "name"},
                               where="blob HWCF section", name=str(raw.get("name", "custom")))
    except ConfigError as e:
        raise BlobError(f"{target} blob carries an invalid hardware config: {e}") from None
    if cfg.fingerprint != blob.fingerprint:
        raise BlobError(f"{target} blob: embedded hardware config does not match its fingerprint")
    meta = blob.json_section("META")
    if not isinstance(meta, dict):
        raise BlobError(f"{target} blob: META section is not a JSON object; recompile the model")
    return blob, cfg, meta
