"""Plain-text tables for the CLI, benchmarks and reports."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

#: the width ``tvmc``'s tables fit (``--wide``: no limit); library calls and benchmarks
#: print whole tables unless inside :func:`table_width`
TABLE_WIDTH = 120
_width: list[int | None] = [None]
_CUT = "..."
_MIN_TEXT = 16  # what a cut column keeps in the first rounds (the layer column: in all)


@contextmanager
def table_width(width: int | None) -> Iterator[None]:
    """Tables formatted inside fit ``width`` columns (None: as wide as their cells)."""
    _width.append(width)
    try:
        yield
    finally:
        _width.pop()


def format_table(header: Sequence[str], rows: Sequence[Sequence], align: str | None = None,
                 width: int | None = -1, optional: Sequence[str] = ()) -> str:
    """Fixed-width table; ``align`` is one char per column (``l`` or ``r``, default: numbers
    right, text left). It fits ``width`` characters (default: :func:`table_width`'s, which
    ``tvmc`` sets to 120; None: no limit): its last long text columns (reasons, notes) move to
    an indented line under each row while layer names cut to 16 characters would not make it
    fit; then cells are cut (ending in ``...``, see :func:`_fit`); then the ``optional``
    columns (derived ones, e.g. a time next to its cycles) are left out. A last line says
    which, and that ``--wide`` prints the table whole."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [len(h) for h in header]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    if align is None:
        align = "".join("r" if rows and isinstance(rows[0][i], (int, float)) else "l"
                        for i in range(len(header)))
    limit = _width[-1] if width == -1 else width
    if not limit or _span(widths) <= limit:
        return _lines(header, cells, widths, align)
    dropped = []
    for name in optional:  # numbers too wide for any cut: leave out a derived column
        if _span(_fit(widths, header, align, limit)) <= limit or name not in header:
            continue
        i = list(header).index(name)
        dropped.append(name)
        header = [h for j, h in enumerate(header) if j != i]
        cells = [[c for j, c in enumerate(row) if j != i] for row in cells]
        widths = [w for j, w in enumerate(widths) if j != i]
        align = align[:i] + align[i + 1:]
    keep = len(header)  # columns kept in the table; the rest go to each row's detail line
    while _span(_fit(widths[:keep], header, align, limit, rounds=1)) > limit and keep > 2 \
            and align[keep - 1] == "l" and widths[keep - 1] > _MIN_TEXT:
        keep -= 1
    fit = _fit(widths[:keep], header, align, limit)
    short = [[_cut(c, w) for c, w in zip(row[:keep], fit, strict=True)] for row in cells]
    lines = _lines([_cut(h, w) for h, w in zip(header[:keep], fit, strict=True)], short, fit,
                   align).split("\n")
    notes = []
    if keep < len(header):
        lines = lines[:2]
        for row, cut_row in zip(cells, short, strict=True):
            lines.append(_line(cut_row, fit, align))
            detail = "; ".join(f"{h}: {c}" for h, c in zip(header[keep:], row[keep:],
                                                               strict=True) if c not in ("", "-"))
            if detail:
                lines += textwrap.wrap(detail, limit, initial_indent="    ",
                                       subsequent_indent="      ", break_on_hyphens=False)
        notes.append(f"{', '.join(header[keep:])} under each row")
    n_cut = sum(a != b for a, b in zip(widths[:keep], fit, strict=True))
    if n_cut:
        notes.append(f"{n_cut} column(s) cut")
    if dropped:
        notes.append(f"{', '.join(dropped)} left out")
    return "\n".join(lines) + f"\n({'; '.join(notes)} to fit {limit} characters; --wide " \
        "prints the table whole)"


def _span(widths: Sequence[int]) -> int:
    return sum(widths) + 2 * (len(widths) - 1)


def _fit(widths: list[int], header: Sequence[str], align: str, limit: int,
         rounds: int = 4) -> list[int]:
    """Column widths within ``limit``: the widest left-aligned column shrinks one character
    at a time, in rounds (the first ``rounds`` of them): the first column (the layer's name)
    to 16 characters, then other text to 16, then a ``shape`` column to 16, then text to 7
    characters (``compute``, ``cluster``, ``conv2d`` stay whole) or its header."""
    out = list(widths)
    shape = {i for i, h in enumerate(header[:len(out)]) if h == "shape"}
    text = set(range(1, len(out))) - shape
    for stage, least in (({0}, _MIN_TEXT), (text, _MIN_TEXT), (shape, _MIN_TEXT),
                         (text, 7))[:rounds]:
        while _span(out) > limit:
            free = [i for i in stage if align[i] == "l"
                    and out[i] > max(least, len(header[i]), len(_CUT) + 1)]
            if not free:
                break
            out[max(free, key=lambda j: (out[j], j))] -= 1
    return out


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - len(_CUT)] + _CUT


def _line(vals: Sequence[str], widths: Sequence[int], align: str) -> str:
    return "  ".join(v.rjust(w) if a == "r" else v.ljust(w)
                     for v, w, a in zip(vals, widths, align, strict=False)).rstrip()


def _lines(header: Sequence[str], cells: list[list[str]], widths: list[int], align: str) -> str:
    out = [_line(header, widths, align), _line(["-" * w for w in widths], widths, align)]
    out += [_line(r, widths, align) for r in cells]
    return "\n".join(out)


def _fmt(v) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
