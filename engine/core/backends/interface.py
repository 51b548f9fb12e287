"""The one interface over where a run's ranks live (``engine.core.backends``): say whether a run
is its own, locate its processes, check and start it, start an ended run's next attempt
(``ddptui resume``), observe where it is, take its stacks, stop it, and describe where it runs;
and what a backend adds to ``ddptui run`` (``RunOptions``), declared as plain data. Plain Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from engine.core.backends.local.kill import KillResult
from engine.core.backends.local.start import StartedRun
from engine.core.common.statuses import StopRequester
from engine.core.config.schema import RunConfig
from engine.core.plan.resource_guard import ResourceCheck
from engine.core.plan.run_plan import RunPlan
from engine.core.procs.process_identity import ProcessRef
from engine.core.procs.stopping import STOP_GRACE_SECONDS
from engine.core.runs.placement import PlacementWatch
from engine.core.runs.run_handle import RunHandle
from engine.core.runs.run_info import RunInfo
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir
from engine.core.stacks.snapshot import StackSnapshot

# A process a run's records name: its global rank (None: a launcher) and who it is.
RecordedProcess = tuple[int | None, ProcessRef]


@dataclass(frozen=True)
class RunOption:
    """One option a backend adds to ``ddptui run``: it sets one key of the backend's own config
    section (``engine.core.config.backend_sections``)."""

    name: str  # as typed: "--nodes"
    key: str  # the config key it sets: "SECTION.nodes"
    help: str
    kind: str = "text"  # "text"; "count": a whole number from 1; "items": repeatable, a table
    metavar: str = ""
    # "items": one item ("KEY=VALUE") to a (key, value) of the table, or ConfigError (a sentence)
    parse_item: Callable[[str], tuple[str, str]] | None = None


@dataclass(frozen=True)
class RunOptions:
    """What a backend adds to ``ddptui run``: the flag that runs there, the options that set its
    section, and the help lines that teach them (``ddptui run --help`` prints them as they are,
    each line a line)."""

    flag: str  # "--NAME": run there
    help: str
    options: tuple[RunOption, ...]
    teaching: tuple[str, ...] = ()


@dataclass(frozen=True)
class AttemptPlan:
    """The next attempt of an ended run, checked where its backend would start it: one node's
    plan, the ranks of the whole run (0: each node decides its devices, as it starts), what the
    resource guard found (this machine's), and what the backend keeps for ``start_attempt``."""

    plan: RunPlan
    world_size: int
    resources: ResourceCheck | None = None
    detail: object = field(default=None, compare=False)


class Backend(Protocol):
    name: str  # run.json's placement.backend of its runs; the registry's key
    title: str  # how a sentence names where it runs ("this machine", a scheduler's name)
    # What the run observer asks of its runs (engine.core.runs.placement); None: a run of it
    # is decided as one of this machine's launcher
    watch: PlacementWatch | None
    run_options: RunOptions | None  # None: ddptui run needs no flag to run there

    def owns(self, info: RunInfo) -> bool:
        """Whether the run of this run.json is this backend's (where it is: ``backend_of``)."""
        ...

    def locate(self, run_dir: RunDir, info: RunInfo) -> tuple[RecordedProcess, ...]:
        """Every launcher (rank None) and rank process the run's records name, each with its
        global rank, wherever the backend keeps them; live or not is the caller's to check."""
        ...

    def check(self, config: RunConfig, runs_dir: Path) -> RunPlan:
        """``config`` checked as ``start`` would check it, nothing started: the plan of one
        node's share where the ranks are spread over nodes; ConfigError (one sentence) when it
        cannot run there."""
        ...

    def start(
        self,
        config: RunConfig,
        runs_dir: Path,
        *,
        run_id: str | None = None,
        gpu_count: int | None = None,
    ) -> StartedRun:
        """Check, make the run directory and start the run; ConfigError / RunDirError (one
        sentence, nothing started) when it cannot. ``gpu_count``: the GPUs this machine has, as
        the caller already counted them (None: counted here); a backend that places the ranks
        elsewhere goes by its own."""
        ...

    def plan_attempt(self, config: RunConfig, run_dir: RunDir) -> AttemptPlan:
        """The next attempt of the ended run in ``run_dir`` (its ``config``), checked as
        ``start`` would check a new run, nothing started or changed; ConfigError (one sentence)
        when it cannot run there now."""
        ...

    def start_attempt(
        self, run_dir: RunDir, config: RunConfig, planned: AttemptPlan, *, attempt: int,
        created: float,
    ) -> StartedRun:  # fmt: skip
        """Start attempt ``attempt`` of the run in its own run directory, the attempt before it
        moved below attempts/ already: run.json for it (``starting``, the run ``created`` then)
        and its launcher(s). OSError / RunDirError / ConfigError when it could not start."""
        ...

    def snapshot(
        self, run_dir: RunDir, *, reason: str, handle: RunHandle | None = None
    ) -> StackSnapshot | None:
        """Every live rank's stack now, judged and stored; None when none is alive. ``handle``:
        the caller's one look at the run (``engine.core.runs.run_handle``), taken instead of
        reading run.json and looking its processes up again."""
        ...

    def stop(
        self,
        run_dir: RunDir,
        grace: float = STOP_GRACE_SECONDS,
        *,
        allow_other_users: bool = False,
        by: StopRequester = StopRequester.KILL,
        handle: RunHandle | None = None,
    ) -> KillResult:
        """Stop exactly the run's processes, verified; the summary says killed. ``handle``: as
        ``snapshot``'s (made with the same ``allow_other_users``)."""
        ...

    def describe(self, state: RunState) -> tuple[str, ...]:
        """The lines ``ddptui show`` prints of where the observed run is (a label, padded to
        11 characters, then the text); none where its devices line says it all."""
        ...
