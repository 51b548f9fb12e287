"""Fixtures for the UI tests: the app fed from the recorded run directory, a stand-in NVML at the
pynvml boundary (two GPUs, the second failing), a stand-in process probe and engine actions, and a
pinned clock, time zone and colour mode, so every snapshot is the same on every machine."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ddptui.app import DdptuiApp
from engine.core.host.gpus import GpuInventory
from engine.core.plan.resource_guard import ResourceCheck, check_resources
from engine.core.plan.run_plan import RunPlan
from tests.fixtures import make_recorded_run as recorded
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.standin_nvml import standin_nvml
from tests.ui.standins import (
    NOW,
    RECORDED,
    StandInActions,
    StandInProbe,
    seed_gpu_history,
)

USER_PRESETS = REPO_ROOT / "tests" / "fixtures" / "user-presets"
SNAPSHOT_MEMORY_BYTES = 64 * 2**30
SNAPSHOT_CORES = 16
SIZES = {"small": (80, 24), "large": (160, 48)}
HOUR = 3600.0


def pinned_resources(plan: RunPlan, inventory: GpuInventory | None) -> ResourceCheck:
    """The resource guard on a fixed machine: 16 cores, 64 GiB available, the stand-in GPUs."""
    return check_resources(
        plan,
        inventory=inventory or GpuInventory(error="not sampled yet"),
        available_bytes=SNAPSHOT_MEMORY_BYTES,
        cores=SNAPSHOT_CORES,
    )


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
def make_app(pinned: None, nvml: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[..., DdptuiApp]:
    """An app on the recorded runs with every machine boundary pinned. Polling is hourly, so a
    snapshot shows exactly one read of each source; the launch form's where row asks the stand-in
    actions for Slurm's partitions."""
    from ddptui.widgets import where_to_run

    def make(runs_dir: Path = RECORDED, **kwargs: Any) -> DdptuiApp:
        probe = StandInProbe(alive=[recorded.LIVE_LAUNCHER.pid, *recorded.LIVE_RANK_PIDS])
        options: dict[str, Any] = {
            "clock": lambda: NOW,
            "resource_checker": pinned_resources,
            "probe": probe,
            "actions": StandInActions(runs_dir),
            "run_poll_seconds": HOUR,
            "gpu_poll_seconds": HOUR,
            "list_poll_seconds": HOUR,
        }
        options.update(kwargs)
        app = DdptuiApp(runs_dir, **options)
        partitions = getattr(options["actions"], "slurm_partitions", None)
        if partitions is not None:
            monkeypatch.setattr(where_to_run, "read_slurm_partitions", partitions)
        seed_gpu_history(app)
        return app

    return make
