"""A disk that takes no more writes: one sentence naming the path and the free space. Plain Python.

A run directory fills up while a run goes on (logs, events, the checkpoint), and so does the disk
under it. What a writer may rely on:

- ``write_failure(path, err)`` says why a write of ``path`` failed in one sentence, with the free
  space of the file system that holds it when the disk is full;
- ``WriteFailed`` is the OSError that carries that sentence (``str()``), errno kept;
- the room set aside for a summary is ``run_files.SpaceReserve``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from engine.core.common.formatting import format_bytes

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding ``path`` (or its
    nearest existing parent); None when it cannot be told."""
    here = Path(path)
    while True:
        try:
            st = os.statvfs(here)
            return st.f_bavail * st.f_frsize
        except OSError:
            if here.parent == here:
                return None
            here = here.parent


def disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in FULL_ERRNOS


def write_failure(path: Path, err: OSError) -> str:
    """One sentence: ``path`` could not be written, and why; on a full disk, how much is free.
    A WriteFailed already is that sentence (for the file it names)."""
    if isinstance(err, WriteFailed):
        return str(err)
    why = err.strerror or str(err)
    if disk_full(err):
        free = free_bytes(path)
        room = f"{format_bytes(free)} free" if free is not None else "free space unknown"
        return (
            f"cannot write {path}: the disk is full ({why}; {room} on the file system holding it)"
        )
    return f"cannot write {path}: {why}"


class WriteFailed(OSError):
    """A write of a run file failed; ``str()`` is one sentence naming the path (and the free
    space on a full disk)."""

    def __init__(self, path: Path, err: OSError) -> None:
        super().__init__(err.errno, err.strerror or str(err), str(path))
        self.sentence = write_failure(path, err)

    def __str__(self) -> str:
        return self.sentence
