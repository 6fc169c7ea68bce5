"""Running ``tvmc`` in-process the way a shell would see it: the exit code, argparse's
``SystemExit`` included."""

from __future__ import annotations

from tvm_accel import cli


def tvmc(*argv) -> int:
    """``tvmc ARGV...`` (any argument turned into a string); its exit code."""
    try:
        return cli.main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        return int(e.code or 0)
