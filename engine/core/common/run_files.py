"""Making and reading the files of a run directory safely, whoever planted what in it. Plain Python.

Writing: directories and files are made with explicit modes, so no umask makes them group- or
world-writable, and logs, checkpoints and the space reserve are readable by their owner only:

==========================  ======
run, events directories     0755
logs directory              0700
config, run.json, events,   0644
summary.json
logs, checkpoint            0600
==========================  ======

Reading: ``open_in_run`` opens a file below a run directory without following a symbolic link at
any step below it, and refuses anything but a regular file owned by the run directory's owner.
A user who can write into a run directory (its owner) can plant ``logs/rank-0.log -> /etc/shadow``;
a reader running as root must not show it. Each refusal is ``UnsafeRunFile`` with one sentence.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

DIR_MODE = 0o755
PRIVATE_DIR_MODE = 0o700
FILE_MODE = 0o644
PRIVATE_FILE_MODE = 0o600


class UnsafeRunFile(OSError):
    """A run file that was not opened: a symbolic link, not a regular file, or another user's.
    ``str()`` is one sentence."""

    def __init__(self, sentence: str) -> None:
        super().__init__(errno.EPERM, sentence)
        self.sentence = sentence

    def __str__(self) -> str:
        return self.sentence


def make_dirs(path: Path, mode: int = DIR_MODE) -> None:
    """``mkdir -p`` where every directory made gets ``mode`` (the umask can only take bits away,
    and Path.mkdir(parents=True) would give the parents 0777 minus the umask)."""
    path = Path(path)
    missing = []
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=mode)


def user_name(uid: int) -> str:
    """The name of user ``uid``; ``uid N`` when this machine has none for it."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def open_in_run(run_path: Path, path: Path) -> BinaryIO:
    """Open ``path`` (a file below ``run_path``) for reading, following no symbolic link below the
    run directory, and only if it is a regular file owned by the run directory's owner.

    FileNotFoundError when it is not there; UnsafeRunFile when it must not be read.
    """
    run_path, path = Path(run_path), Path(path)
    try:
        parts = path.relative_to(run_path).parts
    except ValueError:
        raise UnsafeRunFile(f"{path} is outside the run directory {run_path}: not read") from None
    if not parts:
        raise UnsafeRunFile(f"{path} is the run directory itself, not a file in it")
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(run_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        owner = os.fstat(fd).st_uid
        here = run_path
        for i, part in enumerate(parts):
            here = here / part
            last = i == len(parts) - 1
            flags = os.O_RDONLY | nofollow | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(here):
                    raise UnsafeRunFile(
                        f"{here} is a symbolic link ({os.readlink(here)}): not followed"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if st.st_uid != owner:
                raise UnsafeRunFile(
                    f"{here} belongs to {user_name(st.st_uid)}, not to {user_name(owner)} who owns the "
                    "run directory: not read"
                )
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeRunFile(f"{path} is not a regular file: not read")
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return handle


def read_run_text(run_path: Path, path: Path) -> str:
    """The whole of a run file as text, read as ``open_in_run`` allows."""
    with open_in_run(run_path, path) as f:
        return f.read().decode("utf-8", errors="replace")
