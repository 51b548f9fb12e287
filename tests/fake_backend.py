"""A third backend for the tests, a few dozen lines as any new one should be: its runs' ranks run
on this machine under this machine's launcher, but the run is the fake's own (run.json's
``placement`` names it), so ``backend_of`` hands every operation on it to the fake, and the run
observer asks the fake's watch (itself) where the run is: pending while the fake says its slot is
taken, how it ended once the fake says so, the "node" each rank is on; else this machine's rules
decide. It records what it was asked, so a test can see that ``ddptui kill`` went through it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from engine.core.backends.interface import AttemptPlan, RecordedProcess, RunOptions
from engine.core.backends.local.backend import recorded_here
from engine.core.backends.local.kill import KillResult, kill_run
from engine.core.backends.local.snapshot import snapshot_run
from engine.core.backends.local.start import (
    StartedRun,
    check_run,
    start_next_attempt,
    start_run,
)
from engine.core.backends.registry import LOCAL
from engine.core.common.statuses import RunStatus, StopRequester
from engine.core.config.schema import RunConfig
from engine.core.plan.run_plan import RunPlan
from engine.core.procs.process_identity import ProcessProbe
from engine.core.procs.stopping import STOP_GRACE_SECONDS
from engine.core.runs.placement import Placement, PlacementVerdict, PlacementView
from engine.core.runs.run_handle import RunHandle, observe_handle
from engine.core.runs.run_info import RunInfo
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir
from engine.core.runs.settle import bare_summary
from engine.core.runs.summary import RunSummary
from engine.core.stacks.snapshot import StackSnapshot


class FakeBackend:
    name = "fake"
    title = "the fake"
    run_options: RunOptions | None = None
    attempt_files: tuple[str, ...] = ("fake/slot.json",)  # its own file of one attempt

    def __init__(self, slot: str = "bench-7") -> None:
        self.slot = slot  # the fake's own key in run.json: where it "placed" the run
        self.asked: list[tuple[str, str]] = []  # (operation, run id), in order
        self.watch = self  # what the run observer asks of its runs (engine.core.runs.placement)
        self.waiting_for = ""  # its "scheduler" holds the run back, and says why
        self.ended_as: tuple[RunStatus, str] | None = None  # its "scheduler" ended the run

    def owns(self, info: RunInfo) -> bool:
        return info.placement is not None and info.placement.backend == self.name

    def locate(self, run_dir: RunDir, info: RunInfo) -> tuple[RecordedProcess, ...]:
        return recorded_here(info)  # its ranks run here, under this machine's launcher

    def check(self, config: RunConfig, runs_dir: Path) -> RunPlan:
        return check_run(config)[0]

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

    def plan_attempt(self, config: RunConfig, run_dir: RunDir) -> AttemptPlan:
        return LOCAL.plan_attempt(config, run_dir)  # its ranks run here

    def start_attempt(
        self, run_dir: RunDir, config: RunConfig, planned: AttemptPlan, *, attempt: int,
        created: float,
    ) -> StartedRun:  # fmt: skip
        self.asked.append(("start attempt", run_dir.run_id))
        placement = Placement(self.name, {"slot": self.slot})
        return start_next_attempt(
            run_dir, config, planned.plan, planned.resources, attempt=attempt, created=created,
            placement=placement,
        )  # fmt: skip

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

    # -- its watch: what the run observer asks --------------------------------------------------

    def observe(
        self, run_dir: RunDir, info: RunInfo, now: float, probe: ProcessProbe
    ) -> PlacementVerdict:
        seen = replace(self.recorded(run_dir, info), waiting_for=self.waiting_for)
        if self.ended_as is not None:
            return PlacementVerdict(seen, self.ended_as[0], self.ended_as[1], ended=True)
        if self.waiting_for:
            return PlacementVerdict(seen, RunStatus.PENDING, f"waiting for {self.waiting_for}")
        return PlacementVerdict(seen)  # None: its launcher here decides, as any run's does

    def recorded(self, run_dir: RunDir, info: RunInfo) -> PlacementView:
        slot = str(info.placement.keys.get("slot", "")) if info.placement else ""
        nodes = {rank: f"fake-{slot}" for rank, _ in info.ranked()}
        return PlacementView(self.name, f"slot {slot}", keys={"slot": slot}, rank_nodes=nodes)

    def summary(self, run_dir: RunDir, verdict: PlacementVerdict) -> RunSummary:
        assert verdict.status is not None
        return bare_summary(run_dir, verdict.status, verdict.reason)
