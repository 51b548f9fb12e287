"""Live state of each rank of a run, derived from its event files (``ddptui runs``, ``ddptui show``
and the UI all read it from here).

Plain Python (no torch). Two layers:

- ``RankStateTracker`` folds events (rank and launcher events, in any order of files) and answers
  ``states(now, ...)``: pure logic, no I/O, so the UI can feed it events it already tails.
- ``RunWatch`` owns the incremental file readers of one run directory and adds what only the
  machine can tell: run.json, summary.json and whether the launcher is still alive.

Per-rank states:

``starting``   no event from the rank yet (and not yet silent for ``stall_seconds``)
``running``    reporting
``stalled``    the launcher reported it silent (``RankStalled`` newer than the rank's last event),
               or the launcher is gone and the rank has been silent for ``stall_seconds``
``straggler``  its latest step time is over ``straggler_factor`` times the median of the other
               ranks' latest step times (the launcher's own rule, so both agree)
``failed``     it reported an error, or it was the first to exit badly (the root cause)
``done``       it finished (``RankFinished`` or a clean exit)
``stopped``    ended by a signal after another rank failed or the run was killed
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.core.events import (
    EpochStarted,
    Event,
    EventTail,
    RankExited,
    RankFailed,
    RankFinished,
    RankStalled,
    RankStarted,
    RankStraggling,
    RunFinished,
    RunStarted,
    StepProgress,
)
from engine.core.rundir import FINAL_STATES, KILLED, LOST, RunDir, RunDirError, RunInfo

STARTING, RUNNING, STALLED, STRAGGLER, FAILED, DONE, STOPPED = (
    "starting",
    "running",
    "stalled",
    "straggler",
    "failed",
    "done",
    "stopped",
)
RANK_STATES = (STARTING, RUNNING, STALLED, STRAGGLER, FAILED, DONE, STOPPED)
_STOP_SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT")

# Run-level states beyond run.json's starting / running / completed / failed / killed
ORPHANED = "orphaned"  # launcher gone, no summary, some rank still alive
# LOST (engine.core.rundir): launcher gone, no summary, nothing left alive
UNREADABLE = "unreadable"  # run.json is corrupt


@dataclass(frozen=True)
class RankState:
    """One rank at one moment. Figures are None until the rank reported them."""

    rank: int
    state: str
    pid: int | None = None
    epoch: int | None = None
    step: int | None = None  # steps done in this epoch
    steps: int | None = None  # steps in this epoch
    global_step: int | None = None
    loss: float | None = None
    images_per_s: float | None = None
    step_seconds: float | None = None
    last_event_time: float | None = None
    silent_seconds: float | None = None  # since its last event (or the run's start)
    exitcode: int | None = None
    signal: str | None = None
    error: str = ""
    traceback: str = ""
    reason: str = ""  # one phrase: why stalled / straggler / failed / stopped

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _RankFold:
    rank: int
    pid: int | None = None
    epoch: int | None = None
    step: int | None = None
    steps: int | None = None
    global_step: int | None = None
    loss: float | None = None
    images_per_s: float | None = None
    step_seconds: float | None = None
    last_event_time: float | None = None
    finished: bool = False
    failure: RankFailed | None = None
    exited: RankExited | None = None
    stalled_report: RankStalled | None = None
    straggling_reports: int = 0


@dataclass
class RankStateTracker:
    """Folds events into per-rank state. Feed it every event once; ask ``states`` any time."""

    world_size: int = 0
    stall_seconds: float = 60.0
    straggler_factor: float = 2.0
    run_started: float | None = None
    run_finished: RunFinished | None = None
    _ranks: dict[int, _RankFold] = field(default_factory=dict)

    def _fold(self, rank: int) -> _RankFold:
        return self._ranks.setdefault(rank, _RankFold(rank))

    def feed(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.run_started = event.time
            self.world_size = self.world_size or event.world_size
            return
        if isinstance(event, RunFinished):
            self.run_finished = event
            return
        rank = getattr(event, "rank", None)
        if not isinstance(rank, int):
            return
        fold = self._fold(rank)
        if isinstance(event, RankStalled):
            fold.stalled_report = event
            return
        if isinstance(event, RankStraggling):
            fold.straggling_reports += 1
            return
        if isinstance(event, RankExited):
            fold.exited = event
            fold.pid = fold.pid or event.pid
            return
        # every other rank-tagged event is the rank's own report
        fold.last_event_time = max(fold.last_event_time or 0.0, event.time)
        if isinstance(event, RankStarted):
            fold.pid = event.pid
            self.world_size = self.world_size or event.world_size
        elif isinstance(event, EpochStarted):
            fold.epoch, fold.step, fold.steps = event.epoch, 0, event.steps
        elif isinstance(event, StepProgress):
            fold.epoch, fold.step, fold.steps = event.epoch, event.step, event.steps
            fold.global_step = event.global_step
            fold.loss = event.loss
            fold.images_per_s = event.images_per_s
            fold.step_seconds = event.step_seconds
        elif isinstance(event, RankFailed):
            fold.failure = event
        elif isinstance(event, RankFinished):
            fold.finished = True

    def feed_all(self, events: list[Event]) -> None:
        for e in events:
            self.feed(e)

    def states(
        self,
        *,
        now: float | None = None,
        launcher_alive: bool = True,
        run_status: str | None = None,
    ) -> tuple[RankState, ...]:
        """Every rank's state. ``run_status`` is the final status when the run has ended
        (summary.json or run.json), else None; ``launcher_alive`` False lets silence alone mark a
        rank stalled, since no launcher is left to report it."""
        now = time.time() if now is None else now
        status = run_status or (self.run_finished.status if self.run_finished else None)
        ranks = set(self._ranks) | set(range(self.world_size))
        folds = [self._ranks.get(r) or _RankFold(r) for r in sorted(ranks)]
        root = _root_cause(folds)
        step_times = {
            f.rank: f.step_seconds
            for f in folds
            if f.step_seconds is not None and _is_live(f) and status is None
        }
        return tuple(
            self._state_of(f, now, launcher_alive, status, root, step_times) for f in folds
        )

    def _state_of(
        self,
        f: _RankFold,
        now: float,
        launcher_alive: bool,
        status: str | None,
        root: int | None,
        step_times: dict[int, float],
    ) -> RankState:
        since = f.last_event_time if f.last_event_time is not None else self.run_started
        silent = max(0.0, now - since) if since is not None and status is None else None
        base = RankState(
            rank=f.rank,
            state=RUNNING,
            pid=f.pid,
            epoch=f.epoch,
            step=f.step,
            steps=f.steps,
            global_step=f.global_step,
            loss=f.loss,
            images_per_s=f.images_per_s,
            step_seconds=f.step_seconds,
            last_event_time=f.last_event_time,
            silent_seconds=silent,
            exitcode=f.exited.exitcode if f.exited else None,
            signal=f.exited.signal if f.exited else None,
            error=f.failure.error if f.failure else "",
            traceback=f.failure.traceback if f.failure else "",
        )
        if f.failure is not None:
            return replace(base, state=FAILED, reason="reported an error")
        if f.finished or (f.exited is not None and f.exited.exitcode == 0):
            return replace(base, state=DONE)
        if f.exited is not None:
            how = f"exit code {f.exited.exitcode}" if f.exited.signal is None else f.exited.signal
            if f.rank == root and status != KILLED:
                return replace(base, state=FAILED, reason=f"exited first ({how})")
            if f.exited.signal in _STOP_SIGNALS:
                return replace(base, state=STOPPED, reason=f"stopped ({how})")
            return replace(base, state=FAILED, reason=f"exited ({how})")
        if status is not None:  # the run ended and this rank left no word of how
            return replace(base, state=STOPPED, reason=f"the run ended ({status})")
        report = f.stalled_report
        if report is not None and (f.last_event_time is None or report.time > f.last_event_time):
            said = f"silent for {silent:.0f} s" if silent is not None else "silent"
            return replace(base, state=STALLED, reason=f"{said} (reported by the launcher)")
        if not launcher_alive and silent is not None and silent >= self.stall_seconds:
            return replace(
                base, state=STALLED, reason=f"silent for {silent:.0f} s and its launcher is gone"
            )
        mine = step_times.get(f.rank)
        others = [s for r, s in step_times.items() if r != f.rank]
        if mine is not None and others:
            median = statistics.median(others)
            if median > 0 and mine > self.straggler_factor * median:
                return replace(
                    base,
                    state=STRAGGLER,
                    reason=f"{mine:.3f} s a step against {median:.3f} s for the others",
                )
        if f.last_event_time is None:
            return replace(base, state=STARTING)
        return replace(base, state=RUNNING)


def _is_live(f: _RankFold) -> bool:
    return f.exited is None and not f.finished and f.failure is None


def _root_cause(folds: list[_RankFold]) -> int | None:
    """The rank that exited badly first: the one whose exit the others followed."""
    bad = [f for f in folds if f.exited is not None and f.exited.exitcode != 0 and not f.finished]
    if not bad:
        return None
    return min(bad, key=lambda f: f.exited.time if f.exited else 0.0).rank


# ---- reading one run directory ---------------------------------------------------------------


@dataclass(frozen=True)
class RunProgress:
    """One run at one moment: what ``ddptui runs`` lists, ``ddptui show`` prints, the UI draws."""

    run_id: str
    path: Path
    state: str  # starting | running | completed | failed | killed | orphaned | lost | unreadable
    preset: str = ""
    created: float | None = None
    devices: str = ""
    world_size: int = 0
    info: RunInfo | None = None
    launcher_alive: bool | None = None  # None: run.json names no launcher (yet)
    ranks: tuple[RankState, ...] = ()
    summary: dict[str, Any] | None = None
    problem: str = ""  # one sentence when run.json / summary.json could not be read

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def stalled_ranks(self) -> tuple[int, ...]:
        return tuple(r.rank for r in self.ranks if r.state == STALLED)

    @property
    def straggler_ranks(self) -> tuple[int, ...]:
        return tuple(r.rank for r in self.ranks if r.state == STRAGGLER)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "state": self.state,
            "preset": self.preset,
            "created": self.created,
            "devices": self.devices,
            "world_size": self.world_size,
            "launcher_alive": self.launcher_alive,
            "stalled_ranks": list(self.stalled_ranks),
            "straggler_ranks": list(self.straggler_ranks),
            "ranks": [r.to_json() for r in self.ranks],
            "summary": self.summary,
            "problem": self.problem,
        }


class RunWatch:
    """Incremental reader of one run directory; ``refresh()`` reads only what was appended."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.tracker = RankStateTracker()
        self._tails: dict[Path, EventTail] = {}
        self._configured = False

    def _configure(self) -> None:
        """Thresholds from config.toml once it is there (defaults otherwise)."""
        if self._configured or not self.run_dir.config_path.exists():
            return
        self._configured = True
        try:
            from engine.core.config import load_config

            sup = load_config(self.run_dir.config_path).supervision
        except Exception:  # a broken config must not hide the ranks
            return
        self.tracker.stall_seconds = sup.stall_seconds
        self.tracker.straggler_factor = sup.straggler_factor

    def _read_events(self) -> None:
        paths = [self.run_dir.launcher_events_path, *self.run_dir.rank_event_paths().values()]
        for path in paths:
            tail = self._tails.setdefault(path, EventTail(path))
            self.tracker.feed_all(tail.read_new())

    def refresh(self, now: float | None = None) -> RunProgress:
        from engine.core.lost_runs import LAUNCHER_START_GRACE_SECONDS, settle_lost_run
        from engine.core.process_table import ref_alive

        now = time.time() if now is None else now
        self._configure()
        self._read_events()
        problem = ""
        info: RunInfo | None = None
        try:
            info = self.run_dir.read_run_info()
        except RunDirError as err:
            problem = str(err)
        summary: dict[str, Any] | None = None
        try:
            summary = self.run_dir.read_summary()
        except RunDirError as err:
            problem = problem or str(err)
        if info is not None:
            self.tracker.world_size = max(self.tracker.world_size, info.world_size)
        launcher_alive = ref_alive(info.launcher) if info and info.launcher else None
        status: str | None = None
        if summary is not None and isinstance(summary.get("status"), str):
            status = summary["status"]
        elif info is not None and info.state in FINAL_STATES:
            status = info.state
        if status is not None:
            state = status
        elif info is None:
            state = UNREADABLE if problem else "starting"
        elif info.launcher is None and now - info.created >= LAUNCHER_START_GRACE_SECONDS:
            # its launcher never recorded itself: it died first
            summary = settle_lost_run(self.run_dir, now=now) or summary
            state = status = LOST if summary is not None else info.state
        elif launcher_alive is False:
            ranks_alive = any(ref_alive(r) for r in info.ranks)
            state = ORPHANED if ranks_alive else LOST
            if state == LOST:  # nobody else will: write the summary the launcher could not
                summary = settle_lost_run(self.run_dir, now=now) or summary
                status = LOST if summary is not None else None
        else:
            state = info.state
        ranks = self.tracker.states(
            now=now, launcher_alive=launcher_alive is not False, run_status=status
        )
        if state == LOST:  # nothing is left alive: no rank can still be "running"
            ranks = self.tracker.states(now=now, launcher_alive=False, run_status=LOST)
        preset = info.preset if info else (str(summary.get("preset", "")) if summary else "")
        return RunProgress(
            run_id=self.run_dir.run_id,
            path=self.run_dir.path,
            state=state,
            preset=preset,
            created=info.created if info else None,
            devices=info.devices if info else "",
            world_size=info.world_size if info else self.tracker.world_size,
            info=info,
            launcher_alive=launcher_alive,
            ranks=ranks,
            summary=summary,
            problem=problem,
        )


def read_run_progress(run_dir: RunDir, now: float | None = None) -> RunProgress:
    """One-shot read of a run (CLI); the UI keeps a ``RunWatch`` per run instead."""
    return RunWatch(run_dir).refresh(now)
