"""How busy the host is: its CPU, memory and swap, as nvitop's host line shows them beside the
GPUs (the GPUs screen and ``ddptui gpus``). Plain Python; never raises: a figure that cannot be
read is None."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class HostUsage:
    cpu_percent: float | None  # of all the machine's cores, since the previous sample
    cores: int
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    swap_used_bytes: int | None
    swap_total_bytes: int | None
    load_average: float | None = None  # over the last minute

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "cpu_percent": self.cpu_percent,
            "cores": self.cores,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_total_bytes": self.memory_total_bytes,
            "swap_used_bytes": self.swap_used_bytes,
            "swap_total_bytes": self.swap_total_bytes,
            "load_average": self.load_average,
        }


class HostSampler:
    """Samples the host; its CPU figure covers the time since the previous sample (the first
    sample has none: psutil's first reading measures nothing)."""

    def __init__(self) -> None:
        self.primed = False

    def sample(self) -> HostUsage:
        cpu: float | None
        try:
            cpu = psutil.cpu_percent(interval=None) if self.primed else None
            if not self.primed:
                psutil.cpu_percent(interval=None)
                self.primed = True
        except (OSError, psutil.Error):
            cpu = None
        used = total = swap_used = swap_total = None
        try:
            memory = psutil.virtual_memory()
            used, total = memory.total - memory.available, memory.total
        except (OSError, psutil.Error):
            pass
        try:
            swap = psutil.swap_memory()
            swap_used, swap_total = swap.used, swap.total
        except (OSError, psutil.Error, RuntimeError):
            pass
        try:
            load: float | None = os.getloadavg()[0]
        except OSError:
            load = None
        return HostUsage(
            cpu_percent=cpu,
            cores=os.cpu_count() or 1,
            memory_used_bytes=used,
            memory_total_bytes=total,
            swap_used_bytes=swap_used,
            swap_total_bytes=swap_total,
            load_average=load,
        )
