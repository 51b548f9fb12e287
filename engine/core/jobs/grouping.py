"""Grouping the processes of one /proc scan into training jobs, before any is judged.

Plain Python. In order, each step taking only processes no earlier step placed:

1. ours, by the run marker in their own environment: the run id ``DDPTUI_RUN_ID`` and the run
   directory ``DDPTUI_RUN_DIR`` (two runs of one id in two directories are two jobs). The run
   directory is the one the processes carry, wherever it lies, never one looked up by id under
   the runs directory being looked at; run.json's pids and start times give them their roles
   (launcher, rank and its global rank), never membership;
2. foreign workers by a distributed-training environment: torchelastic ones by
   ``TORCHELASTIC_RUN_ID`` and master address, others by master address (or process group);
3. ``multiprocessing`` spawn children with torch loaded, under the Python process that started
   them (or their process group once it is gone);
4. launchers (torchrun agents, ddptui's): the job of their children, else a job of their own;
5. descendants of any job's process (DataLoader workers, helpers): that job;

and last, a child of a rank is that rank's worker.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engine.core.backends.registry import backend_for
from engine.core.common.run_environment import LAUNCHER_PID_ENV, RUN_DIR_ENV
from engine.core.common.run_layout import is_run_dir
from engine.core.common.statuses import JobKind, ProcessRole
from engine.core.procs.process_identity import same_start
from engine.core.procs.process_scan import (
    ProcessInfo,
    distributed_env,
    env_int,
    is_python,
    is_spawn_child,
    launcher_of,
    loads_torch,
)
from engine.core.procs.run_proof import RunMarker
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo

DESCENT_LIMIT = 64  # parents followed up from one process: /proc can show a cycle mid-scan


@dataclass
class FoundJob:
    """A job as grouping found it: its processes and their roles, not yet judged."""

    key: str
    kind: JobKind
    label: str
    members: dict[int, ProcessRole] = field(default_factory=dict)
    ranks: dict[int, int] = field(default_factory=dict)  # pid -> global rank (ours: run.json)
    run_id: str | None = None
    run_dir: RunDir | None = None
    info: RunInfo | None = None
    info_problem: str = ""
    marker: RunMarker | None = None  # ours: what every member carries (id and run directory)


def locate_run(marker: RunMarker) -> tuple[RunDir | None, str]:
    """The run directory a run's processes carry in their environment, or None and why not: it
    must be an absolute path named after the run id, and a run directory (``is_run_dir``: the one
    rule)."""
    if not marker.run_dir:
        return None, f"its processes carry no run directory ({RUN_DIR_ENV})"
    path = Path(marker.run_dir)
    if not path.is_absolute() or path.name != marker.run_id:
        return None, f"its processes carry {marker.run_dir}, which is not run {marker.run_id}'s"
    if path.is_symlink():
        return None, f"its run directory {path} is a symbolic link: not followed"
    if not is_run_dir(path):
        return None, f"its run directory {path} (from its processes' environment) holds no run"
    return RunDir(path), ""


def process_group(pid: int) -> int | str:
    try:
        return os.getpgid(pid)
    except OSError:
        return "?"


class _Grouping:
    """The jobs found so far and which job each placed process is in."""

    def __init__(self, procs: dict[int, ProcessInfo], me: int) -> None:
        self.procs = procs
        self.me = me
        self.jobs: dict[str, FoundJob] = {}
        self.job_of: dict[int, str] = {}

    def add(self, key: str, kind: JobKind, label: str, pid: int, role: ProcessRole) -> FoundJob:
        job = self.jobs.setdefault(key, FoundJob(key=key, kind=kind, label=label))
        self.place(job, pid, role)
        return job

    def place(self, job: FoundJob, pid: int, role: ProcessRole) -> None:
        job.members[pid] = role
        self.job_of[pid] = job.key

    def unplaced(self) -> Iterator[ProcessInfo]:
        """Processes no job holds yet (this process never), as of each step of the iteration."""
        for p in self.procs.values():
            if p.pid not in self.job_of and p.pid != self.me:
                yield p


def group_jobs(procs: dict[int, ProcessInfo], me: int) -> list[FoundJob]:
    """Every training job among ``procs`` (``me``, this process, left out)."""
    grouping = _Grouping(procs, me)
    _ours_by_marker(grouping)
    for job in grouping.jobs.values():
        _roles_from_run_json(grouping, job)
    _foreign_by_environment(grouping)
    _spawn_children(grouping)
    _launchers(grouping)
    _descendants(grouping)
    _worker_roles(grouping)
    return list(grouping.jobs.values())


def _ours_by_marker(grouping: _Grouping) -> None:
    """Processes carrying a run marker, one job per run id and run directory. A marked process
    that carries no run directory (a launcher of an older ddptui) joins the one job of its id
    when there is one, else stands as a job whose directory is unknown."""
    by_id: dict[str, list[tuple[ProcessInfo, RunMarker]]] = {}
    for p in grouping.unplaced():
        marker = RunMarker.of_environ(p.environ or {})
        if marker is not None:
            by_id.setdefault(marker.run_id, []).append((p, marker))
    for run_id, members in by_id.items():
        dirs = sorted({m.run_dir for _, m in members if m.run_dir})
        for p, marker in members:
            run_dir = marker.run_dir or (dirs[0] if len(dirs) == 1 else "")
            key = f"ddptui:{run_id}" if len(dirs) <= 1 else f"ddptui:{run_id}@{run_dir}"
            job = grouping.add(
                key, JobKind.DDPTUI, f"ddptui run {run_id}", p.pid, ProcessRole.CHILD
            )
            if job.marker is None:
                job.run_id, job.marker = run_id, RunMarker(run_id, run_dir)
                job.run_dir, job.info_problem = locate_run(job.marker)


def _roles_from_run_json(grouping: _Grouping, job: FoundJob) -> None:
    """The launcher and ranks run.json names, where they carry the marker: run.json can name any
    process, so only the marker proves one ours. Without a run.json, the launcher is the member
    whose pid the others carry as their launcher's."""
    if job.marker is not None:
        _launcher_by_environment(grouping, job)
    if job.run_dir is None:
        return
    try:
        info = job.run_dir.read_run_info()
    except RunDirError as err:
        job.info_problem = str(err)
        return
    if info.run_id != job.run_id:
        job.info_problem = f"{job.run_dir.run_json_path} names run {info.run_id}, not {job.run_id}"
        return
    job.info = info
    # as the run's backend records them (run.json; each node launcher's record across nodes)
    for rank, ref in backend_for(info).locate(job.run_dir, info):
        p = grouping.procs.get(ref.pid)
        if p is None or not same_start(p.create_time, ref.start_time):
            continue
        if not p.zombie and grouping.job_of.get(p.pid) != job.key:  # not carrying its marker
            continue
        grouping.place(job, p.pid, ProcessRole.LAUNCHER if rank is None else ProcessRole.RANK)
        if rank is not None:
            job.ranks[p.pid] = rank


def _launcher_by_environment(grouping: _Grouping, job: FoundJob) -> None:
    named = {
        pid
        for m in job.members
        if (pid := env_int((grouping.procs[m].environ or {}).get(LAUNCHER_PID_ENV)))
    }
    for pid in named & set(job.members):
        grouping.place(job, pid, ProcessRole.LAUNCHER)


def _foreign_by_environment(grouping: _Grouping) -> None:
    for p in grouping.unplaced():
        env = p.environ
        if not env or not distributed_env(env):
            continue
        master = f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
        if "TORCHELASTIC_RUN_ID" in env:
            rid = env["TORCHELASTIC_RUN_ID"]
            # torchrun's run id is "none" unless --rdzv-id (or --standalone) gave one: no name
            named = f" {rid!r}" if rid and rid != "none" else ""
            key, kind, label = (
                f"elastic:{rid}@{master}",
                JobKind.ELASTIC,
                f"torchrun job{named} at {master}",
            )
        elif "MASTER_ADDR" in env and "MASTER_PORT" in env:
            key, kind, label = f"env:{master}", JobKind.ENV, f"job at {master}"
        else:
            key, kind, label = f"env:pgid:{process_group(p.pid)}", JobKind.ENV, "job by environment"
        grouping.add(key, kind, label, p.pid, ProcessRole.RANK)


def _spawn_children(grouping: _Grouping) -> None:
    """Spawn children that loaded torch (other programs use multiprocessing too), grouped under
    the process that started them."""
    procs = grouping.procs
    for p in grouping.unplaced():
        if not is_spawn_child(p.cmdline) or not is_python(p) or loads_torch(p.pid) is False:
            continue
        parent = procs.get(p.ppid)
        top = p
        while parent is not None and is_spawn_child(parent.cmdline):
            top, parent = parent, procs.get(parent.ppid)
        if parent is not None and parent.pid in grouping.job_of:
            continue  # a descendant of a known job: ``_descendants`` places it
        if parent is not None and is_python(parent):
            key = f"spawn:{parent.pid}:{parent.create_time:.2f}"
            label = f"multiprocessing children of pid {parent.pid}"
        else:
            key = f"spawn:pgid:{process_group(top.pid)}"
            label = f"multiprocessing children (process group {process_group(top.pid)})"
        grouping.add(key, JobKind.SPAWN, label, p.pid, ProcessRole.RANK)


def _launchers(grouping: _Grouping) -> None:
    """Launchers (torchrun agents) join the job of their children, else stand alone."""
    procs = grouping.procs
    for p in grouping.unplaced():
        kind = launcher_of(p)
        if kind is None:
            continue
        child_jobs = {
            grouping.job_of[c.pid]
            for c in procs.values()
            if c.ppid == p.pid and c.pid in grouping.job_of
        }
        if len(child_jobs) == 1:
            role = ProcessRole.AGENT if kind != "ddptui" else ProcessRole.LAUNCHER
            grouping.place(grouping.jobs[child_jobs.pop()], p.pid, role)
        else:
            label = f"{kind} (no workers yet)"
            grouping.add(f"agent:{p.pid}", JobKind.AGENT, label, p.pid, ProcessRole.AGENT)


def _descendants(grouping: _Grouping) -> None:
    """A process below any job's process joins that job, with every process between them."""
    for p in grouping.unplaced():
        chain: list[ProcessInfo] = []
        cur: ProcessInfo | None = p
        while (
            cur is not None
            and cur.pid not in grouping.job_of
            and cur.ppid
            and len(chain) < DESCENT_LIMIT
        ):
            chain.append(cur)
            cur = grouping.procs.get(cur.ppid)
        if cur is not None and cur.pid in grouping.job_of:
            job = grouping.jobs[grouping.job_of[cur.pid]]
            for c in chain:
                grouping.place(job, c.pid, ProcessRole.CHILD)


def _worker_roles(grouping: _Grouping) -> None:
    """A child whose parent is a rank of the same job is that rank's worker (and has its rank);
    a child of ours that run.json names a rank is one."""
    for job in grouping.jobs.values():
        for pid, role in list(job.members.items()):
            ppid = grouping.procs[pid].ppid
            if (
                role in (ProcessRole.CHILD, ProcessRole.RANK)
                and job.members.get(ppid) == ProcessRole.RANK
            ):
                job.members[pid] = ProcessRole.WORKER
                if ppid in job.ranks:
                    job.ranks[pid] = job.ranks[ppid]
            if job.kind == JobKind.DDPTUI and role == ProcessRole.CHILD and pid in job.ranks:
                job.members[pid] = ProcessRole.RANK
