"""A run on Slurm going on as its next attempt in the same run directory, as
``supervision.max_restarts`` allows (``ddptui run --slurm --max-restarts N``).

One decision, the local launcher's (``engine.core.runs.restart_policy.decide_restart``, asked
with the run's attempts and ``resume_point``), taken where the end of an attempt is known:

- **a node lost**: a run with restarts is submitted with ``--requeue``, so Slurm itself puts its
  job back in the queue when it ends it NODE_FAIL, whichever node failed, the batch script's own
  included: nothing of ddptui has to live through the failure. Slurm holds a requeued job two
  minutes (BeginTime), then starts it on nodes that answer: a node still down is not among
  them, so none is excluded by name (on a cluster of as many nodes as the job asks, the job
  waits until the lost node is back). As its batch script starts again, with a
  ``SLURM_RESTART_COUNT`` above the count run.json's attempt began with,
  ``begin_after_requeue`` writes down the attempt that ended (``node-failure``, the lost node
  named: ``engine.core.backends.slurm.node_loss``) and asks the decision.
- **a failed attempt** (a rank's failure, or a stall its node launcher ended): the batch
  script's last step, ``finish_attempt``, asks it once every node launcher said how its share
  ended; a restart runs in the same allocation (the batch script starts the node launchers
  again), and the job keeps its nodes.

Either way a restart moves the attempt that ended below ``attempts/<n>/`` (its summary, run.json
with its job, its node records), writes run.json for the next (``starting``; its placement says
how it began and under which restart count of the job), waits what is left of the back-off, and
the node launchers begin the attempt run.json names, from the checkpoint. No restart: the run's
summary says why not. Once the restarts are used up, Slurm is told not to requeue the job again
(``scontrol update Requeue=0``), so a node lost after that ends the run as ``node-failure``.

Plain Python: the batch script runs these through ``engine.core.backends.slurm.job_steps``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace

from engine.core.backends.slurm.cluster import SlurmUnavailable, run_slurm
from engine.core.backends.slurm.jobs import QUEUE, read_job
from engine.core.backends.slurm.node_loss import which_failed
from engine.core.backends.slurm.records import SlurmPlacement
from engine.core.backends.slurm.state import (
    JobReader,
    SlurmVerdict,
    SlurmView,
    ended_view,
    from_nodes,
    read_view,
    settle_slurm_run,
    slurm_summary,
)
from engine.core.common.config_error import ConfigError
from engine.core.common.statuses import RunStatus
from engine.core.runs.attempts import archive_attempt
from engine.core.runs.restart_policy import (
    RESTARTABLE,
    RestartDecision,
    decide_restart,
    restarts_made,
)
from engine.core.runs.resume_point import resume_point
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo
from engine.core.runs.settle import settle_run
from engine.core.runs.summary import AttemptStart

REQUEUE_COUNT_ENV = "SLURM_RESTART_COUNT"  # the times Slurm requeued the job, as its steps see it


def attempt_start(info: RunInfo) -> AttemptStart:
    """How the run's current attempt began, as run.json's placement says (its node launchers
    ask): the run's first, a restart, or ``ddptui resume``."""
    placement = SlurmPlacement.of(info)
    if info.attempt <= 1 or placement is None:
        return AttemptStart.FIRST
    try:
        return AttemptStart(placement.attempt_start)
    except ValueError:
        return AttemptStart.RESUME  # run.json named a later attempt, and no more


def _stop_requeue(job_id: str) -> None:
    """Tell Slurm not to requeue the job again: the run has no restart left. Best effort (a
    Slurm that refuses leaves the next requeue to ``begin_after_requeue``, which ends it)."""
    with contextlib.suppress(SlurmUnavailable):
        run_slurm("scontrol", "update", f"JobId={job_id}", "Requeue=0")
        QUEUE.forget()


def _ended_at(view: SlurmView, now: float) -> float:
    """When the attempt's node launchers last said anything of their end (its start, else)."""
    times = [r.finished or r.started for r in view.nodes.values()]
    return max(times) if times else now


def go_on(
    run_dir: RunDir, info: RunInfo, verdict: SlurmVerdict, view: SlurmView, *, requeues: int
) -> RestartDecision:
    """The attempt of run.json ended as ``verdict`` says: ask the restart policy, then begin the
    next attempt (its back-off waited) or write the run's end. ``requeues``: the job's restart
    count the next attempt begins under. RunDirError when the restart could not begin (the run's
    end is written then, saying so); ConfigError when config.toml no longer loads."""
    placement = SlurmPlacement.of(info)
    assert placement is not None
    config = run_dir.load_config()
    summary = slurm_summary(run_dir, verdict, view)
    max_restarts = config.supervision.max_restarts
    decision = decide_restart(
        summary.attempts,
        max_restarts=max_restarts,
        restarts_done=restarts_made(summary.attempts),
        backoff_seconds=config.supervision.restart_backoff_seconds,
        resume_from=resume_point(run_dir, config),
    )
    if not decision.restart:
        if verdict.status in RESTARTABLE and max_restarts > 0:
            summary = replace(summary, reason=f"{summary.reason}; {decision.why}")
        problem = settle_run(run_dir, summary)
        if problem:
            raise RunDirError(problem)
        return decision
    try:
        archive_attempt(
            run_dir, info.attempt, summary=summary, info=replace(info, state=verdict.status)
        )
    except RunDirError as err:  # the attempt's end stands; the restart never began
        settle_run(run_dir, replace(summary, reason=f"{summary.reason}; {err}"))
        raise
    placed = replace(placement, requeues=requeues, attempt_start=AttemptStart.RESTART.value)
    now = time.time()
    run_dir.write_run_info(
        replace(
            info, state=RunStatus.STARTING, launcher=None, ranks=(), global_ranks=(),
            attempt=info.attempt + 1, attempt_started=now, placement=placed.placement(),
        )
    )  # fmt: skip
    if decision.number >= max_restarts:
        _stop_requeue(placement.job_id)
    time.sleep(max(0.0, decision.delay - (now - _ended_at(view, now))))
    return decision


def begin_after_requeue(
    run_dir: RunDir, requeue_count: int, jobs: JobReader | None = None
) -> RestartDecision | None:
    """The batch script's first step: None when this is not a requeued start (the job's first
    run for run.json's attempt: it begins as it is); else the attempt that Slurm's requeue
    ended, written down as a node failure, and whether the next begins (``go_on``)."""
    info = run_dir.read_run_info()
    placement = SlurmPlacement.of(info)
    if placement is None:
        raise RunDirError(f"run {run_dir.run_id} is not a run on Slurm")
    if run_dir.summary_path.exists():
        return RestartDecision(False, f"run {run_dir.run_id} has ended already")
    if requeue_count <= placement.requeues:
        return None
    view = read_view(run_dir, info, jobs or read_job)
    verdict = SlurmVerdict(
        RunStatus.NODE_FAILURE,
        f"{which_failed(view.lost)} failed: Slurm requeued job {placement.job_id} (NODE_FAIL)",
        ended=True,
    )
    return _go_on_or_end(run_dir, info, verdict, view, requeue_count)


def finish_attempt(run_dir: RunDir) -> RestartDecision | None:
    """The batch script's last step, once its node launchers ended: when every one said how
    its share ended, a failed attempt goes on as the restart policy decides, any other end is
    written (the run's summary). None when some node did not say: the run is left to the first
    reader that finds the job over, which has Slurm's word on it."""
    info = run_dir.read_run_info()
    placement = SlurmPlacement.of(info)
    if placement is None or run_dir.summary_path.exists():
        return None
    view = ended_view(run_dir, info)
    verdict = from_nodes(view, placement.nodes)
    if verdict is None:
        return None
    return _go_on_or_end(run_dir, info, verdict, view, placement.requeues)


def _go_on_or_end(
    run_dir: RunDir, info: RunInfo, verdict: SlurmVerdict, view: SlurmView, requeues: int
) -> RestartDecision:
    """``go_on`` for an attempt that may restart; any other end (or a run whose config.toml no
    longer loads) written as it is."""
    if verdict.status in RESTARTABLE:
        with contextlib.suppress(ConfigError):  # no config: no restart, its end as it was
            return go_on(run_dir, info, verdict, view, requeues=requeues)
    problem = settle_slurm_run(run_dir, verdict, view)
    if problem:
        raise RunDirError(problem)
    return RestartDecision(False, f"attempt {info.attempt} {verdict.status}")
