"""One look at a run before an operation acts on it: run.json, the run marker, whose processes may
be the run's, and the processes run.json names, each looked up once and proved (or not) to be the
run's, read once and passed down for the rest of the operation: ``ddptui kill`` (its status, its
targets, its stacks), ``ddptui stacks`` and the UI's stacks and kill. So nothing reads run.json,
looks a process up or scans /proc for the marker twice before it acts.

Two parts of the look are taken the first time they are asked for, then kept: ``processes`` (the
one scan of /proc for every other process carrying the marker: a stop needs it, a stack
snapshot does not) and ``state`` (the run observer's verdict, from this look's run.json and
processes). ``refreshed()`` is a second look, for an operation that must look again after acting
(a kill's sweep after stopping is one, by design).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

import psutil

from engine.core.common.statuses import ProcessState
from engine.core.procs.process_identity import ProcessRef, identify, lookup
from engine.core.procs.run_proof import RunMarker, directory_owner, marked_processes, prove
from engine.core.procs.stopping import protected_pids
from engine.core.runs.observer import RunObserver
from engine.core.runs.run_info import RunInfo
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir

Proved = tuple[psutil.Process, str]  # a live process proved to be the run's, and its role


@dataclass(frozen=True)
class RunHandle:
    run_dir: RunDir
    info: RunInfo
    marker: RunMarker
    owner_uid: int | None  # whose processes may be the run's; None: anyone's (root, all users)
    named: tuple[Proved, ...]  # the launcher and ranks run.json names that proved the run's
    skipped: tuple[str, ...]  # one sentence each: a pid run.json names that is left alone
    # rank -> why its process is not provably the run's ("" when proved or simply ended)
    rank_refusals: dict[int, str] = field(default_factory=dict)
    looked: dict[ProcessRef, ProcessState] = field(default_factory=dict)  # each named process
    protected: frozenset[int] = frozenset()  # never the run's: this process and its ancestors

    def alive(self, ref: ProcessRef) -> bool:
        """Whether a process run.json names was alive at this look (not looked up again)."""
        state = self.looked.get(ref)
        return state is not None and state.alive

    @cached_property
    def processes(self) -> tuple[Proved, ...]:
        """Every live process proved to be the run's, with its role: the named ones, then every
        other process carrying the run's marker (``protected`` left out), from one scan of
        /proc made the first time this is asked."""
        found = {proc.pid: (proc, role) for proc, role in self.named}
        for proc in marked_processes(self.marker, owner_uid=self.owner_uid, exclude=self.protected):
            found.setdefault(proc.pid, (proc, "marked"))
        return tuple(found.values())

    @cached_property
    def state(self) -> RunState:
        """The run observer's verdict on this look: its run.json and the processes it looked up,
        neither read nor looked up again (config.toml, summary.json and the events are read the
        first time this is asked)."""
        return RunObserver(self.run_dir).observe(self.info, self.looked)

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
    run_dir: RunDir, protected: frozenset[int] | None = None, *, allow_other_users: bool = False
) -> RunHandle:
    """The run as it is now: run.json read once (RunDirError: the caller says so and stops), and
    the launcher and ranks it names each looked up once and proved to be the run's (pid, start
    time, marker, owner) or not. ``protected`` (this process and its ancestors when None) is
    never taken for one of the run's processes."""
    info = run_dir.read_run_info()
    marker = RunMarker.of_dir(run_dir.path)
    owner = None if allow_other_users else directory_owner(run_dir.path)
    named: dict[int, Proved] = {}
    skipped: list[str] = []
    refusals: dict[int, str] = {}
    looked: dict[ProcessRef, ProcessState] = {}
    recorded: list[tuple[ProcessRef, str, int | None]] = []
    recorded += [(info.launcher, "launcher", None)] if info.launcher is not None else []
    recorded += [(ref, f"rank {rank}", rank) for rank, ref in info.ranked()]
    for ref, role, rank in recorded:
        found = lookup(ref)
        looked[ref] = found[0]
        proc, why = prove(ref, marker, owner, found)
        if rank is not None:
            refusals[rank] = why
        if why:
            skipped.append(_left_alone(ref, role, why))
        if proc is not None:
            named[proc.pid] = (proc, role)
    return RunHandle(
        run_dir,
        info,
        marker,
        owner,
        tuple(named.values()),
        tuple(skipped),
        refusals,
        looked,
        frozenset(protected_pids()) if protected is None else protected,
    )
