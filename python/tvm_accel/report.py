"""Plain-text tables for the CLI, benchmarks and reports."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

#: the width tables fit by default (``tvmc --wide``: None, no limit)
TABLE_WIDTH = 120
_width: list[int | None] = [TABLE_WIDTH]
_CUT = "..."
_MIN_FIRST = 16  # the first column (layer names) keeps at least this many characters
_MIN_SHAPE = 12


@contextmanager
def table_width(width: int | None) -> Iterator[None]:
    """Tables formatted inside fit ``width`` columns (None: as wide as their cells)."""
    _width.append(width)
    try:
        yield
    finally:
        _width.pop()


def format_table(header: Sequence[str], rows: Sequence[Sequence], align: str | None = None,
                 width: int | None = -1) -> str:
    """Fixed-width table; ``align`` is one char per column (``l`` or ``r``, default: numbers
    right, text left). It fits ``width`` columns (default: :func:`table_width`'s, 120): the
    widest text columns are cut, their cells ending in ``...``, and a last line says so
    (numbers are never cut)."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [len(h) for h in header]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    if align is None:
        align = "".join("r" if rows and isinstance(rows[0][i], (int, float)) else "l"
                        for i in range(len(header)))
    limit = _width[-1] if width == -1 else width
    cut = _fit(widths, header, align, limit) if limit else widths
    if cut != widths:
        cells = [[_cut(c, w) for c, w in zip(row, cut, strict=True)] for row in cells]
        header = [_cut(h, w) for h, w in zip(header, cut, strict=True)]
        text = _lines(header, cells, cut, align)
        return text + f"\n({sum(a != b for a, b in zip(widths, cut, strict=True))} column(s) " \
            f"cut to fit {limit} characters; --wide shows them whole)"
    return _lines(header, cells, widths, align)


def _fit(widths: list[int], header: Sequence[str], align: str, limit: int) -> list[int]:
    """Column widths within ``limit`` (with two spaces between columns): the widest
    left-aligned column shrinks one character at a time; the first column (the layer's name)
    and a ``shape`` column only when the others are down to their minimum."""
    out = list(widths)
    shape = {i for i, h in enumerate(header) if h == "shape"}
    for stage, least in ((set(range(1, len(out))) - shape, 0), ({0}, _MIN_FIRST),
                         (shape, _MIN_SHAPE)):
        while sum(out) + 2 * (len(out) - 1) > limit:
            free = [i for i in stage if align[i] == "l"
                    and out[i] > max(least, len(header[i]), len(_CUT) + 1)]
            if not free:
                break
            out[max(free, key=lambda j: (out[j], j))] -= 1
    return out


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - len(_CUT)] + _CUT


def _lines(header: Sequence[str], cells: list[list[str]], widths: list[int], align: str) -> str:
    def line(vals):
        return "  ".join(v.rjust(w) if a == "r" else v.ljust(w)
                         for v, w, a in zip(vals, widths, align, strict=True)).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
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
