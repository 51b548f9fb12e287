"""Pilot tests that drive the real app against the real launcher and training (CPU ranks on gloo):
pick cpu-demo, launch it, see both ranks progress, see it finish and its row in the results table;
kill a run that hangs (fault injection) from the Kill button, see the kill confirmed and no process
of the run left.

Runs started from the UI live in their own session (that is the point: a dropped SSH link must not
stop them), so the fixture stops whatever a test left through the job-scoped kill, even when the
test fails."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ddptui.app import DdptuiApp
from ddptui.screens.launch import LaunchScreen
from ddptui.screens.results import ResultsScreen
from ddptui.screens.run import RunScreen
from ddptui.widgets.confirm import ConfirmDialog
from engine.core.common.run_environment import RUN_MARKER_ENV
from engine.core.runs.rundir import list_runs
from tests.ui.standins import settle

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

HANG_PRESET = """
description = "cpu-demo whose rank 1 hangs at step 3"
faults = ["hang:1:3"]

[strategy]
name = "ddp"

[devices]
spec = "cpu:2"

[data]
dataset = "synthetic"
train_size = 12800
test_size = 500

[training]
epochs = 1
batch_size = 64
max_steps = 50

[supervision]
stall_seconds = 5.0
"""


@pytest.fixture
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    runs = tmp_path / "runs"
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "hang-demo.toml").write_text(HANG_PRESET, encoding="utf-8")
    monkeypatch.setenv("DDPTUI_PRESETS", str(presets))
    yield runs
    from engine.core.backends.local.kill import kill_run

    for run_dir in list_runs(runs):
        # A failure here is not hidden: the process reaper still fails the test on leftovers.
        with contextlib.suppress(Exception):
            kill_run(run_dir, 2.0, check_gpu=False)


def processes_of(run_id: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(RUN_MARKER_ENV) == run_id:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


async def start_from_the_form(pilot, app: DdptuiApp, preset: str, **fields: str) -> RunScreen:  # type: ignore[no-untyped-def]
    await settle(pilot, lambda: isinstance(app.screen, LaunchScreen) and bool(app.screen.checks))
    screen = app.screen
    assert isinstance(screen, LaunchScreen)
    screen.select_preset(preset)
    for input_id, value in fields.items():
        screen.query_one(f"#{input_id}").value = value  # type: ignore[attr-defined]
    await settle(pilot)
    assert screen.effective is not None, screen.problem
    screen.query_one("#presets").focus()
    await pilot.press("s")
    await settle(pilot, lambda: isinstance(app.screen, RunScreen), timeout=30)
    run_screen = app.screen
    assert isinstance(run_screen, RunScreen)
    return run_screen


async def test_launch_cpu_demo_watch_both_ranks_and_compare(runs_dir: Path) -> None:
    app = DdptuiApp(runs_dir, run_poll_seconds=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await start_from_the_form(
            pilot, app, "cpu-demo", **{"epochs": "1", "max-steps": "12", "train-size": "3072"}
        )
        progressed: dict[int, int] = {}
        statuses = set()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            await pilot.pause(0.1)
            view = screen.view
            if view is None:
                continue
            statuses.add(view.run.status)
            for rank in view.run.ranks:
                if rank.step:
                    progressed[rank.rank] = max(progressed.get(rank.rank, 0), rank.step)
            if view.run.final:
                break
        view = screen.view
        assert view is not None and view.run.status == "completed", view and view.run.reason
        assert "running" in statuses
        assert sorted(progressed) == [0, 1], "both ranks showed progress"
        assert [r.state for r in view.run.ranks] == ["done", "done"]
        await pilot.press("c")
        results = app.screen
        assert isinstance(results, ResultsScreen)
        await settle(pilot, lambda: results.table is not None, timeout=20)
        (row,) = results.table.rows
        assert row.run_ids == (view.run.run_id,)
        assert row.ok and row.images_per_s and row.baseline


async def test_kill_a_hanging_run_from_the_button(runs_dir: Path) -> None:
    app = DdptuiApp(runs_dir, run_poll_seconds=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await start_from_the_form(pilot, app, "hang-demo")
        run_id = screen.run_dir.run_id

        def hanging() -> bool:
            view = screen.view
            return bool(
                view and view.run.status == "running" and any(r.pid for r in view.run.ranks)
            )

        await settle(pilot, hanging, timeout=120)
        assert hanging()
        # The launcher is in its own session: the SIGHUP of a dropped SSH link cannot reach it.
        info = screen.run_dir.read_run_info()
        assert info.launcher is not None
        assert os.getsid(info.launcher.pid) != os.getsid(0)
        await pilot.click("#kill")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await settle(pilot, lambda: bool(screen.kill_report) and not screen.killing, timeout=60)
        assert "none left" in screen.kill_report, screen.kill_report
        await settle(
            pilot, lambda: bool(screen.view and screen.view.run.status == "killed"), timeout=20
        )
        assert screen.view is not None and screen.view.run.status == "killed"
        assert processes_of(run_id) == []


async def test_launch_your_own_script_by_its_path(runs_dir: Path) -> None:
    """``o``, the tutorial's plain DDP loop and its arguments, two CPU ranks, ``s``: the run
    completes on the Run screen with each rank's optimizer steps, and nothing of it is left."""
    from ddptui.widgets.rank_table import RankTable
    from ddptui.widgets.script_prompt import ScriptPrompt
    from tests.fixtures.repo import REPO_ROOT
    from tests.ui.standins import text_of

    app = DdptuiApp(runs_dir, run_poll_seconds=0.2)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(
            pilot, lambda: isinstance(app.screen, LaunchScreen) and bool(app.screen.checks)
        )
        launch = app.screen
        assert isinstance(launch, LaunchScreen)
        await pilot.press("o")
        await settle(pilot, lambda: isinstance(app.screen, ScriptPrompt))
        script = REPO_ROOT / "tests" / "fixtures" / "tutorial_ddp.py"
        await pilot.press(*str(script), "enter", *"--epochs 1 --steps 6", "enter")
        await settle(pilot, lambda: app.screen is launch)
        assert launch.current is not None and launch.current.name == "tutorial_ddp (script)"
        if launch.query_one("#gpu-picker").display:  # a GPU machine: run it on two CPU ranks here
            launch.query_one("#gpu-picker").deselect_all()  # type: ignore[attr-defined]
        launch.query_one("#cpu-ranks").value = "2"  # type: ignore[attr-defined]
        await settle(pilot)
        assert launch.effective is not None, launch.problem
        launch.query_one("#presets").focus()
        await pilot.press("s")
        if isinstance(app.screen, ConfirmDialog):  # on the CPU although GPUs are here: yes
            await pilot.press("y")
        await settle(pilot, lambda: isinstance(app.screen, RunScreen), timeout=30)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (screen.view and screen.view.run.final):
            await pilot.pause(0.2)
        view = screen.view
        assert view is not None and view.run.status == "completed", view and view.run.reason
        await settle(pilot)
        lines = text_of(screen.query_one(RankTable)).splitlines()
        assert "step/s" in lines[0]
        assert "6/6" in lines[1].split() and "6" in lines[2].split()  # rank 0's bar, rank 1's steps
        (run_dir,) = list_runs(runs_dir)
        summary = run_dir.read_summary()
        assert summary is not None and summary.model == str(script)
        assert summary.global_steps == 6
        assert processes_of(view.run.run_id) == []
