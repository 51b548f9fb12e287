"""Pilot tests of the app's behaviour against the recorded runs and stand-ins (no training): every
screen is reachable from the keyboard at 80x24, the launch form turns into the right config, a kill
and a clean need a confirmation, quitting asks about running runs, worker errors are shown and not
fatal, coalesced updates are counted, and the results table exports."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Select, Static

from ddptui.app import DdptuiApp
from ddptui.messages import RunProgressed
from ddptui.screens.launch import LaunchScreen
from ddptui.screens.processes import ProcessesScreen
from ddptui.screens.results import ChoiceDialog, ResultsScreen
from ddptui.screens.run import RunScreen
from ddptui.screens.runs import RunsScreen
from ddptui.widgets import confirm
from ddptui.widgets.confirm import ConfirmDialog
from ddptui.widgets.gpu_panel import GpuPanel
from ddptui.widgets.keys_dialog import KeysDialog
from engine.core.runs.rundir import RunDir
from tests.fixtures.repo import REPO_ROOT
from tests.ui.standins import (
    FAILED_RUN,
    GPU_RUN,
    LIVE_RUN,
    RECORDED,
    StandInActions,
    screen_text,
    settle,
    text_of,
)

SMALL = (80, 24)
pytestmark = pytest.mark.asyncio


def actions(app: DdptuiApp) -> StandInActions:
    assert isinstance(app.actions, StandInActions)
    return app.actions


async def test_every_screen_is_reachable_from_the_keyboard(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, lambda: isinstance(app.screen, LaunchScreen))
        for key, screen in (
            ("r", RunsScreen),
            ("p", ProcessesScreen),
            ("c", ResultsScreen),
            ("l", LaunchScreen),
        ):
            await pilot.press(key)
            await settle(pilot)
            assert isinstance(app.screen, screen), key
        await pilot.press("r")
        await settle(pilot, lambda: isinstance(app.screen, RunsScreen) and bool(app.screen.runs))
        await pilot.press("enter")  # the newest run: the live one, re-attached
        await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        assert isinstance(app.screen, RunScreen)
        assert app.screen.run_dir.run_id == LIVE_RUN
        view = app.screen.view
        assert view is not None and view.run.status == "running"
        assert [r.state for r in view.run.ranks] == ["running", "straggler", "stalled", "running"]
        await pilot.press("escape")
        await settle(pilot)
        assert isinstance(app.screen, RunsScreen)
        await pilot.press("w")  # back to the run last watched
        await settle(pilot)
        assert isinstance(app.screen, RunScreen)


async def test_the_launch_form_becomes_the_config_that_starts(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    actions(app).start_as = RunDir(RECORDED / LIVE_RUN)
    async with app.run_test(size=SMALL) as pilot:
        await settle(
            pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen.current is not None
        )
        screen = app.screen
        assert isinstance(screen, LaunchScreen)
        assert screen.current is not None and screen.current.name == "cpu-demo"
        screen.query_one("#epochs", Input).value = "1"
        screen.query_one("#max-steps", Input).value = "5"
        screen.query_one("#train-size", Input).value = "1280"
        screen.query_one("#precision", Select).value = "bf16"
        screen.query_one("#cpu-ranks", Input).value = "3"
        await settle(pilot)
        assert "overrides" in text_of(screen.query_one("#launch-check", Static))
        screen.query_one("#presets").focus()
        await pilot.press("s")
        await settle(pilot, lambda: isinstance(app.screen, RunScreen))
        (config,) = actions(app).started
        assert (config.training.epochs, config.training.max_steps) == (1, 5)
        assert config.data.train_size == 1280 and config.precision.mode == "bf16"
        assert config.devices.spec == "cpu:3"
        assert config.name == "cpu-demo"
        assert isinstance(app.screen, RunScreen)
        assert [r.run_id for r in app.session_runs] == [LIVE_RUN]


async def test_a_config_that_cannot_run_starts_nothing(make_app: Callable[..., DdptuiApp]) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(
            pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen.current is not None
        )
        screen = app.screen
        assert isinstance(screen, LaunchScreen)
        screen.query_one(
            "#precision", Select
        ).value = "fp16"  # needs CUDA; cpu-demo runs on the CPU
        await settle(pilot)
        assert "fp16 needs CUDA" in text_of(screen.query_one("#launch-check", Static))
        screen.query_one("#presets").focus()
        await pilot.press("s")
        await settle(pilot)
        assert actions(app).started == []
        assert isinstance(app.screen, LaunchScreen)
        # a preset that cannot run here is listed with its reason, not hidden (the stand-in
        # NVML lists two GPUs)
        screen.select_preset("seed-dataparallel")
        await settle(pilot)
        info = text_of(screen.query_one("#preset-info", Static)).splitlines()
        assert info[-1] == (
            "✗ as it is, it cannot run here: devices.spec '4' asks for 4 GPUs, but this machine "
            "has 2"
        )
        listed = next(c for c in screen.listed if c.name == "seed-dataparallel")
        assert not listed.runnable and listed.short_reason == "needs 4 GPUs, 2 here"


async def test_ranks_that_do_not_fit_show_the_guards_sentence_and_start_nothing(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()  # the pinned machine: 16 cores, 64 GiB available
    async with app.run_test(size=SMALL) as pilot:
        await settle(
            pilot, lambda: isinstance(app.screen, LaunchScreen) and app.screen.current is not None
        )
        screen = app.screen
        assert isinstance(screen, LaunchScreen)
        assert "host memory ~" in text_of(screen.query_one("#launch-check", Static))
        screen.query_one("#cpu-ranks", Input).value = "65"
        await settle(pilot)
        check = text_of(screen.query_one("#launch-check", Static))
        assert "asks for 65 CPU ranks, but this machine has 16 cores" in check
        assert screen.query_one("#start").disabled
        screen.query_one("#presets").focus()
        await pilot.press("s")
        await settle(pilot)
        assert actions(app).started == []
        screen.query_one("#cpu-ranks", Input).value = "64"  # 4 per core: allowed by cores
        screen.query_one("#train-size", Input).value = "50000"  # but 64 x ~1.2 GiB > 64 GiB
        await settle(pilot)
        assert "GiB is available here" in text_of(screen.query_one("#launch-check", Static))
        assert screen.query_one("#start").disabled


async def test_kill_asks_first_then_reports(make_app: Callable[..., DdptuiApp]) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.open_run(RunDir(RECORDED / LIVE_RUN))
        await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        await pilot.press("k")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("escape")
        await settle(pilot)
        assert actions(app).killed == []
        await pilot.click("#kill")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await settle(pilot, lambda: bool(actions(app).killed))
        assert actions(app).killed == [LIVE_RUN]
        assert "none left" in text_of(app.screen.query_one("#run-foot", Static))


async def test_a_finished_run_has_nothing_to_kill(make_app: Callable[..., DdptuiApp]) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.open_run(RunDir(RECORDED / FAILED_RUN))
        await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        await pilot.press("k")
        await settle(pilot)
        assert isinstance(app.screen, RunScreen)
        assert actions(app).killed == []
        # the root cause of the failure is on screen, once (the log pins its traceback)
        text = screen_text(app)
        assert text.count("root cause: rank 1") == 1
        assert "rank 1's traceback:" in text_of(app.screen.query_one("#failure", Static))


async def test_quitting_with_a_run_going_asks_and_can_leave_it(
    make_app: Callable[..., DdptuiApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check observes the runs (reading their directories, asking squeue for a Slurm run)
    in a thread, never on the event loop; the answer comes back as a message."""
    import threading

    from ddptui import watch

    checked_in: list[threading.Thread] = []
    real_check = watch.run_is_active

    def recorded(run_dir: RunDir, *args: Any, **kwargs: Any) -> bool:
        checked_in.append(threading.current_thread())
        return real_check(run_dir, *args, **kwargs)

    monkeypatch.setattr(watch, "run_is_active", recorded)
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.session_runs.append(RunDir(RECORDED / LIVE_RUN))
        await pilot.press("q")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        assert checked_in and threading.main_thread() not in checked_in
        await pilot.press("l")
        await settle(pilot)
    assert actions(app).killed == []
    assert app.return_code == 0


async def test_quitting_can_stop_the_runs_first(make_app: Callable[..., DdptuiApp]) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.session_runs.append(RunDir(RECORDED / LIVE_RUN))
        await pilot.press("q")
        await settle(pilot)
        await pilot.press("s")
        await settle(pilot)
    assert actions(app).killed == [LIVE_RUN]


async def test_quitting_with_nothing_running_just_quits(make_app: Callable[..., DdptuiApp]) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.session_runs.append(RunDir(RECORDED / GPU_RUN))
        await pilot.press("q")
        await settle(pilot)
    assert app.return_code == 0


async def test_a_broken_run_directory_is_shown_not_fatal(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    (runs / LIVE_RUN / "run.json").write_text("{not json", encoding="utf-8")
    with open(runs / LIVE_RUN / "events" / "rank-0.jsonl", "a", encoding="utf-8") as f:
        f.write('{"v": 99, "type": "step"}\n')
    app = make_app(runs)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.open_run(RunDir(runs / LIVE_RUN))
        await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.view is not None
        assert "run.json is corrupt" in screen.view.run.problem
        assert screen.view.run.skipped_lines == 1
        assert "run.json is corrupt" in text_of(screen.query_one("#run-foot", Static))


async def test_a_failing_read_is_shown_and_the_next_one_retried(
    make_app: Callable[..., DdptuiApp], monkeypatch: Any
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        from ddptui import watch

        original = watch.RunReader.poll
        monkeypatch.setattr(watch.RunReader, "poll", lambda self, rank=None: 1 / 0)
        app.open_run(RunDir(RECORDED / GPU_RUN))
        await settle(pilot, lambda: bool(getattr(app.screen, "problem", "")))
        screen = app.screen
        assert isinstance(screen, RunScreen)
        assert "ZeroDivisionError" in text_of(screen.query_one("#run-foot", Static))
        monkeypatch.setattr(watch.RunReader, "poll", original)
        screen.poll()
        await settle(pilot, lambda: screen.view is not None)
        assert screen.problem == ""


async def test_stale_updates_coalesce_and_are_counted(make_app: Callable[..., DdptuiApp]) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.open_run(RunDir(RECORDED / GPU_RUN))
        await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.view is not None
        before = screen.coalesced
        view = screen.view
        for _ in range(5):  # queued faster than the screen handles them
            screen.post_message(RunProgressed(view))
        await settle(pilot)
        assert screen.coalesced - before == 4
        assert "stale updates" not in text_of(screen.query_one("#run-foot", Static))
        await pilot.press("d")  # the reader's figures are in the details view
        await settle(pilot)
        details = text_of(screen.query_one("#run-details", Static))
        assert "stale updates skipped: 4" in details and "events read" in details


async def test_one_failing_gpu_is_not_available_alone(make_app: Callable[..., DdptuiApp]) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, lambda: app.gpu_inventory is not None)
        app.open_run(RunDir(RECORDED / GPU_RUN))
        await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        text = text_of(app.screen.query_one(GpuPanel))
        assert "GPU0 A100-SXM4-40GB" in text and "87%" in text
        assert "GPU1 NVIDIA A100-SXM4-40GB not available: NVML: GPU is lost" in text


async def test_results_choose_a_baseline_and_export(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    twin = "20261202-110000-fast-ddp-ffff"
    shutil.copytree(runs / GPU_RUN, runs / twin)
    summary = json.loads((runs / twin / "summary.json").read_text())
    summary["run_id"] = twin
    for epoch in summary["epochs"]:
        epoch["steady_images_per_s"] /= 2
    (runs / twin / "summary.json").write_text(json.dumps(summary))
    app = make_app(runs)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.session_runs.extend(RunDir(runs / r) for r in (GPU_RUN, twin, FAILED_RUN))
        await pilot.press("c")
        screen = app.screen
        assert isinstance(screen, ResultsScreen)
        screen.export_dir = tmp_path
        await settle(pilot, lambda: screen.table is not None)
        assert screen.table.baseline == "fast-ddp-a1b2"
        await pilot.press("b")
        await settle(pilot)
        assert isinstance(app.screen, ChoiceDialog)
        await pilot.press("down", "enter")
        await settle(
            pilot, lambda: screen.table is not None and screen.table.baseline == "fast-ddp-ffff"
        )
        assert screen.table.row("fast-ddp-a1b2").speedup == 2.0
        await pilot.press("m", "v")
        await settle(pilot)
    (markdown,) = tmp_path.glob("ddptui-results-*.md")
    (csv,) = tmp_path.glob("ddptui-results-*.csv")
    assert "| fast-ddp-a1b2" in markdown.read_text()
    assert "2.00x" in markdown.read_text()
    assert csv.read_text().splitlines()[0].startswith("label,")


async def test_clean_asks_first(make_app: Callable[..., DdptuiApp]) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await settle(pilot, lambda: bool(getattr(app.screen, "jobs", None)))
        await pilot.press("x")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await settle(pilot, lambda: actions(app).cleaned == 1)
        assert "cleaned 1 orphaned job" in text_of(app.screen.query_one("#ps-foot", Static))


async def test_a_failing_nvml_sampler_is_shown_not_fatal(
    make_app: Callable[..., DdptuiApp],
) -> None:
    def broken() -> Any:
        raise RuntimeError("sampler exploded")

    app = make_app(gpu_sampler=broken)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, lambda: bool(app._notifications))
        assert any("sampler exploded" in str(n.message) for n in app._notifications)
        await pilot.press("r")
        await settle(pilot)
        assert isinstance(app.screen, RunsScreen)


async def test_a_stalled_run_shows_its_stacks_inline_and_in_full(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    """The recorded live run has a stalled rank 2; a stored snapshot names it the culprit."""
    from ddptui.screens.stacks import StacksScreen
    from engine.core.common.statuses import RankActivity
    from engine.core.stacks.snapshot import Frame, RankDiagnosis, StackSnapshot, save_snapshot

    runs = tmp_path / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    hang = Frame("hang", "/repo/engine/train/faults.py", 35)
    ranks = (
        RankDiagnosis(0, 424250, RankActivity.WAITING, "in backward (all-reduce)",
                      stack="MainThread (main):\n    _engine_run_backward (graph.py:829)"),
        RankDiagnosis(2, 424252, RankActivity.STEPPING, frame=hang, method="py-spy",
                      stack="MainThread (main):\n    hang (/repo/engine/train/faults.py:35)"),
    )  # fmt: skip
    save_snapshot(
        runs / LIVE_RUN,
        StackSnapshot(1.0, "stall", ranks, culprit_rank=2, culprit_reason="the only one"),
    )
    app = make_app(runs)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.open_run(RunDir(runs / LIVE_RUN))
        await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        inline = text_of(screen.query_one("#diagnosis", Static))
        assert "rank 2 stuck at faults.py:35 in hang; rank 0 waiting in backward" in inline
        assert "culprit rank 2" in inline
        assert "ETA stalled" in text_of(screen.query_one("#run-title", Static))
        await pilot.press("s")
        await settle(pilot, lambda: isinstance(app.screen, StacksScreen))
        stacks = app.screen
        assert isinstance(stacks, StacksScreen)
        body = text_of(stacks.query_one("#stacks-text", Static))
        assert "<- culprit: the only one" in body
        assert "hang (/repo/engine/train/faults.py:35)" in body
        await pilot.press("escape")
        await settle(pilot)
        assert app.screen is screen


async def test_processes_show_users_scripts_and_unlisted_gpu_holders(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await settle(pilot, lambda: bool(getattr(app.screen, "jobs", None)))
        table = text_of(app.screen.query_one("#ps-table", Static))
        assert "GPU devices held open that NVML does not list" in table
        assert "8800" in table
        app.screen.query_one("#ps-body").scroll_end(animate=False)
        await settle(pilot)
        shown = screen_text(app).splitlines()
        bo = next(line for line in shown if line.lstrip().startswith("5300"))
        assert " bo " in bo and "finetune_llm.py" in bo  # the script name survives 80 columns


async def test_cleaning_other_users_jobs_needs_the_confirmed_all_users_toggle(
    make_app: Callable[..., DdptuiApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(confirm, "may_stop_other_users", lambda: True)  # as root
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await settle(pilot, lambda: bool(getattr(app.screen, "jobs", None)))
        screen = app.screen
        assert isinstance(screen, ProcessesScreen)
        await pilot.press("x")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        assert "job at 10.0.0.9:29600" not in app.screen.body_text.split("Left alone")[0]
        assert "Left alone: 1 job of bo" in app.screen.body_text
        await pilot.press("escape", "a")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)  # turning all users on is confirmed
        await pilot.press("y")
        await settle(pilot)
        assert screen.all_users
        await pilot.press("x")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        assert "job at 10.0.0.9:29600 (bo)" in app.screen.body_text
        await pilot.press("y")
        await settle(pilot, lambda: actions(app).cleaned == 1)
        assert actions(app).cleaned_all_users == [True]


async def test_not_root_cannot_turn_on_all_users(
    make_app: Callable[..., DdptuiApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(confirm, "may_stop_other_users", lambda: False)
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        await pilot.press("p")
        await settle(pilot, lambda: bool(getattr(app.screen, "jobs", None)))
        await pilot.press("a")
        await settle(pilot)
        assert isinstance(app.screen, ProcessesScreen) and not app.screen.all_users


async def test_results_at_80_columns_put_the_essential_columns_first(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    twin = "20261202-110000-fast-ddp-ffff"
    shutil.copytree(runs / GPU_RUN, runs / twin)
    summary = json.loads((runs / twin / "summary.json").read_text())
    summary["run_id"], summary["devices"], summary["device_count"] = twin, "gpu:0", 1
    for epoch in summary["epochs"]:
        epoch["steady_images_per_s"] /= 2
    (runs / twin / "summary.json").write_text(json.dumps(summary))
    app = make_app(runs)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.session_runs.extend(RunDir(runs / r) for r in (twin, GPU_RUN, FAILED_RUN))
        await pilot.press("c")
        screen = app.screen
        assert isinstance(screen, ResultsScreen)
        await settle(pilot, lambda: screen.table is not None)
        from textual.widgets import DataTable

        labels = [str(c.label) for c in screen.query_one(DataTable).columns.values()]
        assert labels[:8] == ["row", "devices", "prec", "img/s", "speedup", "eff", "acc", "flag"]
        assert {"data wait", "strategy", "epoch s", "note"} <= set(labels[8:])
        assert "→ scrolls right for" in text_of(screen.query_one("#results-scroll", Static))
        shown = screen_text(app)
        header = next(line for line in shown.splitlines() if line.lstrip().startswith("row"))
        assert "flag" in header  # the eight essential columns fit 80 columns
        chart = text_of(screen.query_one("#results-chart", Static))
        assert "speedup against devices" in chart and "bf16" in chart
        lines = chart.splitlines()
        assert lines.index(next(x for x in lines if "gpu:0 " in x)) < lines.index(
            next(x for x in lines if "gpu:0,1" in x)
        )  # ordered by devices
        assert "2.00x" in chart


async def test_at_80_columns_the_footer_shows_quit_and_keys_shows_the_rest(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot)
        app.open_run(RunDir(RECORDED / LIVE_RUN))
        await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        footer = screen_text(app).rstrip().splitlines()[-1]
        assert "? Keys" in footer and "q Quit" in footer, footer
        assert "c Results" not in footer  # no room at 80 columns
        await pilot.press("question_mark")
        await settle(pilot, lambda: isinstance(app.screen, KeysDialog))
        shown = screen_text(app)
        # cut off the footer, or never in it; every one on screen at 80x24
        for keys in ("c  Results", "g  GPUs", "f  Fold", "d  Details", "]  Next run", "k  Kill"):
            assert keys in shown, shown
        assert "q  Quit" in shown and "w  Watch" not in shown  # no watching from a run screen
        await pilot.press("question_mark")
        await settle(pilot, lambda: isinstance(app.screen, RunScreen))
        await pilot.press("question_mark", "escape")
        await settle(pilot, lambda: isinstance(app.screen, RunScreen))
