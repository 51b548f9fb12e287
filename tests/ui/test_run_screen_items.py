"""The Run screen's small lies, each put right and pinned: ``w`` goes to a run that is going, the
end-of-run sparklines cover every epoch at 80 columns, epochs count from 1 in ``ddptui show`` as
on the screens (tests/test_runs_commands.py), the culprit of a stuck run is marked in the rank table, the Stacks screen opens on
each rank's main thread, a log whose last line has no newline is shown, and ``[`` / ``]`` say why
they do nothing with one run open. (The root cause said once: tests/ui/test_pilot.py; the Runs
screen's clock: tests/ui/test_runs_screen.py.)"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.text import Text
from textual.widgets import Static

from ddptui.app import DdptuiApp
from ddptui.screens.run import RunScreen
from ddptui.screens.stacks import StacksScreen
from ddptui.widgets.log_tail import TailLines
from ddptui.widgets.rank_table import RankTable
from engine.core.common.statuses import RankActivity
from engine.core.runs.rundir import RunDir
from engine.core.stacks.snapshot import (
    Frame,
    RankDiagnosis,
    StackSnapshot,
    ThreadStack,
    save_snapshot,
)
from tests.fixtures.repo import REPO_ROOT
from tests.ui.standins import FAILED_RUN, GPU_RUN, LIVE_RUN, NOW, RECORDED, settle, text_of

SMALL = (80, 24)
pytestmark = pytest.mark.asyncio


def copy_of_recorded(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    return runs


async def open_run(pilot: object, app: DdptuiApp, run_dir: RunDir) -> RunScreen:
    await settle(pilot, lambda: app.gpu_inventory is not None)
    app.open_run(run_dir)
    await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
    assert isinstance(app.screen, RunScreen)
    return app.screen


def notices(app: DdptuiApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_w_goes_to_the_run_going_not_back_to_a_finished_one(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await open_run(pilot, app, RunDir(RECORDED / FAILED_RUN))  # the last one watched
        await pilot.press("r", "w")
        await settle(pilot, lambda: isinstance(app.screen, RunScreen))
        assert isinstance(app.screen, RunScreen)
        assert app.screen.run_dir.run_id == LIVE_RUN


async def test_w_with_nothing_going_goes_back_to_the_run_last_watched(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    from tests.ui.standins import StandInProbe

    runs = copy_of_recorded(tmp_path)  # nothing alive: the live run is lost, and settled, here
    app = make_app(runs, probe=StandInProbe())
    async with app.run_test(size=SMALL) as pilot:
        await open_run(pilot, app, RunDir(runs / FAILED_RUN))
        await pilot.press("r", "w")
        await settle(pilot, lambda: isinstance(app.screen, RunScreen))
        assert isinstance(app.screen, RunScreen)
        assert app.screen.run_dir.run_id == FAILED_RUN
        assert notices(app)[-1] == f"No run is going in {runs}: back to the run last watched."


async def test_the_sparklines_cover_every_epoch_at_80_columns(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = copy_of_recorded(tmp_path)
    summary = runs / GPU_RUN / "summary.json"
    data = json.loads(summary.read_text())
    epoch = data["epochs"][0]
    data["epochs"] = [
        {**epoch, "epoch": e, "train_loss": 2.3 - 0.2 * e, "test_accuracy": 0.1 + 0.07 * e}
        for e in range(12)
    ]
    summary.write_text(json.dumps(data))
    app = make_app(runs)
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_run(pilot, app, RunDir(runs / GPU_RUN))
        line = text_of(screen.query_one("#summary-sparks", Static)).strip()
        # 12 epochs in the 8 cells there is room for, epoch 1 first (not the last 8 epochs)
        assert line.split("  accuracy %")[0] == "loss █▇▆▅▄▃▃▂ 2.3→0.1"
        assert len(line) <= 80


async def test_the_culprit_of_a_stuck_run_is_marked_in_the_rank_table(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = copy_of_recorded(tmp_path)
    save_snapshot(
        runs / LIVE_RUN,
        StackSnapshot(
            time=NOW - 5,
            reason="stall",
            ranks=(
                *(RankDiagnosis(rank=r, pid=None, activity=RankActivity.WAITING) for r in (0, 1)),
                RankDiagnosis(rank=2, pid=None, activity=RankActivity.STEPPING),
                RankDiagnosis(rank=3, pid=None, activity=RankActivity.WAITING),
            ),
            culprit_rank=2,
            culprit_reason="the only rank not waiting on its peers",
        ),
    )
    app = make_app(runs)
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_run(pilot, app, RunDir(runs / LIVE_RUN))
        rows = text_of(screen.query_one(RankTable)).splitlines()[1:]
        states = {row.split()[0]: row.split(maxsplit=9)[-1].strip() for row in rows}
        assert states == {"0": "running", "1": "straggler", "2": "stalled ◀", "3": "running"}
        assert "culprit rank 2 ◀" in text_of(screen.query_one("#diagnosis", Static))


async def test_up_and_down_go_round_the_ranks_and_pick_the_log_shown(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_run(pilot, app, RunDir(RECORDED / LIVE_RUN))
        table = screen.query_one(RankTable)
        numbers = [r.rank for r in table.ranks]
        assert numbers == [0, 1, 2, 3]
        table.selected = 3
        table.action_move(1)  # past the last rank: the first
        await settle(pilot)
        assert table.selected == 0
        table.action_move(-1)
        table.action_move(-1)
        await settle(pilot)
        assert table.selected == 2
        table.focus()
        await settle(pilot)
        lines = [line for line in table.render().renderables if isinstance(line, Text)]
        marked = [str(line).split()[0] for line in lines if "reverse" in str(line.spans)]
        assert marked == ["2"]


async def test_the_stacks_screen_opens_on_the_main_thread_native_frames_folded(
    make_app: Callable[..., DdptuiApp],
) -> None:
    watchdog = ThreadStack("Thread 0x7f00 (watchdog)", (Frame("wait", "/usr/lib/threading.py", 9),))
    main_thread = ThreadStack(
        "MainThread",
        (
            Frame("ncclKernel", "/usr/lib/libnccl.so.2", native=True),
            Frame("cudaStreamSync", "/usr/lib/libcudart.so", native=True),
            Frame("all_reduce", "/site-packages/torch/distributed/distributed_c10d.py", 2501),
            Frame("train_step", "/home/u/train.py", 42),
        ),
        main=True,
    )
    snapshot = StackSnapshot(
        time=NOW,
        reason="stall",
        ranks=(
            RankDiagnosis(
                rank=0,
                pid=42,
                activity=RankActivity.WAITING,
                method="py-spy",
                stack="(text)",
                threads=(watchdog, main_thread),
            ),
        ),
    )  # fmt: skip
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.push_screen(StacksScreen(RunDir(RECORDED / LIVE_RUN), snapshot))
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, StacksScreen)
        body = text_of(screen.query_one("#stacks-text", Static)).splitlines()
        threads = [line.strip() for line in body if line.strip().endswith(":") and "Thread" in line]
        assert threads == ["MainThread (main):", "Thread 0x7f00 (watchdog):"]
        assert "      … 2 native frames (n shows them)" in body
        await pilot.press("n")
        await settle(pilot)
        body = text_of(screen.query_one("#stacks-text", Static))
        assert "ncclKernel (/usr/lib/libnccl.so.2)" in body


async def test_a_log_whose_last_line_has_no_newline_is_shown(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = copy_of_recorded(tmp_path)
    log = runs / GPU_RUN / "logs" / "rank-0.log"
    log.write_text("loading\n" + "epoch 1 " + "." * 40_000)  # a progress line, 40 kB, no newline
    app = make_app(runs)
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_run(pilot, app, RunDir(runs / GPU_RUN))
        shown = [line.plain for line in screen.query_one(TailLines).lines]
        assert shown == ["…" + "." * 32_768]  # its end, marked as cut
        log.write_text("epoch 1 step 3/40")  # short, and no newline either
        screen.poll()
        await settle(pilot)
        assert [line.plain for line in screen.query_one(TailLines).lines] == ["epoch 1 step 3/40"]


async def test_brackets_with_one_run_open_say_why_they_do_nothing(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_run(pilot, app, RunDir(RECORDED / GPU_RUN))
        await pilot.press("right_square_bracket")
        await settle(pilot)
        assert app.screen is screen
        assert notices(app)[-1] == (
            "This is the only run open: [ and ] move between open runs (open another from the "
            "Runs screen, r)."
        )
        await open_run(pilot, app, RunDir(RECORDED / FAILED_RUN))
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert isinstance(app.screen, RunScreen) and app.screen.run_dir.run_id == GPU_RUN
