"""Files that dead training jobs leave behind: torch's shared-memory segments in ``/dev/shm`` and
the ``/tmp/torchelastic_*`` directories of torchrun agents (``ddptui clean`` offers both).

Plain Python. A segment ``torch_<pid>_...`` is left over when the process that made it is gone
(or its pid now names a process started after the segment was last written) and no live process
has it open or mapped: it holds host memory until someone removes it. A ``torchelastic_*``
directory is left over when no live process refers to it (environment, working directory, open
files) and no torchrun agent of its owner that started before it was last written still runs.
Only this user's are offered; every other one is listed with the reason it is left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from engine.core.common.statuses import LeftoverKind
from engine.core.procs.process_scan import TORCH_LAUNCHERS, launcher_kind

DEFAULT_SHM_DIR = Path("/dev/shm")
_SEGMENT = re.compile(r"^torch_(\d+)_")
ELASTIC_PREFIX = "torchelastic_"


@dataclass(frozen=True)
class Leftover:
    path: Path
    kind: LeftoverKind
    size_bytes: int
    owner_uid: int
    modified: float
    maker_pid: int | None = None  # the pid in a segment's name
    why: str = ""  # why it is left over, or why it is left alone

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "kind": str(self.kind),
            "size_bytes": self.size_bytes,
            "owner_uid": self.owner_uid,
            "modified": self.modified,
            "maker_pid": self.maker_pid,
            "why": self.why,
        }


@dataclass(frozen=True)
class LeftoverPlan:
    remove: tuple[Leftover, ...]  # this user's leftovers of dead jobs
    left_alone: tuple[Leftover, ...] = ()  # found, but in use or another user's (``why`` says)

    @property
    def size_bytes(self) -> int:
        return sum(item.size_bytes for item in self.remove)


@dataclass(frozen=True)
class LeftoverRemoval:
    removed: tuple[Leftover, ...] = ()
    failed: tuple[tuple[Leftover, str], ...] = ()
    kept: tuple[Leftover, ...] = ()  # in use again by the time of removal

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass
class _Users:
    """What live processes refer to: open and mapped paths, environments, working directories,
    and torch launchers by user (read once per plan)."""

    open_paths: set[str] = field(default_factory=set)
    env_values: list[str] = field(default_factory=list)
    cwds: set[str] = field(default_factory=set)
    launchers: list[tuple[int, int, float]] = field(default_factory=list)  # (pid, uid, start)
    starts: dict[int, float] = field(default_factory=dict)


def _read_users(watched: Iterable[Path]) -> _Users:
    prefixes = tuple(str(p) for p in watched)
    users = _Users()
    for proc in psutil.process_iter(["pid", "cmdline", "uids", "create_time"]):
        info = proc.info
        if info.get("create_time") is not None:
            users.starts[proc.pid] = float(info["create_time"])
        cmd = info.get("cmdline") or []
        if launcher_kind(cmd) in TORCH_LAUNCHERS and info.get("uids") is not None:
            users.launchers.append((proc.pid, info["uids"].real, float(info["create_time"] or 0)))
        try:
            for f in os.listdir(f"/proc/{proc.pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{proc.pid}/fd/{f}")
                except OSError:
                    continue
                if target.startswith(prefixes):
                    users.open_paths.add(target)
        except OSError:
            pass
        try:
            with open(f"/proc/{proc.pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    if "/dev/shm/" in line or any(p in line for p in prefixes):
                        users.open_paths.add(line.split(None, 5)[-1].strip())
        except OSError:
            pass
        with contextlib.suppress(psutil.Error, OSError):
            users.env_values.extend(v for v in proc.environ().values() if v.startswith(prefixes))
        try:
            cwd = proc.cwd()
            if cwd.startswith(prefixes):
                users.cwds.add(cwd)
        except (psutil.Error, OSError):
            pass
    return users


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _refers(users: _Users, path: Path) -> bool:
    text = str(path)
    inside = text + os.sep
    if any(p == text or p.startswith(inside) for p in users.open_paths):
        return True
    if any(c == text or c.startswith(inside) for c in users.cwds):
        return True
    return any(v == text or v.startswith(inside) for v in users.env_values)


def _segment_verdict(item: Leftover, users: _Users) -> str:
    """Why a segment is not left over, or '' when it is."""
    if _refers(users, item.path):
        return "a live process has it open or mapped"
    pid = item.maker_pid
    if pid is not None and pid in users.starts and users.starts[pid] <= item.modified + 1.0:
        return f"the process that made it (pid {pid}) is still running"
    return ""


def _elastic_verdict(item: Leftover, users: _Users) -> str:
    if _refers(users, item.path):
        return "a live process refers to it (environment, working directory or open file)"
    for pid, uid, start in users.launchers:
        if uid == item.owner_uid and start <= item.modified + 1.0:
            return f"a torchrun agent of its owner (pid {pid}) started before it and still runs"
    return ""


def _candidates(shm_dir: Path, tmp_dir: Path) -> list[Leftover]:
    found = []
    for directory, kind in (
        (shm_dir, LeftoverKind.SHM_SEGMENT),
        (tmp_dir, LeftoverKind.ELASTIC_DIR),
    ):
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            path = directory / name
            match = _SEGMENT.match(name) if kind == LeftoverKind.SHM_SEGMENT else None
            if kind == LeftoverKind.SHM_SEGMENT and match is None:
                continue
            if kind == LeftoverKind.ELASTIC_DIR and not name.startswith(ELASTIC_PREFIX):
                continue
            try:
                st = path.lstat()
                if stat.S_ISLNK(st.st_mode):
                    continue  # never follow a link out of the directory
                if kind == LeftoverKind.ELASTIC_DIR and not stat.S_ISDIR(st.st_mode):
                    continue
                size = _size(path)
            except OSError:
                continue
            found.append(
                Leftover(
                    path=path,
                    kind=kind,
                    size_bytes=size,
                    owner_uid=st.st_uid,
                    modified=st.st_mtime,
                    maker_pid=int(match.group(1)) if match else None,
                )
            )
    return found


def _judge(item: Leftover, users: _Users) -> Leftover:
    """``item`` with ``why`` set: why it is left over, or (``why`` starting "in use:") why not."""
    verdict = (
        _segment_verdict(item, users)
        if item.kind == LeftoverKind.SHM_SEGMENT
        else _elastic_verdict(item, users)
    )
    if verdict:
        return replace(item, why=f"in use: {verdict}")
    if item.kind == LeftoverKind.SHM_SEGMENT:
        why = f"made by pid {item.maker_pid}, which is gone; nothing has it open or mapped"
    else:
        why = "no live process refers to it and no torchrun agent of its owner is left"
    return replace(item, why=why)


def plan_leftovers(
    shm_dir: Path = DEFAULT_SHM_DIR, tmp_dir: Path | None = None, *, uid: int | None = None
) -> LeftoverPlan:
    """This user's leftovers of dead jobs, and every other candidate with why it stays."""
    tmp = Path(tmp_dir) if tmp_dir is not None else Path(tempfile.gettempdir())
    me = os.getuid() if uid is None else uid
    candidates = _candidates(Path(shm_dir), tmp)
    if not candidates:
        return LeftoverPlan(())
    users = _read_users([Path(shm_dir), tmp])
    remove: list[Leftover] = []
    left: list[Leftover] = []
    for item in candidates:
        judged = _judge(item, users)
        if judged.why.startswith("in use:"):
            left.append(judged)
        elif item.owner_uid != me:
            left.append(replace(judged, why=f"belongs to uid {item.owner_uid}, not this user"))
        else:
            remove.append(judged)
    return LeftoverPlan(tuple(remove), tuple(left))


def remove_leftovers(items: Iterable[Leftover]) -> LeftoverRemoval:
    """Remove the planned leftovers, each judged again first (a job may have started using it
    since the plan was shown); never follows a symbolic link."""
    wanted = list(items)
    if not wanted:
        return LeftoverRemoval()
    users = _read_users({item.path.parent for item in wanted})
    removed: list[Leftover] = []
    failed: list[tuple[Leftover, str]] = []
    kept: list[Leftover] = []
    for item in wanted:
        if _judge(item, users).why.startswith("in use:"):
            kept.append(item)
            continue
        try:
            st = item.path.lstat()
            if st.st_uid != item.owner_uid or stat.S_ISLNK(st.st_mode):
                failed.append((item, "it was replaced since it was listed"))
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(item.path)
            else:
                item.path.unlink()
        except FileNotFoundError:
            removed.append(item)  # someone else removed it: it is gone all the same
            continue
        except OSError as err:
            failed.append((item, err.strerror or str(err)))
            continue
        removed.append(item)
    return LeftoverRemoval(tuple(removed), tuple(failed), tuple(kept))
