"""The run screen once a run has ended (a summary with its figures, root cause and curves; no kill
key), the reader's figures in a details view, and a small terminal with 8 ranks on 8 GPUs, where
the rank table folds to a line per state so the log tail keeps some lines."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from textual.widgets import Static

from ddptui.app import DdptuiApp
from ddptui.screens.run import LOG_KEEP, RunScreen
from ddptui.widgets.log_tail import TailLines
from ddptui.widgets.rank_table import RankTable
from ddptui.widgets.run_summary import RunSummaryPanel
from engine.core.runs.rundir import RunDir
from tests.fixtures.standin_nvml import EIGHT_GPUS, standin_nvml
from tests.ui.standins import (
    EIGHT_RANK_LAUNCHER,
    EIGHT_RANK_PIDS,
    FAILED_RUN,
    GPU_RUN,
    LIVE_RUN,
    RECORDED,
    StandInProbe,
    make_eight_rank_run,
    screen_text,
    settle,
    stand_in_actions,
    text_of,
)

pytestmark = pytest.mark.asyncio
SMALL = (80, 24)


async def open_run(pilot: object, app: DdptuiApp, run_dir: RunDir) -> RunScreen:
    await settle(pilot, lambda: app.gpu_inventory is not None)
    app.open_run(run_dir)
    await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
    screen = app.screen
    assert isinstance(screen, RunScreen)
    return screen


def footer_keys(app: DdptuiApp) -> set[str]:
    return {key for key, b in app.active_bindings.items() if b.binding.show and b.enabled}


async def test_a_completed_run_ends_with_its_summary_and_curves(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_run(pilot, app, RunDir(RECORDED / GPU_RUN))
        summary = screen.query_one(RunSummaryPanel)
        assert summary.display
        text = text_of(screen.query_one("#summary-text", Static))
        for part in ("completed", "acc 53.0%", "epoch 2s", "10k img/s", "data wait 5%"):
            assert part in text, part
        sparks = text_of(screen.query_one("#summary-sparks", Static))
        assert "loss" in sparks and "accuracy %" in sparks and "images/s" in sparks
        assert "k" not in footer_keys(app)  # nothing left to kill
        assert not screen.check_action("kill", ())


async def test_a_large_terminal_draws_the_curves_as_charts(
    make_app: Callable[..., DdptuiApp],
) -> None:
    from textual_plotext import PlotextPlot

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await open_run(pilot, app, RunDir(RECORDED / GPU_RUN))
        await settle(pilot)
        assert len(screen.query_one(RunSummaryPanel).query(PlotextPlot)) == 3
        assert "loss per epoch" in screen_text(app)
        # the step view is shown beside it on a terminal this tall: its curves per step too
        assert "loss by step" in screen_text(app) and len(screen.query(PlotextPlot)) == 6


async def test_a_failed_run_names_its_root_cause_in_the_summary(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_run(pilot, app, RunDir(RECORDED / FAILED_RUN))
        text = text_of(screen.query_one("#summary-text", Static))
        assert "failed" in text
        assert "root cause: rank 1: InjectedFault: injected crash on rank 1 at step 12" in text


async def test_a_live_run_keeps_its_kill_key_and_no_summary(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_run(pilot, app, RunDir(RECORDED / LIVE_RUN))
        assert "k" in footer_keys(app)
        assert not screen.query_one(RunSummaryPanel).display
        assert "events" not in text_of(screen.query_one("#run-foot", Static))


async def test_a_failed_run_offers_r_which_follows_its_next_attempt(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    actions = stand_in_actions(app)
    async with app.run_test(size=SMALL) as pilot:
        live = await open_run(pilot, app, RunDir(RECORDED / LIVE_RUN))
        assert "R" not in footer_keys(app) and "k" in footer_keys(app)  # a going run: no resume
        screen = await open_run(pilot, app, RunDir(RECORDED / FAILED_RUN))
        assert screen is not live
        assert "R" in footer_keys(app) and "k" not in footer_keys(app)
        assert screen.started is None
        await pilot.press("R")
        await settle(pilot, lambda: screen.started is not None)
        assert actions.resumed == [FAILED_RUN]
        assert app.screen is screen  # the same screen, now following the new attempt's launcher
        assert app.started[FAILED_RUN] is screen.started
        assert [n.title for n in app._notifications][-1] == "Resumed"


@pytest.fixture
def eight_ranks(tmp_path: Path) -> Iterator[RunDir]:
    with standin_nvml(machine=EIGHT_GPUS):
        yield make_eight_rank_run(tmp_path / "runs")


def eight_rank_app(make_app: Callable[..., DdptuiApp], run: RunDir) -> DdptuiApp:
    probe = StandInProbe(alive=[EIGHT_RANK_LAUNCHER.pid, *EIGHT_RANK_PIDS])
    return make_app(run.path.parent, probe=probe)


async def test_eight_ranks_on_eight_gpus_fold_at_80x24(
    make_app: Callable[..., DdptuiApp], eight_ranks: RunDir
) -> None:
    app = eight_rank_app(make_app, eight_ranks)
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_run(pilot, app, eight_ranks)
        await settle(pilot)
        table = screen.query_one(RankTable)
        assert len(screen.view.run.ranks) == 8 if screen.view else False
        assert table.folded
        folded = text_of(table)
        assert "stalled" in folded and "straggler" in folded and "running" in folded
        assert screen.query_one(TailLines).size.height >= LOG_KEEP - 1
        await pilot.press("f")  # unfolded on request
        await settle(pilot)
        assert not table.folded and table.size.height == 9
        await pilot.press("f")
        await settle(pilot)
        assert table.folded


async def test_a_tall_terminal_shows_every_rank(
    make_app: Callable[..., DdptuiApp], eight_ranks: RunDir
) -> None:
    app = eight_rank_app(make_app, eight_ranks)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await open_run(pilot, app, eight_ranks)
        assert not screen.query_one(RankTable).folded


async def test_why_slow_in_one_line_and_the_step_view_on_t_at_80x24(
    make_app: Callable[..., DdptuiApp],
) -> None:
    """The recorded live run: rank 1's forward and backward are slow. Its cause is one line under
    the ranks; t shows each rank's stacked split and the per-step curves in place of the GPUs
    and the log, and t again brings those back."""
    from textual_plotext import PlotextPlot

    from ddptui.widgets.gpu_panel import GpuPanel
    from ddptui.widgets.log_tail import LogTail
    from ddptui.widgets.step_curves import StepCurvesPanel
    from ddptui.widgets.step_split import StepSplitPanel

    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_run(pilot, app, RunDir(RECORDED / LIVE_RUN))
        why = text_of(screen.query_one("#bottleneck", Static))
        assert why.startswith("slow: rank 1's forward and backward take 2.1x the others'")
        assert "t: timing" in why
        split, curves = screen.query_one(StepSplitPanel), screen.query_one(StepCurvesPanel)
        assert not split.display and not curves.display
        await pilot.press("t")
        await settle(pilot)
        assert split.display and curves.display
        assert not screen.query_one(GpuPanel).display and not screen.query_one(LogTail).display
        bars = text_of(split).splitlines()
        assert [line.split()[0] for line in bars[:4]] == ["r0", "r1", "r2", "r3"]
        assert bars[1].rstrip().endswith("forward 55% ◀")  # the slow rank, marked
        assert "450.0 ms" in bars[1] and "300.0 ms" in bars[0]
        assert bars[4].startswith("step: █ data  █ forward  █ backward  █ sync")
        plots = list(curves.query(PlotextPlot))
        assert len(plots) == 3
        text = screen_text(app)
        for title in ("loss by step", "step time (ms)", "images/s by step"):
            assert title in text
        await pilot.press("t")
        await settle(pilot)
        assert not split.display and screen.query_one(LogTail).display
        assert screen.query_one(GpuPanel).display
