"""Compiled-model package: a ``.tar`` holding ``mod.so`` (the exported TVM library, blobs inside)
and ``metadata.json`` (target, config, input/output signature, offload list), like tvmc's
package. Loading needs only this file and the installed toolchain.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field

import numpy as np
import tvm
from tvm import relax

from tvm_accel.errors import AccelError

PACKAGE_FORMAT = 1


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


def save_package(path: str, executable, meta: PackageMetadata,
                 blobs: dict[str, bytes] | None = None) -> None:
    """Export ``executable`` and write the package to ``path`` (``blobs`` kept for inspection)."""
    with tempfile.TemporaryDirectory() as tmp:
        lib = os.path.join(tmp, "mod.so")
        executable.export_library(lib)
        data = json.dumps(asdict(meta), indent=1).encode()
        with tarfile.open(path, "w") as tar:
            tar.add(lib, arcname="mod.so")
            info = tarfile.TarInfo("metadata.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            for name, blob in (blobs or {}).items():
                info = tarfile.TarInfo(f"blobs/{name}.bin")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))


@dataclass
class LoadedPackage:
    meta: PackageMetadata
    module: tvm.runtime.Module
    workdir: tempfile.TemporaryDirectory

    def vm(self, device=None) -> relax.VirtualMachine:
        return relax.VirtualMachine(self.module, device or tvm.cpu())


def load_package(path: str) -> LoadedPackage:
    """Open a package written by :func:`save_package`, importing its target's runtime."""
    if not os.path.exists(path):
        raise AccelError(f"{path}: no such file")
    try:
        tar = tarfile.open(path, "r")
    except tarfile.TarError as e:
        raise AccelError(f"{path}: not a compiled package (.tar from 'tvmc compile'): "
                         f"{e}") from None
    tmp = tempfile.TemporaryDirectory(prefix="tvm_accel_pkg_")
    with tar:
        names = tar.getnames()
        if "mod.so" not in names or "metadata.json" not in names:
            raise AccelError(f"{path}: package lacks mod.so or metadata.json; recompile with "
                             "'tvmc compile'")
        tar.extractall(tmp.name, members=[tar.getmember("mod.so"), tar.getmember("metadata.json")],
                       filter="data")
    try:
        raw = json.loads(open(os.path.join(tmp.name, "metadata.json")).read())
        meta = PackageMetadata(**{**raw, "inputs": [TensorSpec(**t) for t in raw["inputs"]],
                                  "outputs": [TensorSpec(**t) for t in raw["outputs"]]})
    except (json.JSONDecodeError, TypeError, KeyError) as e:
        raise AccelError(f"{path}: corrupt metadata.json ({e}); recompile the model") from None
    if meta.format != PACKAGE_FORMAT:
        raise AccelError(f"{path}: package format {meta.format} is not supported; recompile")
    if meta.target:
        from tvm_accel.target import get_target

        importlib.import_module(get_target(meta.target).package)
    module = tvm.runtime.load_module(os.path.join(tmp.name, "mod.so"))
    return LoadedPackage(meta, module, tmp)


def read_blobs(path: str) -> dict[str, bytes]:
    """Program blobs stored in a package, or the file itself if it is a raw blob."""
    from tvm_accel.blob import MAGIC

    if not os.path.exists(path):
        raise AccelError(f"{path}: no such file")
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) == MAGIC:
            f.seek(0)
            return {os.path.basename(path): f.read()}
    try:
        with tarfile.open(path, "r") as tar:
            return {m.name[len("blobs/"):-len(".bin")]: tar.extractfile(m).read()
                    for m in tar.getmembers() if m.name.startswith("blobs/") and m.isfile()}
    except tarfile.TarError as e:
        raise AccelError(f"{path}: neither a program blob nor a compiled package: {e}") from None


def outputs_to_numpy(result) -> list[np.ndarray]:
    """VM results (a Tensor or a nested Array of Tensors) as a flat list of numpy arrays."""
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    out = []
    for r in result:
        out.extend(outputs_to_numpy(r))
    return out
