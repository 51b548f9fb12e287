"""``ddptui kill RUN_ID`` and the UI's kill: stop exactly the processes that prove they are one
run's, after taking every rank's stack, and settle its summary."""

from __future__ import annotations

import getpass
import os
import time
from dataclasses import dataclass

import psutil

from engine.core.common.statuses import KillOutcome, RunStatus
from engine.core.ops.run_snapshot import snapshot_run
from engine.core.procs.process_identity import (
    ProcessRef,
    marked_processes,
    marker_mismatch,
    process_ended,
    same_start,
    user_of,
)
from engine.core.procs.stopping import (
    KillRefused,
    StopResult,
    gpu_memory_left,
    protected_pids,
    refusal,
    stop_processes,
)
from engine.core.runs.rundir import RunDir, RunDirError, run_dir_owner
from engine.core.runs.settle import record_killed
from engine.core.stacks.snapshot import StackSnapshot

# ---- ddptui kill RUN_ID ----------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    pid: int
    start_time: float
    role: str  # launcher | rank N | marked (by DDPTUI_RUN_ID) | child
    user: str


@dataclass(frozen=True)
class KillResult:
    run_id: str
    outcome: KillOutcome
    status_before: RunStatus  # run.json state or summary status when kill started
    targets: tuple[Target, ...] = ()
    stop: StopResult | None = None
    skipped: tuple[str, ...] = ()  # one sentence each: a pid left alone and why
    gpu_check: str = ""
    summary_written: bool = False
    stacks: StackSnapshot | None = None  # every rank's stack, taken before anything was signalled

    @property
    def ok(self) -> bool:
        """Nothing of the run is left running (nor was any of it refused)."""
        return self.stop is None or (self.stop.ok and not self.stop.refused)


def check_run_owner(run_dir: RunDir, *, allow_other_users: bool) -> None:
    """KillRefused unless ``run_dir`` is this user's, or root was allowed other users' runs."""
    owner = run_dir_owner(run_dir)
    if owner is None:
        return
    if not allow_other_users:
        raise KillRefused(
            f"run {run_dir.run_id}: its run directory belongs to user {owner}, not "
            f"{getpass.getuser()}; ddptui stops only your own runs (as root, add --all-users); "
            "nothing was stopped"
        )
    if os.getuid() != 0:
        raise KillRefused(
            f"run {run_dir.run_id}: its run directory belongs to user {owner}; only root can stop "
            "another user's run; nothing was stopped"
        )


def run_targets(
    run_dir: RunDir, protected: set[int] | None = None
) -> tuple[list[tuple[psutil.Process, str]], list[str]]:
    """The live processes that are provably the run's (not yet descendants), each with its role:
    the launcher and ranks run.json names (pid and start time) that also carry the run's marker,
    and every other process carrying the marker. A sentence for each pid run.json names that is
    left alone (another process now has its pid, or it does not carry the marker)."""
    protected = protected_pids() if protected is None else protected
    info = run_dir.read_run_info()  # RunDirError: the caller says so and stops
    found: dict[int, tuple[psutil.Process, str]] = {}
    skipped: list[str] = []
    refs: list[tuple[ProcessRef, str]] = []
    if info.launcher is not None:
        refs.append((info.launcher, "launcher"))
    first = info.node_rank * len(info.ranks)
    refs += [(ref, f"rank {first + i}") for i, ref in enumerate(info.ranks)]
    for ref, role in refs:
        try:
            proc = psutil.Process(ref.pid)
            started = proc.create_time()
        except psutil.NoSuchProcess:
            continue
        except psutil.Error as err:
            skipped.append(f"pid {ref.pid} ({role}) cannot be inspected ({type(err).__name__})")
            continue
        if not same_start(started, ref.start_time):
            skipped.append(
                f"pid {ref.pid} ({role} in run.json) now belongs to another process, started "
                f"{time.strftime('%H:%M:%S', time.localtime(started))}: left alone"
            )
            continue
        if process_ended(proc):
            continue
        foreign = marker_mismatch(proc, run_dir.run_id)
        if foreign:
            skipped.append(f"{foreign} ({role} in run.json): left alone")
            continue
        found[proc.pid] = (proc, role)
    for proc in marked_processes(run_dir.run_id, exclude=frozenset(protected)):
        found.setdefault(proc.pid, (proc, "marked"))
    return list(found.values()), skipped


def _status_before(run_dir: RunDir) -> RunStatus:
    try:
        summary = run_dir.read_summary()
    except RunDirError:
        summary = None
    if summary is not None:
        return summary.status
    return run_dir.read_run_info().state


def kill_run(
    run_dir: RunDir,
    grace: float = 10.0,
    *,
    allow_other_users: bool = False,
    check_gpu: bool = True,
    reason: str = "",
) -> KillResult:
    """Stop exactly the processes of one run: the launcher and ranks run.json names (pid and start
    time), every process carrying its run marker, and all their descendants.

    Only what is provably the run's is stopped: a process carrying the run's marker (and, for
    the ones run.json names, its pid and start time), and descendants carrying it too.

    Raises RunDirError (run.json missing or corrupt) or KillRefused (the run directory or a
    target is another user's, or a target is this process's own ancestor) before signalling
    anything. A finished run with nothing left
    is reported as such and left alone; a finished run's leftovers are stopped without touching its
    summary. Otherwise summary.json ends up with status ``killed``.
    """
    check_run_owner(run_dir, allow_other_users=allow_other_users)
    status_before = _status_before(run_dir)
    protected = protected_pids()
    found, skipped = run_targets(run_dir, protected)
    finished = status_before.final
    if not found:
        outcome = KillOutcome.ALREADY_FINISHED if finished else KillOutcome.NOTHING_RUNNING
        written = False
        if not finished:
            written = record_killed(
                run_dir,
                reason
                or "ddptui kill found no process left: the launcher had ended without "
                "writing a summary",
            )
        return KillResult(
            run_id=run_dir.run_id,
            outcome=outcome,
            status_before=status_before,
            skipped=tuple(skipped),
            summary_written=written,
        )
    for proc, role in found:
        why = refusal(proc, allow_other_users=allow_other_users, protected=protected)
        if why:
            raise KillRefused(f"run {run_dir.run_id}: {role} {why}; nothing was stopped")
    targets = tuple(Target(p.pid, p.create_time(), role, user_of(p)) for p, role in found)
    # The evidence of why the run was stuck dies with it: take every rank's stack first.
    stacks = None if finished else snapshot_run(run_dir, reason="before kill")
    marker = run_dir.run_id
    result = stop_processes(
        [p for p, _ in found], grace, allow_other_users=allow_other_users, run_marker=marker
    )
    # a last look for marked processes that slipped through (started while we were stopping)
    late = [
        p
        for p in marked_processes(run_dir.run_id, exclude=frozenset(protected))
        if p.pid not in result.stopped
    ]
    if late:
        result = result.merged(
            stop_processes(late, 0.5, allow_other_users=allow_other_users, run_marker=marker)
        )
    pids = [t.pid for t in targets] + list(result.stopped)
    gpu_check = gpu_memory_left(pids) if check_gpu else ""
    written = False
    if not finished:
        written = record_killed(
            run_dir,
            reason or f"stopped by ddptui kill (SIGTERM, SIGKILL after {grace:g} s)",
        )
    return KillResult(
        run_id=run_dir.run_id,
        outcome=KillOutcome.STOPPED,
        status_before=status_before,
        targets=targets,
        stop=result,
        skipped=tuple(skipped),
        gpu_check=gpu_check,
        summary_written=written,
        stacks=stacks,
    )
