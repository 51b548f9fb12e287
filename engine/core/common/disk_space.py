"""A disk that takes no more writes: one sentence naming the path and the free space, and a little
room set aside so that a run's summary still fits. Plain Python.

A run directory fills up while a run goes on (logs, events, the checkpoint), and so does the disk
under it. What a writer may rely on:

- ``write_failure(path, err)`` says why a write of ``path`` failed in one sentence, with the free
  space of the file system that holds it when the disk is full;
- ``WriteFailed`` is the OSError that carries that sentence (``str()``), errno kept;
- ``SpaceReserve``: ``run_start`` sets ``RESERVE_BYTES`` aside in the run directory before the
  launcher starts; the launcher gives it back just before its final writes (run.json, summary.json),
  so a run that filled the disk still ends with a summary saying so.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

RESERVE_NAME = ".space-reserve"
RESERVE_BYTES = 256 * 1024
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


def format_bytes(value: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} bytes"


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


class SpaceReserve:
    """``RESERVE_BYTES`` of real blocks set aside in a directory, given back on demand."""

    def __init__(self, directory: Path, size: int = RESERVE_BYTES) -> None:
        self.path = Path(directory) / RESERVE_NAME
        self.size = size

    def make(self) -> None:
        """Write the reserve (raises WriteFailed when the disk cannot hold it)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                block = b"\0" * 65536
                left = self.size
                while left > 0:
                    left -= os.write(fd, block[: min(left, len(block))])
            finally:
                os.close(fd)
        except OSError as err:
            with contextlib.suppress(OSError):
                self.path.unlink()
            raise WriteFailed(self.path, err) from None

    def release(self) -> None:
        """Give the room back (nothing happens when there is no reserve)."""
        with contextlib.suppress(OSError):
            self.path.unlink()
