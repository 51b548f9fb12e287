"""Which processes hold a GPU device file open: a scan of ``/proc/<pid>/fd``.

NVML lists the processes that hold a CUDA context, but not every process that pins a GPU: a
process in another PID namespace is listed under a pid that means nothing here, the DataLoader
workers of a dead job may keep device memory mapped without a context of their own, and a process
whose main thread has exited (a zombie leader) keeps its device files open in its other threads.
Every one of them has ``/dev/nvidia<N>`` open, and that is what this module looks for.

Plain Python (the standard library and psutil). The device path pattern is injectable: tests open
a file they made (``.../nvidia0``) and pass its glob, so real processes stand in for GPU users.
A process whose file descriptors cannot be read (another user's, without root) is counted, never
guessed at.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from engine.core.common.statuses import ProcessState
from engine.core.procs.process_identity import ProcessRef, status_state, user_of

# Every NVIDIA device node; the digits of /dev/nvidia<N> are the card's minor number.
DEFAULT_DEVICE_GLOB = "/dev/nvidia*"
_MINOR = re.compile(r"nvidia(\d+)$")


@dataclass(frozen=True)
class DeviceHolder:
    """One process with GPU device files open."""

    pid: int
    start_time: float
    user: str
    uid: int | None
    name: str
    zombie: bool  # its main thread has exited; another thread still holds the files
    minors: tuple[int, ...]  # /dev/nvidia<N> it has open (the cards' minor numbers)
    paths: tuple[str, ...]  # every matching path it has open (nvidiactl, nvidia-uvm included)

    @property
    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.start_time)

    @property
    def any_card(self) -> bool:
        """It has a card open, not only the control devices."""
        return bool(self.minors)


@dataclass(frozen=True)
class HolderScan:
    """Every process found with a device open, and how many could not be looked at."""

    holders: tuple[DeviceHolder, ...] = ()
    unreadable: int = 0  # processes of other users whose file descriptors could not be read
    unreadable_users: tuple[str, ...] = ()
    unreadable_pids: frozenset[int] = frozenset()  # every pid whose descriptors were not read

    def by_pid(self) -> dict[int, DeviceHolder]:
        return {h.pid: h for h in self.holders}

    def holds(self, pid: int) -> bool | None:
        """Whether ``pid`` had a device open; None when its descriptors could not be read."""
        if pid in self.unreadable_pids:
            return None
        return any(h.pid == pid for h in self.holders)

    def note(self) -> str:
        """One sentence on what the scan could not see, or ''."""
        if not self.unreadable:
            return ""
        users = ", ".join(self.unreadable_users[:5]) + (
            ", ..." if len(self.unreadable_users) > 5 else ""
        )
        return (
            f"{self.unreadable} process{'es' if self.unreadable != 1 else ''} of other users "
            f"({users}) could not be checked for open GPU devices; run as root to see them."
        )


def minor_of(path: str) -> int | None:
    """The card a device path names (``/dev/nvidia3`` -> 3); None for nvidiactl, nvidia-uvm."""
    match = _MINOR.search(path)
    return int(match.group(1)) if match else None


def _matching(directory: str, glob: str) -> tuple[list[str], int] | None:
    """(paths matching ``glob``, fds seen) in one fd directory; None when it cannot be read."""
    try:
        fds = os.listdir(directory)
    except OSError:  # not ours to read, or gone
        return None
    found = []
    for fd in fds:
        try:
            target = os.readlink(f"{directory}/{fd}")
        except OSError:
            continue
        if fnmatch.fnmatchcase(target, glob):
            found.append(target)
    return found, len(fds)


def _open_paths(pid: int, glob: str) -> list[str] | None:
    """Paths matching ``glob`` that ``pid`` has open; None when its descriptors are not readable."""
    leader = _matching(f"/proc/{pid}/fd", glob)
    if leader is None:
        return None
    found, seen = leader
    if not seen:
        # No descriptor at all: a zombie leader, whose live threads may still hold the files.
        try:
            tids = [t for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]
        except OSError:
            tids = []
        for tid in tids:
            thread = _matching(f"/proc/{pid}/task/{tid}/fd", glob)
            if thread is not None and thread[1]:
                found = thread[0]  # threads of one process share one table
                break
    return sorted(set(found))


def scan_device_holders(
    glob: str = DEFAULT_DEVICE_GLOB, pids: Iterable[int] | None = None
) -> HolderScan:
    """Every process (or every one of ``pids``) with a path matching ``glob`` open."""
    holders: list[DeviceHolder] = []
    unreadable = 0
    users: set[str] = set()
    unread: set[int] = set()
    me = os.getuid()
    wanted = list(pids) if pids is not None else psutil.pids()
    for pid in wanted:
        paths = _open_paths(pid, glob)
        if paths is None:
            unread.add(pid)
            try:
                proc = psutil.Process(pid)
                uid = proc.uids().real
                if uid != me:
                    unreadable += 1
                    users.add(user_of(proc))
            except psutil.Error:
                pass
            continue
        if not paths:
            continue
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                uid = proc.uids().real
                holder = DeviceHolder(
                    pid=pid,
                    start_time=proc.create_time(),
                    user=user_of(proc),
                    uid=uid,
                    name=proc.name(),
                    zombie=status_state(proc.status()) == ProcessState.ZOMBIE,
                    minors=tuple(sorted({m for p in paths if (m := minor_of(p)) is not None})),
                    paths=tuple(paths),
                )
        except psutil.Error:
            continue
        holders.append(holder)
    return HolderScan(tuple(holders), unreadable, tuple(sorted(users)), frozenset(unread))
