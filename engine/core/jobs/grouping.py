"""Grouping the processes of one /proc scan into training jobs, before any is judged.

Plain Python. In order, each step taking only processes no earlier step placed:

1. ours, by the run marker ``DDPTUI_RUN_ID`` in the environment; run.json's pids and start times
   give them their roles (launcher, rank and its global rank), never membership;
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

from engine.core.common.run_environment import RUN_DIR_ENV, RUN_MARKER_ENV
from engine.core.common.statuses import JobKind, ProcessRole
from engine.core.procs.process_identity import ProcessRef, same_start
from engine.core.procs.process_scan import (
    ProcessInfo,
    distributed_env,
    is_python,
    is_spawn_child,
    launcher_of,
    loads_torch,
)
from engine.core.runs.placement import read_node_records
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


def locate_run(run_id: str, env: dict[str, str], runs_dir: Path | None) -> RunDir | None:
    """The run directory of run ``run_id``: the one its process carries in its environment, else
    the one of that id under ``runs_dir``; None when neither holds a run.json."""
    candidates = []
    if env.get(RUN_DIR_ENV):
        candidates.append(Path(env[RUN_DIR_ENV]))
    if runs_dir is not None:
        candidates.append(Path(runs_dir) / run_id)
    for path in candidates:
        if path.name == run_id and (path / "run.json").exists():
            return RunDir(path)
    return None


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


def group_jobs(procs: dict[int, ProcessInfo], me: int, runs_dir: Path | None) -> list[FoundJob]:
    """Every training job among ``procs`` (``me``, this process, left out)."""
    grouping = _Grouping(procs, me)
    _ours_by_marker(grouping, runs_dir)
    for job in grouping.jobs.values():
        _roles_from_run_json(grouping, job)
    _foreign_by_environment(grouping)
    _spawn_children(grouping)
    _launchers(grouping)
    _descendants(grouping)
    _worker_roles(grouping)
    return list(grouping.jobs.values())


def _ours_by_marker(grouping: _Grouping, runs_dir: Path | None) -> None:
    for p in grouping.unplaced():
        env = p.environ or {}
        run_id = env.get(RUN_MARKER_ENV)
        if not run_id:
            continue
        key, label = f"ddptui:{run_id}", f"ddptui run {run_id}"
        job = grouping.add(key, JobKind.DDPTUI, label, p.pid, ProcessRole.CHILD)
        job.run_id = run_id
        if job.run_dir is None:  # any member that carries the run directory names it
            job.run_dir = locate_run(run_id, env, runs_dir)


def _roles_from_run_json(grouping: _Grouping, job: FoundJob) -> None:
    """The launcher and ranks run.json names, where they carry the marker: run.json can name any
    process, so only the marker proves one ours."""
    if job.run_dir is None:
        return
    try:
        job.info = job.run_dir.read_run_info()
    except RunDirError as err:
        job.info_problem = str(err)
        return
    named: list[tuple[int | None, ProcessRef]] = (
        [(None, job.info.launcher)] if job.info.launcher else []
    )
    named += job.info.ranked()
    if job.info.slurm is not None:  # a run on Slurm: its node launchers' records say who
        for record in read_node_records(job.run_dir.path)[0].values():
            named += [(None, record.launcher)] if record.launcher else []
            named += record.ranked()
    for rank, ref in named:
        p = grouping.procs.get(ref.pid)
        if p is None or not same_start(p.create_time, ref.start_time):
            continue
        if not p.zombie and (p.environ or {}).get(RUN_MARKER_ENV) != job.run_id:
            continue
        grouping.place(job, p.pid, ProcessRole.LAUNCHER if rank is None else ProcessRole.RANK)
        if rank is not None:
            job.ranks[p.pid] = rank


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
