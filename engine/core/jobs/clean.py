"""``ddptui clean``: plan which orphaned jobs may be stopped, and stop them."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from engine.core.common.statuses import JobKind, JobState
from engine.core.jobs.process_table import ProcessTable, TrainingJob
from engine.core.procs.stopping import STOP_GRACE_SECONDS, StopResult, protected_pids, stop_refs
from engine.core.runs.rundir import RunDir, run_dir_owner
from engine.core.runs.settle import record_killed

# ---- ddptui clean ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CleanPlan:
    jobs: tuple[TrainingJob, ...]  # orphaned jobs to stop
    left_alone: tuple[tuple[TrainingJob, str], ...]  # orphaned jobs not touched, and why
    # Asked for by pid (``ddptui clean PID``) but not stopped: the pid and why, one sentence
    not_orphaned: tuple[tuple[int, str], ...] = ()

    @property
    def process_count(self) -> int:
        return sum(len(j.live_processes) for j in self.jobs)


@dataclass(frozen=True)
class CleanedJob:
    job: TrainingJob
    stop: StopResult
    skipped: tuple[str, ...]  # pids whose start time changed since the scan
    summary_written: bool = False


def plan_clean(
    table: ProcessTable, *, all_users: bool = False, pids: frozenset[int] = frozenset()
) -> CleanPlan:
    """Orphaned jobs only; another user's only with ``all_users`` as root; never a job holding
    this process or its ancestors. With ``pids``, only the jobs those processes belong to, and
    for each pid in no orphaned job the reason (raises ``UnknownPids`` for pids that are in no
    training job at all)."""
    if pids:
        table, not_orphaned = _narrowed(table, pids)
    else:
        not_orphaned = ()
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
    return CleanPlan(jobs=tuple(chosen), left_alone=tuple(left), not_orphaned=not_orphaned)


class UnknownPids(ValueError):
    """``ddptui clean PID``: a pid that belongs to no training job ddptui can see."""


def _narrowed(
    table: ProcessTable, pids: frozenset[int]
) -> tuple[ProcessTable, tuple[tuple[int, str], ...]]:
    """The jobs of ``table`` that hold one of ``pids``, and the pids whose job is not orphaned."""
    job_of = {p.pid: job for job in table.jobs for p in job.processes}
    unknown = sorted(pid for pid in pids if pid not in job_of)
    if unknown:
        listed = ", ".join(str(pid) for pid in unknown)
        raise UnknownPids(
            f"pid {listed} {'is' if len(unknown) == 1 else 'are'} in no training job ddptui can "
            "see (`ddptui ps` lists them); nothing was stopped"
        )
    not_orphaned = tuple(
        (pid, f"pid {pid} is in {job_of[pid].label}, which is {job_of[pid].state}: left alone")
        for pid in sorted(pids)
        if job_of[pid].state != JobState.ORPHANED
    )
    keys = {job_of[pid].key for pid in pids}
    return replace(table, jobs=tuple(j for j in table.jobs if j.key in keys)), not_orphaned


def _job_run_owner(job: TrainingJob) -> str | None:
    """Another user who owns the run directory of one of our jobs, if so."""
    if job.kind != JobKind.DDPTUI or not job.run_dir:
        return None
    return run_dir_owner(RunDir(Path(job.run_dir)))


def clean_orphans(
    plan: CleanPlan, grace: float = STOP_GRACE_SECONDS, *, all_users: bool = False
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
