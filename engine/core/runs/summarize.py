"""Build a run's summary from what its directory holds: config.toml, run.json and rank 0's events
(every rank's for the step split).

Plain Python. The launcher calls it at its end; the settler (``engine.core.runs.settle``) for a run whose
launcher could not. Reading only: whoever calls it decides whether and where to write.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from engine.core.common.statuses import RunStatus
from engine.core.config.devices import DevicePlan
from engine.core.runs.attempts import with_attempts
from engine.core.runs.events import (
    EpochEnded,
    Evaluation,
    Event,
    MetricsReported,
    RankStarted,
    RunStarted,
    StepProgress,
    read_events,
)
from engine.core.runs.placement import watch_for
from engine.core.runs.rank_states import RankStateTracker
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo
from engine.core.runs.step_breakdown import StepBreakdown, StepBreakdownFold, find_bottleneck
from engine.core.runs.summary import EpochFigures, Failure, RunSummary
from engine.core.stacks.snapshot import latest_snapshot


def epoch_figures(rank0_events: list[Event]) -> list[EpochFigures]:
    """Per-epoch figures from rank 0's events (its EpochEnded carries the reduced figures)."""
    evaluations = {e.epoch: e for e in rank0_events if isinstance(e, Evaluation)}
    figures = []
    for e in rank0_events:
        if not isinstance(e, EpochEnded):
            continue
        ev = evaluations.get(e.epoch)
        steady = e.global_steady_images_per_s
        figure = EpochFigures(
            epoch=e.epoch,
            seconds=e.global_seconds,
            data_wait_seconds=e.global_data_wait_seconds,
            images=e.global_images,
            steps=e.steps,
            warmup_steps=e.warmup_steps,
            steady_images_per_s=steady,
            steady_epoch_seconds=e.global_images / steady if steady > 0 else e.global_seconds,
            train_loss=e.global_train_loss,
            test_accuracy=ev.accuracy if ev else None,
            test_loss=ev.loss if ev else None,
            first_step=e.first_step,
        )
        # an epoch an attempt resumed inside: its steady pace over the whole epoch's images
        whole = figure.whole_images / steady if steady > 0 else e.global_seconds
        figures.append(replace(figure, steady_epoch_seconds=whole))
    return figures


# A last epoch's loss this many times the first step's: the run diverged, even if it stayed finite.
DIVERGED_LOSS_FACTOR = 3.0


def figure_warnings(
    epochs: list[EpochFigures], first_loss: tuple[float, int] | None = None
) -> tuple[str, ...]:
    """Sentences for figures a reader must not trust: a loss that became NaN or infinite in a run
    that went on (``training.on_divergence = "warn"``), or a loss that ended far above where it
    began (``first_loss``: rank 0's first reported loss and its global step): the model diverged
    while its loss stayed a number, and its accuracy means nothing."""
    warnings = []
    bad = [e.epoch + 1 for e in epochs if not math.isfinite(e.train_loss)]
    if bad:
        which = ", ".join(map(str, bad))
        warnings.append(
            f"the training loss was not finite in epoch {which} (training.on_divergence = warn): "
            "the model diverged and its figures mean little"
        )
    last = epochs[-1].train_loss if epochs else None
    began, at = first_loss if first_loss is not None else (None, 0)
    if (
        began is not None
        and last is not None
        and math.isfinite(last)
        and 0 < began < math.inf
        and last > DIVERGED_LOSS_FACTOR * began
    ):
        warnings.append(
            f"the training loss ended far above where it began ({began:.3g} at step {at}, "
            f"{last:.3g} over epoch {epochs[-1].epoch + 1}): the model diverged (a learning rate "
            "too high?) and its figures mean little"
        )
    return tuple(warnings)


@dataclass(frozen=True)
class RunEvents:
    """Every event file of a run, each read once: the launchers' (its own first, then each node
    launcher's) and each rank's, by rank. What every part of a summary is built from."""

    launchers: tuple[list[Event], ...]
    ranks: dict[int, list[Event]]

    @classmethod
    def read(cls, run_dir: RunDir) -> RunEvents:
        launchers = tuple(read_events(p, run_dir.path) for p in run_dir.launcher_event_paths())
        paths = run_dir.rank_event_paths()
        return cls(launchers, {rank: read_events(p, run_dir.path) for rank, p in paths.items()})

    @property
    def rank0(self) -> list[Event]:
        return self.ranks.get(0, [])

    def root_failure(self, status: RunStatus) -> Failure | None:
        """The root cause of a run's failure, as the rank rules decide it
        (``RankStateTracker.root_failure``: the one place it is decided)."""
        tracker = RankStateTracker()
        for events in [*self.launchers, *self.ranks.values()]:
            tracker.feed_all(events)
        return tracker.root_failure(status)

    def step_split(self) -> tuple[tuple[StepBreakdown, ...], str]:
        """(each rank's step split over the whole run, the run's bottleneck sentence)
        (``engine.core.runs.step_breakdown``: the one rule)."""
        fold = StepBreakdownFold()
        for events in self.ranks.values():
            fold.feed_all(events)
        split = fold.whole_run()
        bottleneck = find_bottleneck(split)
        return split, bottleneck.sentence if bottleneck else ""

    def started_time(self, info: RunInfo) -> float:
        """When the (first) launcher started its ranks; run.json's creation before that."""
        started = [e.time for events in self.launchers for e in events if isinstance(e, RunStarted)]
        return min(started) if started else info.created


def root_failure_of(run_dir: RunDir, status: RunStatus) -> Failure | None:
    """The root cause of a run's failure from its event files."""
    return RunEvents.read(run_dir).root_failure(status)


def step_split_of(run_dir: RunDir) -> tuple[tuple[StepBreakdown, ...], str]:
    """Each rank's step split over the whole run and the run's bottleneck, from its files."""
    return RunEvents.read(run_dir).step_split()


def build_summary(
    run_dir: RunDir,
    status: RunStatus,
    failure: Failure | None = None,
    reason: str = "",
    *,
    info: RunInfo | None = None,
) -> RunSummary:
    """The summary of a run from its config, run.json (when there) and rank 0's events.

    Works on whatever the run left: a run killed before rank 0 wrote anything gets a summary with
    no epochs. ``failure`` defaults to the root cause the events show when ``status`` is failed.
    ``info``: run.json as the caller has just read it (the run observer), not read again.
    """
    config = run_dir.load_config()
    if info is None:
        try:
            info = run_dir.read_run_info()
        except RunDirError:  # a summary must be written even next to a broken run.json
            info = None
    events = RunEvents.read(run_dir)  # each file once, for every figure below
    rank0 = events.rank0
    started = events.started_time(info) if info else _first_time(rank0)
    world_size = info.world_size if info else _reported_world_size(rank0)
    devices = info.devices if info else config.devices.spec
    described = DevicePlan.from_description(devices)
    device_count = described.device_count if described is not None else 1
    global_batch = config.training.batch_size * (world_size if config.strategy.name == "ddp" else 1)
    if failure is None and status == RunStatus.FAILED:
        failure = events.root_failure(status)
    finished = time.time()
    epochs = epoch_figures(rank0)
    split, bottleneck = events.step_split()
    summary = RunSummary(
        run_id=run_dir.run_id,
        preset=config.name,
        status=status,
        strategy="script" if config.script.given else config.strategy.name,
        precision="-" if config.script.given else config.precision.mode,
        model=config.workload[0],
        dataset=config.workload[1],
        devices=devices,
        device_count=device_count,
        world_size=world_size,
        global_batch=global_batch,
        started=started,
        finished=finished,
        elapsed_seconds=max(0.0, finished - started),
        epochs=tuple(epochs),
        failure=failure,
        reason=reason,
        diagnosis=latest_snapshot(run_dir.path),
        global_steps=_last_global_step(rank0),
        warnings=figure_warnings(epochs, _first_loss(rank0)),
        reported=_last_reported(rank0),
        step_breakdown=split,
        bottleneck=bottleneck,
    )
    attempt = info.attempt if info else 1
    launchers = [e for events_of in events.launchers for e in events_of]
    watch = watch_for(info)  # a run placed elsewhere: its attempt records where it ran
    where = watch.recorded(run_dir, info).where if watch is not None and info else ""
    return with_attempts(run_dir, summary, launchers, events.ranks, attempt, where)


def _first_loss(rank0_events: list[Event]) -> tuple[float, int] | None:
    """The loss rank 0 reported first, and at which global step: where the training began (the
    engine's loop reports the run's first step)."""
    return next(
        (
            (e.loss, e.global_step)
            for e in rank0_events
            if isinstance(e, StepProgress) and e.loss is not None
        ),
        None,
    )


def _last_reported(rank0_events: list[Event]) -> dict[str, float]:
    """What rank 0 of a script last reported of each figure (``ddptui.report``)."""
    found: dict[str, float] = {}
    for e in rank0_events:
        if isinstance(e, MetricsReported):
            found.update(e.metrics)
    return found


def _last_global_step(rank0_events: list[Event]) -> int | None:
    steps = [e.global_step for e in rank0_events if isinstance(e, StepProgress)]
    return steps[-1] if steps else None


def _reported_world_size(rank0_events: list[Event]) -> int:
    """The world size rank 0 reported; runs with no run.json (torchrun) have only this."""
    started = [e for e in rank0_events if isinstance(e, RankStarted)]
    return started[0].world_size if started else 1


def _first_time(events: list[Event]) -> float:
    return events[0].time if events else time.time()
