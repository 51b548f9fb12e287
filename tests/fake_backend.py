"""A third backend for the tests, a few dozen lines as any new one should be: its runs' ranks run
on this machine under this machine's launcher, but the run is the fake's own (run.json's
``placement`` names it), so ``backend_of`` hands every operation on it to the fake. It records
what it was asked, so a test can see that ``ddptui kill`` went through it."""

from __future__ import annotations

from pathlib import Path

from engine.core.backends.interface import RecordedProcess
from engine.core.backends.local.backend import recorded_here
from engine.core.backends.local.kill import KillResult, kill_run
from engine.core.backends.local.snapshot import snapshot_run
from engine.core.backends.local.start import StartedRun, start_run
from engine.core.common.statuses import StopRequester
from engine.core.config.schema import RunConfig
from engine.core.procs.stopping import STOP_GRACE_SECONDS
from engine.core.runs.observer import RunState
from engine.core.runs.run_handle import RunHandle, observe_handle
from engine.core.runs.run_info import Placement, RunInfo
from engine.core.runs.rundir import RunDir
from engine.core.stacks.snapshot import StackSnapshot


class FakeBackend:
    name = "fake"

    def __init__(self, slot: str = "bench-7") -> None:
        self.slot = slot  # the fake's own key in run.json: where it "placed" the run
        self.asked: list[tuple[str, str]] = []  # (operation, run id), in order

    def owns(self, info: RunInfo) -> bool:
        return info.placement is not None and info.placement.backend == self.name

    def locate(self, run_dir: RunDir, info: RunInfo) -> tuple[RecordedProcess, ...]:
        return recorded_here(info)  # its ranks run here, under this machine's launcher

    def start(
        self,
        config: RunConfig,
        runs_dir: Path,
        *,
        run_id: str | None = None,
        gpu_count: int | None = None,
    ) -> StartedRun:
        placement = Placement(self.name, {"slot": self.slot})
        started = start_run(
            config, runs_dir, run_id=run_id, gpu_count=gpu_count, placement=placement
        )
        self.asked.append(("start", started.run_id))
        return started

    def snapshot(
        self, run_dir: RunDir, *, reason: str, handle: RunHandle | None = None
    ) -> StackSnapshot | None:
        self.asked.append(("snapshot", run_dir.run_id))
        return snapshot_run(handle or observe_handle(run_dir), reason=reason)

    def stop(
        self,
        run_dir: RunDir,
        grace: float = STOP_GRACE_SECONDS,
        *,
        allow_other_users: bool = False,
        by: StopRequester = StopRequester.KILL,
        handle: RunHandle | None = None,
    ) -> KillResult:
        self.asked.append(("stop", run_dir.run_id))
        return kill_run(run_dir, grace, allow_other_users=allow_other_users, by=by, handle=handle)

    def describe(self, state: RunState) -> tuple[str, ...]:
        return (f"placement  fake, slot {self.slot}",)
