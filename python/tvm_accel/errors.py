"""User-facing error types.

Every error a user can cause (bad model, bad config, corrupt blob, simulator fault) is raised as an
``AccelError`` subclass whose message is one line: what went wrong, where, and how to fix it. The
``tvmc`` command prints that line instead of a traceback.

Errors raised inside a TVM pass or inside a packed function the VM calls (``tvm_<target>.run``)
cross TVM's FFI, which rebuilds a Python exception on the other side from a registered *kind*
name and falls back to ``RuntimeError`` for unknown kinds. Every ``AccelError`` class is
therefore registered with the FFI under its qualified name when it is defined, so it comes back
as the same class with the same message and the CLI's one-line handler still recognises it.

Every exception class of the project derives from ``AccelError``, except the control-flow
signals that never leave their module (the CP solver's ``Fail`` / ``SearchLimit``, VTA's uop
overflow while it grows a tile).
"""

from __future__ import annotations

try:
    import tvm_ffi
except ImportError:  # the error types stay usable without TVM (e.g. reading configs)
    tvm_ffi = None  # type: ignore[assignment]


def _register_with_ffi(cls: type) -> None:
    """Let ``cls`` survive a round trip through TVM's FFI (see the module docstring)."""
    if tvm_ffi is not None:
        tvm_ffi.register_error(f"{cls.__module__}.{cls.__qualname__}", cls)


class AccelError(Exception):
    """Base class of all user-facing errors of the toolchain."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        _register_with_ffi(cls)


_register_with_ffi(AccelError)
if tvm_ffi is not None:
    # Ctrl-C inside a packed function the VM calls (a simulation, see tvm_accel.simlib.call)
    # must reach the caller as KeyboardInterrupt, not as a RuntimeError with an empty message.
    tvm_ffi.register_error("KeyboardInterrupt", KeyboardInterrupt)


class ConfigError(AccelError):
    """A hardware config file is missing, malformed or inconsistent."""


class ModelError(AccelError):
    """The input model is not valid ONNX or holds a pattern the importer does not understand."""


class BlobError(AccelError):
    """A program blob is corrupt, truncated, or was built for another target or config."""


class SimulatorError(AccelError):
    """The C simulator rejected a program (bad field, out-of-range address, deadlock, budget)."""

    #: the status code and its kind (docs/architecture.md section 6), set by ``simlib.check``
    code: int
    kind: str


class MappingError(AccelError):
    """A layer (or fused group) the target cannot map under its config: the message names the
    layer. Lowering turns it into a CPU fallback of that layer with this message as the reason,
    never a failed compile."""


class KnobError(MappingError, ValueError):
    """A knob value set by the user (``knobs=``, tuning records) that the layer's knob space
    does not allow (alone or with the defaults of the other knobs): one line naming the layer,
    the knob and the allowed values. Unlike other
    mapping errors it fails the compile instead of moving the layer to the CPU, since the user
    asked for that value and a silent fallback would hide the typo. Raised by
    :func:`tvm_accel.knobs.validate_knobs`; a subclass of ``MappingError`` so a strategy's
    search over candidate knobs can still skip an infeasible one."""


class EncodeError(AccelError, ValueError):
    """An instruction field does not fit its encoding (a value out of the field's range)."""


class DecodeError(BlobError, ValueError):
    """Bytes that are not a valid instruction of the target's ISA."""


class AsmError(AccelError, ValueError):
    """An assembly line that does not parse."""


class PackageError(AccelError):
    """A compiled package is missing, truncated, damaged, or was not written by ``tvmc compile``."""
