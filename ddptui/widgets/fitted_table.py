"""A DataTable that never goes on showing rows cut to their headers' widths.

Textual's DataTable measures new rows when it is next idle. When the screen paints between
``add_row`` and that idle (a worker's message arriving at the right moment is enough), the rows
are drawn at the headers' widths, and we have seen them stay so (the Runs screen's snapshot caught
it about one time in eight) until something else repaints the table. Dropping the table's render
caches and repainting once its columns are re-measured shows them at their measured widths.

No public hook runs after the measuring, so this one leans on DataTable's private ``_on_idle``,
``_require_update_dimensions`` and ``_updated_cells``: pyproject.toml pins textual below 9 for it,
and tests/ui/test_textual_internals.py fails when any of them is gone.
"""

from __future__ import annotations

from typing import Any

from textual import events
from textual.widgets import DataTable


class FittedTable(DataTable[Any]):
    async def _on_idle(self, event: events.Idle) -> None:
        remeasured = self._require_update_dimensions or bool(self._updated_cells)
        await super()._on_idle(event)
        if remeasured:
            self.notify_style_update()
