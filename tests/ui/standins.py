"""Stand-ins at the machine boundaries the UI reads: pynvml (two GPUs, the second failing), the
process probe (psutil) and the clock, so snapshots show the same figures on every machine."""

from __future__ import annotations

import math
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddptui.actions import EngineActions, Outcome
from ddptui.app import DdptuiApp
from engine.core import gpus
from engine.core.config import RunConfig
from engine.core.process_identity import ProcessProbe, ProcessRef, ProcessUsage
from engine.core.process_table import ProcessTable, TrainingJob, TrainingProcess
from engine.core.rundir import RunDir
from engine.core.statuses import JobKind, JobState, ProcessRole
from tests.fixtures import make_recorded_run as recorded

RECORDED = Path("tests/fixtures/recorded-run")  # relative: snapshots show it as is
LIVE_RUN = recorded.LIVE_RUN
GPU_RUN = recorded.GPU_RUN
FAILED_RUN = recorded.FAILED_RUN
NOW = recorded.NOW


class NVMLError(Exception):
    """Shaped like pynvml.NVMLError: str() is NVML's message."""


@dataclass
class _Memory:
    used: int
    total: int
    free: int = 0


@dataclass
class _Util:
    gpu: int
    memory: int = 0


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int  # pynvml's name


def fake_pynvml(*, gpu_count: int = 2, fail_init: str | None = None) -> types.ModuleType:
    """GPU 0 answers every query; GPU 1 names itself, then its memory query raises (a lost GPU)."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]

    def init() -> None:
        if fail_init:
            raise NVMLError(fail_init)

    def handle(index: int) -> int:
        if index >= gpu_count:
            raise NVMLError("Invalid Argument")
        return index

    def memory(h: int) -> _Memory:
        if h == 1:
            raise NVMLError("GPU is lost")
        return _Memory(used=13 * 2**30, total=40 * 2**30)

    def processes(h: int) -> list[_Proc]:
        return [_Proc(pid=31010, usedGpuMemory=12 * 2**30)] if h == 0 else []

    functions: dict[str, Any] = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: gpu_count,
        "nvmlSystemGetDriverVersion": lambda: "550.54.15",
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetName": lambda h: "NVIDIA A100-SXM4-40GB",
        "nvmlDeviceGetUUID": lambda h: f"GPU-0000000{h}",
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetUtilizationRates": lambda h: _Util(gpu=87),
        "nvmlDeviceGetTemperature": lambda h, kind: 71,
        "nvmlDeviceGetPowerUsage": lambda h: 251_000,
        "nvmlDeviceGetComputeRunningProcesses": processes,
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
    }
    for name, fn in functions.items():
        setattr(nvml, name, fn)
    return nvml


@contextmanager
def standin_nvml(**kwargs: Any) -> Iterator[types.ModuleType]:
    """Install the fake pynvml in sys.modules for the duration (engine.core.gpus imports it lazily)."""
    saved = sys.modules.get("pynvml")
    module = fake_pynvml(**kwargs)
    sys.modules["pynvml"] = module
    gpus.reset_for_tests()
    try:
        yield module
    finally:
        if saved is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved
        gpus.reset_for_tests()


class StandInProbe(ProcessProbe):
    """Says the given processes are alive and gives every pid fixed CPU / memory figures."""

    def __init__(
        self, alive: Iterable[int] = (), cpu: float = 97.0, rss: int = 310 * 2**20
    ) -> None:
        super().__init__()
        self.alive_pids = set(alive)
        self.cpu = cpu
        self.rss = rss

    def alive(self, ref: ProcessRef | None) -> bool:
        return ref is not None and ref.pid in self.alive_pids

    def pid_alive(self, pid: int) -> bool:
        return pid in self.alive_pids

    def usage(self, pids: Iterable[int]) -> dict[int, ProcessUsage]:
        return {pid: ProcessUsage(self.cpu, self.rss) for pid in pids if pid in self.alive_pids}


def orphan_table() -> ProcessTable:
    """What the process scan of the snapshot machine finds: our live run, and an orphaned torchrun
    job whose agent is gone."""
    live = tuple(
        TrainingProcess(
            pid=pid,
            ppid=recorded.LIVE_LAUNCHER.pid,
            start_time=recorded.LIVE_START,
            user="ana",
            role=ProcessRole.RANK,
            rank=rank,
            local_rank=rank,
            world_size=4,
            state=JobState.RUNNING,
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
        role=ProcessRole.LAUNCHER,
        rank=None,
        local_rank=None,
        world_size=4,
        state=JobState.RUNNING,
        age_seconds=96.0,
        cpu_percent=1.0,
        rss_bytes=90 * 2**20,
        gpu=(),
        command=f"python -m engine.train.launch runs/{LIVE_RUN}",
        own=True,
    )
    orphans = tuple(
        TrainingProcess(
            pid=5100 + rank,
            ppid=1,
            start_time=NOW - 7200,
            user="ana",
            role=ProcessRole.RANK,
            rank=rank,
            local_rank=rank,
            world_size=2,
            state=JobState.ORPHANED,
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
                kind=JobKind.DDPTUI,
                label=f"ddptui run {LIVE_RUN}",
                state=JobState.RUNNING,
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
                kind=JobKind.ELASTIC,
                label="torchrun job 'none' at 127.0.0.1:29500",
                state=JobState.ORPHANED,
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


def _tables_measured(app: Any) -> bool:
    """A DataTable measures its new rows' columns when the app is next idle; until then it draws
    them at the headers' widths, so a screenshot taken in between is not what a user sees."""
    from textual.widgets import DataTable

    return not any(t._require_update_dimensions for t in app.screen.query(DataTable))


async def settle(pilot: Any, until: Callable[[], bool] | None = None, timeout: float = 5.0) -> None:
    """Let workers post and handlers run (until ``until`` holds, when given), and tables measure
    what they were given."""
    deadline = time.monotonic() + timeout
    while True:
        await pilot.pause(0.05)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        done = until is None or until()
        if (done and _tables_measured(pilot.app)) or time.monotonic() > deadline:
            return
