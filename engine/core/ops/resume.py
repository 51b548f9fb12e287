"""``ddptui resume RUN`` and the UI's resume: go on with a failed, killed or lost run of this
machine in its own run directory, as its next attempt, from its newest checkpoint.

Every check comes first, and a refusal (``ResumeRefused``, one sentence) starts nothing and
changes nothing: a run that is going (or has any process left that carries its marker), another
user's run, a run another backend placed (a scheduler's), a completed one, one whose config.toml no longer loads or no longer
fits this machine, and one whose checkpoint is of another model or another number of ranks (as
its checkpoint.json says; the ranks check the checkpoint itself again). Then the attempt that
ended is moved below ``attempts/<n>/`` (``engine.core.runs.attempts``: a second ddptui resuming
the same run at the same moment finds that folder made and is refused), run.json names attempt
n+1 (``starting``), and the launcher starts as ``ddptui run`` starts it; it goes on from the
checkpoint (``engine.core.runs.resume_point``; step 0 where there is none). Plain Python.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from engine.core.backends.local.start import StartedRun, check_run, start_launcher
from engine.core.backends.registry import LOCAL, backend_for
from engine.core.common.config_error import ConfigError
from engine.core.common.run_files import SpaceReserve
from engine.core.common.statuses import RunStatus
from engine.core.config.schema import RunConfig
from engine.core.plan.resource_guard import ResourceCheck
from engine.core.plan.run_plan import RunPlan
from engine.core.procs.run_proof import RunMarker, marked_processes
from engine.core.runs.attempts import RESUMABLE, archive_attempt
from engine.core.runs.observer import RunObserver
from engine.core.runs.resume_point import ResumePoint, checkpoint_mismatch, resume_point
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo, run_dir_owner
from engine.core.runs.settle import settle_observed


class ResumeRefused(ValueError):
    """A run that cannot be resumed: one sentence saying why; nothing was started or changed."""


@dataclass(frozen=True)
class ResumePlan:
    """What a resume of one run starts: its config and plan here, the attempt it ended with, and
    the checkpoint the next goes on from (None: step 0)."""

    run_dir: RunDir
    config: RunConfig
    plan: RunPlan
    resources: ResourceCheck
    info: RunInfo
    status: RunStatus
    resume_from: ResumePoint | None

    @property
    def attempt(self) -> int:
        """The attempt a resume starts."""
        return self.info.attempt + 1

    def describe(self) -> str:
        """ "attempt 2 (it was killed), from step 4,800 (epoch 3, step 12 of 1,600)"."""
        where = self.resume_from.describe() if self.resume_from else "step 0 (no checkpoint)"
        how = "failed" if self.status == RunStatus.FAILED else f"was {self.status}"
        return f"attempt {self.attempt} (it {how}), from {where}"


def _status(run_dir: RunDir, info: RunInfo) -> RunStatus:
    """The run's status as the observer decides it (a lost run is settled on the way), refused
    when it is not one that can go on."""
    state = settle_observed(RunObserver(run_dir).observe(info))
    run = f"run {run_dir.run_id}"
    if state.status in RESUMABLE:
        return state.status
    if state.status == RunStatus.COMPLETED:
        raise ResumeRefused(f"{run} completed: there is nothing left of it to train")
    if state.status == RunStatus.ORPHANED:
        raise ResumeRefused(
            f"{run} still has ranks alive with no launcher: `ddptui kill {run_dir.run_id}` "
            "them first"
        )
    if state.status.live:
        launcher = f" (launcher pid {info.launcher.pid})" if info.launcher else ""
        raise ResumeRefused(
            f"{run} is {state.status}{launcher}: only a run that failed, was killed or was lost "
            f"goes on; stop it first with `ddptui kill {run_dir.run_id}`"
        )
    why = f": {state.problem}" if state.problem else ""
    raise ResumeRefused(f"{run} is {state.status}{why}; it cannot be resumed")


def check_resume(run_dir: RunDir) -> ResumePlan:
    """Every check before a resume (ResumeRefused, one sentence, at the first that fails)."""
    run = f"run {run_dir.run_id}"
    owner = run_dir_owner(run_dir)
    if owner is not None:
        raise ResumeRefused(
            f"{run} belongs to {owner}: only its owner resumes it (its next attempt writes into "
            "its run directory)"
        )
    try:
        info = run_dir.read_run_info()
    except RunDirError as err:
        raise ResumeRefused(f"{run} cannot be resumed: {err}") from None
    if backend_for(info) is not LOCAL:
        raise ResumeRefused(
            f"{run} runs on {backend_for(info).name}: ddptui resume goes on with runs of this "
            "machine only"
        )
    status = _status(run_dir, info)
    alive = marked_processes(RunMarker.of_dir(run_dir.path))
    if alive:
        pids = ", ".join(str(p.pid) for p in alive[:5])
        raise ResumeRefused(
            f"{run} still has processes carrying its marker (pid {pids}): `ddptui kill "
            f"{run_dir.run_id}` them first"
        )
    try:
        config = run_dir.load_config()
    except ConfigError as err:
        raise ResumeRefused(f"{run}'s config.toml no longer loads: {err}") from None
    try:
        plan, resources = check_run(config)
    except ConfigError as err:
        raise ResumeRefused(f"{run} cannot start here now: {err}") from None
    point = resume_point(run_dir, config)
    mismatch = checkpoint_mismatch(point, config, plan.world_size) if point else ""
    if mismatch:
        raise ResumeRefused(f"{run} cannot go on from its checkpoint: {mismatch}")
    return ResumePlan(run_dir, config, plan, resources, info, status, point)


def resume_run(run_dir: RunDir) -> tuple[StartedRun, ResumePlan]:
    """Check, move the attempt that ended below attempts/, and start the launcher of the next
    (ResumeRefused, one sentence, when it cannot be: then nothing was started or changed)."""
    planned = check_resume(run_dir)
    try:
        archive_attempt(run_dir, planned.info.attempt)
    except RunDirError as err:
        raise ResumeRefused(f"run {run_dir.run_id} cannot be resumed: {err}") from None
    begun = RunInfo.begun(
        run_dir.run_id,
        planned.config.name,
        world_size=planned.plan.world_size,
        devices=planned.plan.devices.describe(),
        created=planned.info.created,
    )
    try:
        run_dir.write_run_info(replace(begun, attempt=planned.attempt, attempt_started=time.time()))
        SpaceReserve(run_dir.path).make()
        process = start_launcher(run_dir)
    except (OSError, RunDirError) as err:  # the attempt moved away stays: nothing of it is lost
        raise RunDirError(
            f"run {run_dir.run_id}'s attempt {planned.attempt} did not start: {err}"
        ) from None
    started = StartedRun(run_dir, planned.plan, process, planned.resources)
    return started, planned
