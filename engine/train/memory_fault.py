"""The ``oom`` fault: a rank allocates memory until the kernel kills it. Plain Python.

What a real out-of-memory rank does, without taking the machine down with it:

1. it raises its own ``oom_score_adj`` to 1000, so that it is the OOM killer's first victim;
2. where it may (root, or a delegated cgroup), it moves itself into a child memory cgroup
   ``ddptui-oom-<pid>`` of its own, capped at ``CONFINED_LIMIT_BYTES`` of new memory, so that the
   kernel's kill comes after a few hundred MiB instead of after all the machine's memory;
3. it allocates and touches ``CHUNK_BYTES`` at a time until the kernel SIGKILLs it.

Without a cgroup it really does fill memory (the score makes it the victim). If it is not killed
within ``GIVE_UP_SECONDS`` it raises instead of hanging. The launcher removes the empty cgroup of
a rank it reaped (``remove_fault_cgroup``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from engine.core.host.cgroups import own_memory_cgroup as own_memory_cgroup

CHUNK_BYTES = 32 * 1024 * 1024
CONFINED_LIMIT_BYTES = 256 * 1024 * 1024
GIVE_UP_SECONDS = 120.0
PAGE_BYTES = 4096
FAULT_CGROUP_PREFIX = "ddptui-oom-"


def confine(limit_bytes: int = CONFINED_LIMIT_BYTES) -> Path | None:
    """Move this process into a fresh memory cgroup capped at ``limit_bytes``; the cgroup's path,
    or None when that is not allowed here (the fault then runs unconfined)."""
    parent = own_memory_cgroup()
    if parent is None:
        return None
    group = parent / f"{FAULT_CGROUP_PREFIX}{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        v1 = (group / "memory.limit_in_bytes").exists()
        limit_file = group / ("memory.limit_in_bytes" if v1 else "memory.max")
        limit_file.write_text(str(limit_bytes), encoding="ascii")
        if v1:  # without swap accounting this file is absent; with it, swap must be capped too
            with contextlib.suppress(OSError):
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        (group / "cgroup.procs").write_text(str(os.getpid()), encoding="ascii")
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return group


def make_oom_victim() -> None:
    """The highest OOM score: when memory runs out, this process goes first."""
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("1000", encoding="ascii")


def allocate_until_killed(
    chunk_bytes: int = CHUNK_BYTES, give_up_seconds: float = GIVE_UP_SECONDS
) -> None:
    """Allocate and touch memory until the kernel kills this process; raises MemoryError if it is
    still alive after ``give_up_seconds`` (an OOM killer that never came)."""
    make_oom_victim()
    group = confine()
    where = f"in cgroup {group} (limit {CONFINED_LIMIT_BYTES >> 20} MiB)" if group else "unconfined"
    print(f"oom fault: allocating {chunk_bytes >> 20} MiB at a time {where}", flush=True)
    held: list[bytearray] = []
    touch = b"\x01" * len(range(0, chunk_bytes, PAGE_BYTES))
    deadline = time.monotonic() + give_up_seconds
    while time.monotonic() < deadline:
        try:
            block = bytearray(chunk_bytes)
            block[::PAGE_BYTES] = touch  # a page is only real once it is written
            held.append(block)
        except MemoryError:
            time.sleep(0.01)  # the kernel's killer is on its way
    total = len(held) * chunk_bytes
    held.clear()
    raise MemoryError(
        f"oom fault: allocated {total >> 20} MiB in {give_up_seconds:.0f} s and was not killed"
    )


def remove_fault_cgroup(rank_pid: int, launcher_cgroup: Path | None) -> None:
    """Remove the (now empty) cgroup the ``oom`` fault of rank ``rank_pid`` made, if any."""
    if launcher_cgroup is None:
        return
    with contextlib.suppress(OSError):
        (launcher_cgroup / f"{FAULT_CGROUP_PREFIX}{rank_pid}").rmdir()
