"""A process's memory cgroup, read from the files the kernel shows: where it is, how much room its
limits leave, and how many out-of-memory kills it has counted. Plain Python, reading only.

The one reader of ``/proc/<pid>/cgroup``. cgroup v1's memory hierarchy
(``<root>/memory/<path>``: ``memory.limit_in_bytes``, ``memory.usage_in_bytes``,
``memory.oom_control``) is used where the process has one, else the v2 unified hierarchy
(``<root>/<path>``, or ``<root>/unified/<path>`` on a hybrid machine: ``memory.max``,
``memory.current``, ``memory.events``). Every figure is None where the files do not say.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit number (9223372036854771712).
_V1_UNLIMITED = 2**62


@dataclass(frozen=True)
class MemoryCgroup:
    """A process's memory cgroup: ``version`` 1 or 2, the hierarchy's ``mount`` here and the
    cgroup's ``path`` inside it as ``/proc/<pid>/cgroup`` names it."""

    version: int
    mount: Path
    path: str

    @property
    def directory(self) -> Path:
        return self.mount.joinpath(*self._parts)

    @property
    def _parts(self) -> list[str]:
        return [p for p in self.path.strip("/").split("/") if p]

    def lineage(self) -> list[Path]:
        """Its directory, then each ancestor's up to the mount: a limit may be set on any of
        them."""
        parts = self._parts
        return [self.mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]

    @property
    def limit_file(self) -> str:
        return "memory.limit_in_bytes" if self.version == 1 else "memory.max"

    @property
    def usage_file(self) -> str:
        return "memory.usage_in_bytes" if self.version == 1 else "memory.current"


def _read_text(path: Path) -> str | None:
    try:
        # utf-8: a cgroup's path may hold any name; the figures are ASCII digits either way
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    """An integer file; None when it is missing, unreadable or says "max" (no limit)."""
    text = (_read_text(path) or "").strip()
    return int(text) if text.isdigit() else None


def _v2_mount(root: Path, path: str) -> Path:
    """Where the unified hierarchy is mounted: ``root`` on a v2 machine, ``root/unified`` on a
    hybrid one; ``root`` when neither shows it (a container that sees its own cgroup as the root:
    the walk up ``lineage`` then finds what is mounted)."""
    relative = path.lstrip("/")
    for mount in (root, root / "unified"):
        if (mount / relative / "memory.max").exists() or (mount / "cgroup.controllers").exists():
            return mount
    return root


def memory_cgroup(
    pid: int | str = "self", *, root: Path = CGROUP_ROOT, proc_cgroup: Path | None = None
) -> MemoryCgroup | None:
    """``pid``'s memory cgroup, from ``proc_cgroup`` (default ``/proc/<pid>/cgroup``); None when
    that cannot be read or names none."""
    source = proc_cgroup if proc_cgroup is not None else Path(f"/proc/{pid}/cgroup")
    text = _read_text(source)
    if text is None:
        return None
    entries = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    for _, controllers, path in entries:
        if "memory" in controllers.split(","):
            return MemoryCgroup(version=1, mount=root / "memory", path=path)
    for hierarchy, controllers, path in entries:
        if hierarchy == "0" and not controllers:
            return MemoryCgroup(version=2, mount=_v2_mount(root, path), path=path)
    return None


def own_memory_cgroup(pid: int | str = "self", root: Path = CGROUP_ROOT) -> Path | None:
    """The directory of ``pid``'s memory cgroup (where its OOM kills are counted, and where a
    child cgroup for it can be made); None when ``/proc`` names none."""
    cgroup = memory_cgroup(pid, root=root)
    return cgroup.directory if cgroup is not None else None


def _inactive_file_bytes(stat: Path) -> int:
    """Page cache the kernel reclaims before it runs out of memory, from ``memory.stat``."""
    lines = (_read_text(stat) or "").splitlines()
    values = dict(line.split(" ", 1) for line in lines if " " in line)
    raw = values.get("total_inactive_file", values.get("inactive_file", "0")).strip()
    return int(raw) if raw.isdigit() else 0


def memory_headroom(cgroup: MemoryCgroup) -> int | None:
    """Bytes the cgroup's limits leave for new allocations, or None without a limit: the
    tightest of limit minus usage (less reclaimable page cache) over the cgroup and its
    ancestors. A directory that is not there is skipped."""
    headroom: int | None = None
    for directory in cgroup.lineage():
        limit = _read_int(directory / cgroup.limit_file)
        if limit is None or limit >= _V1_UNLIMITED:
            continue
        usage = _read_int(directory / cgroup.usage_file) or 0
        used = max(0, usage - _inactive_file_bytes(directory / "memory.stat"))
        room = max(0, limit - used)
        headroom = room if headroom is None else min(headroom, room)
    return headroom


def cgroup_oom_kills(directory: Path) -> int | None:
    """OOM kills the memory cgroup at ``directory`` has counted: v2 ``memory.events`` (its
    descendants included), v1 ``memory.oom_control``; None where neither says."""
    for name in ("memory.events", "memory.oom_control"):
        for line in (_read_text(directory / name) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None
