"""``ddptui clean``: plan which orphaned jobs may be stopped, and stop them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.core.common.statuses import JobKind, JobState
from engine.core.jobs.process_table import ProcessTable, TrainingJob
from engine.core.procs.stopping import StopResult, protected_pids, stop_refs
from engine.core.runs.rundir import RunDir, run_dir_owner
from engine.core.runs.settle import record_killed

# ---- ddptui clean ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CleanPlan:
    jobs: tuple[TrainingJob, ...]  # orphaned jobs to stop
    left_alone: tuple[tuple[TrainingJob, str], ...]  # orphaned jobs not touched, and why

    @property
    def process_count(self) -> int:
        return sum(len(j.live_processes) for j in self.jobs)


@dataclass(frozen=True)
class CleanedJob:
    job: TrainingJob
    stop: StopResult
    skipped: tuple[str, ...]  # pids whose start time changed since the scan
    summary_written: bool = False


def plan_clean(table: ProcessTable, *, all_users: bool = False) -> CleanPlan:
    """Orphaned jobs only; another user's only with ``all_users`` as root; never a job holding
    this process or its ancestors."""
    protected = protected_pids()
    chosen: list[TrainingJob] = []
    left: list[tuple[TrainingJob, str]] = []
    for job in table.jobs:
        if job.state != JobState.ORPHANED or not job.live_processes:
            continue
        mine = {p.pid for p in job.processes} & protected
        if mine:
            left.append((job, f"it holds this ddptui process or its parent (pid {min(mine)})"))
        elif not job.own and not all_users:
            left.append((job, f"it belongs to {', '.join(job.users)}; as root, add --all-users"))
        elif not job.own and os.getuid() != 0:
            left.append((job, f"it belongs to {', '.join(job.users)}; only root can stop it"))
        elif (owner := _job_run_owner(job)) and not (all_users and os.getuid() == 0):
            left.append((job, f"its run directory belongs to {owner}; as root, add --all-users"))
        else:
            chosen.append(job)
    return CleanPlan(jobs=tuple(chosen), left_alone=tuple(left))


def _job_run_owner(job: TrainingJob) -> str | None:
    """Another user who owns the run directory of one of our jobs, if so."""
    if job.kind != JobKind.DDPTUI or not job.run_dir:
        return None
    return run_dir_owner(RunDir(Path(job.run_dir)))


def clean_orphans(
    plan: CleanPlan, grace: float = 5.0, *, all_users: bool = False
) -> tuple[CleanedJob, ...]:
    """Stop the planned jobs. Each process is looked up again by pid and start time, so one that
    ended since the scan, and a pid reused since, are left alone; of a ddptui run, only processes
    that carry its marker are stopped."""
    cleaned = []
    for job in plan.jobs:
        marker = job.marker if job.kind == JobKind.DDPTUI else None
        result, skipped = stop_refs(
            [p.ref for p in job.live_processes], grace, all_users=all_users, run_marker=marker
        )
        written = False
        if job.kind == JobKind.DDPTUI and job.run_dir and result.stopped:
            run_dir = RunDir(Path(job.run_dir))
            if run_dir.config_path.exists() and not run_dir.summary_path.exists():
                written = record_killed(
                    run_dir, "its launcher was gone; ddptui clean stopped the orphaned ranks"
                )
        cleaned.append(CleanedJob(job, result, tuple(skipped), written))
    return tuple(cleaned)
