"""Which distributed-training processes run on this machine, grouped into jobs (``ddptui ps``,
``ddptui clean`` and the UI's process screen).

Plain Python (psutil; NVML through ``engine.core.host.gpus``), never torch.

Recognised processes:

- ours: the run marker ``DDPTUI_RUN_ID`` in the environment (the launcher carries it from its
  start); run.json's pids and start times give them their roles, never membership;
- foreign: torchrun / torch.distributed.run / torch.distributed.launch agents and workers, found by
  what they are, never by name: their environment (``TORCHELASTIC_RUN_ID``; ``RANK`` or
  ``LOCAL_RANK`` with ``WORLD_SIZE``; ``MASTER_ADDR`` with ``MASTER_PORT``), or a Python
  interpreter (by ``/proc/PID/exe``) with torch loaded whose command line is a launcher's or a
  ``multiprocessing.spawn`` child's (what ``torch.multiprocessing.spawn`` starts); ``RANK`` alone
  is not enough, and ``exec -a torchrun sleep 600`` is no agent;
- any descendant of one of those (DataLoader workers, helpers).

Jobs: ours by run id; torchelastic workers by ``TORCHELASTIC_RUN_ID`` and master address; other
workers by master address; spawn children by their parent (or process group once it is gone).

A job is ``orphaned`` when its launcher is gone. For our runs that is exact: run.json's launcher is
not alive with its recorded start time. For foreign jobs it is judged from each worker's nearest
ancestor outside the job: a launcher (torchrun & co.) or, for torchelastic and spawn workers, the
Python process that started them. A worker adopted by something else (init, a container's pid 1,
a subreaper) has lost its launcher. The parent pid being 1 is never the test itself: subreapers
adopt orphans too, and a container's real launcher can be pid 1. Workers started some other way
(a shell script setting RANK, srun, mpirun) are only orphaned when no parent is visible at all,
since their launcher can be any program; ``ps`` says so in the job's note.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from engine.core.common.formatting import format_bytes
from engine.core.common.run_environment import LAUNCHER_PID_ENV, RUN_DIR_ENV, RUN_MARKER_ENV
from engine.core.common.statuses import JobKind, JobState, ProcessRole, RankStatus
from engine.core.host.gpus import GpuInventory, sample_gpus
from engine.core.procs.device_holders import (
    DEFAULT_DEVICE_GLOB,
    DeviceHolder,
    HolderScan,
    scan_device_holders,
)
from engine.core.procs.process_identity import ProcessRef, ref_alive, same_start, stopped_by_signal
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo

DIST_ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*[a-z]?$")


# ---- the raw scan ----------------------------------------------------------------------------


@dataclass
class ProcessInfo:
    """One process as the scan saw it. ``environ`` is None when it could not be read."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    username: str
    uid: int | None
    create_time: float
    status: str
    environ: dict[str, str] | None
    environ_error: str = ""
    proc: psutil.Process | None = field(default=None, repr=False)
    exe: str | None = None  # the executable's path; None when it cannot be read

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (SIGSTOP, Ctrl-Z): it runs again on SIGCONT."""
        return stopped_by_signal(self.status)

    @property
    def zombie(self) -> bool:
        return self.status == psutil.STATUS_ZOMBIE

    @property
    def command(self) -> str:
        return " ".join(self.cmdline) if self.cmdline else f"[{self.name}]"

    @property
    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.create_time)


def snapshot_processes() -> dict[int, ProcessInfo]:
    """Every visible process with its environment where readable (one pass over /proc)."""
    found: dict[int, ProcessInfo] = {}
    attrs = ["pid", "ppid", "name", "cmdline", "username", "uids", "create_time", "status", "exe"]
    for proc in psutil.process_iter(attrs):
        info = proc.info
        if info.get("create_time") is None:
            continue
        environ: dict[str, str] | None
        error = ""
        uids = info.get("uids")
        try:
            environ = proc.environ()
        except psutil.AccessDenied:
            environ = None
            if uids is not None and uids.real != os.getuid():
                error = "environment not readable: another user's process"
            else:
                error = "environment not readable: a protected process"
        except psutil.NoSuchProcess:  # gone meanwhile, or a kernel thread (no environment)
            environ = {}
        except (psutil.Error, OSError) as err:
            environ, error = None, f"environment not readable ({type(err).__name__})"
        found[proc.pid] = ProcessInfo(
            pid=proc.pid,
            ppid=info.get("ppid") or 0,
            name=info.get("name") or "",
            cmdline=tuple(info.get("cmdline") or ()),
            username=info.get("username") or (str(uids.real) if uids else "?"),
            uid=uids.real if uids else None,
            create_time=float(info["create_time"]),
            status=info.get("status") or "",
            environ=environ,
            environ_error=error,
            proc=proc,
            exe=info.get("exe") or None,
        )
    return found


# ---- recognising ---------------------------------------------------------------------------


def launcher_kind(cmdline: Iterable[str]) -> str | None:
    """'torchrun', 'torch.distributed.launch' / '.run', or 'ddptui' for a launcher command line."""
    args = list(cmdline)
    for i, arg in enumerate(args[:3]):  # the program, or the script python runs
        if os.path.basename(arg) == "torchrun":
            return "torchrun"
        if arg == "-m" and i + 1 < len(args):
            module = args[i + 1]
            if module in ("torch.distributed.run", "torch.distributed.launch"):
                return module
            if module == "engine.train.launch":
                return "ddptui"
    return None


def is_spawn_child(cmdline: Iterable[str]) -> bool:
    """A ``multiprocessing`` spawn / forkserver child (what torch.multiprocessing.spawn starts)."""
    text = " ".join(cmdline)
    return (
        "multiprocessing.spawn" in text
        or "spawn_main" in text
        or "--multiprocessing-fork" in text
        or "multiprocessing.forkserver" in text
    )


def loads_torch(pid: int) -> bool | None:
    """Whether ``pid`` has PyTorch's native library mapped; None when its maps are not readable."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            return any("libtorch" in line or "torch/_C" in line for line in f)
    except OSError:
        return None


def is_python(p: ProcessInfo) -> bool:
    """A Python interpreter, by what it executes (``/proc/PID/exe``), not by what it calls itself:
    ``exec -a torchrun sleep 600`` names itself torchrun. Only where the executable cannot be read
    (another user's process) does its name stand in."""
    if p.exe is not None:
        return bool(_PYTHON.match(os.path.basename(p.exe)))
    names = [os.path.basename(p.cmdline[0])] if p.cmdline else []
    return any(_PYTHON.match(n) for n in [*names, p.name])


def launcher_of(p: ProcessInfo) -> str | None:
    """The kind of launcher ``p`` is, by evidence: a Python interpreter whose command line is a
    launcher's (``launcher_kind``) and that has not been seen without torch loaded. A program that
    only calls itself torchrun is none."""
    kind = launcher_kind(p.cmdline)
    if kind is None or not is_python(p) or loads_torch(p.pid) is False:
        return None
    return kind


def _distributed_env(env: dict[str, str]) -> bool:
    """Strong evidence only: a lone RANK is common in unrelated programs."""
    if "TORCHELASTIC_RUN_ID" in env:
        return True
    if "WORLD_SIZE" in env and ("RANK" in env or "LOCAL_RANK" in env):
        return True
    return "MASTER_ADDR" in env and "MASTER_PORT" in env


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


# ---- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuUse:
    gpu_index: int
    used_bytes: int | None  # None: NVML did not say
    listed: bool = True  # False: NVML does not list it; it holds the card's device file open


@dataclass(frozen=True)
class TrainingProcess:
    pid: int
    ppid: int
    start_time: float
    user: str
    role: ProcessRole
    rank: int | None
    local_rank: int | None
    world_size: int | None
    state: JobState  # the process's own: running | orphaned | stalled | zombie
    age_seconds: float
    cpu_percent: float | None
    rss_bytes: int | None
    gpu: tuple[GpuUse, ...]
    command: str
    own: bool  # started by the user running this scan
    note: str = ""

    @property
    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.start_time)

    @property
    def gpu_bytes(self) -> int:
        return sum(g.used_bytes or 0 for g in self.gpu)


@dataclass(frozen=True)
class TrainingJob:
    key: str
    kind: JobKind
    label: str  # for people: "ddptui run <id>", "torchrun job 'none' at 127.0.0.1:29500"
    state: JobState
    reason: str  # why that state, one sentence
    users: tuple[str, ...]
    processes: tuple[TrainingProcess, ...]
    launcher_pid: int | None = None
    launcher_alive: bool | None = None  # None: unknown
    run_id: str | None = None
    run_dir: str | None = None

    @property
    def own(self) -> bool:
        return all(p.own for p in self.processes)

    @property
    def live_processes(self) -> tuple[TrainingProcess, ...]:
        return tuple(p for p in self.processes if p.state != JobState.ZOMBIE)


@dataclass(frozen=True)
class ProcessTable:
    jobs: tuple[TrainingJob, ...]
    notes: tuple[str, ...]  # what this scan could not see, one sentence each
    gpu_error: str | None  # NVML not available: why
    scanned_at: float
    # Processes with a GPU device file open that NVML does not list (every one, without NVML)
    hidden_holders: tuple[DeviceHolder, ...] = ()
    holders: HolderScan = field(default_factory=HolderScan)

    def job(self, key: str) -> TrainingJob | None:
        return next((j for j in self.jobs if j.key == key), None)

    def job_of(self, pid: int) -> tuple[TrainingJob, TrainingProcess] | None:
        """The job ``pid`` belongs to, with its process, or None."""
        for job in self.jobs:
            for p in job.processes:
                if p.pid == pid:
                    return job, p
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "scanned_at": self.scanned_at,
            "gpu_error": self.gpu_error,
            "notes": list(self.notes),
            "hidden_gpu_holders": [
                {**asdict(h), "job": (found[0].key if (found := self.job_of(h.pid)) else None)}
                for h in self.hidden_holders
            ],
            "jobs": [
                {
                    **{k: v for k, v in asdict(j).items() if k != "processes"},
                    "processes": [asdict(p) for p in j.processes],
                }
                for j in self.jobs
            ],
        }


@dataclass
class _Job:
    key: str
    kind: JobKind
    label: str
    members: dict[int, ProcessRole] = field(default_factory=dict)
    ranks: dict[int, int] = field(default_factory=dict)  # pid -> rank (ours: from run.json)
    run_id: str | None = None
    run_dir: RunDir | None = None
    info: RunInfo | None = None
    info_problem: str = ""


def _locate_run(run_id: str, env: dict[str, str], runs_dir: Path | None) -> RunDir | None:
    candidates = []
    if env.get(RUN_DIR_ENV):
        candidates.append(Path(env[RUN_DIR_ENV]))
    if runs_dir is not None:
        candidates.append(Path(runs_dir) / run_id)
    for path in candidates:
        if path.name == run_id and (path / "run.json").exists():
            return RunDir(path)
    return None


class ProcessScanner:
    """Scans the machine; keep one between scans (the UI does) so CPU percentages cover the time
    since the previous scan. A fresh scanner measures CPU over ``cpu_interval`` seconds."""

    def __init__(self, runs_dir: Path | None = None, device_glob: str | None = None) -> None:
        self.runs_dir = runs_dir
        # tests pass a glob of files of their own, held open by real processes
        self.device_glob = device_glob or DEFAULT_DEVICE_GLOB
        self._cpu: dict[tuple[int, float], psutil.Process] = {}

    def scan(self, *, gpus: GpuInventory | None = None, cpu_interval: float = 0.0) -> ProcessTable:
        now = time.time()
        procs = snapshot_processes()
        me = os.getpid()
        jobs = self._group(procs, me)
        inventory = sample_gpus() if gpus is None else gpus
        holders = scan_device_holders(self.device_glob)
        gpu_by_pid, gpu_notes = _gpu_usage(inventory, procs, holders)
        hidden = hidden_holders(inventory, holders)
        for h in hidden:
            hidden_uses = [GpuUse(card_index(inventory, m), None, listed=False) for m in h.minors]
            gpu_by_pid[h.pid] = (*gpu_by_pid.get(h.pid, ()), *hidden_uses)
        cpu = self._cpu_percent([procs[pid] for job in jobs for pid in job.members], cpu_interval)
        built = [self._build(job, procs, gpu_by_pid, cpu, now) for job in jobs]
        built.sort(key=lambda j: (j.kind != JobKind.DDPTUI, min(p.start_time for p in j.processes)))
        notes = [*_visibility_notes(procs), *gpu_notes]
        if holders.note():
            notes.append(holders.note())
        return ProcessTable(
            jobs=tuple(built),
            notes=tuple(notes),
            gpu_error=inventory.error,
            scanned_at=now,
            hidden_holders=hidden,
            holders=holders,
        )

    # -- grouping ---------------------------------------------------------------------------
    def _group(self, procs: dict[int, ProcessInfo], me: int) -> list[_Job]:
        jobs: dict[str, _Job] = {}
        job_of: dict[int, str] = {}

        def add(key: str, kind: JobKind, label: str, pid: int, role: ProcessRole) -> _Job:
            job = jobs.setdefault(key, _Job(key=key, kind=kind, label=label))
            job.members[pid] = role
            job_of[pid] = key
            return job

        # 1. ours, by marker
        for p in procs.values():
            env = p.environ or {}
            run_id = env.get(RUN_MARKER_ENV)
            if not run_id or p.pid == me:
                continue
            job = add(
                f"ddptui:{run_id}", JobKind.DDPTUI, f"ddptui run {run_id}", p.pid, ProcessRole.CHILD
            )
            if job.run_id is None:
                job.run_id = run_id
                job.run_dir = _locate_run(run_id, env, self.runs_dir)
        # ... and what run.json says about them (launcher and ranks, by pid and start time)
        for job in list(jobs.values()):
            if job.run_dir is None:
                continue
            try:
                job.info = job.run_dir.read_run_info()
            except RunDirError as err:
                job.info_problem = str(err)
                continue
            refs: list[tuple[ProcessRef, ProcessRole, int | None]] = []
            if job.info.launcher:
                refs.append((job.info.launcher, ProcessRole.LAUNCHER, None))
            first = job.info.node_rank * len(job.info.ranks)
            refs += [(r, ProcessRole.RANK, first + i) for i, r in enumerate(job.info.ranks)]
            for ref, role, rank in refs:
                named = procs.get(ref.pid)
                if named is None or not same_start(named.create_time, ref.start_time):
                    continue
                if not named.zombie and (named.environ or {}).get(RUN_MARKER_ENV) != job.run_id:
                    continue  # run.json can name any process; only the marker proves it ours
                job.members[named.pid] = role
                job_of[named.pid] = job.key
                if rank is not None:
                    job.ranks[named.pid] = rank
        # 2. foreign, by environment
        for p in procs.values():
            if p.pid in job_of or p.pid == me or not p.environ:
                continue
            env = p.environ
            if not _distributed_env(env):
                continue
            master = f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
            if "TORCHELASTIC_RUN_ID" in env:
                rid = env["TORCHELASTIC_RUN_ID"]
                add(
                    f"elastic:{rid}@{master}",
                    JobKind.ELASTIC,
                    f"torchrun job {rid!r} at {master}",
                    p.pid,
                    ProcessRole.RANK,
                )
            elif "MASTER_ADDR" in env and "MASTER_PORT" in env:
                add(f"env:{master}", JobKind.ENV, f"job at {master}", p.pid, ProcessRole.RANK)
            else:
                add(
                    f"env:pgid:{_pgid(p.pid)}",
                    JobKind.ENV,
                    "job by environment",
                    p.pid,
                    ProcessRole.RANK,
                )

        # 3. foreign, by command line: spawn children that loaded torch (other programs use
        # multiprocessing too), grouped under the process that started them
        for p in procs.values():
            if p.pid in job_of or p.pid == me or not is_spawn_child(p.cmdline):
                continue
            if not is_python(p) or loads_torch(p.pid) is False:
                continue
            parent = procs.get(p.ppid)
            top = p
            while parent is not None and is_spawn_child(parent.cmdline):
                top, parent = parent, procs.get(parent.ppid)
            if parent is not None and parent.pid in job_of:
                continue  # a descendant of a known job: step 5 adds it
            if parent is not None and is_python(parent):
                key = f"spawn:{parent.pid}:{parent.create_time:.2f}"
                label = f"multiprocessing children of pid {parent.pid}"
            else:
                key = f"spawn:pgid:{_pgid(top.pid)}"
                label = f"multiprocessing children (process group {_pgid(top.pid)})"
            add(key, JobKind.SPAWN, label, p.pid, ProcessRole.RANK)

        # 4. launchers (torchrun agents): join the job of their children, else stand alone
        for p in procs.values():
            if p.pid in job_of or p.pid == me:
                continue
            kind = launcher_of(p)
            if kind is None:
                continue
            child_jobs = {
                job_of[c.pid] for c in procs.values() if c.ppid == p.pid and c.pid in job_of
            }
            if len(child_jobs) == 1:
                job = jobs[child_jobs.pop()]
                job.members[p.pid] = ProcessRole.AGENT if kind != "ddptui" else ProcessRole.LAUNCHER
                job_of[p.pid] = job.key
            else:
                add(
                    f"agent:{p.pid}",
                    JobKind.AGENT,
                    f"{kind} (no workers yet)",
                    p.pid,
                    ProcessRole.AGENT,
                )

        # 5. descendants of any job process join that job
        for p in procs.values():
            if p.pid in job_of or p.pid == me:
                continue
            chain: list[ProcessInfo] = []
            cur: ProcessInfo | None = p
            while cur is not None and cur.pid not in job_of and cur.ppid and len(chain) < 64:
                chain.append(cur)
                cur = procs.get(cur.ppid)
            if cur is not None and cur.pid in job_of:
                key = job_of[cur.pid]
                for c in chain:
                    jobs[key].members[c.pid] = ProcessRole.CHILD
                    job_of[c.pid] = key

        # roles: a child whose parent is a rank of the same job is that rank's worker
        for job in jobs.values():
            for pid, role in list(job.members.items()):
                ppid = procs[pid].ppid
                if (
                    role in (ProcessRole.CHILD, ProcessRole.RANK)
                    and job.members.get(ppid) == ProcessRole.RANK
                ):
                    job.members[pid] = ProcessRole.WORKER
                    if ppid in job.ranks:
                        job.ranks[pid] = job.ranks[ppid]
                if job.kind == JobKind.DDPTUI and role == ProcessRole.CHILD and pid in job.ranks:
                    job.members[pid] = ProcessRole.RANK
        return list(jobs.values())

    # -- judging ----------------------------------------------------------------------------
    def _launcher_state(
        self, job: _Job, procs: dict[int, ProcessInfo]
    ) -> tuple[int | None, bool | None, str]:
        """(launcher pid, alive?, reason) for one job."""
        if job.kind == JobKind.DDPTUI:
            if job.info is not None and job.info.launcher is not None:
                ref = job.info.launcher
                alive = ref_alive(ref)
                return (
                    ref.pid,
                    alive,
                    (
                        f"its launcher (pid {ref.pid}) is running"
                        if alive
                        else f"its launcher (pid {ref.pid}, from run.json) is gone"
                    ),
                )
            # no run.json to go by: the launcher pid every rank carries in its environment
            pids = {
                _int((procs[pid].environ or {}).get(LAUNCHER_PID_ENV)) for pid in job.members
            } - {None}
            live = [
                pid for pid in pids if pid is not None and self._is_our_launcher(procs, pid, job)
            ]
            if live:
                return live[0], True, f"its launcher (pid {live[0]}) is running"
            for pid, role in job.members.items():
                if role == ProcessRole.LAUNCHER and not procs[pid].zombie:
                    return pid, True, f"its launcher (pid {pid}) is running"
            if pids:
                gone = sorted(p for p in pids if p is not None)[0]
                why = job.info_problem or "its run directory was not found"
                return gone, False, f"its launcher (pid {gone}) is gone ({why})"
            return None, None, job.info_problem or "its launcher is unknown"
        if job.kind == JobKind.AGENT:
            pid = next(iter(job.members))
            return pid, True, "a launcher with no workers yet"
        agents = [
            pid
            for pid, role in job.members.items()
            if role in (ProcessRole.AGENT, ProcessRole.LAUNCHER)
        ]
        live_agents = [pid for pid in agents if not procs[pid].zombie]
        if live_agents:
            return live_agents[0], True, f"its launcher (pid {live_agents[0]}) is running"
        tops = [
            procs[pid]
            for pid in job.members
            if procs[pid].ppid not in job.members and not procs[pid].zombie
        ]
        verdicts = [self._parent_verdict(job, p, procs) for p in tops]
        running = [v for v in verdicts if v[1]]
        if running:
            return running[0][0], True, running[0][2]
        if not verdicts:
            return None, None, "only zombies are left"
        if all(v[1] is False for v in verdicts):
            return None, False, verdicts[0][2]
        unsure = next(v for v in verdicts if v[1] is None)
        return unsure[0], None, unsure[2]

    def _is_our_launcher(self, procs: dict[int, ProcessInfo], pid: int, job: _Job) -> bool:
        p = procs.get(pid)
        if p is None or p.zombie:
            return False
        earliest = min(procs[m].create_time for m in job.members)
        return launcher_of(p) == "ddptui" and p.create_time <= earliest + 0.5

    def _parent_verdict(
        self, job: _Job, p: ProcessInfo, procs: dict[int, ProcessInfo]
    ) -> tuple[int | None, bool | None, str]:
        parent = procs.get(p.ppid)
        if parent is None:
            return None, False, f"pid {p.pid} has no visible parent: its launcher is gone"
        kind = launcher_of(parent)
        if kind is not None:
            return parent.pid, True, f"its launcher ({kind}, pid {parent.pid}) is running"
        desc = f"{parent.name or '?'} (pid {parent.pid})"
        if job.kind in (JobKind.ELASTIC, JobKind.SPAWN):
            if is_python(parent):
                return (
                    parent.pid,
                    True,
                    f"started by the Python process {parent.pid}, still running",
                )
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

    # -- figures ----------------------------------------------------------------------------
    def _cpu_percent(self, infos: list[ProcessInfo], interval: float) -> dict[int, float]:
        keyed = {}
        fresh = []
        for p in infos:
            key = (p.pid, round(p.create_time, 2))
            cached = self._cpu.get(key)
            if cached is None and p.proc is not None:
                cached = p.proc
                fresh.append(cached)
                with contextlib.suppress(psutil.Error):
                    cached.cpu_percent(None)  # primes the counter
            if cached is not None:
                keyed[key] = cached
        if fresh and interval > 0:
            time.sleep(interval)
        self._cpu = keyed
        result = {}
        for (pid, _), proc in keyed.items():
            with contextlib.suppress(psutil.Error):
                result[pid] = proc.cpu_percent(None)
        return result

    def _build(
        self,
        job: _Job,
        procs: dict[int, ProcessInfo],
        gpu_by_pid: dict[int, tuple[GpuUse, ...]],
        cpu: dict[int, float],
        now: float,
    ) -> TrainingJob:
        launcher_pid, launcher_alive, reason = self._launcher_state(job, procs)
        stalled: dict[int, str] = {}
        if job.kind == JobKind.DDPTUI and job.run_dir is not None and launcher_alive is not False:
            stalled = _stalled_ranks(job.run_dir, now)
        orphaned = launcher_alive is False
        me_uid = os.getuid()
        processes = []
        for pid, role in sorted(job.members.items(), key=lambda kv: procs[kv[0]].create_time):
            p = procs[pid]
            env = p.environ or {}
            rank = job.ranks.get(pid, _int(env.get("RANK")))
            note = p.environ_error
            if p.zombie:
                state = JobState.ZOMBIE
                note = note or f"ended; its parent pid {p.ppid} has not collected it"
            elif orphaned and role not in (ProcessRole.LAUNCHER, ProcessRole.AGENT):
                state = JobState.ORPHANED
            elif p.stopped:
                state = JobState.STOPPED
                note = (
                    note
                    or f"stopped by a signal (SIGSTOP or Ctrl-Z): `kill -CONT {pid}` resumes it"
                )
            elif rank is not None and rank in stalled and role == ProcessRole.RANK:
                state = JobState.STALLED
                note = note or stalled[rank]
            else:
                state = JobState.RUNNING
            rss: int | None = None
            if p.proc is not None and not p.zombie:
                try:
                    rss = p.proc.memory_info().rss
                except psutil.Error:
                    rss = None
            processes.append(
                TrainingProcess(
                    pid=pid,
                    ppid=p.ppid,
                    start_time=p.create_time,
                    user=p.username,
                    role=role,
                    rank=rank,
                    local_rank=_int(env.get("LOCAL_RANK")),
                    world_size=_int(env.get("WORLD_SIZE"))
                    or (job.info.world_size if job.info else None),
                    state=state,
                    age_seconds=max(0.0, now - p.create_time),
                    cpu_percent=cpu.get(pid),
                    rss_bytes=rss,
                    gpu=gpu_by_pid.get(pid, ()),
                    command=p.command,
                    own=p.uid == me_uid,
                    note=note,
                )
            )
        live = [p for p in processes if p.state != JobState.ZOMBIE]
        if not live:
            state = JobState.ZOMBIE
            reason = "every process has ended; only zombie entries are left"
        elif orphaned:
            state = JobState.ORPHANED
        elif stopped := [p.pid for p in live if p.state == JobState.STOPPED]:
            state = JobState.STOPPED
            pids = " ".join(map(str, stopped))
            reason = (
                f"pid {pids} {'is' if len(stopped) == 1 else 'are'} stopped (SIGSTOP or Ctrl-Z), "
                f"so the job waits; `kill -CONT {pids}` resumes it"
            )
        elif any(p.state == JobState.STALLED for p in live):
            state = JobState.STALLED
            reason = "; ".join(f"rank {r}: {why}" for r, why in sorted(stalled.items()))
        else:
            state = JobState.RUNNING
        return TrainingJob(
            key=job.key,
            kind=job.kind,
            label=job.label,
            state=state,
            reason=reason,
            users=tuple(sorted({p.user for p in processes})),
            processes=tuple(processes),
            launcher_pid=launcher_pid,
            launcher_alive=launcher_alive,
            run_id=job.run_id,
            run_dir=str(job.run_dir.path) if job.run_dir else None,
        )


def _pgid(pid: int) -> int | str:
    try:
        return os.getpgid(pid)
    except OSError:
        return "?"


def _stalled_ranks(run_dir: RunDir, now: float) -> dict[int, str]:
    """Stalled ranks of one of our runs, as the run observer judges them (a listing settles
    nothing)."""
    try:
        state = RunObserver(run_dir, clock=lambda: now, settle=False).observe()
    except Exception:  # a half-written run directory must not break the table
        return {}
    return {r.rank: r.reason for r in state.ranks if r.state == RankStatus.STALLED}


def hidden_holders(inventory: GpuInventory, holders: HolderScan) -> tuple[DeviceHolder, ...]:
    """Processes with a card's device file open that NVML does not list (another PID namespace,
    the workers of a dead job pinning memory); without NVML, every process with a card open."""
    listed = inventory.listed_pids() if inventory.error is None else set()
    return tuple(h for h in holders.holders if h.any_card and h.pid not in listed)


def card_index(inventory: GpuInventory, minor: int) -> int:
    """The NVML index of /dev/nvidia<minor> (the minor itself when NVML cannot say)."""
    index = inventory.index_of_minor(minor) if inventory.error is None else None
    return index if index is not None else minor


def _gpu_usage(
    inventory: GpuInventory, procs: dict[int, ProcessInfo], holders: HolderScan
) -> tuple[dict[int, tuple[GpuUse, ...]], list[str]]:
    """GPU memory by local pid, and a note for each holder that cannot be seen here."""
    if inventory.error:
        return {}, [f"GPU memory per process is not available: {inventory.error}."]
    usage: dict[int, list[GpuUse]] = {}
    notes = []
    for gpu in inventory.gpus:
        if not gpu.available:
            notes.append(f"GPU {gpu.index}: not available ({gpu.error}).")
            continue
        for holder in gpu.processes:
            mine = procs.get(holder.pid)
            # NVML pids are host pids in a container: a local process with that pid that has no
            # GPU device open is someone else. (A zombie has no open files left to show.)
            if mine is not None and (mine.zombie or holders.holds(holder.pid) is not False):
                usage.setdefault(holder.pid, []).append(GpuUse(gpu.index, holder.used_memory_bytes))
                if mine.zombie:
                    notes.append(
                        f"GPU {gpu.index}: {format_bytes(holder.used_memory_bytes, 'an unknown amount')} held by pid "
                        f"{holder.pid}, a zombie ({mine.name}); it is freed when its parent "
                        f"pid {mine.ppid} collects it or exits."
                    )
                continue
            where = (
                "not visible here"
                if mine is None
                else "a different process here (another pid namespace)"
            )
            notes.append(
                f"GPU {gpu.index}: {format_bytes(holder.used_memory_bytes, 'an unknown amount')} held by NVML pid "
                f"{holder.pid}, {where}: GPU memory held with no visible process (typical in a "
                "container, whose NVML reports host pids)."
            )
        if not gpu.processes and (gpu.memory_used_bytes or 0) > 1 << 30:
            notes.append(
                f"GPU {gpu.index}: {format_bytes(gpu.memory_used_bytes, 'an unknown amount')} in use but NVML lists no "
                "process (held from another container or namespace)."
            )
    return {pid: tuple(u) for pid, u in usage.items()}, notes


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"


def _visibility_notes(procs: dict[int, ProcessInfo]) -> list[str]:
    notes = []
    unread = [p for p in procs.values() if p.environ is None and p.cmdline]
    others = [p for p in unread if p.uid != os.getuid()]
    protected = [p for p in unread if p.uid == os.getuid()]
    if others:
        users = sorted({p.username for p in others})
        shown = ", ".join(users[:5]) + (", ..." if len(users) > 5 else "")
        notes.append(
            f"{_count(len(others), 'process')} of other users ({shown}): environment not "
            "readable (another user's process), so they were recognised by command line only; "
            "run as root to see them all."
        )
    if protected:
        pids = ", ".join(str(p.pid) for p in protected[:5])
        notes.append(
            f"{_count(len(protected), 'process')} (pid {pids}) whose environment cannot be read "
            "(a protected process, or one in another user namespace): recognised by command line "
            "only."
        )
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            proc_mount = next((line for line in f if line.split()[1:2] == ["/proc"]), "")
        if "hidepid=" in proc_mount and "hidepid=0" not in proc_mount:
            notes.append("/proc is mounted with hidepid: other users' processes are invisible.")
    except OSError:
        pass
    return notes


def scan_processes(
    runs_dir: Path | None = None, *, gpus: GpuInventory | None = None, cpu_interval: float = 0.2
) -> ProcessTable:
    """One-shot scan (``ddptui ps``): jobs, processes, states, GPU memory, and what was not seen."""
    return ProcessScanner(runs_dir).scan(gpus=gpus, cpu_interval=cpu_interval)
