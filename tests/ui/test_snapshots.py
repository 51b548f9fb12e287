"""SVG snapshots of every screen at 80x24 and at a large size, fed from the recorded run directory
(tests/fixtures/recorded-run), a stand-in NVML (GPU 0 fine, GPU 1 failing) and a stand-in process
probe, with the clock, the time zone and the colours pinned.

A failing snapshot means the rendering changed. Open the report pytest links to, and if the change
is intended, run ``pytest tests/ui/test_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from ddptui.app import DdptuiApp
from ddptui.widgets import confirm
from engine.core.runs.rundir import RunDir
from tests.fixtures.standin_nvml import EIGHT_GPUS, standin_nvml
from tests.ui.conftest import SIZES
from tests.ui.queue_standin import standin_line
from tests.ui.standins import (
    EIGHT_RANK_LAUNCHER,
    EIGHT_RANK_PIDS,
    FAILED_RUN,
    GPU_RUN,
    LIVE_RUN,
    RECORDED,
    StandInProbe,
    make_eight_rank_run,
    settle,
)


def on_screen(
    *keys: str,
    run: str | None = None,
    session: tuple[str, ...] = (),
    focus: str | None = None,
    until: Callable[[DdptuiApp], bool] | None = None,
) -> Callable[[Pilot[Any]], Any]:
    """Open ``run`` (if given), record ``session`` runs as launched here, focus ``focus``, press
    ``keys``, and wait until every worker has posted, every handler has run and ``until`` (if
    given) holds."""

    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, DdptuiApp)
        await settle(pilot, lambda: app.gpu_inventory is not None)
        for run_id in session:
            app.session_runs.append(RunDir(RECORDED / run_id))
        if run is not None:
            app.open_run(RunDir(RECORDED / run))
            await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        if focus is not None:
            app.screen.query_one(focus).focus()
        for key in keys:
            await pilot.press(key)
            await settle(pilot)
        await settle(pilot, None if until is None else lambda: until(app))

    return run_before


def runs_listed(app: DdptuiApp) -> bool:
    """The Runs screen has put the recorded runs in its table (its lister runs in a worker)."""
    from textual.widgets import DataTable

    return app.screen.query_one(DataTable).row_count > 0


SCREENS = {
    "launch": on_screen(),
    "launch-gpu-picked": on_screen("space", focus="#gpu-picker"),
    "run-live": on_screen(run=LIVE_RUN),
    "run-gpus": on_screen(run=GPU_RUN),
    "run-failed": on_screen(run=FAILED_RUN),
    "run-kill-confirm": on_screen("k", run=LIVE_RUN),
    # t: the step view (each rank's stacked step split, the curves per step) in place of the GPUs
    # and the log on a small terminal; out of the way on a large one, where it is shown already.
    "run-live-timing": on_screen("t", run=LIVE_RUN),
    "runs": on_screen("r", until=runs_listed),
    "processes": on_screen("p"),
    "results-session": on_screen("c", session=(GPU_RUN, FAILED_RUN, LIVE_RUN)),
    "results-empty": on_screen("c"),
    "quit-confirm": on_screen("q", run=LIVE_RUN),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("screen", SCREENS)
def test_screen(
    snap_compare: Any, make_app: Callable[..., DdptuiApp], screen: str, size: str
) -> None:
    assert snap_compare(make_app(), terminal_size=SIZES[size], run_before=SCREENS[screen])


def test_launch_without_nvml(snap_compare: Any, make_app: Callable[..., DdptuiApp]) -> None:
    """No driver: the device picker says why and offers CPU ranks; GPU presets say they cannot run."""
    with standin_nvml(fail_init="Driver Not Loaded"):
        assert snap_compare(make_app(), terminal_size=SIZES["small"], run_before=on_screen())


# The GPUs screen on the eight-GPU stand-in machine: a ddptui run on GPUs 0-1, a foreign job of
# another user on 2-4, an orphaned job on 5 (its worker unlisted), GPU 6 held only by a process
# NVML does not list, GPU 7 free.
GPU_SIZES = {"small": (80, 24), "large": (200, 50)}
GPU_SCREENS = {
    "gpus": on_screen("g"),
    "gpus-stop-job": on_screen("g", "down", "down", "down", "down", "down", "down", "T"),
    "gpus-by-memory": on_screen("g", "full_stop", "full_stop", "full_stop"),
}


@pytest.mark.parametrize("size", GPU_SIZES)
@pytest.mark.parametrize("screen", GPU_SCREENS)
def test_gpus_screen(
    snap_compare: Any,
    make_app: Callable[..., DdptuiApp],
    monkeypatch: pytest.MonkeyPatch,
    screen: str,
    size: str,
) -> None:
    monkeypatch.setattr(confirm, "may_stop_other_users", lambda: True)  # as root
    with standin_nvml(machine=EIGHT_GPUS):
        assert snap_compare(
            make_app(), terminal_size=GPU_SIZES[size], run_before=GPU_SCREENS[screen]
        )


def test_gpus_screen_without_nvml(snap_compare: Any, make_app: Callable[..., DdptuiApp]) -> None:
    """No driver: one line says why; the ranks of ddptui runs on the CPU are listed."""
    with standin_nvml(fail_init="Driver Not Loaded"):
        assert snap_compare(make_app(), terminal_size=SIZES["small"], run_before=on_screen("g"))


def test_eight_ranks_on_eight_gpus_at_80x24(
    snap_compare: Any, make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    """The rank table folds to a line per state and the GPUs pair up, so the log keeps lines."""
    with standin_nvml(machine=EIGHT_GPUS):
        run = make_eight_rank_run(tmp_path / "runs")
        probe = StandInProbe(alive=[EIGHT_RANK_LAUNCHER.pid, *EIGHT_RANK_PIDS])
        app = make_app(run.path.parent, probe=probe)

        async def open_it(pilot: Pilot[Any]) -> None:
            await settle(pilot, lambda: app.gpu_inventory is not None)
            app.open_run(run)
            await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
            await settle(pilot)

        assert snap_compare(app, terminal_size=SIZES["small"], run_before=open_it)


def test_the_runs_screen_shows_the_machines_queue_at_80x24(
    snap_compare: Any, make_app: Callable[..., DdptuiApp]
) -> None:
    """Above the runs, the queue: who holds their claim, who waits for what, for how long, and
    why (a GPU another user's process holds; CPU slots a claim holds)."""
    app = make_app()
    app.actions.line = standin_line()  # type: ignore[attr-defined]
    waited = on_screen("r", until=lambda app: runs_listed(app) and queue_shown(app))
    assert snap_compare(app, terminal_size=SIZES["small"], run_before=waited)


def queue_shown(app: DdptuiApp) -> bool:
    from ddptui.widgets.queue_line import QueueLine

    return bool(app.screen.query_one(QueueLine).display)
