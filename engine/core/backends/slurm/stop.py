"""Stopping a run on Slurm, verified: ``ddptui kill`` (and Ctrl-C in ``ddptui run``, and the UI's kill).

One look at the run (``engine.core.runs.run_handle``: run.json read once) and one observer of it
serve the whole kill: first every rank's stack (``engine.core.backends.slurm.stacks``), then the
request is written into the run directory (the run's one ``stop-request``,
``engine.core.runs.stop_request``: the run ends ``killed``, not ``cancelled``, and each node
launcher says who asked), then ``scancel`` of the job (inside a user's allocation: of the run's
step only, never the allocation). Slurm sends every node launcher SIGTERM; each stops its ranks
and proves its node clean in its record (``engine.core.backends.slurm.records.NodeProof``). The
kill waits for every node's proof; a node whose launcher does not report is named as unverified
in the summary, which it then writes. Plain Python.
"""

from __future__ import annotations

import contextlib
import time

from engine.core.backends.local.kill import KillResult, Target, check_run_owner
from engine.core.backends.slurm.cluster import SlurmUnavailable, run_slurm
from engine.core.backends.slurm.jobs import QUEUE
from engine.core.backends.slurm.records import (
    NODE_STOP_GRACE_SECONDS,
    SlurmPlacement,
    read_node_records,
)
from engine.core.backends.slurm.stacks import snapshot_slurm_run, step_of
from engine.core.backends.slurm.state import SlurmView, verification, view_of
from engine.core.common.statuses import KillOutcome, RunStatus, StopRequester
from engine.core.procs.stopping import StopResult
from engine.core.runs.observer import RunObserver
from engine.core.runs.run_handle import RunHandle, observe_handle
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir, RunDirError
from engine.core.runs.settle import settle_observed
from engine.core.runs.stop_request import request_stop

# How long the node launchers have to prove their nodes clean after scancel: Slurm's KillWait
# (30 s by default) bounds them; a node that has not reported by then is named unverified.
PROOF_WAIT_SECONDS = 40.0
POLL_SECONDS = 0.2


def request_cancel(run_dir: RunDir, placement: SlurmPlacement, *, by: StopRequester) -> str:
    """Record that ddptui asked for the run's end, then cancel its job (or its step, inside the
    user's allocation). Returns "" or why Slurm refused."""
    # Word of who asked, where this process may write (never into another user's run directory;
    # a full disk): without it the end reads as Slurm's "cancelled", and the stop goes on.
    request_stop(run_dir, by)
    command = [placement.job_id]  # the job: SIGTERM to its tasks, SIGKILL after KillWait
    if placement.in_allocation:
        records, _ = read_node_records(run_dir.path)
        step = step_of(placement, records)
        if not step:
            return f"the step of job {placement.job_id} is not recorded yet; nothing cancelled"
        # A step of the user's allocation: scancel of a step is SIGKILL at once, which leaves
        # no node launcher the time to stop its ranks and prove its node; SIGTERM to its tasks
        # first (``finish_step`` kills what is left).
        command = ["--signal=TERM", step]
    if not command[-1]:
        return "no Slurm job is recorded for it yet; nothing cancelled"
    try:
        run_slurm("scancel", *command)
    except SlurmUnavailable as err:
        return str(err)
    QUEUE.forget()
    return ""


def finish_step(run_dir: RunDir, placement: SlurmPlacement) -> None:
    """Inside an allocation: ``scancel`` the run's step (SIGKILL to whatever of it is left once
    its node launchers had their chance), never the allocation itself."""
    records, _ = read_node_records(run_dir.path)
    step = step_of(placement, records)
    if step:
        with contextlib.suppress(SlurmUnavailable):
            run_slurm("scancel", step)


def _targets(view: SlurmView) -> tuple[Target, ...]:
    found = []
    for record in sorted(view.nodes.values(), key=lambda r: r.node_rank):
        if record.final:
            continue
        if record.launcher is not None:
            found.append(
                Target(
                    record.launcher.pid,
                    record.launcher.start_time,
                    f"node launcher on {record.node}",
                    "",
                )
            )
        found += [
            Target(ref.pid, ref.start_time, f"rank {rank} on {record.node}", "")
            for rank, ref in record.ranked()
        ]
    return tuple(found)


def _wait_for_proofs(run_dir: RunDir, nodes: tuple[str, ...], wait: float) -> None:
    """Until every one of ``nodes`` (and every node launcher that recorded itself) has its final
    record with a proof, or ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        records, _ = read_node_records(run_dir.path)
        names = set(nodes) | set(records)
        if all((r := records.get(n)) and r.final and r.proof for n in names):
            return
        time.sleep(POLL_SECONDS)


def _stop_result(view: SlurmView, seconds: float) -> StopResult:
    proofs = [r.proof for r in view.nodes.values() if r.proof is not None]
    return StopResult(
        terminated=tuple(sorted({p for proof in proofs for p in proof.terminated})),
        killed=tuple(sorted({p for proof in proofs for p in proof.killed})),
        survivors=tuple(sorted({p for proof in proofs for p in proof.left})),
        seconds=seconds,
    )


def _wait_until_over(observer: RunObserver, wait: float) -> RunState:
    """The run's state once Slurm says its job is over (or ``wait`` seconds passed)."""
    deadline = time.monotonic() + wait
    while True:
        QUEUE.forget()
        state = observer.observe()
        if state.final or time.monotonic() >= deadline:
            return state
        time.sleep(POLL_SECONDS)


def kill_slurm_run(
    run_dir: RunDir,
    *,
    allow_other_users: bool = False,
    by: StopRequester = StopRequester.KILL,
    proof_wait: float = PROOF_WAIT_SECONDS,
    handle: RunHandle | None = None,
) -> KillResult:
    """Stop a run on Slurm as the module docstring says; the KillResult names the nodes that
    proved themselves clean and those that did not report. RunDirError / KillRefused before
    anything is signalled when the run cannot be read or is another user's. ``handle``: the
    caller's one look at the run, taken instead of looking again."""
    check_run_owner(run_dir, allow_other_users=allow_other_users)
    if handle is None:
        handle = observe_handle(run_dir, allow_other_users=allow_other_users)  # run.json, once
    placement = SlurmPlacement.of(handle.info)
    if placement is None:
        raise RunDirError(f"{run_dir.run_json_path}: not a run on Slurm")
    observer = RunObserver(run_dir)  # the kill's one observer
    before = observer.observe(handle.info)
    view = view_of(before.placement)
    where = f"Slurm job {placement.job_id}" if placement.job_id else "its Slurm job"
    if before.final or view is None:
        return KillResult(
            run_dir.run_id,
            KillOutcome.ALREADY_FINISHED,
            before.status,
            placement=where,
            placement_ended="cancelled",
        )
    started = time.monotonic()
    stacks = None
    if before.status == RunStatus.RUNNING:
        stacks = snapshot_slurm_run(run_dir, reason="before kill", state=before)
    targets = _targets(view)
    problem = request_cancel(run_dir, placement, by=by)
    if problem:
        return KillResult(
            run_dir.run_id,
            KillOutcome.STOPPED,
            before.status,
            targets=targets,
            skipped=(problem,),
            stacks=stacks,
            placement=where,
            placement_ended="cancelled",
        )
    expected = view.job.nodes if view.job and before.status != RunStatus.PENDING else ()
    if before.status != RunStatus.PENDING:
        _wait_for_proofs(run_dir, expected, proof_wait)
    if placement.in_allocation:
        finish_step(run_dir, placement)
    ended = _wait_until_over(observer, proof_wait)
    view = view_of(ended.placement) or view
    settled = settle_observed(observer.observe())  # writes the summary: killed
    unverified = tuple(
        n
        for n in sorted(set(expected) | set(view.nodes))
        if not ((r := view.nodes.get(n)) and r.proof and r.proof.clean)
    )
    return KillResult(
        run_dir.run_id,
        KillOutcome.STOPPED,
        before.status,
        targets=targets,
        stop=_stop_result(view, time.monotonic() - started),
        stacks=stacks,
        summary_written=settled.summary is not None and settled.status == RunStatus.KILLED,
        by_launcher=True,
        grace_seconds=NODE_STOP_GRACE_SECONDS,
        verified_nodes=tuple(n for n in sorted(view.nodes) if n not in unverified),
        unverified_nodes=unverified,
        daemons=tuple(d for r in view.nodes.values() if r.proof for d in r.proof.daemons),
        verification=verification(view, expected),
        placement=where,
        placement_ended="cancelled",
    )
