"""Judging a grouped job: whether its launcher lives (so whether the job is orphaned), and the
state of each of its processes and of the whole job.

Plain Python. For our runs the launcher is exact: run.json's launcher alive with its recorded
start time (or, with no run.json to go by, the launcher pid every rank carries). For foreign jobs
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
from engine.core.common.statuses import JobKind, JobState, ProcessRole
from engine.core.jobs.grouping import FoundJob
from engine.core.procs.process_identity import ref_alive
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
    if job.info is not None and job.info.launcher is not None:
        ref = job.info.launcher
        if ref_alive(ref):
            return ref.pid, True, f"its launcher (pid {ref.pid}) is running"
        return ref.pid, False, f"its launcher (pid {ref.pid}, from run.json) is gone"
    # no run.json to go by: the launcher pid every rank carries in its environment
    pids = sorted(
        {
            pid
            for m in job.members
            if (pid := env_int((procs[m].environ or {}).get(LAUNCHER_PID_ENV)))
        }
    )
    live = [pid for pid in pids if _is_our_launcher(procs, pid, job)]
    if live:
        return live[0], True, f"its launcher (pid {live[0]}) is running"
    for pid, role in job.members.items():
        if role == ProcessRole.LAUNCHER and not procs[pid].zombie:
            return pid, True, f"its launcher (pid {pid}) is running"
    if pids:
        why = job.info_problem or "its run directory was not found"
        return pids[0], False, f"its launcher (pid {pids[0]}) is gone ({why})"
    return None, None, job.info_problem or "its launcher is unknown"


def _is_our_launcher(procs: dict[int, ProcessInfo], pid: int, job: FoundJob) -> bool:
    p = procs.get(pid)
    if p is None or p.zombie:
        return False
    earliest = min(procs[m].create_time for m in job.members)
    return launcher_of(p) == "ddptui" and p.create_time <= earliest + 0.5


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
