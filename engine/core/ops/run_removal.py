"""Removing run directories: ``ddptui rm RUN...``, ``ddptui runs --prune`` and the Runs screen's
delete. Never a run that is going.

A run is going when the run observer says something of it may run (starting, running, orphaned)
or when any live process carries its run marker (what proves a process the run's, wherever its
launcher's run.json says otherwise). Those are refused with the reason, as are a run directory
that is a symbolic link and, unless root allows it, another user's. The rest are removed whole,
without following any link planted inside them (``shutil.rmtree`` works from file descriptors on
Linux). Plain Python.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.core.common.statuses import RunStatus
from engine.core.procs.run_proof import RunMarker, live_run_markers
from engine.core.runs.observer import observe_run
from engine.core.runs.run_listing import RunListing
from engine.core.runs.rundir import RunDir, run_dir_owner


@dataclass(frozen=True)
class RunToRemove:
    run_id: str
    path: str
    status: RunStatus
    size_bytes: int


@dataclass(frozen=True)
class RemovalPlan:
    """What would be removed, and what is refused with the reason (run id, why)."""

    remove: tuple[RunToRemove, ...]
    refused: tuple[tuple[str, str], ...] = ()

    @property
    def size_bytes(self) -> int:
        return sum(r.size_bytes for r in self.remove)


@dataclass(frozen=True)
class RemovalResult:
    removed: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = field(default=())  # (run id, why)

    @property
    def ok(self) -> bool:
        return not self.failed


def plan_removal(
    run_dirs: Sequence[RunDir],
    *,
    allow_other_users: bool = False,
    now: float | None = None,
    observed: Mapping[str, RunStatus] | None = None,
) -> RemovalPlan:
    """Which of ``run_dirs`` may go, and why each other one may not. Reads and never writes: one
    scan of the processes for the run markers they carry, and one observation of each run,
    unless the caller's listing observed it already (``observed``: run id -> its status, as
    ``ddptui runs --prune`` has them)."""
    markers = live_run_markers()
    now = time.time() if now is None else now
    remove: list[RunToRemove] = []
    refused: list[tuple[str, str]] = []
    for run_dir in run_dirs:
        known = (observed or {}).get(run_dir.run_id)
        why, status = _refusal(run_dir, markers, allow_other_users, now, known)
        if why:
            refused.append((run_dir.run_id, why))
        else:
            remove.append(
                RunToRemove(run_dir.run_id, str(run_dir.path), status, _size(run_dir.path))
            )
    return RemovalPlan(tuple(remove), tuple(refused))


def _refusal(
    run_dir: RunDir,
    markers: dict[RunMarker, list[int]],
    allow_other_users: bool,
    now: float,
    status: RunStatus | None,
) -> tuple[str, RunStatus]:
    """(why it may not be removed, or "", its status): ``status`` as the caller observed it, else
    observed here."""
    why = _not_a_plain_directory(run_dir)
    if why:
        return why, RunStatus.UNREADABLE
    owner = run_dir_owner(run_dir)
    if owner is not None and not allow_other_users:
        return f"it is {owner}'s run (as root, --all-users removes it)", RunStatus.UNREADABLE
    status = status or observe_run(run_dir, now).status
    if status.live:
        return f"it is {status}: stop it first (ddptui kill {run_dir.run_id})", status
    return _carried_by_live_processes(run_dir, markers), status


def _not_a_plain_directory(run_dir: RunDir) -> str:
    """Why ``run_dir`` is no directory rmtree may go into (unreadable, a link), or ""."""
    try:
        mode = os.lstat(run_dir.path).st_mode
    except OSError as err:
        return f"it cannot be read ({err.strerror})"
    if stat.S_ISLNK(mode):
        return "its run directory is a symbolic link; remove the link yourself"
    return ""


def _carried_by_live_processes(run_dir: RunDir, markers: dict[RunMarker, list[int]]) -> str:
    """Why live processes keep ``run_dir`` (they carry its run marker), or ""."""
    # its own processes carry its directory; an older launcher's, its id alone
    pids = markers.get(RunMarker.of_dir(run_dir.path)) or markers.get(RunMarker(run_dir.run_id, ""))
    if not pids:
        return ""
    listed = ", ".join(map(str, pids[:5]))
    return (
        f"processes carrying its run marker are alive (pid {listed}): stop them first "
        f"(ddptui kill {run_dir.run_id})"
    )


def prune_selection(
    runs: Sequence[RunListing],
    *,
    now: float,
    older_than: float | None = None,
    states: Collection[RunStatus] = (),
    keep: int | None = None,
) -> list[RunListing]:
    """The runs a prune removes, of ``runs`` (oldest first): those in ``states`` (ended ones when
    none is named), started more than ``older_than`` seconds ago, less the newest ``keep`` of
    them. Going runs are selected only where ``states`` names them, and refused by the plan."""
    chosen = [r for r in runs if (r.status in states if states else r.status.final)]
    if older_than is not None:
        chosen = [r for r in chosen if r.created and now - r.created > older_than]
    if keep is not None:
        chosen = chosen[: max(0, len(chosen) - keep)]
    return chosen


def remove_runs(plan: RemovalPlan) -> RemovalResult:
    """Remove what the caller's plan removes. What may change since it was planned is checked
    again just before each: the path still no link, and no live process carrying the run's
    marker (one scan of the processes for the whole plan). A run the plan found ended cannot
    start again, so it is not observed twice."""
    removed, failed = [], []
    markers = live_run_markers()
    for run in plan.remove:
        run_dir = RunDir(Path(run.path))
        problem = _not_a_plain_directory(run_dir) or _carried_by_live_processes(run_dir, markers)
        problem = problem or _remove_tree(run.path)
        if problem:
            failed.append((run.run_id, problem))
        else:
            removed.append(run.run_id)
    return RemovalResult(tuple(removed), tuple(failed))


def _remove_tree(path: str) -> str:
    """Remove ``path`` and all below it without following a link; the first failure, or ""."""
    errors: list[str] = []

    def note(_function: object, where: str, error: object) -> None:
        if isinstance(error, tuple):  # onerror's exc_info (Python < 3.12)
            error = error[1]
        reason = error.strerror if isinstance(error, OSError) else str(error)
        errors.append(f"{where}: {reason}")

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=note)
    else:
        shutil.rmtree(path, onerror=note)
    return errors[0] if errors else ""


def _size(path: os.PathLike[str] | str) -> int:
    """Bytes under ``path``, links not followed."""
    total = 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue
    return total
