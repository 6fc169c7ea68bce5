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


def table_rows(text: str, first: str = "layer") -> dict[str, list[str]]:
    """A table ``tvmc`` printed (the first whose header starts with ``first``) -> its rows by
    first cell, each the list of its cells (columns read from the dashes under the header, so
    a cell may hold spaces; a row's indented detail line is skipped)."""
    lines = text.strip().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(first + " "))
    spans, at = [], 0
    for dashes in lines[start + 1].split("  "):
        spans.append((at, at + len(dashes)))
        at += len(dashes) + 2
    rows = {}
    for ln in lines[start + 2:]:
        if not ln.strip() or ln.startswith("("):
            break
        if not ln.startswith(" "):
            cells = [ln[a:b].strip() for a, b in spans]
            rows[cells[0]] = cells
    return rows
