"""Stopping processes safely: ``ddptui kill RUN_ID``, ``ddptui clean`` and the UI's kill button.

Plain Python (psutil; NVML through ``engine.core.gpus``). One way to stop anything, ``stop_processes``:
SIGTERM to every target and its descendants, a grace period, SIGKILL to what is left (children
that appeared meanwhile included), then a check that nothing is left, as torchelastic's
subprocess handler does. Processes are named by pid *and* start time, so a pid the kernel gave to
another process is never hit. Never this process, its ancestors (the shell that runs ddptui) or
another user's process unless the caller allows it (root only).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from engine.core.diagnosis import StackSnapshot
from engine.core.gpus import sample_gpus
from engine.core.process_identity import (
    ProcessRef,
    marked_processes,
    marker_mismatch,
    process_ended,
    same_start,
    user_of,
)
from engine.core.process_table import ProcessTable, TrainingJob
from engine.core.run_files import user_name
from engine.core.run_snapshot import snapshot_run
from engine.core.rundir import RunDir, RunDirError
from engine.core.settle import killed_summary, settle_run
from engine.core.statuses import JobKind, JobState, KillOutcome, RunStatus

POLL_SECONDS = 0.05
KILL_WAIT_SECONDS = 5.0  # after SIGKILL: a process in uninterruptible sleep may take a moment
GPU_RELEASE_WAIT_SECONDS = 5.0


class KillRefused(Exception):
    """Nothing was signalled; the message is one sentence for the user."""


# ---- who may be stopped --------------------------------------------------------------------


def protected_pids() -> set[int]:
    """This process and its ancestors: never stopped, whatever a run file says."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in me.parents())
    return pids


def _uid(proc: psutil.Process) -> int | None:
    try:
        return int(proc.uids().real)
    except psutil.Error:
        return None


def refusal(proc: psutil.Process, *, allow_other_users: bool, protected: set[int]) -> str | None:
    """Why ``proc`` must not be stopped by this process, or None."""
    if proc.pid in protected:
        return f"pid {proc.pid} is this ddptui process or one of its parents"
    uid = _uid(proc)
    if uid is not None and uid != os.getuid():
        if not allow_other_users:
            return (
                f"pid {proc.pid} belongs to user {user_of(proc)}, not {getpass.getuser()}; "
                "ddptui stops only your own processes (as root, add --all-users)"
            )
        if os.getuid() != 0:
            return f"pid {proc.pid} belongs to user {user_of(proc)}; only root can stop it"
    return None


# ---- stopping ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StopResult:
    """What ``stop_processes`` did. Pids in at most one of the tuples."""

    terminated: tuple[int, ...] = ()  # ended within the grace period after SIGTERM
    killed: tuple[int, ...] = ()  # needed SIGKILL and are gone
    survivors: tuple[int, ...] = ()  # still there after SIGKILL (or not ours to signal)
    already_gone: tuple[int, ...] = ()
    refused: tuple[tuple[int, str], ...] = ()  # (pid, why): never signalled
    seconds: float = 0.0
    # (pid, why): descendants that are not provably the run's (no marker): never signalled
    left_alone: tuple[tuple[int, str], ...] = ()

    @property
    def ok(self) -> bool:
        return not self.survivors

    @property
    def stopped(self) -> tuple[int, ...]:
        return self.terminated + self.killed

    def merged(self, other: StopResult) -> StopResult:
        return StopResult(
            terminated=self.terminated + other.terminated,
            killed=self.killed + other.killed,
            survivors=other.survivors,
            already_gone=self.already_gone + other.already_gone,
            refused=self.refused + other.refused,
            seconds=self.seconds + other.seconds,
            left_alone=self.left_alone + other.left_alone,
        )


def _descendants(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    found = []
    for p in procs:
        try:
            found.extend(p.children(recursive=True))
        except psutil.Error:
            continue
    return found


def _signal(proc: psutil.Process, sig: signal.Signals) -> bool:
    """Send ``sig``; psutil refuses when the pid now belongs to another process. False: gone."""
    try:
        proc.send_signal(sig)
        return True
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # still there; it will show up as a survivor


def _wait_ended(procs: dict[int, psutil.Process], timeout: float) -> set[int]:
    """Pids that ended within ``timeout``."""
    deadline = time.monotonic() + timeout
    ended: set[int] = set()
    while True:
        ended |= {pid for pid, p in procs.items() if pid not in ended and process_ended(p)}
        if len(ended) == len(procs) or time.monotonic() >= deadline:
            return ended
        time.sleep(POLL_SECONDS)


def stop_processes(
    processes: Sequence[psutil.Process],
    grace: float,
    *,
    allow_other_users: bool = False,
    include_descendants: bool = True,
    kill_wait: float = KILL_WAIT_SECONDS,
    run_marker: str | None = None,
) -> StopResult:
    """SIGTERM ``processes`` (and their descendants), wait up to ``grace`` seconds, SIGKILL the
    rest (and any child they started meanwhile), wait up to ``kill_wait``, report who is left.

    The ``psutil.Process`` objects carry their start time: a pid reused since they were made is
    never signalled. Protected and other users' processes are refused, not signalled. With
    ``run_marker``, a descendant is stopped only if it carries that run's marker too; one that
    does not is left alone (``left_alone``).
    """
    started = time.monotonic()
    protected = protected_pids()
    targets: dict[int, psutil.Process] = {}
    refused: dict[int, str] = {}
    left_alone: dict[int, str] = {}
    gone: list[int] = []

    def admit(candidates: Iterable[psutil.Process], descendants: bool = False) -> None:
        for p in candidates:
            if p.pid in targets or p.pid in refused or p.pid in left_alone:
                continue
            if process_ended(p):
                gone.append(p.pid)
                continue
            if descendants and run_marker is not None:
                foreign = marker_mismatch(p, run_marker)
                if foreign:
                    left_alone[p.pid] = f"{foreign}: left alone"
                    continue
            why = refusal(p, allow_other_users=allow_other_users, protected=protected)
            if why:
                refused[p.pid] = why
            else:
                targets[p.pid] = p

    admit(processes)
    if include_descendants:
        admit(_descendants(list(targets.values())), descendants=True)
    for p in list(targets.values()):
        if not _signal(p, signal.SIGTERM):
            gone.append(p.pid)
            del targets[p.pid]
    ended = _wait_ended(targets, grace)
    terminated = set(ended)
    rest = {pid: p for pid, p in targets.items() if pid not in ended}
    if include_descendants and rest:  # children started during the grace period
        before = set(targets)
        admit(_descendants(list(rest.values())), descendants=True)
        rest.update({pid: targets[pid] for pid in set(targets) - before})
    for p in rest.values():
        _signal(p, signal.SIGKILL)
    killed = _wait_ended(rest, kill_wait)
    survivors = set(rest) - killed
    return StopResult(
        terminated=tuple(sorted(terminated)),
        killed=tuple(sorted(killed)),
        survivors=tuple(sorted(survivors)),
        already_gone=tuple(sorted(set(gone))),
        refused=tuple(sorted(refused.items())),
        seconds=time.monotonic() - started,
        left_alone=tuple(sorted(left_alone.items())),
    )


def gpu_memory_left(pids: Iterable[int], wait: float = GPU_RELEASE_WAIT_SECONDS) -> str:
    """One sentence: whether NVML still lists any of ``pids`` as holding GPU memory. Drivers free
    memory a moment after the process ends, so this waits up to ``wait`` seconds."""
    wanted = set(pids)
    deadline = time.monotonic() + wait
    while True:
        inventory = sample_gpus()
        if inventory.error:
            return f"GPU memory not checked: {inventory.error}"
        if not inventory.gpus:
            return "GPU memory not checked: NVML sees no GPU"
        held = [
            (gpu.index, holder)
            for gpu in inventory.gpus
            for holder in gpu.processes
            if holder.pid in wanted
        ]
        if not held:
            return "GPU memory released (NVML lists none of these processes)"
        if time.monotonic() >= deadline:
            described = ", ".join(
                f"pid {h.pid} on GPU {i} ({(h.used_memory_bytes or 0) / (1 << 20):.0f} MiB)"
                for i, h in held
            )
            return f"GPU memory still held: {described}"
        time.sleep(0.25)


def stop_refs(
    refs: Iterable[ProcessRef],
    grace: float,
    *,
    all_users: bool = False,
    run_marker: str | None = None,
) -> tuple[StopResult, tuple[str, ...]]:
    """Stop the processes ``refs`` name (and their descendants), each looked up again by pid and
    start time first: one that ended since it was listed is left out, a reused pid is left alone,
    and with ``run_marker`` one that does not carry that run's marker is left alone (one sentence
    each in the second item). ``ddptui clean`` and the GPUs and Processes screens stop through
    this."""
    procs: list[psutil.Process] = []
    skipped: list[str] = []
    for ref in refs:
        try:
            proc = psutil.Process(ref.pid)
            if not same_start(proc.create_time(), ref.start_time):
                skipped.append(f"pid {ref.pid} now belongs to another process: left alone")
                continue
        except psutil.Error:
            continue
        foreign = marker_mismatch(proc, run_marker) if run_marker is not None else None
        if foreign:
            skipped.append(f"{foreign}: left alone")
            continue
        procs.append(proc)
    result = stop_processes(procs, grace, allow_other_users=all_users, run_marker=run_marker)
    return result, tuple(skipped)


def may_stop_other_users() -> bool:
    """Only root may stop other users' processes (and only when asked to)."""
    return os.geteuid() == 0


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


def run_dir_owner(run_dir: RunDir) -> str | None:
    """The user who owns ``run_dir`` or its run.json when that is not this user, else None. A run
    directory is the word of whoever wrote it: another user's run.json may name any process."""
    me = os.getuid()
    for path in (run_dir.path, run_dir.run_json_path):
        try:
            uid = path.lstat().st_uid if path != run_dir.path else path.stat().st_uid
        except OSError:
            continue
        if uid != me:
            return user_name(uid)
    return None


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


def record_killed(run_dir: RunDir, reason: str) -> bool:
    """Settle a run stopped from outside after its launcher was gone: summary.json with status
    killed and run.json's state, unless a summary is there already (the launcher wrote it while
    it was being stopped). True when this wrote the summary."""
    if run_dir.summary_path.exists():
        return False
    return not settle_run(run_dir, killed_summary(run_dir, reason)) and (
        run_dir.summary_path.exists()
    )


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
        marker = job.run_id if job.kind == JobKind.DDPTUI else None
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
