"""The queue in the real app (issue 30), with the real waiter: "when free" in the launch form
queues cpu-demo behind a claim that holds the machine's two CPU slots; its Run screen says
queued; the Runs screen shows its place and why it waits; ``k`` takes it out of the queue, its
waiter gone and reaped, its claim gone, the holder's kept."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
from textual.widgets import DataTable

from ddptui.app import DdptuiApp
from ddptui.screens.runs import RunsScreen
from ddptui.widgets.confirm import ConfirmDialog
from engine.core.common.run_files import user_name
from engine.core.common.statuses import RunStatus
from engine.core.queue.claims import open_store
from engine.core.runs.observer import RunObserver
from tests.fixtures.made_runs import ProcessPen
from tests.test_queue_runs import hold_slots
from tests.ui.standins import screen_text, settle
from tests.ui.test_pilot_real import start_from_the_form

pytestmark = [pytest.mark.slow, pytest.mark.asyncio, pytest.mark.usefixtures("run_reaper")]


async def test_queue_from_the_form_see_why_it_waits_then_take_it_out_with_k(
    runs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pen: ProcessPen
) -> None:
    store = tmp_path / "claims"
    monkeypatch.setenv("DDPTUI_CLAIMS_DIR", str(store))
    monkeypatch.setenv("DDPTUI_QUEUE_CPU_SLOTS", "2")
    hold_slots(store, pen.python())
    app = DdptuiApp(runs_dir, run_poll_seconds=0.2, list_poll_seconds=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        run_screen = await start_from_the_form(pilot, app, "cpu-demo", when="free")
        run_dir = run_screen.run_dir
        await settle(pilot, lambda: run_screen.view is not None, timeout=10)
        assert run_screen.view is not None and run_screen.view.run.status == RunStatus.QUEUED
        waiter = run_dir.read_run_info().launcher
        assert waiter is not None and psutil.pid_exists(waiter.pid)

        await pilot.press("r")
        runs = app.screen
        assert isinstance(runs, RunsScreen)
        await settle(pilot, lambda: runs.places.get(run_dir.run_id) == 1, timeout=20)
        said = screen_text(app)
        assert "queued #1" in said
        me = user_name(os.getuid())
        assert f"needs 2 CPU slots, 0 of 2 free: 2 claimed by run holder-run ({me})" in said
        table = runs.query_one(DataTable)
        table.move_cursor(row=table.get_row_index(run_dir.run_id))
        await pilot.press("k")
        await settle(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        assert f"Remove run {run_dir.run_id} from the queue?" in screen_text(app)
        await pilot.press("y")
        await settle(pilot, lambda: not runs.killing and not runs.places, timeout=30)

    ended = RunObserver(run_dir).observe()
    assert ended.status == RunStatus.KILLED
    assert ended.summary is not None and ended.summary.reason.endswith("while queued")
    assert [c.run_id for c in open_store(store).read()] == ["holder-run"]
    app.reap_launchers()  # the app keeps its queued run's waiter to reap it
    assert not psutil.pid_exists(waiter.pid), "the waiter is left, or a zombie of the app's"
