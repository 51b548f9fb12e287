"""Where each rank's step goes, and which rank is slow and why: the one place a run's bottleneck is
decided, for the Run screen, ``ddptui show``, summary.json and the speedup table alike.

Every rank times its steps with global hooks (``engine.train.step_timing``) and reports, a few
times a second, the mean seconds per step of each part (``StepBreakdownReported``):

``data``       from the end of the previous optimizer step to the first forward of this one
``forward``    the outermost forward calls of modules with parameters
``backward``   from the last forward to the optimizer step: the loss, backward, and the gradient
               sync it waits for (unless timed on its own)
``sync``       the gradient sync backward waited for, where the engine owns the DDP module and
               times it with a communication hook; absent for a user's script
``optimizer``  the optimizer step
``other``      the rest: between two forwards of one step, or a step whose forward was not seen

The parts of one step add up to it, from one optimizer step to the next. A rank times one step in
N (every one of its first steps), each timed step standing for itself and the untimed steps
before it, so a report's figures are means over all the steps since the previous report:
``StepBreakdownFold`` weights each by those steps, as the step reports' own step time is
weighted, into each rank's ``StepBreakdown`` (over the whole run, and over its recent reports
while it runs); ``find_bottleneck`` names the cause from them.

Plain Python, pure: no I/O, so the observer, the summary and the tests feed it events they read.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.core.common.statuses import Vocabulary
from engine.core.common.step_split import StepPart, StepSplit
from engine.core.common.strict_json import float_or_nan
from engine.core.runs.events import Event, StepBreakdownReported, StepProgress

# Fewer timed steps than this on a rank: its split is too thin to judge the run by.
MIN_TIMED_STEPS = 3
# A rank is input-bound when data wait is at least this share of its step and this many times
# the others' median share (and at least INPUT_MARGIN above it).
INPUT_SHARE = 0.25
INPUT_AGAINST = 2.5
INPUT_MARGIN = 0.15
# A rank computes slowly when its compute time is at least this many times the others' median,
# and the excess at least this share of its step (a slower forward in a step that mostly waits
# for data is not what slows the run).
COMPUTE_FACTOR = 1.5
COMPUTE_MARGIN = 0.10
# Every rank waiting at least this share of its step in gradient sync: communication-bound.
SYNC_SHARE = 0.30
# Every rank waiting at least this share of its step for data: input-bound as a whole.
ALL_INPUT_SHARE = 0.30
# The recent reports a live rank's split is the mean of (a few seconds of training).
RECENT_REPORTS = 8


# the parts of a step read back as floats (the sync's is None where it was not timed apart):
# worked out once, a listing reads thousands of breakdowns
_TIMED_PARTS = tuple(part.value for part in StepPart if part != StepPart.SYNC)


@dataclass(frozen=True)
class StepBreakdown:
    """One rank's step, split: mean seconds per step of each part over ``steps`` steps, from the
    ``timed`` ones among them.

    ``step_seconds`` is the rank's step time as its step reports measured it (every step, not
    only the timed ones), when known: what the parts are checked against.
    """

    rank: int
    steps: int
    timed: int
    data: float
    forward: float
    backward: float
    sync: float | None
    optimizer: float
    other: float
    clock: str = "cpu"  # "cuda": GPU time, from CUDA events
    step_seconds: float | None = None

    @property
    def split(self) -> StepSplit:
        return StepSplit.of(self)

    def parts(self) -> dict[StepPart, float]:
        """Seconds per step of each part, in step order; sync only where it was timed."""
        return self.split.parts()

    @property
    def total(self) -> float:
        """Seconds of a timed step: the parts added up."""
        return sum(self.parts().values())

    def share(self, part: StepPart) -> float:
        """``part``'s share of the step, 0..1 (0 for sync where it was not timed)."""
        total = self.total
        return self.parts().get(part, 0.0) / total if total > 0 else 0.0

    @property
    def sync_timed(self) -> bool:
        return self.sync is not None

    @property
    def compute(self) -> float:
        """The rank's own work: forward and backward where the sync is timed apart; forward
        alone where it is not (a backward then holds the wait for slower peers)."""
        return self.forward + self.backward if self.sync_timed else self.forward

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepBreakdown:
        """What ``to_json`` wrote; unknown keys are ignored, a missing one raises TypeError."""
        if not isinstance(data, dict):
            raise TypeError(f"step_breakdown: expected a JSON object, found {type(data).__name__}")
        known = cls.__dataclass_fields__
        values = {k: v for k, v in data.items() if k in known}
        for name in _TIMED_PARTS:
            if name in values:
                values[name] = float_or_nan(values[name])
        return cls(**values)


# ---- folding events ------------------------------------------------------------------------


@dataclass
class _PartSums:
    """Seconds of each part summed over timed steps (a mean per event, weighted by its steps)."""

    steps: int = 0
    timed: int = 0
    seconds: StepSplit = field(default_factory=StepSplit)
    clock: str = "cpu"

    def add(self, e: StepBreakdownReported) -> None:
        if e.steps <= 0 or e.timed <= 0:
            return
        self.steps += e.steps
        self.timed += e.timed
        self.clock = e.clock
        self.seconds = self.seconds.plus(e.split.times(e.steps))

    def breakdown(self, rank: int, step_seconds: float | None) -> StepBreakdown | None:
        if self.steps <= 0:
            return None
        return StepBreakdown(
            rank=rank,
            steps=self.steps,
            timed=self.timed,
            clock=self.clock,
            step_seconds=step_seconds,
            **self.seconds.mean_over(self.steps).fields(),
        )


@dataclass
class _RankSteps:
    """One rank's step reports: its step time over every step it reported."""

    last_global_step: int = 0
    steps: int = 0
    seconds: float = 0.0

    def add(self, e: StepProgress) -> None:
        # A report covers the steps since the previous one (an engine's epoch starts a new
        # window at its first step, which the previous epoch's last report ended on).
        steps = e.global_step - self.last_global_step
        self.last_global_step = e.global_step
        if steps > 0 and e.step_seconds > 0:
            self.steps += steps
            self.seconds += e.step_seconds * steps

    @property
    def step_seconds(self) -> float | None:
        return self.seconds / self.steps if self.steps else None


@dataclass
class StepBreakdownFold:
    """Folds a run's events into each rank's step split. Feed it every event once (any order of
    files; each rank's own events in order); ask ``whole_run`` or ``recent`` any time."""

    _whole: dict[int, _PartSums] = field(default_factory=dict)
    _recent: dict[int, deque[StepBreakdownReported]] = field(default_factory=dict)
    _steps: dict[int, _RankSteps] = field(default_factory=dict)

    def feed(self, event: Event) -> None:
        if isinstance(event, StepBreakdownReported):
            self._whole.setdefault(event.rank, _PartSums()).add(event)
            self._recent.setdefault(event.rank, deque(maxlen=RECENT_REPORTS)).append(event)
        elif isinstance(event, StepProgress):
            self._steps.setdefault(event.rank, _RankSteps()).add(event)

    def feed_all(self, events: Iterable[Event]) -> None:
        for e in events:
            self.feed(e)

    def _step_seconds(self, rank: int) -> float | None:
        steps = self._steps.get(rank)
        return steps.step_seconds if steps is not None else None

    def whole_run(self) -> tuple[StepBreakdown, ...]:
        """Each rank's split over every step it timed (what summary.json keeps)."""
        found = (sums.breakdown(r, self._step_seconds(r)) for r, sums in self._whole.items())
        return tuple(sorted((b for b in found if b is not None), key=lambda b: b.rank))

    def recent(self) -> tuple[StepBreakdown, ...]:
        """Each rank's split over its last ``RECENT_REPORTS`` reports (a live run's now)."""
        out = []
        for rank, reports in self._recent.items():
            sums = _PartSums()
            for e in reports:
                sums.add(e)
            breakdown = sums.breakdown(rank, self._step_seconds(rank))
            if breakdown is not None:
                out.append(breakdown)
        return tuple(sorted(out, key=lambda b: b.rank))


# ---- the cause -----------------------------------------------------------------------------


class BottleneckKind(Vocabulary):
    INPUT_BOUND_RANK = "input-bound rank"  # one rank waits for its data
    COMPUTE_RANK = "compute on one rank"  # one rank computes slower than the others
    COMMUNICATION_BOUND = "communication-bound"  # every rank waits in gradient sync
    INPUT_BOUND = "input-bound"  # every rank waits for its data
    BALANCED = "balanced"  # nothing stands out: where the step goes, in words


@dataclass(frozen=True)
class Bottleneck:
    kind: BottleneckKind
    sentence: str
    rank: int | None = None  # the slow rank, for the causes that name one


def _percent(share: float) -> str:
    return f"{round(100 * share)} %"


def find_bottleneck(breakdowns: Sequence[StepBreakdown]) -> Bottleneck | None:
    """The run's bottleneck from its ranks' splits, in one sentence; None while no rank has
    timed ``MIN_TIMED_STEPS`` steps. A slow rank is named before what every rank shares."""
    ranks = [b for b in breakdowns if b.timed >= MIN_TIMED_STEPS and b.total > 0]
    if not ranks:
        return None
    return (
        _input_bound_rank(ranks)
        or _compute_rank(ranks)
        or _communication_bound(ranks)
        or _input_bound(ranks)
        or _balanced(ranks)
    )


def _others(ranks: Sequence[StepBreakdown], rank: int) -> list[StepBreakdown]:
    return [b for b in ranks if b.rank != rank]


def _input_bound_rank(ranks: Sequence[StepBreakdown]) -> Bottleneck | None:
    if len(ranks) < 2:
        return None
    found = []
    for b in ranks:
        mine = b.share(StepPart.DATA)
        others = statistics.median(o.share(StepPart.DATA) for o in _others(ranks, b.rank))
        if mine >= INPUT_SHARE and mine >= INPUT_AGAINST * others and mine - others >= INPUT_MARGIN:
            found.append((mine, others, b.rank))
    if not found:
        return None
    mine, others, rank = max(found)
    return Bottleneck(
        BottleneckKind.INPUT_BOUND_RANK,
        f"rank {rank}: data wait {_percent(mine)} of its step against {_percent(others)} on the "
        "others: input-bound",
        rank,
    )


def _compute_rank(ranks: Sequence[StepBreakdown]) -> Bottleneck | None:
    if len(ranks) < 2:
        return None
    found = []
    for b in ranks:
        others = statistics.median(o.compute for o in _others(ranks, b.rank))
        excess = b.compute - others
        if (
            others > 0
            and b.compute >= COMPUTE_FACTOR * others
            and excess >= COMPUTE_MARGIN * b.total
        ):
            found.append((b.compute / others, b.rank, b.sync_timed))
    if not found:
        return None
    ratio, rank, sync_timed = max(found)
    what = "forward and backward take" if sync_timed else "forward takes"
    return Bottleneck(
        BottleneckKind.COMPUTE_RANK,
        f"rank {rank}'s {what} {ratio:.1f}x the others': slower device or a neighbour on its cores",
        rank,
    )


def _every(ranks: Sequence[StepBreakdown]) -> str:
    return "every rank waits" if len(ranks) > 1 else f"rank {ranks[0].rank} waits"


def _communication_bound(ranks: Sequence[StepBreakdown]) -> Bottleneck | None:
    if not all(b.sync_timed for b in ranks):
        return None
    least = min(b.share(StepPart.SYNC) for b in ranks)
    if least < SYNC_SHARE:
        return None
    return Bottleneck(
        BottleneckKind.COMMUNICATION_BOUND,
        f"{_every(ranks)} {_percent(least)} of its step in gradient sync: communication-bound",
    )


def _input_bound(ranks: Sequence[StepBreakdown]) -> Bottleneck | None:
    least = min(b.share(StepPart.DATA) for b in ranks)
    if least < ALL_INPUT_SHARE:
        return None
    return Bottleneck(
        BottleneckKind.INPUT_BOUND,
        f"{_every(ranks)} {_percent(least)} of its step for data: input-bound",
    )


def _balanced(ranks: Sequence[StepBreakdown]) -> Bottleneck:
    shares = {
        part: statistics.mean(b.share(part) for b in ranks)
        for part in StepPart
        if part != StepPart.SYNC or all(b.sync_timed for b in ranks)
    }
    part, share = max(shares.items(), key=lambda item: item[1])
    who = "no rank stands out" if len(ranks) > 1 else f"rank {ranks[0].rank}"
    return Bottleneck(
        BottleneckKind.BALANCED,
        f"{who}: the step goes mostly to {part} ({_percent(share)})",
    )
