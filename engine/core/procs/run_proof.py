"""Which processes are one run's, by proof: the one test behind every signal ddptui sends to a run
(``ddptui kill``, ``clean``, ``stacks``, the UI's kill and stacks) and behind grouping processes
into runs (``ddptui ps``).

A process is run R's only when its *own* environment (``/proc/PID/environ``, what it was started
with, which no file can change) carries R's marker (``DDPTUI_RUN_ID``) *and* R's run directory
(``DDPTUI_RUN_DIR``, an absolute path), it is the very process a reference names (pid + start
time, ``process_identity.lookup``), and it belongs to the run directory's owner (unless root asked
for every user's). A run id alone proves nothing: anyone can make a directory of that name and a
run.json naming any pid with its (public) start time.

Knows run directories only as the path their processes carry; plain Python (psutil).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from engine.core.common.run_environment import RUN_DIR_ENV, RUN_MARKER_ENV
from engine.core.common.run_files import user_name
from engine.core.common.statuses import ProcessState
from engine.core.procs.process_identity import ProcessRef, lookup, process_ended


@dataclass(frozen=True)
class RunMarker:
    """What every process of one run carries from its start: the run id and the absolute path of
    its run directory (``""`` for a process that carries no directory: an older launcher)."""

    run_id: str
    run_dir: str

    @classmethod
    def of_dir(cls, path: Path) -> RunMarker:
        """The marker of the run whose directory is ``path``: its name and its real path, as the
        launcher writes it (``Path.resolve``)."""
        return cls(Path(path).name, os.path.realpath(path))

    @classmethod
    def of_environ(cls, env: Mapping[str, str]) -> RunMarker | None:
        run_id = env.get(RUN_MARKER_ENV)
        return cls(run_id, env.get(RUN_DIR_ENV, "")) if run_id else None

    def environment(self) -> dict[str, str]:
        """The variables that carry it, for a process about to be started."""
        return {RUN_MARKER_ENV: self.run_id, RUN_DIR_ENV: self.run_dir}

    def mismatch(self, env: Mapping[str, str], pid: int) -> str | None:
        """Why an environment is not this run's, or None when it carries this marker exactly."""
        theirs = RunMarker.of_environ(env)
        if theirs is None:
            return f"pid {pid} does not carry the run marker {RUN_MARKER_ENV}={self.run_id}"
        if theirs.run_id != self.run_id:
            return f"pid {pid} carries the marker of another run ({RUN_MARKER_ENV}={theirs.run_id})"
        if theirs.run_dir != self.run_dir:
            where = theirs.run_dir or "no run directory"
            return (
                f"pid {pid} carries run {self.run_id}'s id but {where} as its {RUN_DIR_ENV}, not "
                f"{self.run_dir}: another run of the same id"
            )
        return None


def marker_mismatch(proc: psutil.Process, marker: RunMarker) -> str | None:
    """Why ``proc`` is not provably a process of the run ``marker`` names, or None when its own
    environment carries that marker (run id and run directory)."""
    try:
        env = proc.environ()
    except psutil.NoSuchProcess:
        return f"pid {proc.pid} is gone"
    except (psutil.Error, OSError) as err:
        return (
            f"pid {proc.pid}'s environment cannot be read ({type(err).__name__}), so it is not "
            "provably this run's"
        )
    return marker.mismatch(env, proc.pid)


def owner_mismatch(proc: psutil.Process, owner_uid: int | None) -> str | None:
    """Why ``proc`` is not the run directory owner's (``owner_uid``; None: anyone's will do)."""
    if owner_uid is None:
        return None
    try:
        uid = int(proc.uids().real)
    except psutil.Error:
        return f"pid {proc.pid}'s owner cannot be read"
    if uid != owner_uid:
        return (
            f"pid {proc.pid} belongs to {user_name(uid)}, not to {user_name(owner_uid)} who owns "
            "the run directory"
        )
    return None


def prove(
    ref: ProcessRef,
    marker: RunMarker,
    owner_uid: int | None,
    looked: tuple[ProcessState, psutil.Process | None] | None = None,
) -> tuple[psutil.Process | None, str]:
    """The live process ``ref`` names, proved to be the run's (see the module docstring), or None
    and why not: "" when it has simply ended, one sentence when something else has the pid, its
    environment does not carry the marker or another user owns it. ``looked``: what ``lookup``
    said of ``ref`` just now, when the caller looked it up already."""
    state, proc = looked if looked is not None else lookup(ref)
    if state == ProcessState.REUSED:
        return None, f"pid {ref.pid} now belongs to another process"
    if state == ProcessState.UNREADABLE:
        return None, f"pid {ref.pid} cannot be inspected"
    if proc is None or not state.alive:
        return None, ""
    why = marker_mismatch(proc, marker) or owner_mismatch(proc, owner_uid)
    return (None, why) if why else (proc, "")


def marked_processes(
    marker: RunMarker, *, owner_uid: int | None = None, exclude: frozenset[int] = frozenset()
) -> list[psutil.Process]:
    """Live processes whose own environment carries ``marker`` (its launcher, ranks, their
    children, multiprocessing's helpers, a daemon a script left), zombies left out; with
    ``owner_uid``, only that user's."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in exclude:
            continue
        try:
            if (
                marker.mismatch(proc.environ(), proc.pid) is None
                and not process_ended(proc)
                and owner_mismatch(proc, owner_uid) is None
            ):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def live_run_markers() -> dict[RunMarker, list[int]]:
    """Run marker (id and directory) -> the live processes carrying it, found in one pass over
    every process this user can read (zombies left out)."""
    found: dict[RunMarker, list[int]] = {}
    for proc in psutil.process_iter(["pid"]):
        try:
            marker = RunMarker.of_environ(proc.environ())
            if marker is not None and not process_ended(proc):
                found.setdefault(marker, []).append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def directory_owner(path: Path) -> int | None:
    """The uid that owns the directory ``path`` itself (never what a link there points to);
    None when it cannot be read."""
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None
