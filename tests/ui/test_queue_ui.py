"""The machine's queue in the UI (issue 30), against stand-ins: the Runs screen shows the line
(who waits for what, since when, and why) at 80 columns, read by the screen's poll in a thread
worker; an untrusted claim store is said where the line goes; ``k`` asks before it removes a
queued run; the launch form's "when free" queues the run, and a queued launch shows as queued."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import DataTable, Select

from ddptui.app import DdptuiApp
from ddptui.screens.run import RunScreen
from ddptui.screens.runs import RunsScreen
from ddptui.widgets.confirm import ConfirmDialog
from ddptui.widgets.queue_line import QueueLine
from engine.core.common.statuses import RunStatus
from engine.core.procs.process_identity import ProcessRef
from engine.core.queue.line import Verdict
from tests.fixtures.made_runs import make_run
from tests.ui.queue_standin import standin_line
from tests.ui.standins import StandInProbe, screen_text, settle, text_of
from tests.ui.test_launch_form import SMALL, actions, launch_screen

pytestmark = pytest.mark.asyncio
WAITER = ProcessRef(434343, 1.0)  # a queued run's waiter, alive to the stand-in probe
QUEUED_RUN = "20261202-102000-cpu-demo-9e8f"  # the third claim of the stand-in line


async def runs_screen(pilot: object, app: DdptuiApp) -> RunsScreen:
    await pilot.press("r")  # type: ignore[attr-defined]
    await settle(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.runs != [])
    await settle(pilot)
    assert isinstance(app.screen, RunsScreen)
    return app.screen


async def test_the_runs_screen_shows_who_waits_for_what_since_when_and_why_at_80_columns(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    read_in: list[threading.Thread] = []

    def read_queue() -> list[Verdict]:
        read_in.append(threading.current_thread())
        return standin_line()

    actions(app).read_queue = read_queue  # type: ignore[method-assign]
    async with app.run_test(size=SMALL) as pilot:
        screen = await runs_screen(pilot, app)
        await settle(pilot, lambda: screen.query_one(QueueLine).display)
        lines = screen_text(app).splitlines()
        said = "\n".join(lines)
        assert max(len(line) for line in lines) <= 80
        assert "Queue · 2 waiting" in said
        assert "on their claims: 20261202-100000-cpu-demo-1a2b (root) runs on cpu:2" in said
        assert "#1 20261202-101200-script-7c3d  nobody  wants GPU 1  for 12m30s  train.py" in said
        assert "GPU 1 held by pid 4411 (alice, python train.py --epochs 90…), 38.0G" in said
        assert "#2 20261202-102000-cpu-demo-9e8f  root  wants cpu:2  for 3m00s" in said
        # its reason wraps under its own head, whole
        reason = " ".join(line.strip() for line in lines if line.startswith("    "))
        assert (
            "needs 2 CPU slots, 0 of 2 free: 2 claimed by run 20261202-100000-cpu-demo-1a2b (root)"
            in reason
        )
        # The line is read by the poll's thread worker, never on the event loop.
        assert read_in and threading.main_thread() not in read_in
        before = len(read_in)
        await pilot.press("f5")
        await settle(pilot, lambda: len(read_in) > before)
        assert threading.main_thread() not in read_in


async def test_an_empty_line_takes_no_room_and_an_untrusted_store_is_said(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await runs_screen(pilot, app)
        assert not screen.query_one(QueueLine).display
        # The real read, of a store that is a symbolic link: one sentence where the line goes.
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "claims").symlink_to(tmp_path / "elsewhere")
        stand_in = actions(app)
        stand_in.claims_dir = tmp_path / "claims"
        stand_in.read_queue = super(type(stand_in), stand_in).read_queue  # type: ignore[method-assign]
        await pilot.press("f5")
        queue = screen.query_one(QueueLine)
        await settle(pilot, lambda: queue.display)
        assert text_of(queue).startswith(
            f"Queue: the claim store {tmp_path / 'claims'} is a symbolic"
        )


async def test_k_asks_then_takes_a_queued_run_out_of_the_queue(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    made = make_run(runs, QUEUED_RUN, launcher=WAITER, state=RunStatus.QUEUED)
    make_run(runs, "20261202-090000-cpu-demo-0000", state=RunStatus.COMPLETED)
    app = make_app(runs, probe=StandInProbe(alive=[WAITER.pid]))
    actions(app).line = standin_line()
    async with app.run_test(size=SMALL) as pilot:
        screen = await runs_screen(pilot, app)
        table = screen.query_one(DataTable)
        await settle(pilot, lambda: screen.places.get(QUEUED_RUN) == 2)
        assert "queued #2" in screen_text(app)
        table.move_cursor(row=table.get_row_index(QUEUED_RUN))
        await pilot.press("k")
        await settle(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        dialog = screen_text(app)
        assert f"Remove run {QUEUED_RUN} from the queue?" in dialog
        assert actions(app).killed == []  # nothing before the answer
        await pilot.press("y")
        await settle(pilot, lambda: actions(app).killed == [made.run_id])
        # An ended run has nothing to stop: said, nothing asked.
        table.move_cursor(row=table.get_row_index("20261202-090000-cpu-demo-0000"))
        await pilot.press("k")
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmDialog)
        assert actions(app).killed == [made.run_id]


async def test_when_free_queues_the_run_and_a_queued_launch_shows_as_queued(
    make_app: Callable[..., DdptuiApp], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDPTUI_QUEUE_CPU_SLOTS", "2")
    queued = make_run(tmp_path / "runs", QUEUED_RUN, launcher=WAITER, state=RunStatus.QUEUED)
    app = make_app(probe=StandInProbe(alive=[WAITER.pid]))
    actions(app).start_as = queued
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await launch_screen(pilot, app)
        screen.query_one("#when", Select).value = "free"
        await settle(pilot, lambda: screen.form_check is not None and screen.form_check.queued)
        said = " ".join(text_of(screen.query_one("#launch-check")).split())
        assert "✓ queues here, starts when free: cpu:2, 2 ranks" in said
        await pilot.press("s")
        await settle(pilot, lambda: isinstance(app.screen, RunScreen))
        assert actions(app).queued == [True] and actions(app).where == [""]
        assert actions(app).started[0].devices.spec == "cpu:2"
        run_screen = app.screen
        assert isinstance(run_screen, RunScreen)
        await settle(pilot, lambda: run_screen.view is not None)
        assert run_screen.view is not None and run_screen.view.run.status == RunStatus.QUEUED
        assert "made · queued · cpu:2" in screen_text(app)  # its head line
        # More CPU slots than the machine's queue has: said under the form, Start does nothing.
        await pilot.press("l")
        screen = await launch_screen(pilot, app)
        screen.query_one("#cpu-ranks").value = "3"  # type: ignore[attr-defined]
        await settle(pilot, lambda: screen.form_check is not None and not screen.form_check.ok)
        said = " ".join(text_of(screen.query_one("#launch-check")).split())
        assert "asks for 3 CPU slots, but this machine's queue has 2; ask for at most" in said
        await pilot.press("s")
        await settle(pilot)
        assert actions(app).queued == [True]
