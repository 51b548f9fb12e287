"""Per-rank state from a run's events: where each rank is and whether it is stalled, straggling,
failed, done or stopped. The stall and straggler rules live here, once; the run observer
(``engine.core.runs.observer``) and the launcher's supervision both ask ``RankStateTracker``.

Pure logic: it folds events fed to it (rank and launcher events, in any order of files) and answers
``states(now, ...)``, with no I/O, so every caller can feed it events it already reads.

Per-rank states (``RankStatus``):

``starting``   no event from the rank yet
``running``    reporting
``stalled``    silent for ``stall_seconds`` (plus a start-up allowance before its first event):
               judged by the launcher, which reports it (``RankStalled``), or by a reader once
               the launcher is gone and cannot
``straggler``  its latest step time is over ``straggler_factor`` times the median of the other
               live ranks' latest step times
``failed``     it reported an error, or it was the first to exit badly (the root cause)
``done``       it finished (``RankFinished`` or a clean exit)
``stopped``    ended by a signal after another rank failed or the run was killed
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.common.statuses import RankStatus, RunStatus
from engine.core.config.schema import RunConfig
from engine.core.procs.process_identity import ProcessUsage
from engine.core.runs.event_notices import event_notice
from engine.core.runs.events import (
    CheckpointSaved,
    EpochStarted,
    Evaluation,
    Event,
    MetricsReported,
    PhaseStarted,
    RankExited,
    RankFailed,
    RankFinished,
    RankStalled,
    RankStarted,
    RankStraggling,
    RunFinished,
    RunStarted,
    StepProgress,
    StopSignalled,
)
from engine.core.runs.root_cause import RankEnd, root_failure, stopped
from engine.core.runs.summary import Failure, RankReached

# Before its first event a rank imports torch and loads its data: silence is expected that long.
STARTUP_ALLOWANCE_SECONDS = 60.0
NOTICES_KEPT = 20
REPORT_TIMES_KEPT = 8


# A rank this many of its step gaps late is probed (a look at the stacks decides, not a rule).
PROBE_PACE_MULTIPLE = 3.0

# The engine's known slow phases: no step report is due while a rank is in one.
SLOW_PHASES = frozenset({"setup", "warmup", "evaluation", "checkpoint"})
TRAINING = "training"


@dataclass(frozen=True)
class Thresholds:
    """When silence is a stall and slowness a straggler (a preset's ``[supervision]``).

    ``stall_seconds`` > 0 is a fixed threshold; 0 follows the run's own pace: ``stall_pace_multiple``
    times the rank's expected gap between step reports (the longest recent gap, or its step time),
    never below ``stall_floor_seconds``, and ``slow_phase_seconds`` while it is in a slow phase."""

    stall_seconds: float = 0.0
    straggler_factor: float = 2.0
    stall_floor_seconds: float = 10.0
    stall_pace_multiple: float = 10.0
    slow_phase_seconds: float = 600.0

    @classmethod
    def of(cls, config: RunConfig) -> Thresholds:
        sup = config.supervision
        return cls(
            stall_seconds=sup.stall_seconds,
            straggler_factor=sup.straggler_factor,
            stall_floor_seconds=sup.stall_floor_seconds,
            stall_pace_multiple=sup.stall_pace_multiple,
            slow_phase_seconds=sup.slow_phase_seconds,
        )

    def describe(self) -> str:
        """The two rules in words (``ddptui show``)."""
        silent = (
            f"{self.stall_seconds:g} s"
            if self.stall_seconds > 0
            else f"{self.stall_pace_multiple:g}x its recent step gap (at least "
            f"{self.stall_floor_seconds:g} s)"
        )
        return (
            f"stalled when silent {silent}, straggler at {self.straggler_factor:g}x the median step"
        )

    def probe_after(self, expected_gap: float | None) -> float:
        """Seconds of silence, in any phase, after which the launcher looks at the rank's stacks
        (``engine.core.stacks.stall_probe``): past its normal pace, before the slow-phase rule."""
        return max(self.stall_floor_seconds, PROBE_PACE_MULTIPLE * (expected_gap or 0.0))

    def stall_after(self, phase: str, expected_gap: float | None) -> float:
        """Seconds of silence that make a rank in ``phase`` stalled."""
        if self.stall_seconds > 0:
            return self.stall_seconds
        if phase in SLOW_PHASES:
            return self.slow_phase_seconds
        pace = self.stall_pace_multiple * (expected_gap or 0.0)
        return max(self.stall_floor_seconds, pace)


@dataclass(frozen=True)
class StepReport:
    """Where a rank is in its training: the one shape of a step report, from the event to the
    screen. An ``EpochStarted`` is a report of step 0 with no figures yet."""

    epoch: int  # counted from 0
    step: int  # steps done in this epoch
    steps: int  # steps in this epoch
    global_step: int | None = None
    loss: float | None = None
    images_per_s: float | None = None
    step_seconds: float | None = None

    @classmethod
    def of(cls, event: StepProgress) -> StepReport:
        return cls(
            epoch=event.epoch,
            step=event.step,
            steps=event.steps,
            global_step=event.global_step,
            loss=event.loss,
            images_per_s=event.images_per_s,
            step_seconds=event.step_seconds,
        )


@dataclass(frozen=True)
class RankState:
    """One rank at one moment. Figures are None until the rank reported them."""

    rank: int
    state: RankStatus
    reason: str = ""  # one phrase: why stalled / straggler / failed / stopped
    pid: int | None = None
    phase: str = ""  # setup | warmup | training | evaluation | checkpoint ("" before any event)
    stall_after: float | None = None  # the silence that would make it stalled now
    probe_after: float | None = None  # the silence after which the launcher probes its stacks
    device: str = "?"  # "cpu", "cuda:0" (from its RankStarted)
    gpu_index: int | None = None
    report: StepReport | None = None
    last_event_time: float | None = None
    silent_seconds: float | None = None  # since its last event (or the run's start)
    peers_step_seconds: float | None = None  # median latest step time of the other live ranks
    exitcode: int | None = None
    signal: str | None = None
    error: str = ""
    traceback: str = ""
    usage: ProcessUsage | None = None  # CPU and memory, when the observer measures them
    node: str = ""  # the node it runs on, in a run across nodes (its node launcher's record)

    @property
    def epoch(self) -> int | None:
        return self.report.epoch if self.report else None

    @property
    def step(self) -> int | None:
        return self.report.step if self.report else None

    @property
    def steps(self) -> int | None:
        return self.report.steps if self.report else None

    @property
    def global_step(self) -> int | None:
        return self.report.global_step if self.report else None

    @property
    def loss(self) -> float | None:
        return self.report.loss if self.report else None

    @property
    def images_per_s(self) -> float | None:
        return self.report.images_per_s if self.report else None

    @property
    def step_seconds(self) -> float | None:
        return self.report.step_seconds if self.report else None

    def reached(self) -> RankReached:
        """How far it got, as a lost run's summary records it."""
        return RankReached(
            rank=self.rank,
            state=self.state,
            epoch=self.epoch,
            step=self.step,
            steps=self.steps,
            global_step=self.global_step,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "state": self.state,
            "pid": self.pid,
            "device": self.device,
            "gpu_index": self.gpu_index,
            "epoch": self.epoch,
            "step": self.step,
            "steps": self.steps,
            "global_step": self.global_step,
            "loss": self.loss,
            "images_per_s": self.images_per_s,
            "step_seconds": self.step_seconds,
            "last_event_time": self.last_event_time,
            "silent_seconds": self.silent_seconds,
            "exitcode": self.exitcode,
            "signal": self.signal,
            "error": self.error,
            "traceback": self.traceback,
            "reason": self.reason,
            "node": self.node,
        }


@dataclass
class _RankFold:
    """What the events said of one rank so far (internal to the tracker)."""

    rank: int
    pid: int | None = None
    device: str = "?"
    gpu_index: int | None = None
    report: StepReport | None = None
    last_event_time: float | None = None
    finished: bool = False
    failure: RankFailed | None = None
    exited: RankExited | None = None
    stalled_report: RankStalled | None = None
    signalled_at: float | None = None  # when the launcher first signalled it to stop
    phase: str = ""
    report_times: list[float] = field(default_factory=list)  # recent step reports, this phase

    @property
    def live(self) -> bool:
        return self.exited is None and not self.finished and self.failure is None

    def end(self) -> RankEnd:
        return RankEnd(self.rank, self.failure, self.exited, self.finished, self.signalled_at)

    def enter(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.report_times.clear()

    def expected_gap(self) -> float | None:
        """How long this rank goes between step reports: the longest of its recent gaps, or its
        latest step time when it reported once only."""
        gaps = [b - a for a, b in zip(self.report_times, self.report_times[1:], strict=False)]
        step = self.report.step_seconds if self.report else None
        known = [g for g in [*gaps, step] if g is not None]
        return max(known) if known else None


@dataclass
class RankStateTracker:
    """Folds events into per-rank state. Feed it every event once; ask ``states`` any time."""

    world_size: int = 0
    thresholds: Thresholds = field(default_factory=Thresholds)
    run_started: float | None = None
    run_finished: RunFinished | None = None
    accuracy: float | None = None  # rank 0's latest test accuracy
    metrics_reported: bool = False  # a rank of a script called ddptui.report
    stops_recorded: bool = False  # the launcher names every rank it stops (``StopSignalled``)
    events_read: int = 0
    notices: list[str] = field(default_factory=list)  # what happened, in words, newest last
    _ranks: dict[int, _RankFold] = field(default_factory=dict)

    def _fold(self, rank: int) -> _RankFold:
        return self._ranks.setdefault(rank, _RankFold(rank))

    def feed(self, event: Event) -> None:
        self.events_read += 1
        self._note(event)
        if isinstance(event, RunStarted):
            self.run_started = event.time
            self.world_size = self.world_size or event.world_size
            self.stops_recorded = self.stops_recorded or event.stops_recorded
            return
        if isinstance(event, RunFinished):
            self.run_finished = event
            return
        if isinstance(event, StopSignalled):
            for stopping in map(self._fold, event.ranks):
                stopping.signalled_at = stopping.signalled_at or event.time
            return
        rank = getattr(event, "rank", None)
        if not isinstance(rank, int):
            return
        fold = self._fold(rank)
        if isinstance(event, RankStalled):
            fold.stalled_report = event
            return
        if isinstance(event, RankStraggling):
            return
        if isinstance(event, RankExited):
            fold.exited = event
            fold.pid = fold.pid or event.pid
            return
        # every other rank-tagged event is the rank's own report
        fold.last_event_time = max(fold.last_event_time or 0.0, event.time)
        if isinstance(event, RankStarted):
            fold.pid = event.pid
            fold.device, fold.gpu_index = event.device, event.gpu_index
            fold.enter("setup")
            self.world_size = self.world_size or event.world_size
        elif isinstance(event, PhaseStarted):
            fold.enter(event.phase)
        elif isinstance(event, EpochStarted):
            previous = fold.report.global_step if fold.report else None
            fold.report = StepReport(event.epoch, 0, event.steps, global_step=previous)
            fold.enter("warmup")  # the first steps of an epoch: compiling, autotuning, prefetching
        elif isinstance(event, StepProgress):
            fold.report = StepReport.of(event)
            fold.enter(TRAINING)
            fold.report_times = [*fold.report_times[-(REPORT_TIMES_KEPT - 1) :], event.time]
        elif isinstance(event, MetricsReported):
            self.metrics_reported = True
            if rank == 0 and "accuracy" in event.metrics:
                self.accuracy = event.metrics["accuracy"]
        elif isinstance(event, (Evaluation, CheckpointSaved)):
            if isinstance(event, Evaluation) and rank == 0:
                self.accuracy = event.accuracy
            fold.enter(TRAINING)  # the slow phase is over; the next report is due at the pace
        elif isinstance(event, RankFailed):
            fold.failure = event
        elif isinstance(event, RankFinished):
            fold.finished = True

    def feed_all(self, events: list[Event]) -> None:
        for e in events:
            self.feed(e)

    def _note(self, e: Event) -> None:
        note = event_notice(e)
        if note:
            self.notices.append(note)
            del self.notices[:-NOTICES_KEPT]

    def states(
        self,
        *,
        now: float | None = None,
        launcher_alive: bool = True,
        judge_silence: bool | None = None,
        run_status: RunStatus | None = None,
        stopped_pids: frozenset[int] = frozenset(),
    ) -> tuple[RankState, ...]:
        """Every rank's state.

        ``run_status`` is the final status when the run has ended (summary.json or run.json),
        else None. Silence is judged by whoever can act on it: the launcher while it lives (it
        reports ``RankStalled``, which readers see), so a reader judges it itself only once the
        launcher is gone (``launcher_alive`` False). The launcher passes ``judge_silence=True``.
        ``stopped_pids``: rank processes the caller saw in the stopped state (SIGSTOP).
        """
        now = time.time() if now is None else now
        judge = (not launcher_alive) if judge_silence is None else judge_silence
        status = run_status or (self.run_finished.status if self.run_finished else None)
        if status is not None and not RunStatus(status).final:
            status = None
        ranks = set(self._ranks) | set(range(self.world_size))
        folds = [self._ranks.get(r) or _RankFold(r) for r in sorted(ranks)]
        final = RunStatus(status) if status else None
        ends = [f.end() for f in folds]
        cause = root_failure(ends, final, self.stops_recorded)
        root = cause.rank if cause is not None else None
        step_times = {
            f.rank: f.report.step_seconds
            for f in folds
            if f.report is not None
            and f.report.step_seconds is not None
            and f.live
            and status is None
        }
        halted = {e.rank for e in ends if stopped(e, ends, final, self.stops_recorded)}
        return tuple(
            self._state_of(
                f, now, launcher_alive, judge, final, root, f.rank in halted, step_times,
                f.pid in stopped_pids,
            )
            for f in folds
        )  # fmt: skip

    def _state_of(
        self,
        f: _RankFold,
        now: float,
        launcher_alive: bool,
        judge_silence: bool,
        status: RunStatus | None,
        root: int | None,
        was_stopped: bool,
        step_times: dict[int, float],
        suspended: bool,
    ) -> RankState:
        since = f.last_event_time if f.last_event_time is not None else self.run_started
        silent = max(0.0, now - since) if since is not None and status is None else None
        others = [s for r, s in step_times.items() if r != f.rank]
        base = RankState(
            rank=f.rank,
            state=RankStatus.RUNNING,
            pid=f.pid,
            phase=f.phase,
            stall_after=self.stall_after(f) if f.live and status is None else None,
            probe_after=self.thresholds.probe_after(f.expected_gap())
            if f.live and status is None
            else None,
            device=f.device,
            gpu_index=f.gpu_index,
            report=f.report,
            last_event_time=f.last_event_time,
            silent_seconds=silent,
            peers_step_seconds=statistics.median(others) if others else None,
            exitcode=f.exited.exitcode if f.exited else None,
            signal=f.exited.signal if f.exited else None,
            error=f.failure.error if f.failure else "",
            traceback=f.failure.traceback if f.failure else "",
        )
        if f.failure is not None:
            return replace(base, state=RankStatus.FAILED, reason="reported an error")
        if f.finished or (f.exited is not None and f.exited.exitcode == 0):
            return replace(base, state=RankStatus.DONE)
        if f.exited is not None:
            how = f"exit code {f.exited.exitcode}" if f.exited.signal is None else f.exited.signal
            if f.rank == root and status != RunStatus.KILLED:
                return replace(base, state=RankStatus.FAILED, reason=f"exited first ({how})")
            if was_stopped:
                return replace(base, state=RankStatus.STOPPED, reason=f"stopped ({how})")
            return replace(base, state=RankStatus.FAILED, reason=f"exited ({how})")
        if status is not None:  # the run ended and this rank left no word of how
            return replace(base, state=RankStatus.STOPPED, reason=f"the run ended ({status})")
        if suspended:
            resume = f": resume it with kill -CONT {f.pid}" if f.pid else ""
            return replace(
                base, state=RankStatus.STOPPED, reason=f"stopped by a signal (SIGSTOP){resume}"
            )
        report = f.stalled_report
        if report is not None and (f.last_event_time is None or report.time > f.last_event_time):
            said = f"silent for {silent:.0f} s" if silent is not None else "silent"
            why = report.why or "reported by the launcher"
            return replace(base, state=RankStatus.STALLED, reason=f"{said} ({why})")
        if judge_silence and silent is not None and silent >= (base.stall_after or 0.0):
            why = f"silent for {silent:.0f} s"
            if not launcher_alive:
                why += " and its launcher is gone"
            return replace(base, state=RankStatus.STALLED, reason=why)
        mine = step_times.get(f.rank)
        median = base.peers_step_seconds
        if mine is not None and median and mine > self.thresholds.straggler_factor * median:
            return replace(
                base,
                state=RankStatus.STRAGGLER,
                reason=f"{mine:.3f} s a step against {median:.3f} s for the others",
            )
        if f.last_event_time is None:
            return replace(base, state=RankStatus.STARTING)
        return base

    def root_failure(self, run_status: RunStatus | None = None) -> Failure | None:
        """The root cause of the run's failure by ``engine.core.runs.root_cause``'s rule, from the
        events fed; ``run_status``: its final status when known (a killed run's stops are none)."""
        status = run_status or (RunStatus(self.run_finished.status) if self.run_finished else None)
        ends = [self._ranks[r].end() for r in sorted(self._ranks)]
        return root_failure(ends, status, self.stops_recorded)

    def stall_after(self, f: _RankFold) -> float:
        """The stall rule: the silence after which this rank is stalled, by its phase and pace,
        plus the start-up allowance for a rank that has not reported yet (it is importing torch)."""
        after = self.thresholds.stall_after(f.phase or "setup", f.expected_gap())
        if f.last_event_time is None:
            return after + STARTUP_ALLOWANCE_SECONDS
        return after
