"""The speedup table as ``ddptui bench`` and ``ddptui results show`` print it: on a terminal, a
table fitted to its width (the columns a reader can spare give up width first: precision,
strategy, global batch, data wait; the note wraps); to a file or a pipe, markdown, whole; or CSV
and JSON for scripts (``engine.core.bench.table_render`` renders those).
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from ddptui.cli_table import Column, render_table, terminal_width, wrap_line
from engine.core.bench.speedup_table import SpeedupTable
from engine.core.bench.table_render import (
    DISPLAY_COLUMNS,
    FORMATS,
    display_rows,
    markdown_table,
)
from engine.core.bench.table_render import render_table as render_speedup_table

TABLE = "table"
CLI_FORMATS = (TABLE, *FORMATS)

# key -> how the column fits a terminal (DISPLAY_COLUMNS gives the keys, order and headers)
_FITTING: dict[str, dict[str, object]] = {
    "label": {"shrink": 6, "min_width": 10},
    "strategy": {"shrink": 1, "min_width": 0},
    "devices": {"shrink": 7, "min_width": 6},
    "precision": {"shrink": 0, "min_width": 0},
    "global_batch": {"shrink": 2, "min_width": 0, "right": True},
    "epoch_seconds": {"right": True},
    "data_wait_share": {"shrink": 3, "min_width": 0, "right": True},
    "images_per_s": {"right": True},
    "speedup": {"right": True},
    "efficiency": {"right": True},
    # a cut split would misread; the notes under the table name each row's bottleneck anyway
    "step_split": {"shrink": 4, "min_width": 0, "whole": True},
    "test_accuracy": {"right": True},
    "note": {"shrink": 5, "min_width": 12, "wrap": True},
}
SPEEDUP_COLUMNS = tuple(
    Column(header, **_FITTING.get(key, {}))  # type: ignore[arg-type]
    for key, header in DISPLAY_COLUMNS
)

format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(CLI_FORMATS),
    default=None,
    help="table: fitted to the terminal (the default on one); markdown (the default to a file or "
    "a pipe); csv or json for scripts.",
)


def chosen_format(fmt: str | None, as_json: bool) -> str:
    """--json, else --format, else a fitted table on a terminal and markdown elsewhere."""
    if as_json:
        return "json"
    if fmt is not None:
        return fmt
    return TABLE if terminal_width() is not None else "markdown"


def speedup_lines(table: SpeedupTable, fmt: str, width: int | None) -> list[str]:
    """The table in ``fmt``: as text lines no wider than ``width`` (``table``; None: whole), or
    the markdown, CSV or JSON of ``engine.core.bench.table_render``."""
    if fmt != TABLE:
        return render_speedup_table(table, fmt).splitlines()
    lines = [table.title, ""] if table.title else []
    for line in table.header_lines:
        lines += wrap_line(line, width, hang="  ")
    if table.header_lines:
        lines.append("")
    lines += render_table(SPEEDUP_COLUMNS, display_rows(table), width)
    if table.notes:
        lines.append("")
        for note in table.notes:
            lines += wrap_line(note, width, indent="- ", hang="  ")
    return lines


def pairs_lines(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    fmt: str,
    width: int | None,
    *,
    wrap: int | Sequence[int] = -1,
) -> list[str]:
    """A small table beside the speedup table (a machine's description, the benches recorded):
    markdown where it is markdown, else fitted like it, the columns numbered in ``wrap`` (the
    last by default) wrapping at word boundaries."""
    if fmt == "markdown":
        return markdown_table(headers, rows)
    wrapped = {wrap % len(headers)} if isinstance(wrap, int) else {w % len(headers) for w in wrap}
    columns = [
        Column(h, shrink=0, min_width=12, wrap=True) if i in wrapped else Column(h)
        for i, h in enumerate(headers)
    ]
    return render_table(columns, rows, width)
