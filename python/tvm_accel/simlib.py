"""Loader of the C simulator library (``tvm_accel/lib/libaccelsim.so``) and shared call helpers.

The library is plain C99 loaded once with :mod:`ctypes`. Every simulator entry point returns a
status code (0 = ok) and writes a one-line message into a caller-provided buffer;
:func:`check` turns a non-zero code into :class:`tvm_accel.errors.SimulatorError` carrying that
message (and the code as ``.code`` / its name as ``.kind``).

``ACCELSIM_LIB`` (environment) overrides the library path, e.g. to test a sanitizer build.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from tvm_accel.errors import AccelError, SimulatorError

#: must equal ACCELSIM_ABI_VERSION in sim/common/status.h
ABI_VERSION = 2
LIB_NAME = "libaccelsim.so"
ERR_LEN = 1024

#: status codes of sim/common/status.h
STATUS_NAMES = {
    0: "ok", 1: "argument", 2: "config", 3: "decode", 4: "bounds", 5: "protocol", 6: "budget",
    7: "io", 8: "nomem",
}

_lib: ctypes.CDLL | None = None
_lock = threading.Lock()


def lib_path() -> Path:
    override = os.environ.get("ACCELSIM_LIB")
    if override:
        return Path(override)
    return Path(__file__).parent / "lib" / LIB_NAME


def get_lib() -> ctypes.CDLL:
    """The loaded simulator library (loaded and version-checked on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = lib_path()
        hint = "run `pip install -e .` or `python setup.py build_sim` in the source tree"
        if not path.exists():
            raise AccelError(f"simulator library {path} is missing; {hint}")
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise AccelError(f"cannot load simulator library {path}: {e}; {hint}") from None
        try:
            version = lib.accelsim_abi_version
        except AttributeError:
            raise AccelError(f"{path} is not a simulator library (no accelsim_abi_version); "
                             f"{hint}") from None
        version.restype = ctypes.c_int
        version.argtypes = []
        got = version()
        if got != ABI_VERSION:
            raise AccelError(f"simulator library {path} has ABI version {got}, this package "
                             f"expects {ABI_VERSION}; {hint}")
        _lib = lib
        return lib


def function(name: str, restype, argtypes: list) -> ctypes._CFuncPtr:
    """A typed entry point of the library; a missing symbol is reported as a stale build."""
    lib = get_lib()
    try:
        fn = getattr(lib, name)
    except AttributeError:
        raise AccelError(f"simulator library {lib_path()} has no function {name}; rebuild it with "
                         "`python setup.py build_sim`") from None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


def err_buffer() -> ctypes.Array:
    return ctypes.create_string_buffer(ERR_LEN)


def check(code: int, err: ctypes.Array, what: str = "simulator") -> None:
    """Raise :class:`SimulatorError` for a non-zero status code with the C message."""
    if code == 0:
        return
    msg = err.value.decode("utf-8", "replace") or f"failed with status {code}"
    kind = STATUS_NAMES.get(code, f"status {code}")
    exc = SimulatorError(f"{what}: {msg}")
    exc.code = code
    exc.kind = kind
    raise exc
