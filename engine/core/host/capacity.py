"""What this process may use of the machine now: its CPU cores and the host memory a new run may
take. Plain Python (``os``, ``psutil`` and the memory cgroup files, never torch), so the UI can
ask on every change of the launch form and the launcher before it splits threads among ranks.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from engine.core.host.cgroups import CGROUP_ROOT, memory_cgroup, memory_headroom


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity mask where the platform has one
    (a container or ``taskset`` gives fewer than the machine has), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_memory_bytes(root: Path = CGROUP_ROOT, proc_cgroup: Path | None = None) -> int:
    """Host memory a new run may use now: the kernel's estimate of available memory, or this
    process's memory cgroup headroom where that is less. ``root`` and ``proc_cgroup`` (default
    ``/proc/self/cgroup``) are where the cgroup files are read (tests give their own)."""
    available = int(psutil.virtual_memory().available)
    cgroup = memory_cgroup(root=root, proc_cgroup=proc_cgroup)
    headroom = memory_headroom(cgroup) if cgroup is not None else None
    return available if headroom is None else min(available, headroom)
