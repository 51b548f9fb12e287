"""summary.json's typed contents: the final status and figures of a run.

Plain Python, and only types: ``engine.core.runs.summarize`` builds a summary from a run directory,
``RunDir.read_summary`` reads one back into these same objects. The launcher writes it whatever
happens (completed, failed, killed); ``engine.core.runs.settle`` writes it for a run whose launcher
cannot (lost, or stopped by ``ddptui kill`` / ``clean`` after its launcher was gone).
"""

from __future__ import annotations

import functools
import signal
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from engine.core.common.statuses import RankStatus, RunStatus
from engine.core.common.strict_json import float_or_nan
from engine.core.runs.step_breakdown import StepBreakdown
from engine.core.stacks.snapshot import StackSnapshot


@dataclass(frozen=True)
class EpochFigures:
    """One epoch, reduced across ranks (slowest rank's seconds, all ranks' images)."""

    epoch: int
    seconds: float  # device-synchronised wall seconds, data loading included
    data_wait_seconds: float
    images: int
    steps: int
    warmup_steps: int  # left out of the steady-state figures
    steady_images_per_s: float
    steady_epoch_seconds: float  # images / steady_images_per_s: the epoch without warm-up
    train_loss: float
    test_accuracy: float | None = None
    test_loss: float | None = None
    attempt: int = 1  # the attempt of the run that trained it
    # the step it began at: above 0 when an attempt resumed inside it (its figures are of the
    # steps from there; steady_epoch_seconds is still a whole epoch's, at that pace)
    first_step: int = 0

    @property
    def whole_images(self) -> float:
        """The images of the whole epoch (``images`` are of the steps taken from ``first_step``)."""
        return self.images * (self.first_step + self.steps) / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class Failure:
    """The root cause of a failed run: the first rank to fail; ``rank`` None with
    ``every_rank``: every rank failed with the same error (the run's configuration or code, no
    one rank's fault), with ``node``: that node was lost (its scheduler counted it down), else
    the launcher."""

    rank: int | None
    exitcode: int | None = None
    signal: str | None = None
    error: str = ""
    traceback: str = ""
    node: str = ""  # the node of that rank, in a run across nodes
    every_rank: bool = False

    @property
    def who(self) -> str:
        """Whose failure it is, in words: "rank 1", "rank 1 on n2" across nodes, "every rank",
        "node n2" (a node lost), "the launcher"."""
        if self.rank is not None:
            return f"rank {self.rank} on {self.node}" if self.node else f"rank {self.rank}"
        if self.every_rank:
            return "every rank"
        return f"node {self.node}" if self.node else "the launcher"


class AttemptStart(str, Enum):
    """How an attempt of a run began."""

    FIRST = "first"  # ddptui run (or the UI's launch)
    RESTART = "restart"  # the launcher, after a failure (supervision.max_restarts)
    RESUME = "resume"  # ddptui resume (or the UI's resume)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class AttemptRecord:
    """One start of a run and how it ended: summary.json keeps one per attempt, in order."""

    attempt: int
    status: RunStatus
    started: float
    finished: float
    start: AttemptStart = AttemptStart.FIRST
    from_step: int | None = None  # the checkpoint's global step it went on from; None: step 0
    reached_step: int | None = None  # where it ended: its failure's step, else its last report
    step_exact: bool = False  # reached_step is the step it failed at (not its last report)
    reason: str = ""  # why it ended so (a failed or killed attempt)
    failure: Failure | None = None
    # where it ran, when a backend placed it elsewhere: "n1, n2 (job 4242)"; "" on this machine
    where: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", RunStatus(self.status))
        object.__setattr__(self, "start", AttemptStart(self.start))

    def describe(self) -> str:
        """ "attempt 1 failed at step 4,812: rank 3: CUDA error ...", "attempt 2 resumed from step
        4,800 (ddptui resume), completed"; on a scheduler's nodes, where: "attempt 2 resumed from
        step 40 (restart) on n1, n2 (job 4243), completed"."""
        began = ""
        if self.start != AttemptStart.FIRST:
            how = "restart" if self.start == AttemptStart.RESTART else "ddptui resume"
            where = f"from step {self.from_step:,}" if self.from_step else "from step 0"
            began = f" resumed {where} ({how})"
        if self.where:
            began += f" on {self.where}"
        ended = f" {self.status}"
        if self.status != RunStatus.COMPLETED and self.reached_step is not None:
            ended += f" {'at' if self.step_exact else 'after'} step {self.reached_step:,}"
        why = ""
        if self.failure is not None and self.failure.error:
            who, error = self.failure.who, self.failure.error
            why = f": {error}" if error.startswith(who) else f": {who}: {error}"
        elif self.reason and self.status != RunStatus.COMPLETED:
            why = f": {self.reason}"
        return f"attempt {self.attempt}{began}{',' if began else ''}{ended}{why}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["failure"] = asdict(self.failure) if self.failure else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttemptRecord:
        values = _known(cls, data)
        failure = data.get("failure")
        values["failure"] = Failure(**_known(Failure, failure)) if failure else None
        return cls(**values)


@dataclass(frozen=True)
class RankReached:
    """How far one rank got, for a run whose launcher could not say (a ``lost`` run)."""

    rank: int
    state: RankStatus  # the state the run observer saw it end in
    epoch: int | None = None  # counted from 0, as in the events
    step: int | None = None  # steps done in that epoch
    steps: int | None = None  # steps in that epoch
    global_step: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", RankStatus(self.state))  # the word, typed where made

    def describe(self) -> str:
        if self.epoch is None:
            return f"rank {self.rank} had not started training"
        of = f"/{self.steps}" if self.steps is not None else ""
        return f"rank {self.rank} reached epoch {self.epoch + 1} step {self.step or 0}{of}"


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    preset: str
    status: RunStatus  # completed | failed | killed | lost
    strategy: str
    precision: str
    model: str
    dataset: str
    devices: str  # "cpu:2", "gpu:0,1"
    device_count: int
    world_size: int
    global_batch: int
    started: float
    finished: float = field(default_factory=time.time)
    elapsed_seconds: float = 0.0
    epochs: tuple[EpochFigures, ...] = ()
    failure: Failure | None = None
    reason: str = ""  # one sentence for killed / failed / lost runs
    launcher_end: str = ""  # lost runs: how the launcher ended, as far as can be told
    ranks: tuple[RankReached, ...] = ()  # lost runs: how far each rank got
    diagnosis: StackSnapshot | None = None  # the last stack snapshot of the ranks, if one was taken
    global_steps: int | None = None  # optimizer steps rank 0 reported (a script's only figure)
    warnings: tuple[str, ...] = ()  # one sentence each: what a reader must know of the figures
    # one sentence each: a process of the run alive when its ranks had ended, and what became of it
    leftovers: tuple[str, ...] = ()
    # a script's: what rank 0 last reported with ddptui.report (its own figures, named its way)
    reported: dict[str, float] = field(default_factory=dict)
    # Cores other processes kept busy while it ran, when a bench measured it (never in the run's
    # own summary.json: a bench adds it to the copy it records).
    outside_load_cores: float | None = None
    # Each rank's step split over the whole run, and the run's bottleneck in one sentence
    # (engine.core.runs.step_breakdown); empty where no step was timed.
    step_breakdown: tuple[StepBreakdown, ...] = ()
    bottleneck: str = ""
    # The run's attempts, in order (its first; a restart or ``ddptui resume`` adds one), each with
    # how it ended; () in a summary from before attempts. ``attempt``: the one this summary ends.
    attempt: int = 1
    attempts: tuple[AttemptRecord, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", RunStatus(self.status))  # the word, typed where made

    @property
    def last_epoch(self) -> EpochFigures | None:
        return self.epochs[-1] if self.epochs else None

    @property
    def table_epoch(self) -> EpochFigures | None:
        """The figures a speedup table shows: the last epoch of the attempt that ended the run
        (an earlier, failed attempt's steps never count), None when it trained no epoch."""
        mine = [e for e in self.epochs if e.attempt == self.attempt]
        return mine[-1] if mine else None

    @property
    def test_accuracy(self) -> float | None:
        return self.last_epoch.test_accuracy if self.last_epoch else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["epochs"] = [asdict(e) for e in self.epochs]
        data["ranks"] = [asdict(r) for r in self.ranks]
        data["diagnosis"] = self.diagnosis.to_json() if self.diagnosis else None
        data["step_breakdown"] = [b.to_json() for b in self.step_breakdown]
        data["attempts"] = [a.to_json() for a in self.attempts]
        data["test_accuracy"] = self.test_accuracy
        if self.failure is not None and not self.failure.node:
            del data["failure"]["node"]  # a run across nodes only
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        """The summary ``to_json`` wrote. Keys this version does not know are ignored; a missing
        key or a value of the wrong kind raises KeyError, TypeError or ValueError."""
        values = _known(cls, data)
        values["status"] = RunStatus(data["status"])
        values["epochs"] = tuple(
            EpochFigures(**_known(EpochFigures, e)) for e in data.get("epochs") or []
        )
        values["ranks"] = tuple(
            RankReached(**{**_known(RankReached, r), "state": RankStatus(r["state"])})
            for r in data.get("ranks") or []
        )
        values["warnings"] = tuple(str(w) for w in data.get("warnings") or ())
        values["leftovers"] = tuple(str(w) for w in data.get("leftovers") or ())
        values["step_breakdown"] = tuple(
            StepBreakdown.from_json(b) for b in data.get("step_breakdown") or ()
        )
        values["attempts"] = tuple(AttemptRecord.from_json(a) for a in data.get("attempts") or ())
        failure = data.get("failure")
        values["failure"] = Failure(**_known(Failure, failure)) if failure else None
        diagnosis = data.get("diagnosis")
        values["diagnosis"] = StackSnapshot.from_json(diagnosis) if diagnosis else None
        return cls(**values)


def _known(cls: type, data: Any) -> dict[str, Any]:
    """The keys of ``data`` that ``cls`` has; a float written as null (a NaN or an infinity, see
    ``engine.core.common.strict_json``) reads back as NaN."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: expected a JSON object, found {type(data).__name__}")
    names, floats = _fields_of(cls)
    return {k: float_or_nan(v) if k in floats else v for k, v in data.items() if k in names}


@functools.cache
def _fields_of(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """(every field, the float ones) of the dataclass ``cls``: worked out once per class, a
    listing reads a thousand summaries."""
    fields = cls.__dataclass_fields__  # type: ignore[attr-defined]
    return frozenset(fields), frozenset(k for k, f in fields.items() if f.type == "float")


def exit_status(code: int | None) -> tuple[int | None, str | None]:
    """(exit code, signal name) of a waited-for process; a negative code is a signal."""
    if code is None:
        return None, None
    if code >= 0:
        return code, None
    try:
        return None, signal.Signals(-code).name
    except ValueError:
        return None, f"signal {-code}"
