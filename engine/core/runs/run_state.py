"""What one observation of a run says (``RunState``): its status and why, each rank's state, its
figures, its summary (or the one built for a lost run, ``unsettled``), where its backend placed
it, its attempts and its step split; and the one JSON shape ``ddptui show --json`` prints. Made
by the run observer (``engine.core.runs.observer``), the one place that decides it; read by every
surface. Plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.common.statuses import RankStatus, RunStatus
from engine.core.config.devices import DevicePlan
from engine.core.runs.placement import PlacementView
from engine.core.runs.rank_states import RankState
from engine.core.runs.run_listing import RunListing
from engine.core.runs.rundir import RunInfo
from engine.core.runs.step_breakdown import Bottleneck, StepBreakdown
from engine.core.runs.step_curves import StepCurves
from engine.core.runs.summary import AttemptRecord, Failure, RunSummary
from engine.core.stacks.snapshot import StackSnapshot


@dataclass(frozen=True)
class RunState:
    """One run at one moment: what ``ddptui runs`` lists, ``ddptui show`` prints, the UI draws and
    the follower prints."""

    run_id: str
    path: Path
    status: RunStatus
    reason: str = ""  # why that status, one sentence (a final run: its summary's reason)
    preset: str = ""
    created: float | None = None
    devices: str = ""
    world_size: int = 0
    info: RunInfo | None = None
    launcher_alive: bool | None = None  # None: no launcher recorded (yet), or not asked
    ranks: tuple[RankState, ...] = ()
    summary: RunSummary | None = None  # summary.json, or the lost one built when it is missing
    failure: Failure | None = None  # the root cause: the summary's, else the first failed rank
    started: float | None = None
    elapsed: float | None = None
    eta: float | None = None  # seconds, while running and every rank's pace is known
    now: float = 0.0
    epochs: int = 0  # from config.toml
    accuracy: float | None = None
    notices: tuple[str, ...] = ()
    events_read: int = 0
    skipped_lines: int = 0  # event lines this ddptui could not read (counted, never hidden)
    diagnosis: StackSnapshot | None = None  # the latest stack snapshot of its ranks, if any
    script: str = ""  # the user's script it runs ("" for the engine's workload)
    metrics_reported: bool = False  # the script called ddptui.report: loss, accuracy, images/s
    problem: str = ""  # what could not be read (a corrupt run.json or summary.json)
    # The end this observation found that no one has written down (a lost run's summary, the
    # summary of a run its backend says is over): what ``engine.core.runs.settle.Settler`` writes
    # when a caller asks.
    unsettled: RunSummary | None = None
    unsaved: str = ""  # a settler could not write the summary shown here (a full disk), and why
    # Where another backend placed it (engine.core.runs.placement): its job, its nodes, ...
    placement: PlacementView | None = None
    # Each rank's step split (recent while it runs, the whole run's once it ended), the cause
    # it names, and the per-step curves (engine.core.runs.step_breakdown, step_curves).
    step_breakdown: tuple[StepBreakdown, ...] = ()
    bottleneck: Bottleneck | None = None
    curves: StepCurves = field(default_factory=StepCurves)
    # Its attempt now (a restart or ``ddptui resume`` adds one), and every attempt known: all of
    # them once it ended (its summary's), the earlier ones while it goes.
    attempt: int = 1
    attempts: tuple[AttemptRecord, ...] = ()

    @property
    def final(self) -> bool:
        return self.status.final

    @property
    def active(self) -> bool:
        return self.status.active

    @property
    def across_nodes(self) -> bool:
        """Its ranks are on other machines (a scheduler's nodes), each sampling its own GPUs."""
        return self.placement is not None and self.placement.across_nodes

    @property
    def stalled_ranks(self) -> tuple[int, ...]:
        return tuple(r.rank for r in self.ranks if r.state == RankStatus.STALLED)

    @property
    def straggler_ranks(self) -> tuple[int, ...]:
        return tuple(r.rank for r in self.ranks if r.state == RankStatus.STRAGGLER)

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """The NVML indices of the run's GPUs: from its devices, else what its ranks reported."""
        plan = DevicePlan.from_description(self.devices)
        if plan is not None and plan.kind == "cuda":
            return plan.gpu_indices
        return tuple(sorted({r.gpu_index for r in self.ranks if r.gpu_index is not None}))

    def to_json(self) -> dict[str, Any]:
        """``ddptui show --json``: the run in the one JSON shape of a run (``RunListing``'s, what
        ``ddptui runs --json`` lists), then what only an observation holds."""
        return {
            **RunListing.of(self).to_json(),
            "launcher_alive": self.launcher_alive,
            "ranks": [r.to_json() for r in self.ranks],
            "summary": self.summary.to_json() if self.summary else None,
            "diagnosis": self.diagnosis.to_json() if self.diagnosis else None,
            "step_breakdown": [b.to_json() for b in self.step_breakdown],
            "bottleneck": self.bottleneck.sentence if self.bottleneck else "",
            "attempts": [a.to_json() for a in self.attempts],
        }
