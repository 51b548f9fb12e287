"""Judging a grouped job: whether its launcher lives (so whether the job is orphaned), and the
state of each of its processes and of the whole job.

Plain Python. For our runs the launcher is exact, and a job is orphaned only on proof: run.json's
launcher (found in the run directory the processes carry) and the launcher pid every rank carries
are gone by pid and start time; a launcher that cannot be told is unknown, never gone. For foreign jobs
it is judged from each worker's nearest ancestor outside the job: a launcher (torchrun & co.) or,
for torchelastic and spawn workers, the Python process that started them. A worker adopted by
something else (init, a container's pid 1, a subreaper) has lost its launcher. The parent pid
being 1 is never the test itself: subreapers adopt orphans too, and a container's real launcher
can be pid 1. Workers started some other way (a shell script setting RANK, srun, mpirun) are only
orphaned when no parent is visible at all, since their launcher can be any program.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.common.run_environment import LAUNCHER_PID_ENV
from engine.core.common.statuses import JobKind, JobState, ProcessRole, ProcessState
from engine.core.jobs.grouping import FoundJob
from engine.core.procs.process_identity import START_TIME_TOLERANCE, ProcessRef, lookup
from engine.core.procs.process_scan import ProcessInfo, env_int, is_python, launcher_of

# (launcher pid, alive: True / False / None for cannot tell, why in one sentence)
LauncherVerdict = tuple[int | None, bool | None, str]


def launcher_state(job: FoundJob, procs: dict[int, ProcessInfo]) -> LauncherVerdict:
    """Whether the launcher of ``job`` lives, and why that is the answer."""
    if job.kind == JobKind.DDPTUI:
        return _our_launcher(job, procs)
    if job.kind == JobKind.AGENT:
        pid = next(iter(job.members))
        return pid, True, "a launcher with no workers yet"
    return _foreign_launcher(job, procs)


def _our_launcher(job: FoundJob, procs: dict[int, ProcessInfo]) -> LauncherVerdict:
    """Alive when any evidence shows the launcher alive; gone only on proof (every launcher the
    run names, by run.json's pid and start time or by the pid its ranks carry, is gone or its pid
    now names a later process); else unknown, and an unknown launcher never makes a job
    orphaned."""
    for member, role in job.members.items():
        if role == ProcessRole.LAUNCHER and not procs[member].zombie:
            return member, True, f"its launcher (pid {member}) is running"
    verdicts: list[LauncherVerdict] = []
    if job.info is not None and job.info.launcher is not None:
        verdicts.append(_recorded_launcher(job.info.launcher))
    earliest = min(procs[m].create_time for m in job.members)
    carried = {
        pid for m in job.members if (pid := env_int((procs[m].environ or {}).get(LAUNCHER_PID_ENV)))
    }
    verdicts += [_carried_launcher(pid, procs.get(pid), earliest) for pid in sorted(carried)]
    if alive := [v for v in verdicts if v[1]]:
        return alive[0]
    if verdicts and all(v[1] is False for v in verdicts):
        why = f" ({job.info_problem})" if job.info_problem and job.info is None else ""
        return verdicts[0][0], False, verdicts[0][2] + why
    unknown = [v for v in verdicts if v[1] is None]
    if unknown:
        return unknown[0]
    return None, None, job.info_problem or "its launcher is unknown"


def _recorded_launcher(ref: ProcessRef) -> LauncherVerdict:
    """run.json's launcher, by pid and start time."""
    state, _ = lookup(ref)
    if state == ProcessState.UNREADABLE:
        return ref.pid, None, f"its launcher (pid {ref.pid}) cannot be inspected"
    if state in (ProcessState.RUNNING, ProcessState.STOPPED):
        return ref.pid, True, f"its launcher (pid {ref.pid}) is running"
    if state == ProcessState.REUSED:
        return (
            ref.pid,
            False,
            (
                f"its launcher (pid {ref.pid}, from run.json) is gone: the pid now names a later process"
            ),
        )
    return ref.pid, False, f"its launcher (pid {ref.pid}, from run.json) is gone"


def _carried_launcher(pid: int, p: ProcessInfo | None, earliest: float) -> LauncherVerdict:
    """The launcher pid the ranks carry: the process with that pid is their launcher only if it
    started no later than the first of them (a pid is not reused while its process lives)."""
    if p is None:
        return pid, False, f"its launcher (pid {pid}) is gone"
    if p.create_time > earliest + START_TIME_TOLERANCE:
        return pid, False, f"its launcher (pid {pid}) is gone: the pid now names a later process"
    if p.zombie:
        return pid, False, f"its launcher (pid {pid}) has exited"
    return pid, True, f"its launcher (pid {pid}) is running"


def _foreign_launcher(job: FoundJob, procs: dict[int, ProcessInfo]) -> LauncherVerdict:
    agents = [
        pid
        for pid, role in job.members.items()
        if role in (ProcessRole.AGENT, ProcessRole.LAUNCHER) and not procs[pid].zombie
    ]
    if agents:
        return agents[0], True, f"its launcher (pid {agents[0]}) is running"
    tops = [
        procs[pid]
        for pid in job.members
        if procs[pid].ppid not in job.members and not procs[pid].zombie
    ]
    verdicts = [_parent_verdict(job, p, procs) for p in tops]
    running = [v for v in verdicts if v[1]]
    if running:
        return running[0]
    if not verdicts:
        return None, None, "only zombies are left"
    if all(v[1] is False for v in verdicts):
        return None, False, verdicts[0][2]
    return next(v for v in verdicts if v[1] is None)


def _parent_verdict(
    job: FoundJob, p: ProcessInfo, procs: dict[int, ProcessInfo]
) -> LauncherVerdict:
    parent = procs.get(p.ppid)
    if parent is None:
        return None, False, f"pid {p.pid} has no visible parent: its launcher is gone"
    kind = launcher_of(parent)
    if kind is not None:
        return parent.pid, True, f"its launcher ({kind}, pid {parent.pid}) is running"
    desc = f"{parent.name or '?'} (pid {parent.pid})"
    if job.kind in (JobKind.ELASTIC, JobKind.SPAWN):
        if is_python(parent):
            return parent.pid, True, f"started by the Python process {parent.pid}, still running"
        starter = "torchrun agent" if job.kind == JobKind.ELASTIC else "Python parent"
        return (
            None,
            False,
            f"its {starter} is gone: the parent of pid {p.pid} is now {desc}, which did not start it",
        )
    return (
        parent.pid,
        None,
        f"started outside torchrun; its parent is {desc}, which may or may not be its launcher",
    )


def process_state(
    p: ProcessInfo,
    role: ProcessRole,
    rank: int | None,
    *,
    orphaned: bool,
    stalled: dict[int, str],
) -> tuple[JobState, str]:
    """(state, note) of one process of a job whose launcher is gone (``orphaned``) or not, with
    the job's stalled ranks and why each is."""
    note = p.environ_error
    if p.zombie:
        return JobState.ZOMBIE, note or f"ended; its parent pid {p.ppid} has not collected it"
    if orphaned and role not in (ProcessRole.LAUNCHER, ProcessRole.AGENT):
        return JobState.ORPHANED, note
    if p.stopped:
        resume = f"stopped by a signal (SIGSTOP or Ctrl-Z): `kill -CONT {p.pid}` resumes it"
        return JobState.STOPPED, note or resume
    if rank is not None and rank in stalled and role == ProcessRole.RANK:
        return JobState.STALLED, note or stalled[rank]
    return JobState.RUNNING, note


def job_state(
    states: Sequence[tuple[int, JobState]],
    *,
    orphaned: bool,
    stalled: dict[int, str],
    reason: str,
) -> tuple[JobState, str]:
    """(state, why) of a whole job from its processes' (pid, state), whether its launcher is gone
    and the launcher verdict's ``reason``."""
    live = [(pid, state) for pid, state in states if state != JobState.ZOMBIE]
    if not live:
        return JobState.ZOMBIE, "every process has ended; only zombie entries are left"
    if orphaned:
        return JobState.ORPHANED, reason
    if stopped := [pid for pid, state in live if state == JobState.STOPPED]:
        pids = " ".join(map(str, stopped))
        return JobState.STOPPED, (
            f"pid {pids} {'is' if len(stopped) == 1 else 'are'} stopped (SIGSTOP or Ctrl-Z), "
            f"so the job waits; `kill -CONT {pids}` resumes it"
        )
    if any(state == JobState.STALLED for _, state in live):
        return JobState.STALLED, "; ".join(f"rank {r}: {why}" for r, why in sorted(stalled.items()))
    return JobState.RUNNING, reason
