"""summary.json: the final status and figures of a run, built from its event files.

Plain Python. The launcher writes it whatever happens (completed, failed, killed); ``ddptui kill``
writes it when the launcher is gone; the bench table and the UI read it.
"""

from __future__ import annotations

import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.core.events import EpochEnded, Evaluation, Event, RankFailed, RankStarted, RunStarted
from engine.core.rundir import RunDir, RunInfo


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


@dataclass(frozen=True)
class Failure:
    """The root cause of a failed run: the first rank to fail."""

    rank: int | None
    exitcode: int | None = None
    signal: str | None = None
    error: str = ""
    traceback: str = ""


@dataclass(frozen=True)
class RankReached:
    """How far one rank got, for a run whose launcher could not say (a ``lost`` run)."""

    rank: int
    state: str  # the rank state (engine.core.rank_states) it ended in
    epoch: int | None = None  # counted from 0, as in the events
    step: int | None = None  # steps done in that epoch
    steps: int | None = None  # steps in that epoch
    global_step: int | None = None

    def describe(self) -> str:
        if self.epoch is None:
            return f"rank {self.rank} had not started training"
        of = f"/{self.steps}" if self.steps is not None else ""
        return f"rank {self.rank} reached epoch {self.epoch + 1} step {self.step or 0}{of}"


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    preset: str
    status: str  # completed | failed | killed
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

    # figures of the last epoch, the ones a speedup table shows
    @property
    def last_epoch(self) -> EpochFigures | None:
        return self.epochs[-1] if self.epochs else None

    @property
    def test_accuracy(self) -> float | None:
        return self.last_epoch.test_accuracy if self.last_epoch else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["epochs"] = [asdict(e) for e in self.epochs]
        data["ranks"] = [asdict(r) for r in self.ranks]
        data["test_accuracy"] = self.test_accuracy
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        values["epochs"] = tuple(EpochFigures(**e) for e in data.get("epochs", []))
        values["ranks"] = tuple(RankReached(**r) for r in data.get("ranks", []))
        failure = data.get("failure")
        values["failure"] = Failure(**failure) if failure else None
        return cls(**values)


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


def epoch_figures(rank0_events: list[Event]) -> list[EpochFigures]:
    """Per-epoch figures from rank 0's events (its EpochEnded carries the reduced figures)."""
    evaluations = {e.epoch: e for e in rank0_events if isinstance(e, Evaluation)}
    figures = []
    for e in rank0_events:
        if not isinstance(e, EpochEnded):
            continue
        ev = evaluations.get(e.epoch)
        steady = e.global_steady_images_per_s
        figures.append(
            EpochFigures(
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
            )
        )
    return figures


def first_rank_failure(run_dir: RunDir) -> Failure | None:
    """The earliest RankFailed event of any rank (the root cause), if a rank reported one."""
    from engine.core.events import read_events

    failures = [
        e
        for path in run_dir.rank_event_paths().values()
        for e in read_events(path)
        if isinstance(e, RankFailed)
    ]
    if not failures:
        return None
    first = min(failures, key=lambda e: e.time)
    return Failure(rank=first.rank, error=first.error, traceback=first.traceback)


def started_time(run_dir: RunDir, info: RunInfo) -> float:
    from engine.core.events import read_events

    for e in read_events(run_dir.launcher_events_path):
        if isinstance(e, RunStarted):
            return e.time
    return info.created


def build_summary(
    run_dir: RunDir, status: str, failure: Failure | None = None, reason: str = ""
) -> RunSummary:
    """The summary of a run from its config, run.json (when there) and rank 0's events.

    Works on whatever the run left: a run killed before rank 0 wrote anything gets a summary with
    no epochs. ``failure`` defaults to the first RankFailed event when ``status`` is failed.
    """
    from engine.core.config import load_config
    from engine.core.events import read_events

    config = load_config(run_dir.config_path)
    try:
        info: RunInfo | None = run_dir.read_run_info()
    except Exception:  # a summary must be written even next to a broken run.json
        info = None
    rank0 = read_events(run_dir.rank_events_path(0))
    started = started_time(run_dir, info) if info else _first_time(rank0)
    world_size = info.world_size if info else _reported_world_size(rank0)
    devices = info.devices if info else config.devices.spec
    device_count = _device_count(devices)
    global_batch = config.training.batch_size * (world_size if config.strategy.name == "ddp" else 1)
    if failure is None and status == "failed":
        failure = first_rank_failure(run_dir)
    finished = time.time()
    return RunSummary(
        run_id=run_dir.run_id,
        preset=config.name,
        status=status,
        strategy=config.strategy.name,
        precision=config.precision.mode,
        model=config.model.name,
        dataset=config.data.dataset,
        devices=devices,
        device_count=device_count,
        world_size=world_size,
        global_batch=global_batch,
        started=started,
        finished=finished,
        elapsed_seconds=max(0.0, finished - started),
        epochs=tuple(epoch_figures(rank0)),
        failure=failure,
        reason=reason,
    )


def _reported_world_size(rank0_events: list[Event]) -> int:
    """The world size rank 0 reported; runs with no run.json (torchrun) have only this."""
    started = [e for e in rank0_events if isinstance(e, RankStarted)]
    return started[0].world_size if started else 1


def _first_time(events: list[Event]) -> float:
    return events[0].time if events else time.time()


def _device_count(devices: str) -> int:
    """'cpu:2' -> 2, 'gpu:0,2' -> 2."""
    kind, _, rest = devices.partition(":")
    if kind == "cpu":
        return int(rest) if rest.isdigit() else 1
    if kind == "gpu":
        return len([p for p in rest.split(",") if p])
    return 1
