"""Comparing two runs in the UI: on the Runs screen, mark two runs (space) and compare (d); one
marked, or none, compares as ``ddptui diff`` does; on the Results screen, two rows of the
speedup table are compared the same way. The dialog shows the report ``ddptui diff`` prints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from ddptui.app import DdptuiApp
from ddptui.screens.results import ResultsScreen
from ddptui.screens.runs import RunsScreen
from ddptui.widgets.run_diff_dialog import RunDiffDialog
from engine.core.runs.rundir import RunDir
from tests.fixtures.diff_runs import (
    SLOWER_A,
    SLOWER_B,
    SLOWER_SENTENCE,
    make_ended_run,
    make_slower_data_pair,
)
from tests.ui.standins import settle, text_of

pytestmark = pytest.mark.asyncio
SIZE = (100, 40)
A, B, SENTENCE = SLOWER_A, SLOWER_B, SLOWER_SENTENCE


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    make_slower_data_pair(tmp_path / "runs")
    return tmp_path / "runs"


def report(app: DdptuiApp) -> str:
    assert isinstance(app.screen, RunDiffDialog), type(app.screen)
    return " ".join(text_of(app.screen.query_one("#diff-report", Static)).split())


async def on_runs(app: DdptuiApp, pilot: object) -> RunsScreen:
    await pilot.press("r")  # type: ignore[attr-defined]
    await settle(pilot, lambda: isinstance(app.screen, RunsScreen) and len(app.screen.runs) == 2)
    assert isinstance(app.screen, RunsScreen)
    return app.screen


async def test_two_marked_runs_are_compared(make_app: Callable[..., DdptuiApp], runs: Path) -> None:
    app = make_app(runs)
    async with app.run_test(size=SIZE) as pilot:
        screen = await on_runs(app, pilot)
        await pilot.press("down", "space", "up", "space")  # A is the older run, the second row
        await settle(pilot)
        assert screen.marked == [A, B]
        head = text_of(screen.query_one("#runs-head", Static))
        assert f"marked A {A}, B {B} (d compares)" in head
        table = screen.query_one(DataTable)
        assert str(table.get_row_at(0)[0]).startswith("B ")
        assert str(table.get_row_at(1)[0]).startswith("A ")
        await pilot.press("d")
        await settle(pilot, lambda: isinstance(app.screen, RunDiffDialog))
        text = report(app)
        assert f"A {A} B {B}" in text and SENTENCE in text
        assert "data.num_workers 10 2" in text
        await pilot.press("escape")
        await settle(pilot)
        assert app.screen is screen
        await pilot.press("space")  # unmarks B
        assert screen.marked == [A]


async def test_none_marked_compares_with_the_newest_completed_run_of_the_preset(
    make_app: Callable[..., DdptuiApp], runs: Path
) -> None:
    app = make_app(runs)
    async with app.run_test(size=SIZE) as pilot:
        await on_runs(app, pilot)
        await pilot.press("d")  # the highlighted run is B, the newest
        await settle(pilot, lambda: isinstance(app.screen, RunDiffDialog))
        assert SENTENCE in report(app)


async def test_a_run_with_nothing_to_compare_with_is_one_notification(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    make_ended_run(runs, A)
    app = make_app(runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await settle(pilot, lambda: isinstance(app.screen, RunsScreen) and bool(app.screen.runs))
        await pilot.press("d")
        await settle(pilot)
        assert not isinstance(app.screen, RunDiffDialog)
        said = [n.message for n in app._notifications][-1]
        assert said.startswith("no other completed run of cpu-demo in ")


async def test_two_rows_of_the_speedup_table_are_compared(
    make_app: Callable[..., DdptuiApp], runs: Path
) -> None:
    app = make_app(runs)
    async with app.run_test(size=SIZE) as pilot:
        app.session_runs.extend([RunDir(runs / A), RunDir(runs / B)])
        await pilot.press("c")
        await settle(
            pilot,
            lambda: (
                isinstance(app.screen, ResultsScreen)
                and app.screen.table is not None
                and app.screen.query_one(DataTable).row_count == 2
            ),
        )
        screen = app.screen
        assert isinstance(screen, ResultsScreen)
        labels = [r.label for r in screen.table.rows]
        await pilot.press("space", "down")  # one marked, the other highlighted
        await settle(pilot)
        assert screen.marked == [labels[0]]
        assert "(d compares)" in text_of(screen.query_one("#results-head", Static))
        await pilot.press("d")
        await settle(pilot, lambda: isinstance(app.screen, RunDiffDialog))
        text = report(app)
        run_a, run_b = (screen.table.rows[i].run_ids[-1] for i in (0, 1))
        assert {run_a, run_b} == {A, B}
        assert text.startswith(f"A {run_a} B {run_b} ")
        assert "data.num_workers" in text
