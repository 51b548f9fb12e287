"""``ddptui kill RUN_ID`` and the UI's kill: stop exactly the processes that prove they are one
run's, after taking every rank's stack, and settle its summary.

One stop authority: a run whose launcher lives is stopped by its launcher. The killer sends the
launcher (proved by pid, start time and run marker) one SIGTERM and waits for it to end: the
launcher stops its ranks as it stops them for a failure (stacks, SIGTERM, its grace period,
SIGKILL) and writes summary.json saying killed. The killer signals ranks itself only when the
launcher is gone, stopped by a signal, or not done within its grace period plus a margin, and only
then writes the summary (through ``engine.core.runs.settle``). Either way it sweeps up what carries
the run's marker and is still alive, and says truthfully what ended on SIGTERM and what needed
SIGKILL: from its own stop, or from the launcher's ``StopSignalled`` events.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import psutil

from engine.core.backends.local.snapshot import snapshot_run
from engine.core.common.config_error import ConfigError
from engine.core.common.run_files import refuse_writing, user_name
from engine.core.common.statuses import KillOutcome, ProcessState, RunStatus, StopRequester
from engine.core.procs.process_identity import process_ended, state_of, user_of
from engine.core.procs.run_proof import marked_processes
from engine.core.procs.stopping import (
    POLL_SECONDS,
    STOP_GRACE_SECONDS,
    KillRefused,
    StopResult,
    descendants,
    gpu_memory_left,
    refusal,
    signal_process,
    stop_processes,
)
from engine.core.runs.events import StopSignalled, read_events
from engine.core.runs.run_handle import RunHandle, observe_handle
from engine.core.runs.rundir import RunDir, RunDirError, run_dir_owner
from engine.core.runs.settle import record_killed
from engine.core.runs.stop_request import request_stop
from engine.core.stacks.snapshot import StackSnapshot

# How long past its grace period a launcher may take to finish its stop: its SIGKILL, reaping its
# ranks, and writing the summary (a snapshot of its own, when the killer's is not recent).
LAUNCHER_STOP_MARGIN_SECONDS = 15.0
LATE_GRACE_SECONDS = 0.5  # for marked processes that appeared while the run was being stopped


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
    unwritten: str = ""  # why the killer could not write the summary (another user's directory)
    stacks: StackSnapshot | None = None  # every rank's stack, taken before anything was signalled
    by_launcher: bool = False  # the run's live launcher stopped its ranks and wrote the summary
    grace_seconds: float = 0.0  # between SIGTERM and SIGKILL, as the ranks were given it
    # A run another backend placed (a scheduler's job): where it was and what became of that, in
    # its backend's words ("job 4242 of the scheduler", "cancelled"); the nodes whose launcher proved them
    # clean, those that did not report, a rank's daemon found, and all that in one sentence.
    placement: str = ""
    placement_ended: str = ""
    verified_nodes: tuple[str, ...] = ()
    unverified_nodes: tuple[str, ...] = ()
    daemons: tuple[str, ...] = ()
    verification: str = ""

    @property
    def ok(self) -> bool:
        """Nothing of the run is left running (nor was any of it refused), and every node of a
        run across nodes proved it."""
        stopped = self.stop is None or (self.stop.ok and not self.stop.refused)
        return stopped and not self.unverified_nodes


def check_run_owner(run_dir: RunDir, *, allow_other_users: bool) -> None:
    """KillRefused unless ``run_dir`` is this user's, or root was allowed other users' runs."""
    owner = run_dir_owner(run_dir)
    if owner is None:
        return
    if not allow_other_users:
        raise KillRefused(
            f"run {run_dir.run_id}: its run directory belongs to user {owner}, not "
            f"{user_name(os.getuid())}; ddptui stops only your own runs (as root, add "
            "--all-users); nothing was stopped"
        )
    if os.getuid() != 0:
        raise KillRefused(
            f"run {run_dir.run_id}: its run directory belongs to user {owner}; only root can stop "
            "another user's run; nothing was stopped"
        )


def run_targets(
    run_dir: RunDir, protected: set[int] | None = None, *, allow_other_users: bool = False
) -> tuple[list[tuple[psutil.Process, str]], list[str]]:
    """The live processes that are provably the run's (not yet descendants), each with its role,
    and a sentence for each pid run.json names that is left alone (``observe_handle``)."""
    kept = None if protected is None else frozenset(protected)
    handle = observe_handle(run_dir, kept, allow_other_users=allow_other_users)
    return list(handle.processes), list(handle.skipped)


def _status_before(handle: RunHandle) -> RunStatus:
    run_dir = handle.run_dir
    try:
        summary = run_dir.read_summary()
    except RunDirError:
        summary = None
    if summary is not None:
        return summary.status
    return handle.info.state


def _launcher_grace(run_dir: RunDir) -> float | None:
    """The grace period the run's launcher gives its ranks (its preset's supervision)."""
    try:
        return run_dir.load_config().supervision.failure_grace_seconds
    except (ConfigError, OSError):
        return None


def _killed_by_launcher(run_dir: RunDir, since: float) -> set[int]:
    """The pids the launcher sent SIGKILL to since ``since`` (its ``StopSignalled`` events)."""
    return {
        pid
        for e in read_events(run_dir.launcher_events_path, run_dir.path)
        if isinstance(e, StopSignalled) and e.signal == "SIGKILL" and e.time >= since - 1.0
        for pid in e.pids
    }


def ask_launcher_to_stop(
    run_dir: RunDir,
    launcher: psutil.Process,
    members: list[psutil.Process],
    wait: float,
    by: StopRequester = StopRequester.KILL,
) -> tuple[StopResult, bool]:
    """Leave word who asks (``engine.core.runs.stop_request``), SIGTERM to the launcher only, then
    wait up to ``wait`` seconds for it to end. Returns what of ``members`` (and their descendants)
    ended meanwhile and how, as the launcher's events tell it, and whether the launcher finished
    its stop (it ended and summary.json is there)."""
    watched = {p.pid: p for p in [*members, *descendants(members)]}
    asked, started = time.time(), time.monotonic()
    request_stop(run_dir, by)
    if not signal_process(launcher, signal.SIGTERM):
        return StopResult(), False
    deadline = started + wait
    while not process_ended(launcher) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    finished = process_ended(launcher) and run_dir.summary_path.exists()
    ended = sorted(pid for pid, p in watched.items() if process_ended(p))
    killed = _killed_by_launcher(run_dir, asked)
    return StopResult(
        terminated=tuple(pid for pid in ended if pid not in killed),
        killed=tuple(pid for pid in ended if pid in killed),
        seconds=time.monotonic() - started,
    ), finished


def _stop_run(
    handle: RunHandle, grace: float, *, allow_other_users: bool, by: StopRequester
) -> tuple[StopResult, bool, float]:
    """Stop the run's processes: through its live launcher where it has one, else (or when it does
    not finish in time) directly, then whatever carrying the marker is left. Returns what was
    stopped and how, whether the launcher did it, and the grace the ranks were given."""
    run_dir, marker, found = handle.run_dir, handle.marker, list(handle.processes)
    launcher = next((p for p, role in found if role == "launcher"), None)
    result, by_launcher, given = StopResult(), False, grace
    if launcher is not None and state_of(launcher) == ProcessState.RUNNING:  # it can act
        launcher_grace = _launcher_grace(run_dir)
        wait = max(grace, launcher_grace or grace) + LAUNCHER_STOP_MARGIN_SECONDS
        result, by_launcher = ask_launcher_to_stop(
            run_dir, launcher, [p for p, _ in found], wait, by
        )
        if by_launcher and launcher_grace is not None:
            given = launcher_grace
    rest = [p for p, _ in found if p.pid not in result.stopped and not process_ended(p)]
    if rest:  # the launcher was gone, could not act, or did not finish in time
        result = result.merged(
            stop_processes(rest, grace, allow_other_users=allow_other_users, run_marker=marker)
        )
    # a last look for marked processes that slipped through (started while we were stopping):
    # the one second scan of /proc for the marker, after acting, by design
    late = [
        p
        for p in marked_processes(marker, owner_uid=handle.owner_uid, exclude=handle.protected)
        if p.pid not in result.stopped
    ]
    if late:
        result = result.merged(
            stop_processes(
                late, LATE_GRACE_SECONDS, allow_other_users=allow_other_users, run_marker=marker
            )
        )
    return result, by_launcher, given


def _nothing_left(
    run_dir: RunDir, status_before: RunStatus, skipped: list[str], by: StopRequester
) -> KillResult:
    """Nothing of the run runs: a finished run is left as it is, an unfinished one is recorded as
    killed (its launcher ended without a summary)."""
    finished = status_before.final
    written = not finished and record_killed(
        run_dir,
        f"{by.sentence}, which found no process left: the launcher had ended without writing a "
        "summary",
    )
    return KillResult(
        run_id=run_dir.run_id,
        outcome=KillOutcome.ALREADY_FINISHED if finished else KillOutcome.NOTHING_RUNNING,
        status_before=status_before,
        skipped=tuple(skipped),
        summary_written=written,
        unwritten="" if finished else refuse_writing(run_dir.path),
    )


def kill_run(
    run_dir: RunDir,
    grace: float = STOP_GRACE_SECONDS,
    *,
    allow_other_users: bool = False,
    check_gpu: bool = True,
    by: StopRequester = StopRequester.KILL,
    handle: RunHandle | None = None,
) -> KillResult:
    """Stop exactly the processes of one run: the launcher and ranks run.json names (pid and start
    time), every process carrying its run marker, and all their descendants carrying it too; a
    live launcher is asked to stop its ranks itself (see the module docstring), ``grace`` is the
    grace period when the killer stops them. ``handle``: the caller's one look at the run (made
    with the same ``allow_other_users``), else this looks (``observe_handle``); either way nothing
    reads run.json or proves a process again before the first signal.

    Raises RunDirError (run.json missing or corrupt) or KillRefused (the run directory or a
    target is another user's, or a target is this process's own ancestor) before signalling
    anything. A finished run with nothing left is reported as such and left alone; a finished
    run's leftovers are stopped without touching its summary. Otherwise summary.json ends up with
    status ``killed``, saying who asked (``by``): the launcher's, or the killer's when the
    launcher could not write it.
    """
    check_run_owner(run_dir, allow_other_users=allow_other_users)
    # RunDirError (run.json missing or corrupt): the caller says so and stops
    handle = handle or observe_handle(run_dir, allow_other_users=allow_other_users)
    protected = set(handle.protected)
    status_before = _status_before(handle)
    found, skipped = list(handle.processes), list(handle.skipped)
    if not found:
        return _nothing_left(run_dir, status_before, skipped, by)
    for proc, role in found:
        why = refusal(proc, allow_other_users=allow_other_users, protected=protected)
        if why:
            raise KillRefused(f"run {run_dir.run_id}: {role} {why}; nothing was stopped")
    targets = tuple(Target(p.pid, p.create_time(), role, user_of(p)) for p, role in found)
    finished = status_before.final
    # The evidence of why the run was stuck dies with it: take every rank's stack first.
    stacks = None if finished else snapshot_run(handle, reason="before kill")
    result, by_launcher, given = _stop_run(
        handle, grace, allow_other_users=allow_other_users, by=by
    )
    pids = [t.pid for t in targets] + list(result.stopped)
    written = (
        not finished
        and not by_launcher
        and record_killed(run_dir, f"{by.sentence} (SIGTERM, SIGKILL after {grace:g} s)")
    )
    return KillResult(
        run_id=run_dir.run_id,
        outcome=KillOutcome.STOPPED,
        status_before=status_before,
        targets=targets,
        stop=result,
        skipped=tuple(skipped),
        gpu_check=gpu_memory_left(pids) if check_gpu else "",
        summary_written=written,
        unwritten="" if finished or by_launcher else refuse_writing(run_dir.path),
        stacks=stacks,
        by_launcher=by_launcher,
        grace_seconds=given,
    )
