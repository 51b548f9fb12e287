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

The one way a run file is written: ``open_private`` (a descriptor made with an explicit mode, never
through a symbolic link planted where the file goes), ``write_atomic`` / ``write_json_atomic`` (a
temporary file renamed over the old one, so a reader sees the old file or the new one; a failed
write raises ``WriteFailed`` and leaves neither half a file nor the temporary one) and the
``SpaceReserve`` set aside so a run that filled the disk still gets its summary.

Reading: ``open_in_run`` opens a file below a run directory without following a symbolic link at
any step below it, and refuses anything but a regular file owned by the run directory's owner.
A user who can write into a run directory (its owner) can plant ``logs/rank-0.log -> /etc/shadow``;
a reader running as root must not show it. Each refusal is ``UnsafeRunFile`` with one sentence.
``read_run_bytes`` / ``read_run_text`` load a whole file only up to a size limit (a file over it is
named, not loaded: ``RunFileTooLarge``); ``tail_lines`` reads the end of a log only, however large
it has grown.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO, Literal

from engine.core.common import strict_json
from engine.core.common.disk_space import WriteFailed
from engine.core.common.formatting import format_bytes
from engine.core.common.run_layout import RunLayout

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


# How ``open_private`` opens: add to the end of what is there, replace it, or make a new file only.
WriteHow = Literal["append", "truncate", "exclusive"]
_HOW_FLAGS = {"append": os.O_APPEND, "truncate": os.O_TRUNC, "exclusive": os.O_EXCL}


def open_private(
    path: Path,
    how: WriteHow = "append",
    mode: int = PRIVATE_FILE_MODE,
    *,
    parents: int | None = None,
) -> int:
    """A descriptor for writing ``path``, made with ``mode`` when it is new (the umask can only take
    bits away), never through a symbolic link planted where it goes, closed on exec. With
    ``parents`` the missing directories above it are made first, each with that mode. Raises
    OSError as ``os.open`` does (the caller knows what a failure means for it)."""
    if parents is not None:
        make_dirs(Path(path).parent, parents)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | _HOW_FLAGS[how]
    return os.open(path, flags, mode)


def write_atomic(
    path: Path, data: str | bytes, mode: int = FILE_MODE, *, durable: bool = False
) -> None:
    """Write ``data`` (text as UTF-8) to a temporary file beside ``path`` made with ``mode``, then
    rename it over ``path``: a reader sees the old file or the new one, never half of one. A failed
    write (a full disk) leaves neither a half file nor the temporary one, and raises WriteFailed,
    whose message names the path and the free space. ``durable``: the data and the rename are on
    disk (fsync) before it returns, so a power cut or a lost node leaves the old file or the new
    one, not an empty one (a checkpoint, which a resumed run trusts)."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = open_private(tmp, "truncate", mode)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            sync_directory(path.parent)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and not isinstance(err, WriteFailed):
            raise WriteFailed(path, err) from None
        raise


def sync_directory(directory: Path) -> None:
    """fsync a directory, so a rename in it survives a crash of the machine."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    """``data`` as strict JSON (``engine.core.common.strict_json``), written as ``write_atomic``."""
    write_atomic(path, strict_json.dumps(data, indent=2) + "\n")


RESERVE_BYTES = 256 * 1024


class SpaceReserve:
    """``RESERVE_BYTES`` of real blocks set aside in a run directory (``run_start`` makes it before
    the launcher starts), given back just before the final writes (run.json, summary.json), so a
    run that filled the disk still ends with a summary saying so."""

    def __init__(self, directory: Path, size: int = RESERVE_BYTES) -> None:
        self.path = RunLayout(Path(directory)).space_reserve
        self.size = size

    def make(self) -> None:
        """Write the reserve (raises WriteFailed when the disk cannot hold it)."""
        try:
            fd = open_private(self.path, "truncate")
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


def user_name(uid: int) -> str:
    """The name of user ``uid``; ``uid N`` when this machine has none for it."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def refuse_writing(run_path: Path) -> str:
    """Why this process must not write into the run directory ``run_path`` ("" when it may): only
    its owner writes there. A reader (root's ``ddptui runs``, ``show``, ``stacks``) that wrote
    into another user's run directory would leave files its owner cannot replace (and that
    ``open_in_run`` then refuses), and would write through whatever that user planted there."""
    try:
        st = os.lstat(run_path)
    except OSError as err:
        return f"{run_path} cannot be read ({err.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{run_path} is a symbolic link: nothing is written through it"
    if st.st_uid != os.geteuid():
        return (
            f"the run directory {run_path} belongs to {user_name(st.st_uid)}: only its owner "
            "writes there"
        )
    return ""


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


# The most of one run file a reader loads: run.json, summary.json and stack snapshots (every rank's
# stack of a large run fits many times over), config.toml. A file over its limit is named, not
# loaded: a run directory is its owner's, and root's `ddptui runs` must not read 4 GiB for them.
JSON_MAX_BYTES = 16 << 20
CONFIG_MAX_BYTES = 1 << 20


class RunFileTooLarge(UnsafeRunFile):
    """A run file over the size a reader loads of it."""


def read_run_bytes(run_path: Path, path: Path, limit: int = JSON_MAX_BYTES) -> bytes:
    """The whole of a run file, read as ``open_in_run`` allows and only when it holds at most
    ``limit`` bytes: RunFileTooLarge (one sentence naming the file, its size and the limit)
    otherwise, before anything is loaded."""
    with open_in_run(run_path, path) as f:
        size = os.fstat(f.fileno()).st_size
        if size <= limit:
            data = f.read(limit + 1)
            if len(data) <= limit:  # it may have grown since
                return data
            size = len(data)
    raise RunFileTooLarge(
        f"{path} is {format_bytes(size)}, over the {format_bytes(limit)} ddptui reads of such a "
        "file: not loaded"
    )


def read_run_text(run_path: Path, path: Path, limit: int = JSON_MAX_BYTES) -> str:
    """A run file as text (``read_run_bytes``: no planted link followed, nobody else's file, at
    most ``limit`` bytes)."""
    return read_run_bytes(run_path, path, limit).decode("utf-8", errors="replace")


def tail_lines(
    path: Path, count: int, max_bytes: int = 32_768, *, run_path: Path | None = None
) -> tuple[str, ...]:
    """The last ``count`` lines of a log, read from its end only (at most ``max_bytes``). Given its
    run directory, the log is opened as ``open_in_run`` allows (no symbolic link, nobody else's
    file), and a refusal is the one line returned; a log that cannot be read has no lines."""
    try:
        with open(path, "rb") if run_path is None else open_in_run(run_path, path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except UnsafeRunFile as err:
        return (f"({err})",)
    except OSError:
        return ()
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > max_bytes and lines:
        # The first line read is cut: dropped, unless it is the only one (a last line longer than
        # what is read, with no newline yet): then its end, marked as cut, is the log's tail.
        lines = lines[1:] if len(lines) > 1 else ["…" + lines[0]]
    return tuple(line.rstrip() for line in lines[-count:])
