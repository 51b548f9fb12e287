"""The run observer: the one place that decides what state a run and each of its ranks are in.

Everyone who asks "how is this run doing" asks here: the launcher's supervision (through the rank
rules of ``engine.core.runs.rank_states``), ``ddptui run``'s follower, ``ddptui runs`` / ``show`` /
``ps``, the Run and Runs screens and the UI's quit check. Plain Python.

``RunObserver`` reads one run directory incrementally (its events fed to a ``RankStateTracker``)
and adds what only the machine can tell: run.json, summary.json, and whether the launcher and
ranks are alive (through a ``ProcessProbe``, with an injectable clock), each process looked up once
an observation (``ProcessLooks``). It decides and never writes: the summary of a run it finds lost
is built and returned (``RunState.unsettled``); writing it down is an explicit operation its
callers ask for (``engine.core.runs.settle.Settler``).

Run statuses (``RunStatus``): from summary.json when there; else run.json's final state; else
run.json's ``starting`` / ``running`` while the launcher lives (it writes ``running`` once it has
recorded itself and started the ranks), ``orphaned`` when the launcher is gone but a rank is alive,
``lost`` when nothing is alive. A run another backend placed (a scheduler's job) is decided by
what that backend's ``PlacementWatch`` (``engine.core.runs.placement``) says, asked without
knowing which backend it is: pending with the scheduler's reason, the ends only it can tell
(cancelled, timeout, node failure), the node each rank is on.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.core.common.config_error import ConfigError
from engine.core.common.statuses import ProcessState, RankStatus, RunStatus
from engine.core.config.schema import RunConfig
from engine.core.procs.process_identity import ProcessLooks, ProcessProbe, ProcessRef
from engine.core.runs.attempt_watch import AttemptWatch
from engine.core.runs.events import EventTail
from engine.core.runs.placement import PlacementVerdict, PlacementView, PlacementWatch, watch_for
from engine.core.runs.rank_states import RankState, RankStateTracker, Thresholds
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo
from engine.core.runs.settle import lost_summary
from engine.core.runs.step_breakdown import (
    StepBreakdown,
    StepBreakdownFold,
    find_bottleneck,
)
from engine.core.runs.step_curves import StepCurveFold
from engine.core.runs.summary import RunSummary
from engine.core.stacks.snapshot import StackSnapshot, latest_snapshot, snapshot_paths

# A launcher records itself in run.json within seconds of its start; a run.json that names none
# this long after it was made belongs to a launcher that died first.
LAUNCHER_START_GRACE_SECONDS = 30.0

Clock = Callable[[], float]


class RunObserver:
    """Incremental observer of one run directory: ``observe()`` reads only what was appended.

    ``launcher_poll`` is given by the process that started the launcher (its ``Popen.poll``): it
    knows the launcher's exit status, and polling reaps it. ``measure_usage`` adds each live
    rank's CPU and memory. Not thread-safe: one caller at a time (the UI wraps it in a lock).
    """

    def __init__(
        self,
        run_dir: RunDir,
        *,
        clock: Clock = time.time,
        probe: ProcessProbe | None = None,
        launcher_poll: Callable[[], int | None] | None = None,
        measure_usage: bool = False,
        watch: PlacementWatch | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.watch = watch  # of the run's backend (None: the registered one; a stand-in in tests)
        self._placement: PlacementView | None = None
        self._placement_end: PlacementVerdict | None = None  # once its backend says it is over
        self._placement_read = False  # where an ended run was, read once from its directory
        self.clock = clock
        self.probe = probe or ProcessProbe()
        self.launcher_poll = launcher_poll
        self.measure_usage = measure_usage
        self.tracker = RankStateTracker()
        self.step_split = StepBreakdownFold()
        self.step_curves = StepCurveFold()
        self._tails: dict[Path, EventTail] = {}
        self._config: RunConfig | None = None
        self._config_problem = ""
        self._summary: RunSummary | None = None  # summary.json, once there
        self._lost: RunSummary | None = None  # the lost summary this observer built
        self._snapshot: tuple[Path, StackSnapshot | None] | None = None
        self._looks = ProcessLooks(self.probe)  # this observation's look at each process
        self.attempts = AttemptWatch(run_dir)
        self._polled_launcher: ProcessRef | None = None  # the launcher launcher_poll is of
        self._poll_attempt: int | None = None  # the attempt that launcher began

    def _start_attempt(self) -> None:
        """The files read so far were an earlier attempt's (moved below attempts/): read the
        current attempt's from their start."""
        self.tracker = RankStateTracker(thresholds=self.tracker.thresholds)
        self.step_split = StepBreakdownFold()
        self.step_curves = StepCurveFold()
        self._tails.clear()
        self._summary = self._lost = self._snapshot = None
        self._placement_end = None  # a placed run's end was the earlier attempt's

    @property
    def config(self) -> RunConfig | None:
        return self._config

    # -- reading -------------------------------------------------------------------------------

    def _load_config(self) -> None:
        """Thresholds and epochs from config.toml once it is there (defaults otherwise)."""
        if self._config is not None or self._config_problem:
            return
        if not os.path.lexists(self.run_dir.config_path):
            return
        try:
            self._config = self.run_dir.load_config()
        except ConfigError as err:  # a broken config must not hide the ranks
            self._config_problem = str(err)
            return
        self.tracker.thresholds = Thresholds.of(self._config)

    def _read_events(self) -> None:
        paths = [*self.run_dir.launcher_event_paths(), *self.run_dir.rank_event_paths().values()]
        for path in paths:
            tail = self._tails.setdefault(path, EventTail(path, self.run_dir.path))
            events = tail.read_new()
            self.attempts.feed(events)
            self.tracker.feed_all(events)
            self.step_split.feed_all(events)
            self.step_curves.feed_all(events)

    def _is_script(self) -> bool:
        return self._config is not None and self._config.script.given

    def _latest_snapshot(self) -> StackSnapshot | None:
        """The newest stored stack snapshot, read again only when a newer file appears."""
        paths = snapshot_paths(self.run_dir.path)
        if paths and (self._snapshot is None or self._snapshot[0] != paths[-1]):
            self._snapshot = (paths[-1], latest_snapshot(self.run_dir.path))
        return self._snapshot[1] if self._snapshot else None

    @property
    def skipped_lines(self) -> int:
        return sum(t.skipped for t in self._tails.values())

    # -- the run's status ------------------------------------------------------------------------

    def _decide(
        self, info: RunInfo | None, info_problem: str, summary_problem: str, now: float
    ) -> tuple[RunStatus, str, bool | None]:
        """(status, why, launcher alive): the one decision of a run's status."""
        if summary_problem:  # how it ended cannot be told
            return RunStatus.UNREADABLE, summary_problem, None
        if self._summary is not None:
            return self._summary.status, self._summary.reason, False
        if info is None:
            return (RunStatus.UNREADABLE if info_problem else RunStatus.STARTING), "", None
        watch = self._watch_of(info)
        if watch is not None:
            placed = self._decide_placed(watch, info, now)
            if placed is not None:
                return placed
        finished = self.tracker.run_finished
        if info.state.final:
            return info.state, finished.reason if finished else "", False
        if self._polls(info):
            assert self.launcher_poll is not None
            code = self.launcher_poll()
            if code is not None:
                with contextlib.suppress(RunDirError):  # it may have written it meanwhile
                    self._summary = self.run_dir.read_summary()
                if self._summary is not None:
                    return self._summary.status, self._summary.reason, False
                why = f"the launcher exited (code {code}) without a summary"
                return self._gone(info, why, launcher_exit=code)
        if info.launcher is None:
            begun = info.attempt_started or info.created
            if self._polls(info) or now - begun < LAUNCHER_START_GRACE_SECONDS:
                return RunStatus.STARTING, "", None
            return self._gone(info, "no launcher was ever recorded in run.json")
        if self._looks.alive(info.launcher):  # starting until it has started the ranks
            return info.state, self.attempts.restarting(), True
        return self._gone(info, f"the launcher (pid {info.launcher.pid}) is gone without a summary")

    def _polls(self, info: RunInfo) -> bool:
        """Whether ``launcher_poll`` speaks for run.json's launcher: the one recorded in the
        attempt this observer first saw (its restarts keep it; a ``ddptui resume`` starts
        another launcher, whose start the poll cannot tell)."""
        if self.launcher_poll is None:
            return False
        if self._poll_attempt is None:
            self._poll_attempt = info.attempt
        if info.launcher is None:
            return info.attempt == self._poll_attempt
        if self._polled_launcher is None and info.attempt == self._poll_attempt:
            self._polled_launcher = info.launcher
        return info.launcher == self._polled_launcher

    def _watch_of(self, info: RunInfo | None) -> PlacementWatch | None:
        """The watch of the backend that placed the run (engine.core.runs.placement), if any."""
        placed = info.placement if info is not None else None
        if placed is not None and self.watch is not None and self.watch.name == placed.backend:
            return self.watch
        return watch_for(info)

    def _decide_placed(
        self, watch: PlacementWatch, info: RunInfo, now: float
    ) -> tuple[RunStatus, str, bool | None] | None:
        """A run another backend placed: its backend decides from what it asks (a scheduler's
        word on the job, its node launchers' records), and says None where the rules of a
        launcher on this machine decide. While the run goes on, its own launchers judge silence,
        as a live launcher does; once its backend says it is over, its summary is built once."""
        if self._placement_end is None:
            verdict = watch.observe(self.run_dir, info, now, self.probe)
            self._placement = verdict.view
            if verdict.status is None:
                return None
            if not verdict.ended:
                return verdict.status, verdict.reason, verdict.launcher_alive
            self._placement_end = verdict
        if self._lost is None:
            self._lost = watch.summary(self.run_dir, self._placement_end)
        return self._lost.status, self._lost.reason, False

    def _gone(
        self, info: RunInfo, why: str, launcher_exit: int | None = None
    ) -> tuple[RunStatus, str, bool | None]:
        """The launcher is gone and left no summary: orphaned while a rank lives, else lost."""
        if any(self._looks.alive(r) for r in info.ranks):
            return (
                RunStatus.ORPHANED,
                f"{why}; some of its ranks are still alive (ddptui ps / clean, or Processes)",
                False,
            )
        if self._lost is None:  # built once: nothing of the run is alive to change it
            reached = tuple(
                s.reached()
                for s in self.tracker.states(now=self.clock(), run_status=RunStatus.LOST)
            )
            self._lost = lost_summary(self.run_dir, info, reached, launcher_exit)
        return self._lost.status, self._lost.reason, False

    def _split(self, summary: RunSummary | None, status: RunStatus) -> tuple[StepBreakdown, ...]:
        """The step split shown: the summary's (the whole run), else the whole run's once it
        ended, else the ranks' recent reports."""
        if summary is not None and summary.step_breakdown:
            return summary.step_breakdown
        return self.step_split.whole_run() if status.final else self.step_split.recent()

    # -- the whole state -------------------------------------------------------------------------

    def _read_files(self, info: RunInfo | None) -> tuple[RunInfo | None, str, str, list[str]]:
        """Read what is new: config.toml (once), run.json (unless the caller read it: ``info``),
        summary.json (until it is there) and the events. (run.json's info, why run.json could not
        be read, why summary.json could not, every problem met)."""
        self._load_config()
        problems = [self._config_problem] if self._config_problem else []
        info_problem = ""
        if info is None and self.run_dir.run_json_path.exists():
            try:
                info = self.run_dir.read_run_info()
            except RunDirError as err:
                info_problem = str(err)
                problems.append(info_problem)
        if info is not None and self.attempts.moved_on(info):
            self._start_attempt()
        summary_problem = ""
        if self._summary is None:
            try:
                self._summary = self.run_dir.read_summary()
            except RunDirError as err:
                summary_problem = str(err)
                problems.append(summary_problem)
        self._read_events()
        problems += [t.refused for t in self._tails.values() if t.refused]
        if info is not None:
            self.tracker.world_size = max(self.tracker.world_size, info.world_size)
        return info, info_problem, summary_problem, problems

    def _rank_states(
        self, info: RunInfo | None, status: RunStatus, launcher_alive: bool | None, now: float
    ) -> tuple[RankState, ...]:
        """Every rank's state (the tracker decides it), with what only the machine tells while
        the run lives: which ranks are SIGSTOPped and, when asked, their CPU and memory."""
        live = status.live
        ranks = self.tracker.states(
            now=now,
            launcher_alive=launcher_alive is not False,
            run_status=status if status.final else None,
            stopped_pids=self._looks.stopped(info.ranks) if live and info else frozenset(),
        )
        placed = self._placement
        if self.measure_usage and live and (placed is None or not placed.across_nodes):
            usage = self.probe.usage([r.pid for r in ranks if r.pid])
            ranks = tuple(replace(r, usage=usage.get(r.pid)) if r.pid else r for r in ranks)
        if placed is not None and placed.rank_nodes:  # as the launcher that numbered it said
            ranks = tuple(replace(r, node=placed.rank_nodes.get(r.rank, "")) for r in ranks)
        return ranks

    def _elapsed(
        self, summary: RunSummary | None, started: float | None, now: float, live: bool
    ) -> float | None:
        if summary is not None:
            return summary.elapsed_seconds
        if self.tracker.run_finished is not None and started is not None:
            return self.tracker.run_finished.time - started
        return now - started if started is not None and live else None

    def observe(
        self,
        info: RunInfo | None = None,
        seen: Mapping[ProcessRef, ProcessState] | None = None,
    ) -> RunState:
        """Read what is new and return the run's whole state as of the clock's now. ``info`` and
        ``seen`` are what the caller's own look at the run holds already (a ``RunHandle``, a
        /proc scan): run.json as just read and processes just looked up, taken instead of
        reading and looking again."""
        now = self.clock()
        self._looks = ProcessLooks(self.probe, seen)
        info, info_problem, summary_problem, problems = self._read_files(info)
        status, reason, launcher_alive = self._decide(info, info_problem, summary_problem, now)
        watch = self._watch_of(info)
        if watch is not None and info is not None and status.final and not self._placement_read:
            self._placement_read = True  # where it was, read once, its scheduler not asked
            self._placement = watch.recorded(self.run_dir, info)
        ranks = self._rank_states(info, status, launcher_alive, now)
        summary = self._summary or (self._lost if status.final else None)
        unsettled = self._lost if self._summary is None and status.final else None
        started = self.tracker.run_started or (info.created if info else None)
        epochs = self._config.training.epochs if self._config else 0
        preset = (self._config.name if self._config else info.preset if info else "") or (
            summary.preset if summary else ""
        )
        devices = (info.devices if info else "") or (summary.devices if summary else "")
        split = self._split(summary, status)
        return RunState(
            run_id=self.run_dir.run_id,
            path=self.run_dir.path,
            status=status,
            reason=reason,
            preset=preset,
            created=info.created if info else None,
            devices=devices,
            world_size=info.world_size if info else self.tracker.world_size,
            info=info,
            launcher_alive=launcher_alive,
            ranks=ranks,
            summary=summary,
            failure=(summary.failure if summary else None)
            or self.tracker.root_failure(status if status.final else None),
            started=started,
            elapsed=self._elapsed(summary, started, now, status.live),
            eta=eta_seconds(ranks, epochs) if status == RunStatus.RUNNING else None,
            now=now,
            epochs=epochs,
            # a script's accuracy is what it reported; the engine's, its summary's last epoch
            accuracy=summary.test_accuracy
            if summary is not None and not self._is_script()
            else self.tracker.accuracy,
            notices=tuple(self.tracker.notices),
            events_read=self.tracker.events_read,
            skipped_lines=self.skipped_lines,
            diagnosis=self._latest_snapshot(),
            script=self._config.script.label if self._config and self._is_script() else "",
            metrics_reported=self.tracker.metrics_reported,
            problem="; ".join(problems),
            unsettled=unsettled,
            placement=self._placement,
            step_breakdown=split,
            bottleneck=find_bottleneck(split),
            curves=self.step_curves.curves(),
            attempt=info.attempt if info else (summary.attempt if summary else 1),
            attempts=self.attempts.records(summary),
        )


def eta_seconds(ranks: tuple[RankState, ...], epochs: int) -> float | None:
    """Seconds until the slowest rank finishes at its current pace; None while a pace is unknown."""
    remaining = []
    for r in ranks:
        if r.state == RankStatus.DONE:
            continue
        report = r.report
        if report is None or not report.steps or not report.step_seconds or not epochs:
            return None
        steps_left = (report.steps - report.step) + (epochs - report.epoch - 1) * report.steps
        remaining.append(max(0, steps_left) * report.step_seconds)
    return max(remaining) if remaining else None


def observe_run(run_dir: RunDir, now: float | None = None, **options: Any) -> RunState:
    """One-shot observation of a run (the CLI); the UI keeps a ``RunObserver`` per run instead."""
    clock: Clock = time.time if now is None else (lambda: now)
    return RunObserver(run_dir, clock=clock, **options).observe()
