"""Which distributed-training processes run on this machine, grouped into jobs and judged
(``ddptui ps``, ``ddptui clean`` and the UI's process screen).

Plain Python (psutil; NVML through ``engine.core.host.gpus``), never torch. One scan is: the /proc
scan (``engine.core.procs.process_scan``), grouping into jobs (``engine.core.jobs.grouping``: ours
by run marker, foreign torchrun / spawn / hand-launched jobs by what they are, never by name),
judging each job's launcher and processes (``engine.core.jobs.judging``: a job is ``orphaned``
when its launcher is gone), and the one GPU join (``engine.core.jobs.gpu_join``). A stalled rank
of one of our runs is the run observer's word: the scanner keeps one observer per run between
scans, so each scan reads only what the run appended since.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from engine.core.common.formatting import format_bytes
from engine.core.common.statuses import JobKind, JobState, ProcessRole, ProcessState, RankStatus
from engine.core.host.gpus import GpuInventory, sample_gpus
from engine.core.jobs.gpu_join import GpuHolding, GpuJoin, GpuUse, join_gpus
from engine.core.jobs.grouping import FoundJob, group_jobs
from engine.core.jobs.judging import job_state, launcher_state, process_state
from engine.core.procs.device_holders import (
    DEFAULT_DEVICE_GLOB,
    DeviceHolder,
    HolderScan,
    scan_device_holders,
)
from engine.core.procs.process_identity import ProcessProbe, ProcessRef, same_start
from engine.core.procs.process_scan import ProcessInfo, env_int, is_python, snapshot_processes
from engine.core.procs.run_proof import RunMarker
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir, RunInfo


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
    run_dir: str | None = None  # ours: the run directory its processes carry, where it holds a run
    marker: RunMarker | None = None  # ours: what every process of it carries (id and directory)

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
    # Which process holds which card (``engine.core.jobs.gpu_join``): the GPU view's rows
    gpu_holdings: tuple[GpuHolding, ...] = ()

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


class ProcessScanner:
    """Scans the machine; keep one between scans (the UI does) so CPU percentages cover the time
    since the previous scan and each run's observer reads only what its run appended since. A
    fresh scanner measures CPU over ``cpu_interval`` seconds."""

    def __init__(self, device_glob: str | None = None) -> None:
        # tests pass a glob of files of their own, held open by real processes
        self.device_glob = device_glob or DEFAULT_DEVICE_GLOB
        self._cpu: dict[tuple[int, float], psutil.Process] = {}
        self._observers: dict[Path, RunObserver] = {}  # one per run seen in the last scan
        self._probe = ProcessProbe()
        self._now = time.time()

    def scan(self, *, gpus: GpuInventory | None = None, cpu_interval: float = 0.0) -> ProcessTable:
        self._now = now = time.time()
        procs = snapshot_processes()
        jobs = group_jobs(procs, os.getpid())
        inventory = sample_gpus() if gpus is None else gpus
        holders = scan_device_holders(self.device_glob)
        join = join_gpus(inventory, holders, {pid: p.zombie for pid, p in procs.items()})
        cpu = self._cpu_percent([procs[pid] for job in jobs for pid in job.members], cpu_interval)
        observers, self._observers = self._observers, {}
        uses = join.uses()
        built = [self._build(job, procs, uses, cpu, observers) for job in jobs]
        built.sort(key=lambda j: (j.kind != JobKind.DDPTUI, min(p.start_time for p in j.processes)))
        notes = [*_visibility_notes(procs), *_gpu_notes(inventory, join, procs)]
        if holders.note():
            notes.append(holders.note())
        return ProcessTable(
            jobs=tuple(built),
            notes=tuple(notes),
            gpu_error=inventory.error,
            scanned_at=now,
            hidden_holders=join.hidden,
            holders=holders,
            gpu_holdings=join.holdings,
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

    def _stalled_ranks(
        self, job: FoundJob, run_dir: RunDir, procs: dict[int, ProcessInfo],
        kept: dict[Path, RunObserver],
    ) -> dict[int, str]:  # fmt: skip
        """Stalled ranks of one of our runs, as its run observer judges them. The observer of the
        previous scan goes on from where it read to; it takes this scan's look at the run
        (run.json as grouping read it, its processes as the scan saw them), not one of its own."""
        observer = kept.get(run_dir.path) or RunObserver(
            run_dir, clock=lambda: self._now, probe=self._probe
        )
        try:
            state = observer.observe(job.info, _scan_looks(job.info, procs))
        except Exception:  # a half-written run directory must not break the table
            return {}
        self._observers[run_dir.path] = observer
        return {r.rank: r.reason for r in state.ranks if r.state == RankStatus.STALLED}

    # -- one job ----------------------------------------------------------------------------
    def _build(
        self,
        job: FoundJob,
        procs: dict[int, ProcessInfo],
        gpu_by_pid: dict[int, tuple[GpuUse, ...]],
        cpu: dict[int, float],
        observers: dict[Path, RunObserver],
    ) -> TrainingJob:
        launcher_pid, launcher_alive, reason = launcher_state(job, procs)
        stalled: dict[int, str] = {}
        if job.kind == JobKind.DDPTUI and job.run_dir is not None and launcher_alive is not False:
            stalled = self._stalled_ranks(job, job.run_dir, procs, observers)
        orphaned = launcher_alive is False
        processes = []
        for pid, role in sorted(job.members.items(), key=lambda kv: procs[kv[0]].create_time):
            p = procs[pid]
            rank = job.ranks.get(pid, env_int((p.environ or {}).get("RANK")))
            state, note = process_state(p, role, rank, orphaned=orphaned, stalled=stalled)
            processes.append(
                _training_process(job, p, role, rank, state, note, self._now, gpu_by_pid, cpu)
            )
        state, reason = job_state(
            [(p.pid, p.state) for p in processes], orphaned=orphaned, stalled=stalled, reason=reason
        )
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
            marker=job.marker,
        )


def _scan_looks(
    info: RunInfo | None, procs: dict[int, ProcessInfo]
) -> dict[ProcessRef, ProcessState]:
    """What the scan saw of each process run.json names: its state, or gone, or its pid reused."""
    if info is None:
        return {}
    looks = {}
    for ref in [*([info.launcher] if info.launcher else []), *info.ranks]:
        p = procs.get(ref.pid)
        if p is None:
            looks[ref] = ProcessState.GONE
        else:
            looks[ref] = (
                p.state if same_start(p.create_time, ref.start_time) else ProcessState.REUSED
            )
    return looks


def _training_process(
    job: FoundJob,
    p: ProcessInfo,
    role: ProcessRole,
    rank: int | None,
    state: JobState,
    note: str,
    now: float,
    gpu_by_pid: dict[int, tuple[GpuUse, ...]],
    cpu: dict[int, float],
) -> TrainingProcess:
    env = p.environ or {}
    rss: int | None = None
    if p.proc is not None and not p.zombie:
        with contextlib.suppress(psutil.Error):
            rss = p.proc.memory_info().rss
    return TrainingProcess(
        pid=p.pid,
        ppid=p.ppid,
        start_time=p.create_time,
        user=p.username,
        role=role,
        rank=rank,
        local_rank=env_int(env.get("LOCAL_RANK")),
        world_size=env_int(env.get("WORLD_SIZE")) or (job.info.world_size if job.info else None),
        state=state,
        age_seconds=max(0.0, now - p.create_time),
        cpu_percent=cpu.get(p.pid),
        rss_bytes=rss,
        gpu=gpu_by_pid.get(p.pid, ()),
        command=p.command,
        own=p.uid == os.getuid(),
        note=note,
    )


def _gpu_notes(inventory: GpuInventory, join: GpuJoin, procs: dict[int, ProcessInfo]) -> list[str]:
    """A note for each GPU that cannot be read and each holder that cannot be seen here."""
    if inventory.error:
        return [f"GPU memory per process is not available: {inventory.error}."]
    notes = []
    listed = {(h.gpu_index, h.pid): h for h in join.holdings if h.listed}
    for gpu in inventory.gpus:
        if not gpu.available:
            notes.append(f"GPU {gpu.index}: not available ({gpu.error}).")
            continue
        for nv in gpu.processes:
            holding = listed[(gpu.index, nv.pid)]
            amount = format_bytes(nv.used_memory_bytes, "an unknown amount")
            mine = procs.get(nv.pid)
            if holding.here and mine is not None and mine.zombie:
                notes.append(
                    f"GPU {gpu.index}: {amount} held by pid {nv.pid}, a zombie ({mine.name}); it "
                    f"is freed when its parent pid {mine.ppid} collects it or exits."
                )
            elif not holding.here:
                where = (
                    "not visible here"
                    if mine is None
                    else "a different process here (another pid namespace)"
                )
                notes.append(
                    f"GPU {gpu.index}: {amount} held by NVML pid {nv.pid}, {where}: GPU memory "
                    "held with no visible process (typical in a container, whose NVML reports "
                    "host pids)."
                )
        if not gpu.processes and (gpu.memory_used_bytes or 0) > 1 << 30:
            notes.append(
                f"GPU {gpu.index}: {format_bytes(gpu.memory_used_bytes, 'an unknown amount')} in "
                "use but NVML lists no process (held from another container or namespace)."
            )
    return notes


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"


def _visibility_notes(procs: dict[int, ProcessInfo]) -> list[str]:
    """What the scan could not see, one sentence each. Only Python interpreters count: a process
    whose environment cannot be read matters only if it could be a training process (a
    container's init, unreadable on every scan, is not one)."""
    notes = []
    unread = [p for p in procs.values() if p.environ is None and p.cmdline and is_python(p)]
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


def scan_processes(*, gpus: GpuInventory | None = None, cpu_interval: float = 0.2) -> ProcessTable:
    """One-shot scan (``ddptui ps``): jobs, processes, states, GPU memory, and what was not seen.
    Each of our runs is found from its processes, wherever its run directory lies."""
    return ProcessScanner().scan(gpus=gpus, cpu_interval=cpu_interval)
