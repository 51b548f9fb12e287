"""Stopping a run on Slurm, verified: ``ddptui kill`` (and Ctrl-C in ``ddptui run``, and the UI's kill).

First every rank's stack (``engine.core.backends.slurm.stacks``), then the request is written into the
run directory (the run ends ``killed``, not ``cancelled``), then ``scancel`` of the job (inside a
user's allocation: of the run's step only, never the allocation). Slurm sends every node launcher
SIGTERM; each stops its ranks and proves its node clean in its record
(``engine.core.runs.placement.NodeProof``). The kill waits for every node's proof; a node whose
launcher does not report is named as unverified in the summary, which it then writes.
Plain Python.
"""

from __future__ import annotations

import contextlib
import os
import time

from engine.core.backends.local.kill import KillResult, Target, check_run_owner
from engine.core.backends.slurm.cluster import SlurmUnavailable, run_slurm
from engine.core.backends.slurm.jobs import QUEUE
from engine.core.backends.slurm.stacks import snapshot_slurm_run, step_of
from engine.core.backends.slurm.state import SlurmView, verification
from engine.core.common.run_files import refuse_writing, user_name, write_json_atomic
from engine.core.common.statuses import KillOutcome, RunStatus
from engine.core.procs.stopping import StopResult
from engine.core.runs.observer import RunObserver, RunState
from engine.core.runs.placement import (
    NODE_STOP_GRACE_SECONDS,
    KillRequest,
    kill_request_path,
    read_node_records,
)
from engine.core.runs.rundir import RunDir, RunDirError
from engine.core.runs.settle import settle_observed

# How long the node launchers have to prove their nodes clean after scancel: Slurm's KillWait
# (30 s by default) bounds them; a node that has not reported by then is named unverified.
PROOF_WAIT_SECONDS = 40.0
POLL_SECONDS = 0.2


def request_cancel(run_dir: RunDir, *, reason: str) -> str:
    """Record that ddptui asked for the run's end, then cancel its job (or its step, inside the
    user's allocation). Returns "" or why Slurm refused."""
    info = run_dir.read_run_info()
    assert info.slurm is not None
    # Word of who asked, where this process may write (never into another user's run directory;
    # a full disk): without it the end reads as Slurm's "cancelled", and the stop goes on.
    if not refuse_writing(run_dir.path):
        with contextlib.suppress(OSError):
            write_json_atomic(
                kill_request_path(run_dir.path),
                KillRequest(time=time.time(), user=user_name(os.getuid()), reason=reason).to_json(),
            )
    command = [info.slurm.job_id]  # the job: SIGTERM to its tasks, SIGKILL after KillWait
    if info.slurm.in_allocation:
        records, _ = read_node_records(run_dir.path)
        step = step_of(info, records)
        if not step:
            return f"the step of job {info.slurm.job_id} is not recorded yet; nothing cancelled"
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


def finish_step(run_dir: RunDir) -> None:
    """Inside an allocation: ``scancel`` the run's step (SIGKILL to whatever of it is left once
    its node launchers had their chance), never the allocation itself."""
    info = run_dir.read_run_info()
    assert info.slurm is not None
    records, _ = read_node_records(run_dir.path)
    step = step_of(info, records)
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


def kill_slurm_run(
    run_dir: RunDir,
    *,
    allow_other_users: bool = False,
    reason: str = "",
    proof_wait: float = PROOF_WAIT_SECONDS,
) -> KillResult:
    """Stop a run on Slurm as the module docstring says; the KillResult names the nodes that
    proved themselves clean and those that did not report. RunDirError / KillRefused before
    anything is signalled when the run cannot be read or is another user's."""
    check_run_owner(run_dir, allow_other_users=allow_other_users)
    observer = RunObserver(run_dir)
    before = observer.observe()
    info = before.info
    if info is None or info.slurm is None:
        raise RunDirError(f"{run_dir.run_json_path}: not a run on Slurm")
    view = before.slurm
    if before.final or view is None:
        return KillResult(
            run_id=run_dir.run_id,
            outcome=KillOutcome.ALREADY_FINISHED,
            status_before=before.status,
            job_id=info.slurm.job_id,
        )
    started = time.monotonic()
    stacks = None
    if before.status == RunStatus.RUNNING:
        stacks = snapshot_slurm_run(run_dir, reason="before kill")
    targets = _targets(view)
    problem = request_cancel(run_dir, reason=reason or "stopped by ddptui kill")
    if problem:
        return KillResult(
            run_id=run_dir.run_id,
            outcome=KillOutcome.STOPPED,
            status_before=before.status,
            targets=targets,
            skipped=(problem,),
            stacks=stacks,
            job_id=info.slurm.job_id,
        )
    expected = view.job.nodes if view.job and before.status != RunStatus.PENDING else ()
    if before.status != RunStatus.PENDING:
        _wait_for_proofs(run_dir, expected, proof_wait)
    if info.slurm.in_allocation:
        finish_step(run_dir)
    ended = _wait_until_over(run_dir, proof_wait)
    view = ended.slurm or view
    settled = settle_observed(RunObserver(run_dir).observe())  # writes the summary: killed
    unverified = tuple(
        n
        for n in sorted(set(expected) | set(view.nodes))
        if not ((r := view.nodes.get(n)) and r.proof and r.proof.clean)
    )
    return KillResult(
        run_id=run_dir.run_id,
        outcome=KillOutcome.STOPPED,
        status_before=before.status,
        targets=targets,
        stop=_stop_result(view, time.monotonic() - started),
        stacks=stacks,
        summary_written=settled.summary is not None and settled.status == RunStatus.KILLED,
        by_launcher=True,
        grace_seconds=NODE_STOP_GRACE_SECONDS,
        job_id=info.slurm.job_id,
        verified_nodes=tuple(n for n in sorted(view.nodes) if n not in unverified),
        unverified_nodes=unverified,
        daemons=tuple(d for r in view.nodes.values() if r.proof for d in r.proof.daemons),
        verification=verification(view, expected),
    )


def _wait_until_over(run_dir: RunDir, wait: float) -> RunState:
    """The run's state once Slurm says its job is over (or ``wait`` seconds passed)."""
    deadline = time.monotonic() + wait
    observer = RunObserver(run_dir)
    while True:
        QUEUE.forget()
        state = observer.observe()
        if state.final or time.monotonic() >= deadline:
            return state
        time.sleep(POLL_SECONDS)
