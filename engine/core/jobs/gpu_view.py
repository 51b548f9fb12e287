"""The machine's GPUs and every process on them, each named for what it is: a rank of a ddptui run,
a foreign torchrun job's rank, an orphaned job's process, a DataLoader worker, or unknown
(``ddptui gpus`` and the GPUs screen).

Plain Python. It names the holdings of the one GPU join (``engine.core.jobs.gpu_join``, made with
the process scan and carried by its table): NVML's processes card by card, then the processes NVML
does not list but that hold ``/dev/nvidia<N>`` open, shown on card N too and marked as found that
way; the scan's jobs (``engine.core.jobs.process_table``) say what each process is.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from engine.core.common.formatting import short_bytes
from engine.core.common.statuses import HolderKind, JobKind, JobState, ProcessRole
from engine.core.host.gpus import GpuInventory, GpuSample, sample_gpus
from engine.core.host.host_usage import HostSampler, HostUsage
from engine.core.jobs.process_table import (
    ProcessScanner,
    ProcessTable,
    TrainingJob,
    TrainingProcess,
)
from engine.core.procs.device_holders import DEFAULT_DEVICE_GLOB, DeviceHolder
from engine.core.procs.process_identity import ProcessProbe, ProcessRef


@dataclass(frozen=True)
class GpuProcessRow:
    """One process on one GPU (or, without NVML, one CPU rank: ``gpu_index`` None)."""

    gpu_index: int | None
    pid: int
    kind: HolderKind
    what: str  # "ddptui run <id> rank 2", "torchrun job 'x' at host:port rank 1", ...
    user: str = "?"
    own: bool = False  # started by the user looking
    start_time: float | None = None  # None: no process with this pid is visible here
    gpu_memory_bytes: int | None = None  # None: NVML did not say (or does not list it)
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    age_seconds: float | None = None
    command: str = ""
    listed: bool = True  # NVML lists it; False: found by its open device file only
    job_key: str | None = None  # its training job (for stopping the whole job)
    job_label: str = ""
    note: str = ""

    @property
    def visible(self) -> bool:
        return self.start_time is not None

    @property
    def ref(self) -> ProcessRef | None:
        return ProcessRef(self.pid, self.start_time) if self.start_time is not None else None

    @property
    def memory_text(self) -> str:
        """Its GPU memory as the GPUs screen and ``ddptui gpus`` show it: "-" for a rank on the
        CPU (no GPU memory to list; "unlisted" is for holders NVML does not list)."""
        if self.gpu_index is None:
            return "-"
        if not self.listed:
            return "unlisted"
        return short_bytes(self.gpu_memory_bytes)


@dataclass(frozen=True)
class GpuView:
    """Every GPU and its processes at one moment; ``error``: NVML is not available, and why."""

    gpus: tuple[GpuSample, ...]
    rows: tuple[GpuProcessRow, ...]
    error: str | None = None
    driver_version: str = ""
    notes: tuple[str, ...] = ()
    scanned_at: float = 0.0
    table: ProcessTable | None = field(default=None, repr=False, compare=False)
    host: HostUsage | None = None  # the host's CPU, memory and swap at the scan

    def rows_of(self, gpu_index: int | None) -> tuple[GpuProcessRow, ...]:
        return tuple(r for r in self.rows if r.gpu_index == gpu_index)

    def job_refs(self, job_key: str) -> tuple[ProcessRef, ...]:
        """Every live process of one job (its launcher and workers too), for stopping it whole."""
        job = self.table.job(job_key) if self.table is not None else None
        if job is None:
            return tuple(r.ref for r in self.rows if r.job_key == job_key and r.ref is not None)
        return tuple(p.ref for p in job.live_processes)

    def to_json(self) -> dict[str, Any]:
        return {
            "scanned_at": self.scanned_at,
            "error": self.error,
            "driver_version": self.driver_version,
            "gpus": [_gpu_json(g, self.rows_of(g.index)) for g in self.gpus],
            "processes": [_row_json(r) for r in self.rows],
            "notes": list(self.notes),
            "host": self.host.to_json() if self.host else None,
        }


def _gpu_json(gpu: GpuSample, rows: tuple[GpuProcessRow, ...]) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "error": gpu.error,
        "utilization_percent": gpu.utilization_percent,
        "memory_used_bytes": gpu.memory_used_bytes,
        "memory_total_bytes": gpu.memory_total_bytes,
        "temperature_c": gpu.temperature_c,
        "power_watts": gpu.power_watts,
        "processes": [r.pid for r in rows],
    }


def _row_json(row: GpuProcessRow) -> dict[str, Any]:
    return {
        "gpu": row.gpu_index,
        "pid": row.pid,
        "kind": str(row.kind),
        "what": row.what,
        "user": row.user,
        "own": row.own,
        "visible": row.visible,
        "start_time": row.start_time,
        "gpu_memory_bytes": row.gpu_memory_bytes,
        "cpu_percent": row.cpu_percent,
        "rss_bytes": row.rss_bytes,
        "age_seconds": row.age_seconds,
        "command": row.command,
        "listed_by_nvml": row.listed,
        "job": row.job_key,
        "job_label": row.job_label,
        "note": row.note,
    }


# ---- naming each process --------------------------------------------------------------------


def describe(job: TrainingJob, process: TrainingProcess) -> tuple[HolderKind, str]:
    """What a process of a training job is, in one kind and a few words."""
    name = f"ddptui run {job.run_id}" if job.kind == JobKind.DDPTUI else job.label
    if process.role == ProcessRole.WORKER:
        of = f"rank {process.rank} of " if process.rank is not None else ""
        dead = "orphaned " if job.state == JobState.ORPHANED else ""
        return HolderKind.WORKER, f"DataLoader worker of {of}{dead}{name}"
    role = f"rank {process.rank}" if process.rank is not None else str(process.role)
    if job.state == JobState.ORPHANED:
        return HolderKind.ORPHANED, f"orphaned {name} {role}: {job.reason}"
    if job.kind == JobKind.DDPTUI:
        return HolderKind.DDPTUI, f"{name} {role}"
    return HolderKind.FOREIGN, f"{name} {role}"


def _job_row(
    gpu_index: int | None,
    job: TrainingJob,
    p: TrainingProcess,
    memory: int | None,
    listed: bool,
) -> GpuProcessRow:
    kind, what = describe(job, p)
    return GpuProcessRow(
        gpu_index=gpu_index,
        pid=p.pid,
        kind=kind,
        what=what,
        user=p.user,
        own=p.own,
        start_time=p.start_time,
        gpu_memory_bytes=memory,
        cpu_percent=p.cpu_percent,
        rss_bytes=p.rss_bytes,
        age_seconds=p.age_seconds,
        command=p.command,
        listed=listed,
        job_key=job.key,
        job_label=job.label,
        note=p.note,
    )


def _holder_row(
    gpu_index: int | None,
    holder: DeviceHolder,
    probe: ProcessProbe,
    memory: int | None,
    listed: bool,
    me: int,
    now: float,
    command: str,
) -> GpuProcessRow:
    usage = probe.usage([holder.pid]).get(holder.pid)
    if holder.zombie:
        what = (
            "a zombie whose other threads still hold the device: freed when its parent collects it"
        )
    else:
        what = "not part of any training job found"
    return GpuProcessRow(
        gpu_index=gpu_index,
        pid=holder.pid,
        kind=HolderKind.UNKNOWN,
        what=what,
        user=holder.user,
        own=holder.uid == me,
        start_time=holder.start_time,
        gpu_memory_bytes=memory,
        cpu_percent=usage.cpu_percent if usage else None,
        rss_bytes=usage.rss_bytes if usage else None,
        age_seconds=max(0.0, now - holder.start_time),
        command=command or f"[{holder.name}]",
        listed=listed,
    )


def build_gpu_view(
    inventory: GpuInventory,
    table: ProcessTable,
    *,
    probe: ProcessProbe | None = None,
    commands: dict[int, str] | None = None,
    uid: int | None = None,
    now: float | None = None,
    host: HostUsage | None = None,
) -> GpuView:
    """The rows of a process scan's GPU holdings (``ProcessTable.gpu_holdings``), with the card
    figures of ``inventory``, the NVML sample the scan was joined with.

    ``commands`` gives the command line of processes outside every job (the scan knows those of
    job members); ``probe`` their CPU and memory. Without NVML the rows are the processes with a
    card open, and the ranks of ddptui runs on the CPU.
    """
    probe = probe or ProcessProbe()
    me = os.getuid() if uid is None else uid
    now = time.time() if now is None else now
    commands = commands or {}
    by_holder = table.holders.by_pid()
    rows: list[GpuProcessRow] = []
    notes = list(table.notes)

    def row_for(
        pid: int, gpu_index: int | None, memory: int | None, listed: bool
    ) -> GpuProcessRow | None:
        found = table.job_of(pid)
        if found is not None:
            return _job_row(gpu_index, found[0], found[1], memory, listed)
        holder = by_holder.get(pid)
        if holder is not None:
            return _holder_row(
                gpu_index, holder, probe, memory, listed, me, now, commands.get(pid, "")
            )
        return None

    for h in table.gpu_holdings:
        row = row_for(h.pid, h.gpu_index, h.used_bytes, h.listed) if h.here else None
        if row is None and h.listed:
            row = GpuProcessRow(
                gpu_index=h.gpu_index,
                pid=h.pid,
                kind=HolderKind.UNKNOWN,
                what="not visible here: another PID namespace (a container's NVML reports host pids)",
                gpu_memory_bytes=h.used_bytes,
            )
        if row is not None:
            rows.append(row)
    if inventory.error is not None or not inventory.gpus:
        shown = {r.pid for r in rows}
        for job in table.jobs:
            if job.kind != JobKind.DDPTUI:
                continue
            for p in job.live_processes:
                if p.role == ProcessRole.RANK and p.pid not in shown:
                    rows.append(_job_row(None, job, p, None, False))
        placed = {r.job_key for r in rows}
        unplaced = [job for job in table.jobs if job.key not in placed]
        if unplaced and inventory.error is not None:
            notes.append(unplaced_jobs_note(unplaced))
    return GpuView(
        gpus=inventory.gpus,
        rows=tuple(rows),
        error=inventory.error,
        driver_version=inventory.driver_version,
        notes=tuple(notes),
        scanned_at=now,
        table=table,
        host=host,
    )


def unplaced_jobs_note(jobs: list[TrainingJob]) -> str:
    """The sentence for training jobs that run here but that no NVML can place on a GPU."""
    labels = ", ".join(job.label for job in jobs[:3]) + (", …" if len(jobs) > 3 else "")
    count = f"{len(jobs)} training job{'s' if len(jobs) != 1 else ''}"
    return (
        f"{count} running here {'is' if len(jobs) == 1 else 'are'} not listed, since without "
        f"NVML the GPU a process uses cannot be told ({labels}); `ddptui ps` lists every job."
    )


class GpuScanner:
    """What the GPUs screen and ``ddptui gpus --watch`` keep between scans: the process scanner
    (CPU percentages cover the time since the previous scan) and a probe for the processes
    outside every job."""

    def __init__(self, device_glob: str | None = None) -> None:
        self.scanner = ProcessScanner(device_glob=device_glob or DEFAULT_DEVICE_GLOB)
        self.probe = ProcessProbe()
        self.host = HostSampler()

    def scan(self, inventory: GpuInventory | None = None, cpu_interval: float = 0.0) -> GpuView:
        if not self.host.primed:  # so the first scan's host CPU covers the scan
            self.host.sample()
        inventory = sample_gpus() if inventory is None else inventory
        table = self.scanner.scan(gpus=inventory, cpu_interval=cpu_interval)
        outside = [
            h.pid for h in table.holders.holders if table.job_of(h.pid) is None and h.any_card
        ]
        return build_gpu_view(
            inventory,
            table,
            probe=self.probe,
            commands=_commands(outside),
            host=self.host.sample(),
        )


def _commands(pids: list[int]) -> dict[int, str]:
    found = {}
    for pid in pids:
        try:
            cmdline = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if cmdline:
            found[pid] = " ".join(cmdline)
    return found
