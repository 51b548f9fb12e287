"""``ddptui resume RUN`` and the UI's resume: go on with a run that failed, was killed or lost
(or that its scheduler ended: a node lost, its time limit, a cancel) in its own run directory,
as its next attempt, from its newest checkpoint, where its backend runs it: this machine's
launcher, or a new job of its scheduler (``Backend.plan_attempt`` / ``start_attempt``).

Every check comes first, and a refusal (``ResumeRefused``, one sentence) starts nothing and
changes nothing: a run that is going (or has any process left that carries its marker), another
user's run, a completed one, one whose config.toml no longer loads or no longer fits where its
backend runs it, and one whose checkpoint is of another model or another number of ranks (as
its checkpoint.json says; the ranks check the checkpoint itself again). Then the attempt that
ended is moved below ``attempts/<n>/`` (``engine.core.runs.attempts``: a second ddptui resuming
the same run at the same moment finds that folder made and is refused), and the backend starts
attempt n+1: run.json names it (``starting``), and its launchers go on from the checkpoint
(``engine.core.runs.resume_point``; step 0 where there is none). Plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.backends.interface import AttemptPlan, Backend
from engine.core.backends.local.start import StartedRun
from engine.core.backends.registry import LOCAL, backend_for
from engine.core.common.config_error import ConfigError
from engine.core.common.statuses import RunStatus
from engine.core.config.schema import RunConfig
from engine.core.plan.resource_guard import ResourceCheck
from engine.core.plan.run_plan import RunPlan
from engine.core.procs.run_proof import RunMarker, marked_processes
from engine.core.runs.attempts import RESUMABLE, RESUMABLE_SAID, archive_attempt
from engine.core.runs.observer import RunObserver
from engine.core.runs.resume_point import ResumePoint, checkpoint_mismatch, resume_point
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo, run_dir_owner
from engine.core.runs.settle import settle_observed


class ResumeRefused(ValueError):
    """A run that cannot be resumed: one sentence saying why; nothing was started or changed."""


@dataclass(frozen=True)
class ResumePlan:
    """What a resume of one run starts: its config, the backend that starts it and its plan
    there, the attempt it ended with, and the checkpoint the next goes on from (None: step 0)."""

    run_dir: RunDir
    config: RunConfig
    backend: Backend
    planned: AttemptPlan
    info: RunInfo
    status: RunStatus
    resume_from: ResumePoint | None

    @property
    def plan(self) -> RunPlan:
        return self.planned.plan

    @property
    def resources(self) -> ResourceCheck | None:
        return self.planned.resources

    @property
    def attempt(self) -> int:
        """The attempt a resume starts."""
        return self.info.attempt + 1

    def describe(self) -> str:
        """ "attempt 2 (it was killed), from step 4,800 (epoch 3, step 12 of 1,600)"."""
        where = self.resume_from.describe() if self.resume_from else "step 0 (no checkpoint)"
        how = _ENDED_HOW.get(self.status, f"was {self.status}")
        return f"attempt {self.attempt} (it {how}), from {where}"


# How the attempt a resume goes on after ended, in "it ..." words (else "it was <status>").
_ENDED_HOW = {
    RunStatus.FAILED: "failed",
    RunStatus.NODE_FAILURE: "lost a node",
    RunStatus.TIMEOUT: "reached its time limit",
}


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
            f"{run} is {state.status}{launcher}: {RESUMABLE_SAID}; stop it first with "
            f"`ddptui kill {run_dir.run_id}`"
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
    backend = backend_for(info)
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
        planned = backend.plan_attempt(config, run_dir)
    except ConfigError as err:
        where = "here" if backend is LOCAL else f"on {backend.title}"
        raise ResumeRefused(f"{run} cannot start {where} now: {err}") from None
    point = resume_point(run_dir, config)
    # a world each node decides as it starts (0) is checked by the ranks as they load it
    known = point is not None and planned.world_size > 0
    mismatch = checkpoint_mismatch(point, config, planned.world_size) if known and point else ""
    if mismatch:
        raise ResumeRefused(f"{run} cannot go on from its checkpoint: {mismatch}")
    return ResumePlan(run_dir, config, backend, planned, info, status, point)


def resume_run(run_dir: RunDir) -> tuple[StartedRun, ResumePlan]:
    """Check, move the attempt that ended below attempts/, and start the next where its backend
    runs it (ResumeRefused, one sentence, when it cannot be: then nothing was started or
    changed)."""
    planned = check_resume(run_dir)
    try:
        archive_attempt(run_dir, planned.info.attempt)
    except RunDirError as err:
        raise ResumeRefused(f"run {run_dir.run_id} cannot be resumed: {err}") from None
    try:
        started = planned.backend.start_attempt(
            run_dir,
            planned.config,
            planned.planned,
            attempt=planned.attempt,
            created=planned.info.created,
        )
    except (OSError, RunDirError, ConfigError) as err:  # the attempt moved away stays
        raise RunDirError(
            f"run {run_dir.run_id}'s attempt {planned.attempt} did not start: {err}"
        ) from None
    return started, planned
