"""The Slurm backend (``engine.core.backends.slurm``): a run's ranks on Slurm's nodes, one
node launcher per node. Plain Python.
"""

from __future__ import annotations

from pathlib import Path

from engine.core.backends.interface import AttemptPlan, RecordedProcess, RunOptions
from engine.core.backends.local.backend import recorded_here
from engine.core.backends.local.kill import KillResult
from engine.core.backends.local.start import StartedRun
from engine.core.backends.slurm.options import RUN_OPTIONS
from engine.core.backends.slurm.records import SlurmPlacement, read_node_records
from engine.core.backends.slurm.stacks import snapshot_slurm_run
from engine.core.backends.slurm.state import view_of
from engine.core.backends.slurm.stop import kill_slurm_run
from engine.core.backends.slurm.submit import (
    SlurmRequest,
    check_request,
    resubmit_run,
    submit_run,
)
from engine.core.backends.slurm.watch import SLURM, SLURM_WATCH
from engine.core.common.statuses import StopRequester
from engine.core.config.schema import RunConfig
from engine.core.plan.run_plan import RunPlan
from engine.core.procs.stopping import STOP_GRACE_SECONDS
from engine.core.runs.run_handle import RunHandle
from engine.core.runs.run_info import RunInfo
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir
from engine.core.stacks.snapshot import StackSnapshot


class SlurmBackend:
    name = SLURM
    title = "Slurm"
    watch = SLURM_WATCH
    run_options: RunOptions | None = RUN_OPTIONS

    def owns(self, info: RunInfo) -> bool:
        return SlurmPlacement.of(info) is not None

    def locate(self, run_dir: RunDir, info: RunInfo) -> tuple[RecordedProcess, ...]:
        """run.json's, then each node launcher's record: itself and its ranks."""
        found = list(recorded_here(info))
        for record in read_node_records(run_dir.path)[0].values():
            found += [(None, record.launcher)] if record.launcher else []
            found += record.ranked()
        return tuple(found)

    def check(self, config: RunConfig, runs_dir: Path) -> RunPlan:
        """As ``ddptui run --slurm`` checks it (the partition and its nodes asked of ``sinfo``):
        each node's plan."""
        return check_request(config, runs_dir).plan

    def start(
        self,
        config: RunConfig,
        runs_dir: Path,
        *,
        run_id: str | None = None,
        gpu_count: int | None = None,  # this machine's: the nodes' GPUs are Slurm's to give
    ) -> StartedRun:
        run_dir, plan, handle = submit_run(config, runs_dir, run_id=run_id)
        return StartedRun(run_dir=run_dir, plan=plan, process=handle)

    def plan_attempt(self, config: RunConfig, run_dir: RunDir) -> AttemptPlan:
        """As ``ddptui run --slurm`` checks a new run, for its run directory's storage."""
        request = check_request(config, run_dir.path.parent)
        return AttemptPlan(request.plan, request.world_size, detail=request)

    def start_attempt(
        self, run_dir: RunDir, config: RunConfig, planned: AttemptPlan, *, attempt: int,
        created: float,
    ) -> StartedRun:  # fmt: skip
        """Submitted again as a new job (the earlier job's id stays in the earlier attempt's
        run.json, below attempts/<n>/), which begins the attempt run.json names."""
        request = planned.detail
        if not isinstance(request, SlurmRequest):
            request = check_request(config, run_dir.path.parent)
        handle = resubmit_run(run_dir, config, request, attempt=attempt, created=created)
        return StartedRun(run_dir=run_dir, plan=request.plan, process=handle)

    # The handle is this machine's look at the run; a Slurm run's ranks are looked at through
    # its node launchers' records, which these read themselves.
    def snapshot(
        self, run_dir: RunDir, *, reason: str, handle: RunHandle | None = None
    ) -> StackSnapshot | None:
        return snapshot_slurm_run(run_dir, reason=reason)

    def stop(
        self,
        run_dir: RunDir,
        grace: float = STOP_GRACE_SECONDS,  # Slurm's KillWait governs; the node launchers' own grace is shorter
        *,
        allow_other_users: bool = False,
        by: StopRequester = StopRequester.KILL,
        handle: RunHandle | None = None,
    ) -> KillResult:
        return kill_slurm_run(run_dir, allow_other_users=allow_other_users, by=by, handle=handle)

    def describe(self, state: RunState) -> tuple[str, ...]:
        """Its job, and each node with its ranks and whether it proved itself clean at its end."""
        view = view_of(state.placement)
        if view is None:
            return ()
        job = view.job
        said = f" ({job.state}{': ' + job.reason if job.reason else ''})" if job else ""
        where = "step of your allocation, " if view.in_allocation else ""
        nodes = []
        for name, record in sorted(view.nodes.items(), key=lambda item: item[1].node_rank):
            ranks = ",".join(map(str, record.global_ranks)) or "-"
            proof = record.proof
            checked = "" if proof is None else (" verified" if proof.clean else " NOT clean")
            nodes.append(f"{name} (ranks {ranks}, {record.state}{checked})")
        return (
            f"slurm      {where}job {view.job_id or '-'}{said}; "
            + ("; ".join(nodes) or "no node launcher yet"),
        )


BACKEND = SlurmBackend()  # what the registry finds in this package (engine.core.backends.registry)
