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

from engine.core.gpus import sample_gpus
from engine.core.process_identity import ProcessRef, process_ended, same_start
from engine.core.process_table import ProcessTable, TrainingJob, launcher_kind
from engine.core.rundir import RUN_MARKER_ENV, RunDir, RunDirError
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


def _user(proc: psutil.Process) -> str:
    try:
        return str(proc.username())
    except (psutil.Error, KeyError):
        uid = _uid(proc)
        return str(uid) if uid is not None else "?"


def refusal(proc: psutil.Process, *, allow_other_users: bool, protected: set[int]) -> str | None:
    """Why ``proc`` must not be stopped by this process, or None."""
    if proc.pid in protected:
        return f"pid {proc.pid} is this ddptui process or one of its parents"
    uid = _uid(proc)
    if uid is not None and uid != os.getuid():
        if not allow_other_users:
            return (
                f"pid {proc.pid} belongs to user {_user(proc)}, not {getpass.getuser()}; "
                "ddptui stops only your own processes (as root, add --all-users)"
            )
        if os.getuid() != 0:
            return f"pid {proc.pid} belongs to user {_user(proc)}; only root can stop it"
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
) -> StopResult:
    """SIGTERM ``processes`` (and their descendants), wait up to ``grace`` seconds, SIGKILL the
    rest (and any child they started meanwhile), wait up to ``kill_wait``, report who is left.

    The ``psutil.Process`` objects carry their start time: a pid reused since they were made is
    never signalled. Protected and other users' processes are refused, not signalled.
    """
    started = time.monotonic()
    protected = protected_pids()
    targets: dict[int, psutil.Process] = {}
    refused: dict[int, str] = {}
    gone: list[int] = []

    def admit(candidates: Iterable[psutil.Process]) -> None:
        for p in candidates:
            if p.pid in targets or p.pid in refused:
                continue
            if process_ended(p):
                gone.append(p.pid)
                continue
            why = refusal(p, allow_other_users=allow_other_users, protected=protected)
            if why:
                refused[p.pid] = why
            else:
                targets[p.pid] = p

    admit(processes)
    if include_descendants:
        admit(_descendants(list(targets.values())))
    for p in list(targets.values()):
        if not _signal(p, signal.SIGTERM):
            gone.append(p.pid)
            del targets[p.pid]
    ended = _wait_ended(targets, grace)
    terminated = set(ended)
    rest = {pid: p for pid, p in targets.items() if pid not in ended}
    if include_descendants and rest:  # children started during the grace period
        before = set(targets)
        admit(_descendants(list(rest.values())))
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
    refs: Iterable[ProcessRef], grace: float, *, all_users: bool = False
) -> tuple[StopResult, tuple[str, ...]]:
    """Stop the processes ``refs`` name (and their descendants), each looked up again by pid and
    start time first: one that ended since it was listed is left out, a reused pid is left alone
    (one sentence each in the second item). The GPUs and Processes screens stop through this."""
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
        procs.append(proc)
    return stop_processes(procs, grace, allow_other_users=all_users), tuple(skipped)


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

    @property
    def ok(self) -> bool:
        """Nothing of the run is left running (nor was any of it refused)."""
        return self.stop is None or (self.stop.ok and not self.stop.refused)


def _marked(run_id: str, protected: set[int]) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in protected:
            continue
        try:
            if proc.environ().get(RUN_MARKER_ENV) == run_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _launchers_of(run_dir: RunDir, protected: set[int]) -> list[psutil.Process]:
    """``python -m engine.train.launch RUN_DIR`` processes of this run (before run.json names one)."""
    wanted = run_dir.path.resolve()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        cmd = proc.info.get("cmdline") or []
        if proc.pid in protected or launcher_kind(cmd) != "ddptui":
            continue
        arg = cmd[cmd.index("-m") + 2] if len(cmd) > cmd.index("-m") + 2 else ""
        base = Path(proc.info.get("cwd") or "/")
        if arg and (base / arg).resolve() == wanted:
            found.append(proc)
    return found


def run_targets(
    run_dir: RunDir, protected: set[int] | None = None
) -> tuple[list[tuple[psutil.Process, str]], list[str]]:
    """The live processes of a run (launcher, ranks, marked processes; not yet descendants),
    each with its role, and a sentence for each pid run.json names that is left alone."""
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
        if not process_ended(proc):
            found[proc.pid] = (proc, role)
    for proc in _marked(run_dir.run_id, protected):
        found.setdefault(proc.pid, (proc, "marked"))
    for proc in _launchers_of(run_dir, protected):
        found.setdefault(proc.pid, (proc, "launcher"))
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

    Raises RunDirError (run.json missing or corrupt) or KillRefused (a target is another user's
    or this process's own ancestor) before signalling anything. A finished run with nothing left
    is reported as such and left alone; a finished run's leftovers are stopped without touching its
    summary. Otherwise summary.json ends up with status ``killed``.
    """
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
    targets = tuple(Target(p.pid, p.create_time(), role, _user(p)) for p, role in found)
    result = stop_processes([p for p, _ in found], grace, allow_other_users=allow_other_users)
    # a last look for marked processes that slipped through (started while we were stopping)
    late = [p for p in _marked(run_dir.run_id, protected) if p.pid not in result.stopped]
    if late:
        result = result.merged(stop_processes(late, 0.5, allow_other_users=allow_other_users))
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
        else:
            chosen.append(job)
    return CleanPlan(jobs=tuple(chosen), left_alone=tuple(left))


def clean_orphans(
    plan: CleanPlan, grace: float = 5.0, *, all_users: bool = False
) -> tuple[CleanedJob, ...]:
    """Stop the planned jobs. Each process is looked up again by pid and start time, so one that
    ended since the scan, and a pid reused since, are left alone."""
    cleaned = []
    for job in plan.jobs:
        result, skipped = stop_refs([p.ref for p in job.live_processes], grace, all_users=all_users)
        written = False
        if job.kind == JobKind.DDPTUI and job.run_dir and result.stopped:
            run_dir = RunDir(Path(job.run_dir))
            if run_dir.config_path.exists() and not run_dir.summary_path.exists():
                written = record_killed(
                    run_dir, "its launcher was gone; ddptui clean stopped the orphaned ranks"
                )
        cleaned.append(CleanedJob(job, result, tuple(skipped), written))
    return tuple(cleaned)
