"""User-facing error types.

Every error a user can cause (bad model, bad config, corrupt blob, simulator fault) is raised as an
``AccelError`` subclass whose message is one line: what went wrong, where, and how to fix it. The
``tvmc`` command prints that line instead of a traceback.
"""


class AccelError(Exception):
    """Base class of all user-facing errors of the toolchain."""


class ConfigError(AccelError):
    """A hardware config file is missing, malformed or inconsistent."""


class ModelError(AccelError):
    """The input model is not valid ONNX or holds a pattern the importer does not understand."""


class BlobError(AccelError):
    """A program blob is corrupt, truncated, or was built for another target or config."""


class SimulatorError(AccelError):
    """The C simulator rejected a program (bad field, out-of-range address, deadlock, budget)."""
