"""One look at a run before an operation acts on it: run.json, the run marker, whose processes may
be the run's, and the live processes that prove to be the run's (each with its role), read once
and passed down, so a ``ddptui kill`` does not read run.json and scan /proc again for its stacks.

``refreshed()`` is a second look, for an operation that must look again after acting (a kill's
sweep after stopping is one, by design).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import psutil

from engine.core.procs.process_identity import ProcessRef, identify
from engine.core.procs.run_proof import RunMarker, directory_owner, marked_processes, prove
from engine.core.runs.run_info import RunInfo
from engine.core.runs.rundir import RunDir


@dataclass(frozen=True)
class RunHandle:
    run_dir: RunDir
    info: RunInfo
    marker: RunMarker
    owner_uid: int | None  # whose processes may be the run's; None: anyone's (root, all users)
    processes: tuple[tuple[psutil.Process, str], ...]  # proved live processes and their roles
    skipped: tuple[str, ...]  # one sentence each: a pid run.json names that is left alone
    # rank -> why its process is not provably the run's ("" when proved or simply ended)
    rank_refusals: dict[int, str] = field(default_factory=dict)
    protected: frozenset[int] = frozenset()

    def refreshed(self) -> RunHandle:
        """A second look: run.json and the processes again (after acting)."""
        return observe_handle(
            self.run_dir, self.protected, allow_other_users=self.owner_uid is None
        )


def _left_alone(ref: ProcessRef, role: str, why: str) -> str:
    if why.endswith("now belongs to another process"):
        now = identify(ref.pid)
        if now is not None:
            why += f", started {time.strftime('%H:%M:%S', time.localtime(now.start_time))}"
    return f"{why} ({role} in run.json): left alone"


def observe_handle(
    run_dir: RunDir, protected: frozenset[int] = frozenset(), *, allow_other_users: bool = False
) -> RunHandle:
    """The run as it is now: run.json read once (RunDirError: the caller says so and stops), the
    launcher and ranks it names proved to be the run's (pid, start time, marker, owner), and every
    other process carrying the run's marker (one scan of /proc), ``protected`` left out."""
    info = run_dir.read_run_info()
    marker = RunMarker.of_dir(run_dir.path)
    owner = None if allow_other_users else directory_owner(run_dir.path)
    found: dict[int, tuple[psutil.Process, str]] = {}
    skipped: list[str] = []
    refusals: dict[int, str] = {}
    named: list[tuple[ProcessRef, str, int | None]] = []
    named += [(info.launcher, "launcher", None)] if info.launcher is not None else []
    named += [(ref, f"rank {rank}", rank) for rank, ref in info.ranked()]
    for ref, role, rank in named:
        proc, why = prove(ref, marker, owner)
        if rank is not None:
            refusals[rank] = why
        if why:
            skipped.append(_left_alone(ref, role, why))
        if proc is not None:
            found[proc.pid] = (proc, role)
    for proc in marked_processes(marker, owner_uid=owner, exclude=protected):
        found.setdefault(proc.pid, (proc, "marked"))
    return RunHandle(
        run_dir, info, marker, owner, tuple(found.values()), tuple(skipped), refusals, protected
    )
