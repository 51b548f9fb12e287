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
``lost`` when nothing is alive.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.core.backends.slurm.jobs import read_job
from engine.core.backends.slurm.state import (
    JobReader,
    SlurmVerdict,
    SlurmView,
    decide,
    ended_view,
    read_view,
    slurm_summary,
)
from engine.core.common.config_error import ConfigError
from engine.core.common.statuses import ProcessState, RankStatus, RunStatus
from engine.core.config.devices import DevicePlan
from engine.core.config.schema import RunConfig
from engine.core.procs.process_identity import ProcessLooks, ProcessProbe, ProcessRef
from engine.core.runs.events import EventTail
from engine.core.runs.placement import rank_nodes
from engine.core.runs.rank_states import RankState, RankStateTracker, Thresholds
from engine.core.runs.run_listing import RunListing
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo
from engine.core.runs.settle import lost_summary
from engine.core.runs.step_breakdown import (
    Bottleneck,
    StepBreakdown,
    StepBreakdownFold,
    find_bottleneck,
)
from engine.core.runs.step_curves import StepCurveFold, StepCurves
from engine.core.runs.summary import Failure, RunSummary
from engine.core.stacks.snapshot import StackSnapshot, latest_snapshot, snapshot_paths

# A launcher records itself in run.json within seconds of its start; a run.json that names none
# this long after it was made belongs to a launcher that died first.
LAUNCHER_START_GRACE_SECONDS = 30.0

Clock = Callable[[], float]


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
    # The end this observation found that no one has written down (a lost run's summary, an
    # ended Slurm job's): what ``engine.core.runs.settle.Settler`` writes when a caller asks.
    unsettled: RunSummary | None = None
    unsaved: str = ""  # a settler could not write the summary shown here (a full disk), and why
    slurm: SlurmView | None = None  # a run on Slurm: its job and its node launchers' records
    # Each rank's step split (recent while it runs, the whole run's once it ended), the cause
    # it names, and the per-step curves (engine.core.runs.step_breakdown, step_curves).
    step_breakdown: tuple[StepBreakdown, ...] = ()
    bottleneck: Bottleneck | None = None
    curves: StepCurves = field(default_factory=StepCurves)

    @property
    def final(self) -> bool:
        return self.status.final

    @property
    def active(self) -> bool:
        return self.status.active

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
            **({"slurm": self.slurm.to_json()} if self.slurm else {}),
            "step_breakdown": [b.to_json() for b in self.step_breakdown],
            "bottleneck": self.bottleneck.sentence if self.bottleneck else "",
        }


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
        slurm_jobs: JobReader | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.slurm_jobs = slurm_jobs or read_job  # Slurm's word on a job (a stand-in in tests)
        self._slurm: SlurmView | None = None
        self._slurm_end: tuple[SlurmVerdict, SlurmView] | None = None  # once the job is over
        self._slurm_read = False  # the node records of an ended Slurm run were read
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
        if info.slurm is not None:
            return self._decide_slurm(info, now)
        finished = self.tracker.run_finished
        if info.state.final:
            return info.state, finished.reason if finished else "", False
        if self.launcher_poll is not None:
            code = self.launcher_poll()
            if code is not None:
                with contextlib.suppress(RunDirError):  # it may have written it meanwhile
                    self._summary = self.run_dir.read_summary()
                if self._summary is not None:
                    return self._summary.status, self._summary.reason, False
                why = f"the launcher exited (code {code}) without a summary"
                return self._gone(info, why, launcher_exit=code)
        if info.launcher is None:
            if self.launcher_poll is not None or now - info.created < LAUNCHER_START_GRACE_SECONDS:
                return RunStatus.STARTING, "", None
            return self._gone(info, "no launcher was ever recorded in run.json")
        if self._looks.alive(info.launcher):  # starting until it has started the ranks
            return info.state, "", True
        return self._gone(info, f"the launcher (pid {info.launcher.pid}) is gone without a summary")

    def _decide_slurm(self, info: RunInfo, now: float) -> tuple[RunStatus, str, bool | None]:
        """A run on Slurm: ``engine.core.backends.slurm.state`` decides from Slurm's word on its job
        and its node launchers' records. While the job runs its node launchers judge silence, as
        a live launcher does; once it is over, its summary is built once."""
        if self._slurm_end is None:
            view = read_view(self.run_dir, info, self.slurm_jobs)
            # inside an allocation, the srun that started the step is its launcher here
            step_alive = self._looks.alive(info.launcher) if info.launcher else None
            verdict = decide(info, view, now, step_alive)
            self._slurm = view
            if not verdict.ended:
                return verdict.status, verdict.reason, verdict.status == RunStatus.RUNNING
            self._slurm_end = (verdict, view)
        verdict, view = self._slurm_end
        if self._lost is None:
            self._lost = slurm_summary(self.run_dir, verdict, view)
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
        if self.measure_usage and live and (info is None or info.slurm is None):
            usage = self.probe.usage([r.pid for r in ranks if r.pid])
            ranks = tuple(replace(r, usage=usage.get(r.pid)) if r.pid else r for r in ranks)
        if self._slurm is not None:  # each rank's node, as the launcher that numbered it said
            nodes = rank_nodes(self._slurm.nodes)
            ranks = tuple(replace(r, node=nodes.get(r.rank, "")) for r in ranks)
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
        if info is not None and info.slurm is not None and status.final and not self._slurm_read:
            self._slurm_read = True  # its nodes' last word, read once, without asking Slurm
            self._slurm = ended_view(self.run_dir, info)
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
            slurm=self._slurm,
            step_breakdown=split,
            bottleneck=find_bottleneck(split),
            curves=self.step_curves.curves(),
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
