"""The UI shows a restarted or resumed run's attempts: the Run screen's head and summary (how each
attempt began and ended), and the Runs screen's state column."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from ddptui.app import DdptuiApp
from ddptui.screens.run import RunScreen
from ddptui.screens.runs import RunsScreen
from engine.core.common.statuses import RunStatus
from engine.core.runs.attempts import archive_attempt
from engine.core.runs.events import EventWriter, RunStarted
from engine.core.runs.rundir import RunDir
from engine.core.runs.summarize import build_summary
from tests.test_attempts import epoch_ended, failed_first_attempt
from tests.ui.standins import settle, text_of

pytestmark = pytest.mark.asyncio


def restarted_run(runs_dir: Path) -> RunDir:
    """Attempt 1 failed at step 40; attempt 2, a restart from step 30, completed."""
    run_dir = failed_first_attempt(runs_dir)
    archive_attempt(run_dir, 1)
    info = run_dir.read_run_info()
    run_dir.write_run_info(replace(info, attempt=2, state=RunStatus.COMPLETED))
    with EventWriter(run_dir.launcher_events_path) as events:
        events.write(RunStarted(run_id=run_dir.run_id, world_size=2, launcher_pid=2,
                                devices="cpu:2", attempt=2, started_by="restart",
                                resumed_from_step=30, resumed_from_epoch=1))  # fmt: skip
    with EventWriter(run_dir.rank_events_path(0)) as events:
        events.write(epoch_ended(1))
    run_dir.write_summary(build_summary(run_dir, RunStatus.COMPLETED))
    return run_dir


async def test_the_run_and_runs_screens_show_the_attempts(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    run_dir = restarted_run(runs)
    app = make_app(runs)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, lambda: app.gpu_inventory is not None)
        app.open_run(run_dir)
        await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        assert " · attempt 2 · " in text_of(screen.query_one("#run-title", Static))
        summary = text_of(screen.query_one("#summary-text", Static))
        assert "attempt 1 failed at step 40: rank 1: E: boom" in summary
        assert "attempt 2 resumed from step 30 (restart), completed" in summary
        await pilot.press("r")
        await settle(pilot, lambda: isinstance(app.screen, RunsScreen) and bool(app.screen.runs))
        table = app.screen.query_one(DataTable)
        assert str(table.get_cell(run_dir.run_id, "status")) == "completed · attempt 2"
