"""Tables and lines the CLI prints, fitted to the terminal.

A table is text lines, its columns two spaces apart, each cell measured in terminal cells as
rich measures them (a wide character takes two). When the table is wider than the terminal, its
columns give up width in the order the command chose (``Column.shrink``), each down to its
``min_width``, and a cell that no longer fits is cut with an ellipsis (or by the column's own
``fit``, or wrapped at word boundaries where the column says so). ``--wide`` prints every cell
whole; output to a file or a pipe is never cut unless ``$COLUMNS`` says how wide to be.

Not a rich ``Table``: laying one out costs about 150 µs a cell, over a second for ``ddptui runs``
with 1,000 runs; these lines cost a fiftieth of that (``bench/runs_listing.py``).

Every cell's text, and every free line a command prints with a table, goes through ``cell_text``:
the one place that decides what a table may show of a value.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import click

from engine.core.common.visible_text import visible

ELLIPSIS = "…"
GAP = 2  # spaces between two columns
NARROWEST = 3  # a column keeps this much however narrow the terminal


def cell_text(value: object) -> str:
    """What a table shows of ``value``: its text on one line ("" for None), control characters
    made visible. Every cell and every line printed with a table goes through here."""
    text = "" if value is None else str(value)
    if "\n" in text or "\r" in text:
        text = " ".join(text.splitlines())
    return visible(text, one_line=True)  # what a run or a command line holds never acts on it


def terminal_width() -> int | None:
    """Columns the output may take: ``$COLUMNS`` when it is set, else the terminal's width when
    stdout is one; None (no limit) for a file or a pipe."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def output_width(wide: bool) -> int | None:
    """The width a command fits its output to: none with ``--wide``, else the terminal's."""
    return None if wide else terminal_width()


wide_option = click.option(
    "--wide", is_flag=True, help="Print every cell whole, however wide the lines get."
)


# ---- cutting text to a width --------------------------------------------------------------------


def cut(text: str, width: int) -> str:
    """``text`` in ``width`` columns: whole when it fits, else its start and an ellipsis."""
    if _cells(text) <= width:
        return text
    if width <= 0:
        return ""
    out, used = [], 0
    for char in text:
        size = _cells(char)
        if used + size > width - 1:
            break
        out.append(char)
        used += size
    return "".join(out) + ELLIPSIS


def cut_middle(text: str, width: int) -> str:
    """``text`` in ``width`` columns, its middle elided: for an id whose both ends matter."""
    if _cells(text) <= width or width < 5 or not text.isascii():
        return cut(text, width)
    head = width // 2
    return text[:head] + ELLIPSIS + text[len(text) - (width - 1 - head) :]


def fit_line(text: object, width: int | None) -> str:
    """One free line (a heading, a note) cut to ``width``."""
    line = cell_text(text)
    return line if width is None else cut(line, width)


def wrap_line(text: object, width: int | None, *, indent: str = "", hang: str = "") -> list[str]:
    """A sentence wrapped at word boundaries into lines of ``width``: the first line starts
    with ``indent``, the others with ``hang``; a word is cut only when it alone is too long."""
    line = cell_text(text)
    if width is None or len(indent) + _cells(line) <= width:
        return [indent + line]
    lines = textwrap.wrap(
        line,
        width=max(len(hang) + 8, width),
        initial_indent=indent,
        subsequent_indent=hang,
        break_on_hyphens=False,
    )
    return lines or [indent]


def with_notes(lines: list[str], notes: Sequence[str], width: int | None) -> list[str]:
    """``lines`` and then, where there are any, the ``notes`` on what this machine cannot see
    (another user's processes, a container's), one wrapped item each; no blank line at the end."""
    out = list(lines)
    if notes:
        out.append("Not visible from here:")
        for note in notes:
            out += wrap_line(note, width, indent="  - ", hang="    ")
    while out and not out[-1]:
        out.pop()
    return out


def echo_wrapped(text: object, width: int | None, *, indent: str = "", hang: str = "") -> None:
    """Print a sentence wrapped to ``width`` (``wrap_line``)."""
    for line in wrap_line(text, width, indent=indent, hang=hang):
        click.echo(line)


# ---- tables -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One column. ``shrink``: when the table is too wide, columns with a lower number give up
    width first, each down to ``min_width`` (one that may go to 0 leaves the table, and the gap
    before it goes too); None keeps its width while any other column can give. ``fit(text,
    width)`` cuts a cell in its own way (a command line keeps its script name); ``wrap`` wraps a
    long cell onto more lines at word boundaries instead of cutting it; a ``whole`` column that
    must shrink leaves the table instead."""

    header: str
    right: bool = False
    shrink: int | None = None
    min_width: int = 6
    fit: Callable[[str, int], str] | None = None
    wrap: bool = False
    whole: bool = False  # shown whole or not at all (a bar, which a cut would misread)


def column_widths(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None
) -> list[int]:
    """Each column's width: its widest cell; then, while the table is wider than ``width``, less
    for the columns that shrink, in their order; then, on a terminal too narrow even for that,
    a column at a time off the widest (never under ``NARROWEST``)."""
    widths = [
        max([_cells(c.header), *(_cells(row[i]) for row in rows)]) for i, c in enumerate(columns)
    ]
    if width is None:
        return widths
    natural = list(widths)
    excess = sum(widths) + GAP * (len(widths) - 1) - width
    shrinking = sorted((c.shrink, i) for i, c in enumerate(columns) if c.shrink is not None)
    for _, i in shrinking:
        if excess <= 0:
            break
        floor = 0 if columns[i].whole else min(columns[i].min_width, widths[i])
        give = widths[i] if columns[i].whole else min(excess, widths[i] - floor)
        if give and floor == 0 and give + GAP >= widths[i]:
            give = widths[i]  # the column leaves the table, and its gap with it
            excess -= GAP
        widths[i] -= give
        excess -= give
    for _, i in shrinking:  # what the last shrink took beyond the need goes back
        if excess >= 0:
            break
        if 0 < widths[i] < natural[i] and not columns[i].whole:
            back = min(-excess, natural[i] - widths[i])
            widths[i] += back
            excess += back
    while excess > 0:
        widest = max(range(len(widths)), key=lambda i: widths[i])
        if widths[widest] <= NARROWEST:
            break
        widths[widest] -= 1
        excess -= 1
    return widths


def render_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[object]],
    width: int | None,
    *,
    indent: int = 0,
) -> list[str]:
    """The header and ``rows`` as text lines no wider than ``width`` (None: every cell whole),
    each line starting with ``indent`` spaces and without trailing spaces."""
    texts = [[cell_text(v) for v in row] for row in rows]
    widths = column_widths(columns, texts, None if width is None else width - indent)
    kept = [i for i, size in enumerate(widths) if size > 0]
    if len(kept) < len(columns):  # columns given up entirely
        columns = [columns[i] for i in kept]
        widths = [widths[i] for i in kept]
        texts = [[row[i] for i in kept] for row in texts]
    pad = " " * indent
    header = [cut(cell_text(c.header), w) for c, w in zip(columns, widths, strict=True)]
    lines = [pad + _joined(columns, widths, header)]
    wraps = any(c.wrap for c in columns)
    for row in texts:
        cells = [
            cell if c.wrap or _cells(cell) <= w else cut(c.fit(cell, w) if c.fit else cell, w)
            for c, w, cell in zip(columns, widths, row, strict=True)
        ]
        if not wraps:
            lines.append(pad + _joined(columns, widths, cells))
            continue
        pieces = [
            _wrapped(cell, w) if c.wrap else [cell]
            for c, w, cell in zip(columns, widths, cells, strict=True)
        ]
        for k in range(max(len(p) for p in pieces)):
            line = [p[k] if k < len(p) else "" for p in pieces]
            lines.append(pad + _joined(columns, widths, line))
    return lines


def _joined(columns: Sequence[Column], widths: Sequence[int], cells: Sequence[str]) -> str:
    """One line of cells, each padded to its column's width (right-aligned where the column
    says), two spaces apart, without trailing spaces."""
    parts = []
    for column, size, cell in zip(columns, widths, cells, strict=True):
        room = " " * max(0, size - _cells(cell))
        parts.append(room + cell if column.right else cell + room)
    return (" " * GAP).join(parts).rstrip()


def _wrapped(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width=max(1, width), break_on_hyphens=False) or [""]


def _cells(text: str) -> int:
    """Terminal columns ``text`` takes (a wide character takes two)."""
    if text.isascii():
        return len(text)
    from rich.cells import cell_len

    return cell_len(text)
