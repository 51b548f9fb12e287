"""The private Textual attributes ddptui still leans on, so that a Textual release that drops one
fails here, by name, rather than as a table drawn at its headers' widths one time in eight.

FittedTable (ddptui/widgets/fitted_table.py) hooks DataTable's ``_on_idle`` and reads its
``_require_update_dimensions`` and ``_updated_cells``; pyproject.toml pins textual below 9 for it.
The UI tests' settle() reads ``_require_update_dimensions`` too.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from ddptui.widgets.fitted_table import FittedTable


def test_the_datatable_internals_fitted_table_hooks_are_there() -> None:
    hook = DataTable.__dict__.get("_on_idle")
    assert hook is not None and inspect.iscoroutinefunction(hook), "DataTable._on_idle is gone"
    table = DataTable[Any]()
    assert isinstance(table._require_update_dimensions, bool)
    assert isinstance(table._updated_cells, set)


class Repaints(FittedTable):
    repaints = 0

    def notify_style_update(self) -> None:
        self.repaints += 1
        super().notify_style_update()


class OneTable(App[None]):
    def compose(self) -> ComposeResult:
        yield Repaints()


@pytest.mark.asyncio
async def test_a_fitted_table_repaints_once_its_new_rows_are_measured() -> None:
    app = OneTable()
    async with app.run_test(size=(80, 12)) as pilot:
        table = app.query_one(Repaints)
        table.add_columns("run", "status")
        await pilot.pause()
        before = table.repaints
        table.add_row("20261202-103000-cpu-demo-e5f6", "running")
        assert table._require_update_dimensions  # measured when the app is next idle
        await pilot.pause()
        assert not table._require_update_dimensions
        assert table.repaints > before  # dropped its caches once the rows were measured
        widths = [column.get_render_width(table) for column in table.columns.values()]
        assert widths[0] >= len("20261202-103000-cpu-demo-e5f6")
