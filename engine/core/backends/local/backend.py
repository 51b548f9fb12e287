"""The local backend (``engine.core.backends.local``): a run's ranks on this machine, under
one launcher in its own session. Plain Python.
"""

from __future__ import annotations

from pathlib import Path

from engine.core.backends.interface import AttemptPlan, RecordedProcess, RunOptions
from engine.core.backends.local.kill import KillResult, kill_run
from engine.core.backends.local.snapshot import snapshot_run
from engine.core.backends.local.start import (
    StartedRun,
    check_run,
    start_next_attempt,
    start_run,
)
from engine.core.common.statuses import StopRequester
from engine.core.config.schema import RunConfig
from engine.core.plan.run_plan import RunPlan
from engine.core.procs.stopping import STOP_GRACE_SECONDS
from engine.core.runs.placement import PlacementWatch
from engine.core.runs.run_handle import RunHandle, observe_handle
from engine.core.runs.run_info import RunInfo
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir
from engine.core.stacks.snapshot import StackSnapshot


def recorded_here(info: RunInfo) -> tuple[RecordedProcess, ...]:
    """The launcher and ranks run.json names: every process of a run on one machine."""
    launcher: tuple[RecordedProcess, ...] = ((None, info.launcher),) if info.launcher else ()
    return (*launcher, *info.ranked())


class LocalBackend:
    name = "local"
    title = "this machine"
    watch: PlacementWatch | None = None  # its runs are decided by their launcher here
    run_options: RunOptions | None = None  # where ddptui run runs unless told otherwise

    def owns(self, info: RunInfo) -> bool:
        return info.placement is None

    def locate(self, run_dir: RunDir, info: RunInfo) -> tuple[RecordedProcess, ...]:
        return recorded_here(info)

    def check(self, config: RunConfig, runs_dir: Path) -> RunPlan:
        """The plan here, with the resource guard ``start`` applies."""
        return check_run(config)[0]

    def start(
        self,
        config: RunConfig,
        runs_dir: Path,
        *,
        run_id: str | None = None,
        gpu_count: int | None = None,
    ) -> StartedRun:
        return start_run(config, runs_dir, run_id=run_id, gpu_count=gpu_count)

    def plan_attempt(self, config: RunConfig, run_dir: RunDir) -> AttemptPlan:
        """The plan here, with the resource guard ``start`` applies."""
        plan, resources = check_run(config)
        return AttemptPlan(plan, plan.world_size, resources)

    def start_attempt(
        self, run_dir: RunDir, config: RunConfig, planned: AttemptPlan, *, attempt: int,
        created: float,
    ) -> StartedRun:  # fmt: skip
        return start_next_attempt(
            run_dir, config, planned.plan, planned.resources, attempt=attempt, created=created
        )

    def snapshot(
        self, run_dir: RunDir, *, reason: str, handle: RunHandle | None = None
    ) -> StackSnapshot | None:
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
        return kill_run(run_dir, grace, allow_other_users=allow_other_users, by=by, handle=handle)

    def describe(self, state: RunState) -> tuple[str, ...]:
        return ()  # this machine: the devices line says where
