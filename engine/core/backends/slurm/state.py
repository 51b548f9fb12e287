"""A run on Slurm, from both sides: Slurm's word on its job (``engine.core.backends.slurm.jobs``) and
what its node launchers recorded (``engine.core.backends.slurm.records``), decided in one place
for the run observer (through ``engine.core.backends.slurm.watch``), the batch script's last step
and ``ddptui kill``.

- ``pending``: Slurm has not started the job, and says why (Priority, Resources, BeginTime ...)
  and when it expects to;
- ``starting`` / ``running``: the job runs; its node launchers have not all recorded themselves
  yet, or they have;
- once the job is over (or, inside an allocation, its step): ``completed``, ``failed`` (the root
  cause names its rank and node), ``killed`` (ddptui asked first: the run's ``stop-request``,
  ``engine.core.runs.stop_request``), ``cancelled``
  (scancel from elsewhere), ``timeout`` (the time limit), ``node-failure`` naming the node
  (``engine.core.backends.slurm.node_loss``);
- ``pending``, restarting, while Slurm holds the job it requeued after a node failure (a run with
  restarts left: ``engine.core.backends.slurm.restarts``) until its next attempt begins;
- ``lost`` only when Slurm has no record of the job at all and no node said how it ended: never
  while Slurm says the job is alive.

Reading only, except ``settle_from_nodes`` and ``settle_slurm_run``, which write the summary once
through ``engine.core.runs.settle``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from engine.core.backends.slurm.jobs import JobLookup, JobState, SlurmJob, read_job
from engine.core.backends.slurm.node_loss import LostNodes, lost_nodes, which_failed
from engine.core.backends.slurm.records import (
    NodeRecord,
    SlurmPlacement,
    rank_nodes,
    read_node_records,
)
from engine.core.backends.slurm.watch import SLURM
from engine.core.common.config_error import ConfigError
from engine.core.common.statuses import RunStatus
from engine.core.procs.process_identity import ProcessProbe
from engine.core.runs.placement import PlacementVerdict, PlacementView
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo
from engine.core.runs.settle import bare_summary, settle_run
from engine.core.runs.stop_request import StopRequest, read_stop_record
from engine.core.runs.summarize import build_summary, root_failure_of
from engine.core.runs.summary import Failure, RunSummary

# Slurm lists a job within moments of sbatch; a job it never listed this long after is not coming.
LISTING_GRACE_SECONDS = 60.0

JobReader = Callable[[str], JobLookup]


@dataclass(frozen=True)
class SlurmView:
    """What a reader knows of a Slurm run at one moment."""

    job_id: str
    job: SlurmJob | None
    problem: str  # Slurm could not be asked: why
    nodes: dict[str, NodeRecord]
    kill: StopRequest | None  # ddptui asked for its end (the run's stop-request)
    in_allocation: bool = False
    # Slurm requeued the job after the current attempt began (its restart count is above the
    # one run.json's placement began with)
    requeued: bool = False
    lost: LostNodes | None = None  # the nodes a job NODE_FAIL ended (or requeued) lost

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "job": self.job.to_json() if self.job else None,
            "problem": self.problem,
            "in_allocation": self.in_allocation,
            "requeued": self.requeued,
            "lost_nodes": list(self.lost.names) if self.lost else [],
            "nodes": {
                name: {
                    "node_rank": r.node_rank,
                    "state": str(r.state),
                    "ranks": list(r.global_ranks),
                    "verified": r.proof is not None and r.proof.clean,
                }
                for name, r in sorted(self.nodes.items())
            },
        }


@dataclass(frozen=True)
class SlurmVerdict:
    status: RunStatus
    reason: str
    ended: bool = False  # nothing of it runs any more: its summary can be written


def _placement(info: RunInfo) -> SlurmPlacement:
    placement = SlurmPlacement.of(info)
    if placement is None:
        raise RunDirError(f"run {info.run_id} is not a run on Slurm")
    return placement


def read_view(run_dir: RunDir, info: RunInfo, jobs: JobReader = read_job) -> SlurmView:
    placement = _placement(info)
    nodes, _ = read_node_records(run_dir.path)
    found = jobs(placement.job_id) if placement.job_id else JobLookup(None)
    job = found.job
    requeued = job is not None and job.restarts > placement.requeues
    lost = None
    if job is not None and (requeued or job.state == JobState.NODE_FAIL):
        lost = lost_nodes(job.nodes, nodes)
    return SlurmView(
        job_id=placement.job_id,
        job=job,
        problem=found.problem,
        nodes=nodes,
        kill=read_stop_record(run_dir),
        in_allocation=placement.in_allocation,
        requeued=requeued,
        lost=lost,
    )


def ended_view(run_dir: RunDir, info: RunInfo) -> SlurmView:
    """What the run directory says of a run that has its summary: its job and its node
    launchers' records; Slurm is not asked (the summary says how the job ended)."""
    placement = _placement(info)
    nodes, _ = read_node_records(run_dir.path)
    return SlurmView(
        job_id=placement.job_id,
        job=None,
        problem="",
        nodes=nodes,
        kill=read_stop_record(run_dir),
        in_allocation=placement.in_allocation,
    )


def placement_view(view: SlurmView) -> PlacementView:
    """``view`` in the words every reader shows (``engine.core.runs.placement``), itself kept
    as the ``detail`` this backend's own describe and stop read."""
    job = view.job
    return PlacementView(
        backend=SLURM,
        label=f"job {view.job_id}" if view.job_id else "",
        waiting_for=job.reason if job is not None and job.state == JobState.PENDING else "",
        keys=view.to_json(),
        rank_nodes=rank_nodes(view.nodes),
        across_nodes=True,
        detail=view,
    )


def view_of(placed: PlacementView | None) -> SlurmView | None:
    """The Slurm view an observation holds, if it observed a run on Slurm."""
    detail = placed.detail if placed is not None else None
    return detail if isinstance(detail, SlurmView) else None


# ---- the decision ----------------------------------------------------------------------------


def _where(job: SlurmJob) -> str:
    return f"job {job.job_id} on {', '.join(job.nodes)}" if job.nodes else f"job {job.job_id}"


def verification(view: SlurmView, expected: tuple[str, ...] = ()) -> str:
    """Which node launchers proved their node clean, and which did not (or never reported)."""
    names = sorted(set(expected) | set(view.nodes))
    verified = [n for n in names if (r := view.nodes.get(n)) and r.proof and r.proof.clean]
    unclean = {
        n: len(r.proof.left)
        for n in names
        if (r := view.nodes.get(n)) and r.proof and not r.proof.clean
    }
    left = [f"{n} ({count} process(es) left)" for n, count in unclean.items()]
    silent = [n for n in names if n not in verified and n not in unclean]
    parts = []
    if verified and not left and not silent:
        parts.append(f"every node verified ({', '.join(verified)})")
    elif verified:
        parts.append(f"verified: {', '.join(verified)}")
    if left:
        parts.append(f"not clean: {', '.join(left)}")
    if silent:
        parts.append(f"unverified: {', '.join(silent)} (its node launcher did not report)")
    return "; ".join(parts)


def from_nodes(view: SlurmView, nodes_expected: int) -> SlurmVerdict | None:
    """The end every node launcher recorded, when they all did and it says which end it was:
    completed everywhere, failed somewhere, or killed after ``ddptui kill`` asked. Ends that only
    Slurm can name (a scancel from elsewhere, the time limit, a node failure) are None here."""
    records = list(view.nodes.values())
    if len(records) < nodes_expected or not all(r.final for r in records):
        return None
    if view.kill is not None:
        return SlurmVerdict(RunStatus.KILLED, _killed_reason(view), ended=True)
    if all(r.state == RunStatus.COMPLETED for r in records):
        return SlurmVerdict(RunStatus.COMPLETED, "", ended=True)
    failed = [r for r in records if r.state == RunStatus.FAILED]
    if failed:
        return SlurmVerdict(RunStatus.FAILED, "", ended=True)
    if view.in_allocation:  # the step of the user's allocation ended by a signal
        return SlurmVerdict(
            RunStatus.CANCELLED,
            f"its step of job {view.job_id} was cancelled (not by ddptui kill)",
            ended=True,
        )
    return None


def _killed_reason(view: SlurmView) -> str:
    expected = view.job.nodes if view.job else ()
    asked = view.kill.by.sentence if view.kill else "stopped by ddptui kill"
    return f"{asked} (job {view.job_id} cancelled); {verification(view, expected)}"


def requeued_reason(view: SlurmView, info: RunInfo, job: SlurmJob) -> str:
    """Why a run whose job Slurm requeued is not over: its attempt ended, and Slurm holds the
    job to start it again (its next attempt begins as the job runs again)."""
    waits = ""
    if job.state == JobState.PENDING:
        waits = f"; waiting for Slurm: {job.reason or 'not scheduled yet'}"
        if job.start_time:
            waits += f", expected to start {time.strftime('%H:%M', time.localtime(job.start_time))}"
    return (
        f"restarting: attempt {info.attempt} ended, {which_failed(view.lost)} failed; Slurm requeued "
        f"job {job.job_id}{waits}"
    )


def _ended(view: SlurmView, job: SlurmJob, nodes_expected: int) -> SlurmVerdict:
    """How a job Slurm says is over ended, in ddptui's words."""
    state = job.state
    if view.kill is not None:
        return SlurmVerdict(RunStatus.KILLED, _killed_reason(view), ended=True)
    if state == JobState.TIMEOUT or state == JobState.DEADLINE:
        limit = f" of {job.time_limit_minutes} min" if job.time_limit_minutes else ""
        return SlurmVerdict(
            RunStatus.TIMEOUT, f"job {job.job_id} reached its time limit{limit}", ended=True
        )
    if state == JobState.NODE_FAIL:
        return SlurmVerdict(
            RunStatus.NODE_FAILURE,
            f"{which_failed(view.lost)} failed: Slurm ended job {job.job_id} (NODE_FAIL)",
            ended=True,
        )
    if state in (JobState.CANCELLED, JobState.PREEMPTED):
        how = "preempted by Slurm" if state == JobState.PREEMPTED else "cancelled (scancel)"
        return SlurmVerdict(
            RunStatus.CANCELLED, f"job {job.job_id} was {how}, not by ddptui kill", ended=True
        )
    by_nodes = from_nodes(view, nodes_expected)
    if by_nodes is not None and by_nodes.status in (RunStatus.COMPLETED, RunStatus.FAILED):
        return by_nodes
    if not view.nodes:
        return SlurmVerdict(
            RunStatus.FAILED,
            f"job {job.job_id} ended {state} before any node launcher recorded itself; its run "
            "directory's slurm/job.out and logs/launcher-<node>.log say why (a node that cannot "
            "see the run directory says so)",
            ended=True,
        )
    silent = [n for n in job.nodes if n not in view.nodes or not view.nodes[n].final]
    said = f"; node(s) {', '.join(silent)} never said how their share ended" if silent else ""
    status = RunStatus.COMPLETED if state == JobState.COMPLETED and not silent else RunStatus.FAILED
    return SlurmVerdict(status, f"job {job.job_id} ended {state}{said}", ended=True)


def decide(
    info: RunInfo, view: SlurmView, now: float, step_alive: bool | None = None
) -> SlurmVerdict:
    """The one decision of a Slurm run's status while it has no summary. ``step_alive``: inside
    an allocation, whether the srun that started the step is alive (None: not known here)."""
    placement = _placement(info)
    expected = placement.nodes
    if not view.job_id:  # sbatch has not answered (for the run, or for its attempt resubmitted)
        if now - max(info.created, info.attempt_started) < LISTING_GRACE_SECONDS:
            return SlurmVerdict(RunStatus.STARTING, "submitting to Slurm")
        return SlurmVerdict(RunStatus.LOST, "no Slurm job was recorded for it", ended=True)
    by_nodes = from_nodes(view, expected)
    job = view.job
    if job is None:
        if by_nodes is not None:
            return by_nodes
        if view.problem:
            status = RunStatus.RUNNING if view.nodes else RunStatus.PENDING
            return SlurmVerdict(status, f"Slurm cannot be asked now: {view.problem}")
        if now - (placement.submitted or info.created) < LISTING_GRACE_SECONDS:
            return SlurmVerdict(RunStatus.PENDING, f"Slurm has not listed job {view.job_id} yet")
        return SlurmVerdict(
            RunStatus.LOST,
            f"Slurm has no record of job {view.job_id} (it left the queue, and this cluster "
            "keeps no accounting) and not every node said how its share ended",
            ended=True,
        )
    if view.in_allocation and by_nodes is not None:
        return by_nodes
    if view.in_allocation and step_alive is False:  # the allocation lives on; the step did not
        silent = [n for n, r in sorted(view.nodes.items()) if not r.final] or ["every node"]
        return SlurmVerdict(
            RunStatus.FAILED,
            f"its step of job {view.job_id} ended before {', '.join(silent)} said how its "
            "share ended; slurm/job.out in its run directory says why",
            ended=True,
        )
    if view.requeued and not job.state.ended:
        return SlurmVerdict(RunStatus.PENDING, requeued_reason(view, info, job))
    if job.state == JobState.PENDING:
        expect = ""
        if job.start_time:
            expect = f", expected to start {time.strftime('%H:%M', time.localtime(job.start_time))}"
        return SlurmVerdict(
            RunStatus.PENDING, f"waiting for Slurm: {job.reason or 'not scheduled yet'}{expect}"
        )
    if not job.state.ended:
        if not view.nodes:
            return SlurmVerdict(
                RunStatus.STARTING, f"{_where(job)}: its node launchers are starting"
            )
        return SlurmVerdict(RunStatus.RUNNING, _where(job))
    return _ended(view, job, expected)


def observe_job(
    run_dir: RunDir, info: RunInfo, now: float, probe: ProcessProbe, jobs: JobReader | None = None
) -> PlacementVerdict:
    """The run observer's question (``SlurmWatch.observe``): Slurm's word and the node records,
    decided. Inside an allocation the srun that started the step is its launcher here."""
    view = read_view(run_dir, info, jobs or read_job)
    step_alive = probe.alive(info.launcher) if info.launcher else None
    verdict = decide(info, view, now, step_alive)
    alive = verdict.status == RunStatus.RUNNING  # its node launchers judge silence
    return PlacementVerdict(
        placement_view(view), verdict.status, verdict.reason, verdict.ended, launcher_alive=alive
    )


# ---- the summary -----------------------------------------------------------------------------


def summary_of(run_dir: RunDir, verdict: PlacementVerdict) -> RunSummary:
    """``SlurmWatch.summary``: the summary of the ended run ``verdict`` observed."""
    view = view_of(verdict.view)
    assert view is not None and verdict.status is not None
    return slurm_summary(run_dir, SlurmVerdict(verdict.status, verdict.reason, True), view)


def slurm_summary(run_dir: RunDir, verdict: SlurmVerdict, view: SlurmView) -> RunSummary:
    """The summary of a Slurm run that ended as ``verdict`` says: the engine's figures from rank
    0's events, the root cause (its rank and node) of a failure."""
    try:
        # a failure's root cause is a rank's; the other ends are Slurm's (its reason says which)
        failed = verdict.status == RunStatus.FAILED
        failure = root_failure_of(run_dir, verdict.status) if failed else None
        if failure is not None and failure.rank is not None:
            failure = replace(failure, node=rank_nodes(view.nodes).get(failure.rank, ""))
        if verdict.status == RunStatus.NODE_FAILURE and view.lost is not None:
            failure = Failure(rank=None, node=", ".join(view.lost.names), error=verdict.reason)
        summary = build_summary(run_dir, verdict.status, failure, verdict.reason)
    except (ConfigError, RunDirError, OSError):
        summary = bare_summary(run_dir, verdict.status, verdict.reason)
    if verdict.status == RunStatus.FAILED and not verdict.reason and summary.failure:
        f = summary.failure
        where = f"rank {f.rank} on {f.node}" if f.node else f"rank {f.rank}"
        summary = replace(summary, reason=f"{where} failed: {f.error}")
    return summary


def settle_slurm_run(run_dir: RunDir, verdict: SlurmVerdict, view: SlurmView) -> str:
    """Write the summary of an ended Slurm run, unless one is there; "" or why it could not."""
    return settle_run(run_dir, slurm_summary(run_dir, verdict, view))


def settle_from_nodes(run_dir: RunDir) -> str:
    """Settle the run when every node launcher said how its share ended and that says the end
    (the batch script's last step); "" when written or left for a reader with Slurm's word."""
    try:
        info = run_dir.read_run_info()
    except RunDirError as err:
        return str(err)
    placement = SlurmPlacement.of(info)
    if placement is None or run_dir.summary_path.exists():
        return ""
    view = ended_view(run_dir, info)
    verdict = from_nodes(view, placement.nodes)
    if verdict is None:
        return ""
    return settle_slurm_run(run_dir, verdict, view)
