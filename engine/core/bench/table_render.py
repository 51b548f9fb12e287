"""The views of a speedup table (``engine.core.bench.speedup_table``): its rows as display cells
(for a Textual DataTable and the markdown), markdown, CSV and JSON. Plain Python.

Every view is rendered from the same computed rows, so they cannot disagree: the display cells
and markdown show the figures rounded with their flags' marks, CSV every ``SpeedupRow`` field as
a raw number, JSON the table's stored form (``SpeedupTable.to_json``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from typing import Any

from engine.core.bench.speedup_table import (
    BATCH_MARK,
    FEW_STEPS_MARK,
    LOAD_MARK,
    SUPERLINEAR_MARK,
    WARN_MARK,
    SpeedupRow,
    SpeedupTable,
    TableError,
)
from engine.core.common import strict_json
from engine.core.common.statuses import RowStatus
from engine.core.common.step_split import StepPart

FORMATS = ("markdown", "csv", "json")
NONE_CELL = "—"

# (key, header) of the displayed columns, in order; keys name SpeedupRow fields where they can.
DISPLAY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("label", "row"),
    ("strategy", "strategy"),
    ("devices", "devices"),
    ("precision", "precision"),
    ("global_batch", "global batch"),
    ("epoch_seconds", "epoch s"),
    ("data_wait_share", "data wait"),
    ("images_per_s", "images/s"),
    ("speedup", "speedup"),
    ("efficiency", "efficiency"),
    ("step_split", "step split"),
    ("test_accuracy", "test acc"),
    ("note", "note"),
)
DISPLAY_HEADERS: tuple[str, ...] = tuple(header for _, header in DISPLAY_COLUMNS)

# The step split's cells: a letter a part, then its share of the step in percent.
SPLIT_LETTERS = {
    StepPart.DATA: "d",
    StepPart.FORWARD: "f",
    StepPart.BACKWARD: "b",
    StepPart.SYNC: "s",
    StepPart.OPTIMIZER: "o",
    StepPart.OTHER: "x",
}

# CSV columns: every SpeedupRow field, raw numbers.
CSV_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(SpeedupRow))


def render_table(table: SpeedupTable, fmt: str) -> str:
    """The whole table in ``fmt`` (one of ``FORMATS``); TableError for another format."""
    if fmt == "markdown":
        return table_markdown(table)
    if fmt == "csv":
        return table_csv(table)
    if fmt == "json":
        return strict_json.dumps(table.to_json(), indent=2) + "\n"
    raise TableError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")


def row_cells(row: SpeedupRow) -> tuple[str, ...]:
    """The row as display strings, in the order of ``DISPLAY_HEADERS``."""
    batch = int_cell(row.global_batch) + (f" {BATCH_MARK}" if row.batch_differs else "")
    speedup = speedup_cell(row.speedup) + (f" {WARN_MARK}" if row.slower_than else "")
    if row.status == RowStatus.OK:
        note = "baseline" if row.baseline else ""
    else:
        note = f"{row.status}: {row.reason}" if row.reason else row.status
    seconds = seconds_cell(row.epoch_seconds, row.epoch_seconds_min, row.epoch_seconds_max)
    rate = rate_cell(row.images_per_s, row.images_per_s_min, row.images_per_s_max)
    efficiency = percent_cell(row.efficiency, digits=0)
    return (
        row.label,
        row.strategy,
        row.devices if row.devices else NONE_CELL,
        row.precision,
        batch,
        seconds + (f" {LOAD_MARK}" if row.loaded else ""),
        percent_cell(row.data_wait_share, digits=0),
        rate + (f" {FEW_STEPS_MARK}" if row.few_steps else ""),
        speedup,
        efficiency + (f" {SUPERLINEAR_MARK}" if row.superlinear else ""),
        split_cell(row),
        percent_cell(row.test_accuracy, digits=1),
        note,
    )


def display_rows(table: SpeedupTable) -> list[tuple[str, ...]]:
    """Each row's display strings, matching ``DISPLAY_HEADERS`` (for ``DataTable.add_row``)."""
    return [row_cells(row) for row in table.rows]


def table_markdown(table: SpeedupTable) -> str:
    lines = [f"## {table.title}", ""] if table.title else []
    if table.header_lines:
        lines.extend([*table.header_lines, ""])
    lines.extend(markdown_table(DISPLAY_HEADERS, display_rows(table)))
    if table.notes:
        lines.append("")
        lines.extend(f"- {note}" for note in table.notes)
    return "\n".join(lines) + "\n"


def table_csv(table: SpeedupTable) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in table.rows:
        values = asdict(row)
        writer.writerow([_csv_value(values[name]) for name in CSV_COLUMNS])
    return out.getvalue()


# ---- cells --------------------------------------------------------------------------------------


def int_cell(value: int) -> str:
    return str(value) if value > 0 else NONE_CELL


def _spread_cell(value: float | None, low: float | None, high: float | None, spec: str) -> str:
    """A median with the spread of its repeats, "11.00 (10.00–12.00)", when there is one."""
    if value is None:
        return NONE_CELL
    text = format(value, spec)
    if low is not None and high is not None and high > low:
        text += f" ({format(low, spec)}–{format(high, spec)})"
    return text


def seconds_cell(value: float | None, low: float | None, high: float | None) -> str:
    return _spread_cell(value, low, high, ".2f")


def rate_cell(value: float | None, low: float | None, high: float | None) -> str:
    return _spread_cell(value, low, high, ".0f")


def speedup_cell(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else NONE_CELL


def split_cell(row: SpeedupRow) -> str:
    """Where a row's step goes, "d4 f48 b34 s13": each part's share in percent, the parts under
    half a percent left out (the table's notes give the letters)."""
    split = row.step_split()
    total = sum(split.values())
    if total <= 0:
        return NONE_CELL
    shares = [(SPLIT_LETTERS[part], round(100 * s / total)) for part, s in split.items()]
    return " ".join(f"{letter}{share}" for letter, share in shares if share > 0) or NONE_CELL


def percent_cell(value: float | None, *, digits: int) -> str:
    return f"{value * 100:.{digits}f}%" if value is not None else NONE_CELL


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return value


def _escape_markdown(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A GitHub-flavoured markdown table, columns padded so it also reads as plain text."""
    body = [[_escape_markdown(c) for c in row] for row in rows]
    head = [_escape_markdown(h) for h in headers]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [line(head), "| " + " | ".join("-" * w for w in widths) + " |", *map(line, body)]
