"""Two speedup tables side by side (``ddptui results compare``): rows matched by label, each
pair's figures and how B's throughput moved against A's. Plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.bench.speedup_table import SpeedupRow, SpeedupTable
from engine.core.bench.table_render import (
    NONE_CELL,
    markdown_table,
    percent_cell,
    rate_cell,
    seconds_cell,
    speedup_cell,
)

COMPARE_COLUMNS: tuple[str, ...] = (
    "row",
    "A epoch s",
    "B epoch s",
    "A images/s",
    "B images/s",
    "B vs A",
    "A speedup",
    "B speedup",
    "A test acc",
    "B test acc",
)


@dataclass(frozen=True)
class RowComparison:
    label: str
    a: SpeedupRow | None  # None: the row is only in B
    b: SpeedupRow | None

    @property
    def throughput_change(self) -> float | None:
        """B's images/s over A's, minus 1 (+0.10: B is 10 % faster)."""
        if self.a is None or self.b is None or not self.a.images_per_s or not self.b.images_per_s:
            return None
        return self.b.images_per_s / self.a.images_per_s - 1.0

    def cells(self) -> tuple[str, ...]:
        def pick(row: SpeedupRow | None, name: str) -> Any:
            return getattr(row, name) if row is not None and row.ok else None

        def missing(row: SpeedupRow | None) -> str:
            return "absent" if row is None else row.status

        change = self.throughput_change
        return (
            self.label,
            seconds_cell(pick(self.a, "epoch_seconds"), None, None)
            if self.a is not None and self.a.ok
            else missing(self.a),
            seconds_cell(pick(self.b, "epoch_seconds"), None, None)
            if self.b is not None and self.b.ok
            else missing(self.b),
            rate_cell(pick(self.a, "images_per_s"), None, None),
            rate_cell(pick(self.b, "images_per_s"), None, None),
            f"{change * 100:+.1f}%" if change is not None else NONE_CELL,
            speedup_cell(pick(self.a, "speedup")),
            speedup_cell(pick(self.b, "speedup")),
            percent_cell(pick(self.a, "test_accuracy"), digits=1),
            percent_cell(pick(self.b, "test_accuracy"), digits=1),
        )


def compare_tables(a: SpeedupTable, b: SpeedupTable) -> list[RowComparison]:
    """Rows matched by label: A's rows in A's order, then rows only B has."""
    b_rows = {r.label: r for r in b.rows}
    a_labels = {r.label for r in a.rows}
    matched = [RowComparison(r.label, r, b_rows.get(r.label)) for r in a.rows]
    matched.extend(RowComparison(r.label, None, r) for r in b.rows if r.label not in a_labels)
    return matched


def comparison_markdown(a: SpeedupTable, b: SpeedupTable) -> list[str]:
    return markdown_table(COMPARE_COLUMNS, [c.cells() for c in compare_tables(a, b)])
