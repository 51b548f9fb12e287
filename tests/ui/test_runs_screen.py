"""The Runs screen: ``delete`` removes an ended run after a confirmation and refuses a going one,
``f`` shows the runs of one state, and a going run's time counts on while it is silent."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from ddptui.app import DdptuiApp
from ddptui.screens.runs import RunsScreen
from ddptui.widgets.confirm import ConfirmDialog
from tests.fixtures.repo import REPO_ROOT
from tests.ui.standins import FAILED_RUN, GPU_RUN, LIVE_RUN, NOW, RECORDED, settle, text_of

SMALL = (80, 24)
pytestmark = pytest.mark.asyncio


def copy_of_recorded(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    return runs


def rows(screen: RunsScreen) -> list[str]:
    table = screen.query_one(DataTable)
    return [str(table.get_row_at(i)[0]).strip().removeprefix("▸ ") for i in range(table.row_count)]


async def on_runs(app: DdptuiApp, pilot: object) -> RunsScreen:
    await pilot.press("r")  # type: ignore[attr-defined]
    await settle(pilot, lambda: isinstance(app.screen, RunsScreen) and bool(app.screen.runs))
    assert isinstance(app.screen, RunsScreen)
    return app.screen


async def test_delete_removes_an_ended_run_after_asking_and_refuses_a_going_one(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = copy_of_recorded(tmp_path)
    app = make_app(runs)
    async with app.run_test(size=SMALL) as pilot:
        screen = await on_runs(app, pilot)
        assert rows(screen) == [LIVE_RUN, FAILED_RUN, GPU_RUN]
        await pilot.press("delete")  # the live run, first: refused without a question
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmDialog)
        assert (runs / LIVE_RUN).is_dir()
        assert (
            f"{LIVE_RUN} is running: stop it first" in [n.message for n in app._notifications][-1]
        )
        await pilot.press("down", "delete")  # the failed run: asked first
        await settle(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        assert isinstance(app.screen, ConfirmDialog)
        assert app.screen.title_text == f"Remove run {FAILED_RUN}?"
        await pilot.press("escape")  # cancelled: nothing goes
        await settle(pilot)
        assert (runs / FAILED_RUN).is_dir()
        await pilot.press("delete", "y")
        await settle(pilot, lambda: FAILED_RUN not in rows(screen))
        assert not (runs / FAILED_RUN).exists()
        assert rows(screen) == [LIVE_RUN, GPU_RUN]
        assert [n.message for n in app._notifications][-1] == f"removed {FAILED_RUN}"


async def test_f_shows_the_runs_of_one_state(make_app: Callable[..., DdptuiApp]) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await on_runs(app, pilot)
        shown = []
        for _ in range(4):
            await pilot.press("f")
            await settle(pilot)
            head = text_of(screen.query_one("#runs-head", Static)).strip()
            shown.append((screen.state, rows(screen), head.split(" · ")[-1]))
        assert shown == [
            ("going", [LIVE_RUN], "showing going (1; f: next state)"),
            ("completed", [GPU_RUN], "showing completed (1; f: next state)"),
            ("failed", [FAILED_RUN], "showing failed (1; f: next state)"),
            ("killed", [], "showing killed (0; f: next state)"),
        ]
        for _ in range(2):  # lost, then every run again
            await pilot.press("f")
        await settle(pilot)
        assert screen.state == "" and rows(screen) == [LIVE_RUN, FAILED_RUN, GPU_RUN]


async def test_a_going_runs_time_counts_on_while_it_is_silent(
    make_app: Callable[..., DdptuiApp],
) -> None:
    now = [NOW]
    app = make_app(clock=lambda: now[0])
    async with app.run_test(size=SMALL) as pilot:
        screen = await on_runs(app, pilot)
        table = screen.query_one(DataTable)
        before = str(table.get_cell(LIVE_RUN, "time"))
        listed = list(screen.runs)
        now[0] += 125  # nothing new in the run directory, but two minutes more
        screen.poll()
        await settle(pilot)
        assert screen.runs == listed  # the listing did not change...
        after = str(table.get_cell(LIVE_RUN, "time"))
        assert (before, after) == ("1m36s", "3m41s")  # ...its time did
        assert str(table.get_cell(GPU_RUN, "time")) == "8s"  # an ended run's stays


async def test_r_resumes_an_ended_run_and_opens_it_refusing_a_going_one(
    make_app: Callable[..., DdptuiApp],
) -> None:
    from ddptui.screens.run import RunScreen
    from tests.ui.standins import stand_in_actions

    app = make_app()
    actions = stand_in_actions(app)
    async with app.run_test(size=SMALL) as pilot:
        screen = await on_runs(app, pilot)
        await pilot.press("R")  # the live run, first: refused here, nothing asked of the engine
        await settle(pilot)
        assert actions.resumed == []
        assert [n.message for n in app._notifications][-1] == (
            f"{LIVE_RUN} is running: only a run that failed, was killed, was lost or was ended by "
            "its scheduler goes on."
        )
        actions.refuse_resume = f"run {FAILED_RUN}'s config.toml no longer loads: ..."
        await pilot.press("down", "R")  # the failed run: the engine's refusal is said
        await settle(pilot, lambda: not screen.resuming)
        assert actions.resumed == [FAILED_RUN]
        assert [n.message for n in app._notifications][-1] == actions.refuse_resume
        assert isinstance(app.screen, RunsScreen)
        actions.refuse_resume = ""
        await pilot.press("R")  # started: its Run screen follows the new attempt's launcher
        await settle(pilot, lambda: isinstance(app.screen, RunScreen))
        assert actions.resumed == [FAILED_RUN, FAILED_RUN]
        assert isinstance(app.screen, RunScreen) and app.screen.run_dir.run_id == FAILED_RUN
        assert app.screen.started is not None and app.started[FAILED_RUN] is app.screen.started
        assert [n.message for n in app._notifications][-1] == (
            f"run {FAILED_RUN}: started attempt 2 (it failed), from step 10"
        )
