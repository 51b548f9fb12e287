"""Stopping processes safely: the one way anything is stopped (``ddptui kill``, ``ddptui clean``,
the UI's stop keys and the launcher's own stop).

``stop_processes``: SIGTERM to every target and its descendants, a grace period, SIGKILL to what is
left (children that appeared meanwhile included), then a check that nothing is left, as
torchelastic's subprocess handler does. Processes are named by pid *and* start time, so a pid the
kernel gave to another process is never hit. Never this process, its ancestors (the shell that
runs ddptui) or another user's process unless the caller allows it (root only).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psutil

from engine.core.common.formatting import format_bytes
from engine.core.common.run_files import user_name
from engine.core.common.statuses import ProcessState
from engine.core.host.gpus import sample_gpus
from engine.core.procs.process_identity import ProcessRef, lookup, process_ended, user_of
from engine.core.procs.run_proof import RunMarker, marker_mismatch

POLL_SECONDS = 0.05
# Between SIGTERM and SIGKILL where the caller names no other: ``ddptui kill``, ``ddptui clean``
# and every stop from the UI alike (a run's ranks stopped by its killer, leftovers, orphans).
STOP_GRACE_SECONDS = 5.0
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
                f"pid {proc.pid} belongs to user {user_of(proc)}, not {user_name(os.getuid())}; "
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


def descendants(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Every live descendant of ``procs`` (those that are gone have none)."""
    found = []
    for p in procs:
        try:
            found.extend(p.children(recursive=True))
        except psutil.Error:
            continue
    return found


def signal_process(proc: psutil.Process, sig: signal.Signals) -> bool:
    """Send ``sig``; psutil refuses when the pid now belongs to another process. False: gone."""
    try:
        proc.send_signal(sig)
        return True
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # still there; it will show up as a survivor


def wait_ended(procs: dict[int, psutil.Process], timeout: float) -> set[int]:
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
    run_marker: RunMarker | None = None,
) -> StopResult:
    """SIGTERM ``processes`` (and their descendants), wait up to ``grace`` seconds, SIGKILL the
    rest (and any child they started meanwhile), wait up to ``kill_wait``, report who is left.

    The ``psutil.Process`` objects carry their start time: a pid reused since they were made is
    never signalled. Protected and other users' processes are refused, not signalled. With
    ``run_marker``, a descendant is stopped only if it carries that run's marker (id and run
    directory) too; one that does not is left alone (``left_alone``).
    """
    started = time.monotonic()
    protected = protected_pids()
    targets: dict[int, psutil.Process] = {}
    refused: dict[int, str] = {}
    left_alone: dict[int, str] = {}
    gone: list[int] = []

    def admit(candidates: Iterable[psutil.Process], below: bool = False) -> None:
        for p in candidates:
            if p.pid in targets or p.pid in refused or p.pid in left_alone:
                continue
            if process_ended(p):
                gone.append(p.pid)
                continue
            if below and run_marker is not None:
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
        admit(descendants(list(targets.values())), below=True)
    for p in list(targets.values()):
        if not signal_process(p, signal.SIGTERM):
            gone.append(p.pid)
            del targets[p.pid]
    ended = wait_ended(targets, grace)
    terminated = set(ended)
    rest = {pid: p for pid, p in targets.items() if pid not in ended}
    if include_descendants and rest:  # children started during the grace period
        before = set(targets)
        admit(descendants(list(rest.values())), below=True)
        rest.update({pid: targets[pid] for pid in set(targets) - before})
    for p in rest.values():
        signal_process(p, signal.SIGKILL)
    killed = wait_ended(rest, kill_wait)
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
                f"pid {h.pid} on GPU {i} ({format_bytes(h.used_memory_bytes, 'an unknown amount')})"
                for i, h in held
            )
            return f"GPU memory still held: {described}"
        time.sleep(0.25)


def stop_refs(
    refs: Iterable[ProcessRef],
    grace: float,
    *,
    all_users: bool = False,
    run_marker: RunMarker | None = None,
) -> tuple[StopResult, tuple[str, ...]]:
    """Stop the processes ``refs`` name (and their descendants), each looked up again by pid and
    start time first: one that ended since it was listed is left out, a reused pid is left alone,
    and with ``run_marker`` one that does not carry that run's marker (id and run directory) is
    left alone (one sentence each in the second item). ``ddptui clean`` and the GPUs and Processes
    screens stop through this."""
    procs: list[psutil.Process] = []
    skipped: list[str] = []
    for ref in refs:
        state, proc = lookup(ref)
        if state == ProcessState.REUSED:
            skipped.append(f"pid {ref.pid} now belongs to another process: left alone")
        if proc is None:
            continue
        foreign = marker_mismatch(proc, run_marker) if run_marker is not None else None
        if foreign:
            skipped.append(f"{foreign}: left alone")
            continue
        procs.append(proc)
    result = stop_processes(procs, grace, allow_other_users=all_users, run_marker=run_marker)
    return result, tuple(skipped)


@dataclass(frozen=True)
class SignalResult:
    """What ``signal_refs`` did: which processes got the signal, which were gone, which were
    refused (pid, why); and the sentences for those left alone."""

    signal: str
    sent: tuple[int, ...] = ()
    gone: tuple[int, ...] = ()
    refused: tuple[tuple[int, str], ...] = ()
    skipped: tuple[str, ...] = ()


def signal_refs(
    refs: Iterable[ProcessRef], sig: signal.Signals, *, all_users: bool = False
) -> SignalResult:
    """Send one signal (SIGINT, SIGKILL, ...) to the processes ``refs`` name, each looked up again
    by pid and start time first, refused as ``stop_processes`` refuses (another user's, unless
    root allowed all users; this process and its ancestors); no wait, no follow-up. The GPUs
    screen's choice of signal sends through this."""
    protected = protected_pids()
    sent: list[int] = []
    gone: list[int] = []
    refused: list[tuple[int, str]] = []
    skipped: list[str] = []
    for ref in refs:
        state, proc = lookup(ref)
        if state == ProcessState.REUSED:
            skipped.append(f"pid {ref.pid} now belongs to another process: left alone")
        if state == ProcessState.UNREADABLE:  # which process has the pid cannot be told
            refused.append((ref.pid, "this user cannot tell which process it is"))
            continue
        if proc is None or not state.alive:
            gone.append(ref.pid)
            continue
        why = refusal(proc, allow_other_users=all_users, protected=protected)
        if why:
            refused.append((ref.pid, why))
        elif signal_process(proc, sig):
            sent.append(ref.pid)
        else:
            gone.append(ref.pid)
    return SignalResult(sig.name, tuple(sent), tuple(gone), tuple(refused), tuple(skipped))


def may_stop_other_users() -> bool:
    """Only root may stop other users' processes (and only when asked to)."""
    return os.geteuid() == 0
