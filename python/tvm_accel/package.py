"""Compiled-model package: a ``.tar`` holding ``mod.so`` (the exported TVM library, blobs inside)
and ``metadata.json`` (target, config, input/output signature, offload list), like tvmc's
package. Loading needs only this file and the installed toolchain.

``metadata.json`` records the size and sha256 of every other file of the package and a digest of
itself. :func:`load_package` checks them all before the shared library is loaded: ``dlopen`` of a
truncated ``mod.so`` dies with SIGBUS, and a hand-edited metadata (another target, another input
shape) only fails deep inside the VM. A damaged, truncated or foreign package is one
:class:`~tvm_accel.errors.PackageError` line instead.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import tvm
from tvm import relax

from tvm_accel.errors import AccelError, PackageError

#: 2: ``files`` (size + sha256 of mod.so and the blobs) and ``digest`` (of the metadata itself)
PACKAGE_FORMAT = 2
RECOMPILE = "recompile the model with 'tvmc compile'"


@dataclass
class TensorSpec:
    name: str
    shape: list[int]
    dtype: str


@dataclass
class PackageMetadata:
    target: str
    host: str
    config: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    offloads: list[dict] = field(default_factory=list)
    format: int = PACKAGE_FORMAT
    host_functions: list[dict] = field(default_factory=list)
    #: archive name -> {"size": bytes, "sha256": hex digest} of every file but metadata.json
    files: dict[str, dict] = field(default_factory=dict)
    #: the tool that wrote it (``tvmc --version``), the hardware config's fields and the
    #: compile-time knobs (strategy, operating point, ...), so a package says how it was built
    tool: str = ""
    config_fields: dict = field(default_factory=dict)
    knobs: dict = field(default_factory=dict)
    #: sha256 of the metadata without this field (see :func:`metadata_digest`)
    digest: str = ""


def file_record(data: bytes) -> dict:
    """``{"size", "sha256"}`` of one package file, as stored in ``metadata.json``."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def metadata_digest(raw: dict) -> str:
    """sha256 of the metadata dict without its ``digest`` entry (keys sorted), so any edit of
    ``metadata.json`` after compile is detected."""
    body = {k: v for k, v in raw.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def check_linker() -> None:
    """Refuse early, in one line, when no C/C++ compiler can link ``mod.so``.

    TVM's ``export_library`` links the package's shared library with the system compiler it
    finds (``$CXX`` or ``$CC``, else the first of g++, gcc, clang++, clang, c++, cc on ``PATH``)
    and fails with an unrelated ``TypeError`` when there is none. Running a package needs none.
    """
    from tvm.support.cc import get_cc

    cc = get_cc()
    name = shlex.split(cc)[0] if cc and cc.strip() else None
    if name is None or shutil.which(name) is None:
        what = f"the compiler '{name}' ($CXX/$CC) is not found" if name else (
            "none of g++, gcc, clang++, clang, c++, cc is on PATH")
        raise PackageError(f"a C/C++ compiler is needed to link the package's mod.so: {what}; "
                           "install one (Debian/Ubuntu: apt-get install g++) or set CXX")


def save_package(path: str, executable, meta: PackageMetadata,
                 blobs: dict[str, bytes] | None = None) -> PackageMetadata:
    """Export ``executable`` and write the package to ``path`` (``blobs`` kept for inspection).

    The sizes and checksums of the files and the metadata digest are filled in here; the
    metadata as written is returned. The package is written next to ``path`` and renamed into
    place, so a failed write never leaves a truncated package behind."""
    check_linker()
    with tempfile.TemporaryDirectory() as tmp:
        lib = os.path.join(tmp, "mod.so")
        executable.export_library(lib)
        with open(lib, "rb") as f:
            members = {"mod.so": f.read()}
        members.update({f"blobs/{name}.bin": bytes(b) for name, b in (blobs or {}).items()})
        meta = replace(meta, format=PACKAGE_FORMAT,
                       files={n: file_record(d) for n, d in members.items()}, digest="")
        meta.digest = metadata_digest(json.loads(json.dumps(asdict(meta))))
        members = {"metadata.json": json.dumps(asdict(meta), indent=1).encode(), **members}
        partial = f"{path}.partial"
        try:
            with tarfile.open(partial, "w") as tar:
                for name, data in members.items():
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    info.mode = 0o755 if name == "mod.so" else 0o644
                    tar.addfile(info, io.BytesIO(data))
            os.replace(partial, path)
        except OSError as e:
            if os.path.exists(partial):
                os.unlink(partial)
            raise PackageError(f"{path}: cannot write the package: {e.strerror or e}") from None
    return meta


@dataclass
class LoadedPackage:
    meta: PackageMetadata
    module: tvm.runtime.Module
    workdir: tempfile.TemporaryDirectory

    def vm(self, device=None) -> relax.VirtualMachine:
        return relax.VirtualMachine(self.module, device or tvm.cpu())


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """The bytes of one regular file of an open archive."""
    f = tar.extractfile(member)
    if f is None:  # only regular files are read
        raise AttributeError(f"{member.name} is not a regular file")
    return f.read()


def _read_members(path: str) -> dict[str, bytes]:
    """Every regular file of the package by archive name; a missing, unreadable, truncated or
    non-tar file is a :class:`PackageError`."""
    if not os.path.exists(path):
        raise PackageError(f"{path}: no such file")
    if os.path.isdir(path):
        raise PackageError(f"{path}: is a directory, not a compiled package (.tar from "
                           "'tvmc compile')")
    try:
        with tarfile.open(path, "r") as tar:
            return {m.name: _read_member(tar, m) for m in tar.getmembers() if m.isfile()}
    except (tarfile.TarError, EOFError) as e:
        truncated = isinstance(e, EOFError) or "unexpected end" in str(e)
        raise PackageError(f"{path}: not a compiled package ("
                           f"{'truncated' if truncated else 'not a tar archive'}); "
                           f"{RECOMPILE}") from None
    except OSError as e:
        raise PackageError(f"{path}: cannot read the package: {e.strerror or e}") from None


def _parse_metadata(path: str, data: bytes) -> PackageMetadata:
    """The checked metadata: valid JSON of this format whose digest matches its content."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(f"{path}: metadata.json is not valid JSON ({e}); {RECOMPILE}") from None
    if not isinstance(raw, dict):
        raise PackageError(f"{path}: metadata.json is not a JSON object; {RECOMPILE}")
    fmt = raw.get("format")
    if fmt != PACKAGE_FORMAT:
        raise PackageError(f"{path}: package format {fmt} is not supported (this tvmc reads "
                           f"format {PACKAGE_FORMAT}); {RECOMPILE}")
    if raw.get("digest") != metadata_digest(raw):
        raise PackageError(f"{path}: metadata.json does not match its checksum (edited or "
                           f"damaged after compile); {RECOMPILE}")
    try:
        return PackageMetadata(**{**raw, "inputs": [TensorSpec(**t) for t in raw["inputs"]],
                                  "outputs": [TensorSpec(**t) for t in raw["outputs"]]})
    except (TypeError, KeyError) as e:
        raise PackageError(f"{path}: corrupt metadata.json ({e}); {RECOMPILE}") from None


def _check_files(path: str, meta: PackageMetadata, members: dict[str, bytes]) -> None:
    """Every file recorded in the metadata is present with its size and sha256, mod.so among
    them, and every program blob is for the target the metadata names."""
    from tvm_accel.blob import unpack_blob

    if "mod.so" not in meta.files:
        raise PackageError(f"{path}: metadata.json records no checksum of mod.so; {RECOMPILE}")
    for name, rec in meta.files.items():
        if name not in members:
            raise PackageError(f"{path}: {name} is missing from the package; {RECOMPILE}")
        data = members[name]
        if not isinstance(rec, dict) or len(data) != rec.get("size"):
            raise PackageError(f"{path}: {name} has {len(data)} bytes, metadata.json records "
                               f"{rec.get('size') if isinstance(rec, dict) else rec} (truncated "
                               f"or damaged); {RECOMPILE}")
        if hashlib.sha256(data).hexdigest() != rec.get("sha256"):
            raise PackageError(f"{path}: {name} is damaged (its sha256 differs from the one in "
                               f"metadata.json); {RECOMPILE}")
        if name.startswith("blobs/"):
            try:
                target = unpack_blob(data).target
            except AccelError as e:
                raise PackageError(f"{path}: {name}: {e}") from None
            if target != meta.target:
                raise PackageError(f"{path}: metadata.json names target '{meta.target or 'cpu'}'"
                                   f" but {name} is a {target} program; {RECOMPILE}")


def load_package(path: str) -> LoadedPackage:
    """Open a package written by :func:`save_package`, importing its target's runtime.

    The metadata digest and the size and sha256 of every file are checked before ``mod.so`` is
    loaded, so a damaged or foreign package is a :class:`PackageError`, never a crash."""
    members = _read_members(path)
    missing = [n for n in ("metadata.json", "mod.so") if n not in members]
    if missing:
        raise PackageError(f"{path}: package lacks {' and '.join(missing)} (not written by "
                           f"'tvmc compile'); {RECOMPILE}")
    meta = _parse_metadata(path, members["metadata.json"])
    _check_files(path, meta, members)
    if meta.target:  # loading the target registers its runtime function
        from tvm_accel.target import get_target

        get_target(meta.target)
    tmp = tempfile.TemporaryDirectory(prefix="tvm_accel_pkg_")
    lib = os.path.join(tmp.name, "mod.so")
    with open(lib, "wb") as f:
        f.write(members["mod.so"])
    try:
        module = tvm.runtime.load_module(lib)
    except Exception as e:  # dlopen or TVM refused the library: another host or TVM version
        first = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise PackageError(f"{path}: cannot load mod.so ({first}); the package was built for "
                           f"another host or TVM version: {RECOMPILE}") from None
    return LoadedPackage(meta, module, tmp)


def read_blobs(path: str) -> dict[str, bytes]:
    """Program blobs stored in a package, or the file itself if it is a raw blob."""
    from tvm_accel.blob import MAGIC

    if not os.path.exists(path):
        raise PackageError(f"{path}: no such file")
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) == MAGIC:
            f.seek(0)
            return {os.path.basename(path): f.read()}
    members = _read_members(path)  # a package: checked like load_package does
    if "metadata.json" not in members:
        raise PackageError(f"{path}: neither a program blob nor a compiled package (no "
                           "metadata.json)")
    _check_files(path, _parse_metadata(path, members["metadata.json"]), members)
    return {n[len("blobs/"):-len(".bin")]: data for n, data in members.items()
            if n.startswith("blobs/")}


def outputs_to_numpy(result) -> list[np.ndarray]:
    """VM results (a Tensor or a nested Array of Tensors) as a flat list of numpy arrays."""
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    out = []
    for r in result:
        out.extend(outputs_to_numpy(r))
    return out
