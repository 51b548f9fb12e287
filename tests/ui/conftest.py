"""Fixtures for the UI tests: the app fed from the recorded run directory, a stand-in NVML at the
pynvml boundary (two GPUs, the second failing), a stand-in process probe and engine actions, and a
pinned clock, time zone and colour mode, so every snapshot is the same on every machine."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ddptui.actions import EngineActions, Outcome
from ddptui.app import DdptuiApp
from engine.config import RunConfig
from engine.process_table import ProcessTable, TrainingJob, TrainingProcess
from engine.rundir import RunDir
from tests.conftest import REPO_ROOT
from tests.fixtures import make_recorded_run as recorded
from tests.ui.standins import StandInProbe, standin_nvml

RECORDED = Path("tests/fixtures/recorded-run")  # relative: snapshots show it as is
USER_PRESETS = REPO_ROOT / "tests" / "fixtures" / "user-presets"
LIVE_RUN = recorded.LIVE_RUN
GPU_RUN = recorded.GPU_RUN
FAILED_RUN = recorded.FAILED_RUN
NOW = recorded.NOW
SIZES = {"small": (80, 24), "large": (160, 48)}
HOUR = 3600.0


def orphan_table() -> ProcessTable:
    """What the process scan of the snapshot machine finds: our live run, and an orphaned torchrun
    job whose agent is gone."""
    live = tuple(
        TrainingProcess(
            pid=pid,
            ppid=recorded.LIVE_LAUNCHER.pid,
            start_time=recorded.LIVE_START,
            user="ana",
            role="rank",
            rank=rank,
            local_rank=rank,
            world_size=4,
            state="running",
            age_seconds=95.0,
            cpu_percent=97.0,
            rss_bytes=310 * 2**20,
            gpu=(),
            command="python -c from multiprocessing.spawn import spawn_main",
            own=True,
        )
        for rank, pid in enumerate(recorded.LIVE_RANK_PIDS)
    )
    launcher = TrainingProcess(
        pid=recorded.LIVE_LAUNCHER.pid,
        ppid=1000,
        start_time=recorded.LIVE_LAUNCHER.start_time,
        user="ana",
        role="launcher",
        rank=None,
        local_rank=None,
        world_size=4,
        state="running",
        age_seconds=96.0,
        cpu_percent=1.0,
        rss_bytes=90 * 2**20,
        gpu=(),
        command=f"python -m engine.launch runs/{LIVE_RUN}",
        own=True,
    )
    orphans = tuple(
        TrainingProcess(
            pid=5100 + rank,
            ppid=1,
            start_time=NOW - 7200,
            user="ana",
            role="rank",
            rank=rank,
            local_rank=rank,
            world_size=2,
            state="orphaned",
            age_seconds=7200.0,
            cpu_percent=0.0,
            rss_bytes=2100 * 2**20,
            gpu=(),
            command="python train.py --epochs 90",
            own=True,
        )
        for rank in range(2)
    )
    return ProcessTable(
        jobs=(
            TrainingJob(
                key=f"ddptui:{LIVE_RUN}",
                kind="ddptui",
                label=f"ddptui run {LIVE_RUN}",
                state="running",
                reason="its launcher is alive",
                users=("ana",),
                processes=(launcher, *live),
                launcher_pid=launcher.pid,
                launcher_alive=True,
                run_id=LIVE_RUN,
                run_dir=str(RECORDED / LIVE_RUN),
            ),
            TrainingJob(
                key="torchelastic:none@127.0.0.1:29500",
                kind="torchelastic",
                label="torchrun job 'none' at 127.0.0.1:29500",
                state="orphaned",
                reason="its torchrun agent is gone",
                users=("ana",),
                processes=orphans,
            ),
        ),
        notes=("1 process of another user could not be inspected.",),
        gpu_error=None,
        scanned_at=NOW,
    )


class StandInActions(EngineActions):
    """Engine actions that record what the UI asked for instead of touching the machine."""

    def __init__(self, runs_dir: Path) -> None:
        super().__init__(runs_dir)
        self.started: list[RunConfig] = []
        self.killed: list[str] = []
        self.cleaned = 0
        self.start_as: RunDir | None = None

    def start_run(self, config: RunConfig, gpu_count: int) -> Any:
        self.started.append(config)
        if self.start_as is None:
            raise RuntimeError("this stand-in starts nothing")

        class Started:
            run_dir = self.start_as
            run_id = self.start_as.run_id

            def poll(self) -> int | None:
                return None

        return Started()

    def kill_run(self, run_dir: RunDir, grace: float = 5.0) -> Outcome:
        self.killed.append(run_dir.run_id)
        return Outcome(True, f"stopped run {run_dir.run_id}: 5 processes; none left")

    def scan_processes(self) -> ProcessTable:
        return orphan_table()

    def clean(self, grace: float = 5.0) -> Outcome:
        self.cleaned += 1
        return Outcome(True, "cleaned 1 orphaned job; 2 processes stopped")

    def list_benches(self) -> list[Any]:
        return []


def seed_gpu_history(app: DdptuiApp) -> None:
    """A fixed 40-sample history, so the sparklines are the same in every snapshot."""
    for i in range(40):
        util = 50 + 45 * math.sin(i / 4)
        app.gpu_history.add(0, util, 0.2 + 0.1 * (i % 5))
        app.gpu_history.add(1, None, None)


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Colours on, UTC, the repo as working directory (the runs dir is shown relative)."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("DDPTUI_PRESETS", str(USER_PRESETS))
    monkeypatch.chdir(REPO_ROOT)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def nvml() -> Iterator[Any]:
    with standin_nvml() as module:
        yield module


@pytest.fixture
def make_app(pinned: None, nvml: Any) -> Callable[..., DdptuiApp]:
    """An app on the recorded runs with every machine boundary pinned. Polling is hourly, so a
    snapshot shows exactly one read of each source."""

    def make(runs_dir: Path = RECORDED, **kwargs: Any) -> DdptuiApp:
        probe = StandInProbe(alive=[recorded.LIVE_LAUNCHER.pid, *recorded.LIVE_RANK_PIDS])
        options: dict[str, Any] = {
            "clock": lambda: NOW,
            "probe": probe,
            "actions": StandInActions(runs_dir),
            "run_poll_seconds": HOUR,
            "gpu_poll_seconds": HOUR,
            "list_poll_seconds": HOUR,
        }
        options.update(kwargs)
        app = DdptuiApp(runs_dir, **options)
        seed_gpu_history(app)
        return app

    return make


async def settle(pilot: Any, until: Callable[[], bool] | None = None, timeout: float = 5.0) -> None:
    """Let workers post and handlers run (until ``until`` holds, when given)."""
    deadline = time.monotonic() + timeout
    while True:
        await pilot.pause(0.05)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        if until is None or until() or time.monotonic() > deadline:
            return
