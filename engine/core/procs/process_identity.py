"""Which process is which: a process is named by its pid *and* its start time, and it is alive only
while that very process exists and is not a zombie. ``lookup(ref)`` is the one place that decides
it (a ``ProcessState``: running, stopped, zombie, gone, reused, unreadable), for liveness (the run
observer), scanning (``ddptui ps``), stacks, stopping (``ddptui kill`` / ``clean``) and the rank's
launcher watchdog; ``status_state`` reads the same states from a status word a scan already has.

Plain Python (psutil).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from engine.core.common.run_files import user_name
from engine.core.common.statuses import ProcessState

# psutil's create_time is boot time + start ticks; boot time can shift by a second when the clock
# is adjusted. A pid cannot be reused within a second (the pid counter has to wrap first).
START_TIME_TOLERANCE = 1.0


@dataclass(frozen=True)
class ProcessRef:
    """A process identified by pid *and* start time, so a reused pid is never mistaken for it."""

    pid: int
    start_time: float  # psutil.Process.create_time()

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_time": self.start_time}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRef:
        return cls(pid=int(data["pid"]), start_time=float(data["start_time"]))


def same_start(a: float, b: float) -> bool:
    return abs(a - b) <= START_TIME_TOLERANCE


def ref_of(proc: psutil.Process) -> ProcessRef:
    """The identity of a live process (psutil.Error when it is gone)."""
    return ProcessRef(proc.pid, proc.create_time())


def identify(pid: int) -> ProcessRef | None:
    """The identity of the process that has ``pid`` now, or None when there is none."""
    try:
        return ref_of(psutil.Process(pid))
    except (psutil.Error, OSError):
        return None


def status_state(status: str) -> ProcessState:
    """A psutil status word as a ``ProcessState`` of a process that exists: a zombie, stopped by a
    signal (SIGSTOP, SIGTSTP: it runs again on SIGCONT) or running. A tracer's stop is running:
    py-spy holds every rank in one for a moment while ddptui takes their stacks, and a debugger's
    stop is not the user's kill -STOP either."""
    if status == psutil.STATUS_ZOMBIE:
        return ProcessState.ZOMBIE
    if status == psutil.STATUS_STOPPED:
        return ProcessState.STOPPED
    return ProcessState.RUNNING


def state_of(proc: psutil.Process) -> ProcessState:
    """The state of this very process: a ``psutil.Process`` remembers the start time it was made
    with, so a pid reused since is ``GONE`` for it, never another process's state."""
    try:
        if not proc.is_running():
            return ProcessState.GONE
        return status_state(proc.status())
    except psutil.NoSuchProcess:
        return ProcessState.GONE
    except (psutil.Error, OSError):
        return ProcessState.UNREADABLE


def lookup(ref: ProcessRef) -> tuple[ProcessState, psutil.Process | None]:
    """The one process lookup: what became of the process ``ref`` names, and that very process
    while it exists (running, stopped or a zombie), else None. A pid that now names a process
    with another start time is ``REUSED``; one whose start time cannot be read is
    ``UNREADABLE``: neither is ever handed out, so nothing signals the wrong process."""
    try:
        proc = psutil.Process(ref.pid)
        started = proc.create_time()
    except psutil.NoSuchProcess:
        return ProcessState.GONE, None
    except (psutil.Error, OSError):
        return ProcessState.UNREADABLE, None
    if not same_start(started, ref.start_time):
        return ProcessState.REUSED, None
    state = state_of(proc)
    return state, (None if state in (ProcessState.GONE, ProcessState.UNREADABLE) else proc)


def find_process(ref: ProcessRef) -> psutil.Process | None:
    """The live process ``ref`` names (``lookup``), or None once it has ended or its pid names
    another process. Zombies count as ended: only the entry is left."""
    state, proc = lookup(ref)
    return proc if state.alive else None


def ref_alive(ref: ProcessRef | None) -> bool:
    return ref is not None and lookup(ref)[0].alive


def process_ended(proc: psutil.Process) -> bool:
    """True once ``proc`` (this very process, not a later one with its pid) is gone or a zombie;
    False while it cannot be told (``UNREADABLE``)."""
    return state_of(proc).ended


@dataclass(frozen=True)
class ProcessUsage:
    cpu_percent: float | None  # of one core, since the previous reading; None on the first
    rss_bytes: int | None


class ProcessLooks:
    """One look at each process for one observation: the first question about a process asks the
    probe, every later question of the same observation gets that answer (a run's launcher is
    not looked up once for its status and again for its rank states). ``seen``: looks the caller
    has made already (a run handle's proofs, a /proc scan), taken as they are."""

    def __init__(
        self, probe: ProcessProbe, seen: Mapping[ProcessRef, ProcessState] | None = None
    ) -> None:
        self.probe = probe
        self._seen: dict[ProcessRef, ProcessState] = dict(seen or {})

    def state(self, ref: ProcessRef) -> ProcessState:
        found = self._seen.get(ref)
        if found is None:
            found = self._seen[ref] = self.probe.state(ref)
        return found

    def alive(self, ref: ProcessRef | None) -> bool:
        return ref is not None and self.state(ref).alive

    def stopped(self, refs: Iterable[ProcessRef]) -> frozenset[int]:
        """The pids of those of ``refs`` stopped by a signal, as ``ProcessProbe.stopped``."""
        return frozenset(ref.pid for ref in refs if self.state(ref) == ProcessState.STOPPED)


def user_of(proc: psutil.Process) -> str:
    """The name of the process's user, as ``user_name`` names every user (``uid N`` when this
    machine has no name for it: another container's user); "?" when the process is gone."""
    try:
        return user_name(proc.uids().real)
    except psutil.Error:
        return "?"


class ProcessProbe:
    """Liveness and CPU / memory of processes: what the run observer asks the OS.

    Tests replace it with a stand-in so that views show fixed figures (a stand-in answers
    ``state``). ``state`` is ``lookup``'s answer; ``usage`` keeps one psutil handle per process
    between calls, so CPU percentages cover the time since the previous call. Safe to share
    between threads.
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()

    def state(self, ref: ProcessRef) -> ProcessState:
        """What became of the process ``ref`` names, looked up now (``lookup``)."""
        return lookup(ref)[0]

    def alive(self, ref: ProcessRef | None) -> bool:
        return ref is not None and self.state(ref).alive

    def stopped(self, refs: Iterable[ProcessRef]) -> frozenset[int]:
        """The pids of those of ``refs`` whose very process is stopped by a signal (``lookup``):
        a pid reused since is never taken for the rank it named."""
        return frozenset(ref.pid for ref in refs if self.state(ref) == ProcessState.STOPPED)

    def users(self, pids: Iterable[int]) -> dict[int, str]:
        """The user of each of ``pids`` still running here (NVML's pids of processes in another
        PID namespace are not: they are left out)."""
        found = {}
        for pid in pids:
            try:
                found[pid] = user_of(psutil.Process(pid))
            except (psutil.Error, OSError):
                continue
        return found

    def usage(self, pids: Iterable[int]) -> dict[int, ProcessUsage]:
        """CPU percent (of one core, since the previous call for that pid) and resident memory."""
        found: dict[int, ProcessUsage] = {}
        with self._lock:
            for pid in pids:
                proc = self._procs.get(pid)
                try:
                    if proc is None or not proc.is_running():
                        proc = psutil.Process(pid)
                        self._procs[pid] = proc
                        proc.cpu_percent(None)  # primes the counter; the first figure is 0
                        cpu: float | None = None
                    else:
                        cpu = proc.cpu_percent(None)
                    found[pid] = ProcessUsage(cpu, int(proc.memory_info().rss))
                except (psutil.Error, OSError):
                    self._procs.pop(pid, None)
        return found
