"""What the UI's thread workers read: run directories folded into views, process liveness and usage.

Plain Python (no textual, no torch). The screens call these from ``@work(thread=True)`` workers and
post the results as messages (``ddptui.messages``); nothing here touches a widget. Every reader is
incremental and cheap enough to call a few times a second while training writes to the same files.

What the UI shows must never be a guess dressed up as a fact: a run whose launcher is gone without a
summary is ``lost``, not ``running``; a rank that stopped reporting is ``stalled`` with the seconds
it has been silent; a rank ended by the launcher after another rank failed is ``stopped``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

# Kept here for its importers; it lives apart so the app can start without this module.
from ddptui.gpu_history import GpuHistory as GpuHistory
from engine.core.config import ConfigError, RunConfig, load_config
from engine.core.events import (
    CheckpointSaved,
    Evaluation,
    Event,
    EventTail,
    RankExited,
    RankStalled,
    RankStarted,
    RankStraggling,
    RunFinished,
    RunStarted,
)
from engine.core.lost_runs import LAUNCHER_START_GRACE_SECONDS, settle_lost_run
from engine.core.rank_states import LOST, ORPHANED, UNREADABLE, RankState, RankStateTracker
from engine.core.rundir import FINAL_STATES, ProcessRef, RunDir, RunDirError, RunInfo

Clock = Callable[[], float]

# Run statuses besides engine.core.rundir's final ones and engine.core.rank_states' orphaned / lost.
STARTING, RUNNING = "starting", "running"
# A run.json with no launcher recorded this long after it was created is lost.
STARTING_GRACE_SECONDS = LAUNCHER_START_GRACE_SECONDS


# ---- processes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessUsage:
    cpu_percent: float | None
    rss_bytes: int | None


class ProcessProbe:
    """Liveness and CPU / memory of processes, through psutil: the one place the UI asks the OS.

    Tests replace it with a stand-in so snapshots show fixed figures. A process is alive only when
    its pid exists with the recorded start time and it is not a zombie, so a reused pid or an
    unreaped child is never reported as a running launcher.
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()

    def alive(self, ref: ProcessRef | None) -> bool:
        if ref is None:
            return False
        try:
            proc = psutil.Process(ref.pid)
            if abs(proc.create_time() - ref.start_time) > 1.0:
                return False
            return proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, OSError):
            return False

    def pid_alive(self, pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, OSError):
            return False

    def usage(self, pids: Iterable[int]) -> dict[int, ProcessUsage]:
        """CPU percent (of one core, since the previous call for that pid) and resident memory."""
        found: dict[int, ProcessUsage] = {}
        with self._lock:
            for pid in pids:
                proc = self._procs.get(pid)
                try:
                    if proc is None or not proc.is_running():
                        proc = psutil.Process(pid)
                        self._procs[pid] = proc
                        proc.cpu_percent(None)  # primes the counter; the first figure is 0
                        cpu: float | None = None
                    else:
                        cpu = proc.cpu_percent(None)
                    found[pid] = ProcessUsage(cpu, int(proc.memory_info().rss))
                except (psutil.Error, OSError):
                    self._procs.pop(pid, None)
        return found


# ---- run views -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankView:
    """One rank as the run screen shows it."""

    rank: int
    state: str = "starting"
    detail: str = ""  # why the state: "silent 75 s", "exit code 1", "2.4x the others' step time"
    device: str = "?"
    gpu_index: int | None = None
    pid: int | None = None
    epoch: int | None = None  # 0-based epoch it is in (or last finished)
    epochs: int = 0
    step: int = 0  # steps done in this epoch
    steps: int = 0  # steps this epoch runs
    global_step: int = 0
    loss: float | None = None
    images_per_s: float | None = None
    step_seconds: float | None = None
    last_report: float | None = None  # time of its last event
    usage: ProcessUsage | None = None


@dataclass(frozen=True)
class FailureView:
    """The root cause of a failure: the first rank to fail, its error and traceback."""

    rank: int | None
    error: str
    traceback: str = ""


@dataclass(frozen=True)
class RunView:
    """Everything the run screen shows about one run, as of ``now``."""

    run_id: str
    path: Path
    preset: str = ""
    status: str = STARTING  # starting | running | completed | failed | killed | lost
    status_detail: str = ""
    devices: str = ""
    world_size: int = 0
    gpu_indices: tuple[int, ...] = ()
    started: float | None = None
    elapsed: float | None = None
    eta: float | None = None
    now: float = 0.0
    ranks: tuple[RankView, ...] = ()
    failure: FailureView | None = None
    notices: tuple[str, ...] = ()  # launcher reports and evaluations, newest last
    log_rank: int | None = None
    log_path: Path | None = None
    log_lines: tuple[str, ...] = ()
    events_read: int = 0
    skipped_lines: int = 0  # event lines this ddptui could not read (counted, never hidden)
    accuracy: float | None = None
    error: str = ""  # a reader problem (corrupt run.json, bad config), shown, never fatal

    @property
    def final(self) -> bool:
        return self.status in (*FINAL_STATES, LOST)

    @property
    def active(self) -> bool:
        return self.status in (STARTING, RUNNING)


@dataclass
class _RankPlace:
    """Where a rank runs (from its RankStarted); its state comes from engine.core.rank_states."""

    device: str = "?"
    gpu_index: int | None = None


def _tail_lines(path: Path, count: int, max_bytes: int = 32_768) -> tuple[str, ...]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ()
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first line is probably cut
    return tuple(line.rstrip() for line in lines[-count:])


def _gpu_indices(devices: str) -> tuple[int, ...]:
    kind, _, rest = devices.partition(":")
    if kind != "gpu":
        return ()
    return tuple(int(p) for p in rest.split(",") if p.strip().isdigit())


class RunReader:
    """Folds one run directory into ``RunView``s, reading only what was appended since the last poll.

    Rank states come from ``engine.core.rank_states.RankStateTracker`` (the same rules as ``ddptui runs``
    and the launcher); this adds where each rank runs, the run's status with the launcher's
    liveness, the root cause of a failure, the log tail and the ETA. Safe to call from a worker
    thread: a poll that finds the previous one still running returns None (counted in
    ``busy_polls``) instead of waiting.
    """

    def __init__(
        self,
        run_dir: RunDir,
        *,
        clock: Clock = time.time,
        probe: ProcessProbe | None = None,
        log_lines: int = 40,
        launcher_poll: Callable[[], int | None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.clock = clock
        self.probe = probe or ProcessProbe()
        self.log_line_count = log_lines
        # When this UI started the launcher, polling its Popen reaps it (no zombie left behind).
        self.launcher_poll = launcher_poll
        self.busy_polls = 0
        self.tracker = RankStateTracker()
        self._lock = threading.Lock()
        self._tails: dict[Path, EventTail] = {}
        self._places: dict[int, _RankPlace] = {}
        self._config: RunConfig | None = None
        self._config_error = ""
        self._run_started: RunStarted | None = None
        self._notices: list[str] = []
        self._events_read = 0
        self._accuracy: float | None = None
        self._summary: dict[str, Any] | None = None

    # -- reading ---------------------------------------------------------------------------------

    def _load_config(self) -> None:
        if self._config is not None or self._config_error:
            return
        if not self.run_dir.config_path.exists():
            return
        try:
            self._config = load_config(self.run_dir.config_path)
        except ConfigError as err:
            self._config_error = str(err)
            return
        self.tracker.stall_seconds = self._config.supervision.stall_seconds
        self.tracker.straggler_factor = self._config.supervision.straggler_factor

    def _note(self, e: Event) -> None:
        """Keep what the log pane should say about events that are not a rank's progress."""
        if isinstance(e, RankStarted):
            self._places[e.rank] = _RankPlace(e.device, e.gpu_index)
        elif isinstance(e, RunStarted):
            self._run_started = e
        elif isinstance(e, Evaluation) and e.rank == 0:
            self._accuracy = e.accuracy
            self._notices.append(
                f"epoch {e.epoch + 1}: test accuracy {e.accuracy:.1%} on {e.samples} images"
            )
        elif isinstance(e, CheckpointSaved):
            self._notices.append(f"rank {e.rank} saved {Path(e.path).name}")
        elif isinstance(e, RankExited) and (e.exitcode != 0 or e.signal):
            how = f"signal {e.signal}" if e.signal else f"exit code {e.exitcode}"
            self._notices.append(f"rank {e.rank} (pid {e.pid}) exited: {how}")
        elif isinstance(e, RankStalled):
            self._notices.append(f"launcher: rank {e.rank} silent for {e.silent_seconds:.0f} s")
        elif isinstance(e, RankStraggling):
            self._notices.append(
                f"launcher: rank {e.rank} straggling ({e.step_seconds:.2f} s a step, "
                f"others {e.others_median_step_seconds:.2f} s)"
            )
        elif isinstance(e, RunFinished):
            self._notices.append(f"run {e.status}" + (f": {e.reason}" if e.reason else ""))

    def _read_events(self) -> None:
        paths = [self.run_dir.launcher_events_path, *self.run_dir.rank_event_paths().values()]
        for path in paths:
            tail = self._tails.get(path)
            if tail is None:
                tail = self._tails[path] = EventTail(path)
            events = tail.read_new()
            self._events_read += len(events)
            for e in events:
                self.tracker.feed(e)
                self._note(e)

    @property
    def skipped_lines(self) -> int:
        return sum(t.skipped for t in self._tails.values())

    # -- status ----------------------------------------------------------------------------------

    def _status(self, info: RunInfo | None, now: float) -> tuple[str, str, bool | None]:
        """(status, why, launcher alive). Final statuses come from summary.json or run.json."""
        try:
            if self._summary is None:
                self._summary = self.run_dir.read_summary()
        except RunDirError as err:
            return UNREADABLE, str(err), None
        if self._summary is not None:
            return (
                str(self._summary.get("status", "?")),
                str(self._summary.get("reason", "")),
                False,
            )
        finished = self.tracker.run_finished
        if info is not None and info.state in FINAL_STATES:
            return info.state, finished.reason if finished else "", False
        if self.launcher_poll is not None:
            code = self.launcher_poll()
            if code is not None and finished is not None:
                return finished.status, finished.reason, False
            if code is not None:
                return self._gone(
                    info, f"the launcher exited (code {code}) without a summary", launcher_exit=code
                )
        if info is None:
            return STARTING, "", None
        if info.launcher is None:
            if self.launcher_poll is not None or now - info.created < STARTING_GRACE_SECONDS:
                return STARTING, "", None
            return self._gone(info, "no launcher was ever recorded in run.json")
        if self.probe.alive(info.launcher):
            started = any(r.last_event_time is not None for r in self.tracker.states(now=now))
            return (RUNNING if started else STARTING), "", True
        return self._gone(info, f"the launcher (pid {info.launcher.pid}) is gone without a summary")

    def _gone(
        self, info: RunInfo | None, why: str, launcher_exit: int | None = None
    ) -> tuple[str, str, bool | None]:
        if info is not None and any(self.probe.alive(r) for r in info.ranks):
            return ORPHANED, why + "; some of its ranks are still alive (see Processes)", False
        # Nothing of the run is alive: write the summary its launcher could not.
        settled = settle_lost_run(
            self.run_dir,
            launcher_exit=launcher_exit,
            launcher_exited=launcher_exit is not None,
            alive=self.probe.alive,
            now=self.clock(),
        )
        if settled is not None:
            self._summary = settled
            return str(settled["status"]), str(settled["reason"]), False
        return LOST, why, False

    # -- the view --------------------------------------------------------------------------------

    def poll(self, log_rank: int | None = None) -> RunView | None:
        """Read what is new and return the whole view; None when another poll is in progress."""
        if not self._lock.acquire(blocking=False):
            self.busy_polls += 1
            return None
        try:
            return self._poll(log_rank)
        finally:
            self._lock.release()

    def _poll(self, log_rank: int | None) -> RunView:
        now = self.clock()
        errors = []
        self._load_config()
        if self._config_error:
            errors.append(self._config_error)
        info: RunInfo | None = None
        if self.run_dir.run_json_path.exists():
            try:
                info = self.run_dir.read_run_info()
            except RunDirError as err:
                errors.append(str(err))
        self._read_events()
        if info is not None:
            self.tracker.world_size = max(self.tracker.world_size, info.world_size)
        status, detail, launcher_alive = self._status(info, now)
        ended = status in FINAL_STATES or status == LOST
        states = self.tracker.states(
            now=now,
            launcher_alive=launcher_alive is not False,
            run_status=status if ended else None,
        )
        live = status in (RUNNING, STARTING, ORPHANED)
        usage = self.probe.usage([s.pid for s in states if s.pid]) if live else {}
        epochs = self._config.training.epochs if self._config else 0
        ranks = tuple(
            RankView(
                rank=s.rank,
                state=s.state,
                detail=s.reason,
                device=self._places.get(s.rank, _RankPlace()).device,
                gpu_index=self._places.get(s.rank, _RankPlace()).gpu_index,
                pid=s.pid,
                epoch=s.epoch,
                epochs=epochs,
                step=s.step or 0,
                steps=s.steps or 0,
                global_step=s.global_step or 0,
                loss=s.loss,
                images_per_s=s.images_per_s,
                step_seconds=s.step_seconds,
                last_report=s.last_event_time,
                usage=usage.get(s.pid) if s.pid else None,
            )
            for s in states
        )
        failure = self._failure(states)
        started = self._run_started.time if self._run_started else (info.created if info else None)
        elapsed: float | None
        summary_elapsed = (self._summary or {}).get("elapsed_seconds")
        if isinstance(summary_elapsed, (int, float)):
            elapsed = float(summary_elapsed)
        elif self.tracker.run_finished is not None and started is not None:
            elapsed = self.tracker.run_finished.time - started
        else:
            elapsed = now - started if started is not None and live else None
        if log_rank is None:
            log_rank = failure.rank if failure and failure.rank is not None else 0
        log_path = self.run_dir.rank_log_path(log_rank)
        devices = (info.devices if info else "") or (
            self._run_started.devices if self._run_started else ""
        )
        gpu_indices = _gpu_indices(devices) or tuple(
            sorted({p.gpu_index for p in self._places.values() if p.gpu_index is not None})
        )
        preset = self._config.name if self._config else (info.preset if info else "")
        return RunView(
            run_id=self.run_dir.run_id,
            path=self.run_dir.path,
            preset=preset,
            status=status,
            status_detail=detail,
            devices=devices,
            world_size=len(ranks),
            gpu_indices=gpu_indices,
            started=started,
            elapsed=elapsed,
            eta=self._eta(ranks) if status == RUNNING else None,
            now=now,
            ranks=ranks,
            failure=failure,
            notices=tuple(self._notices[-20:]),
            log_rank=log_rank,
            log_path=log_path,
            log_lines=_tail_lines(log_path, self.log_line_count),
            events_read=self._events_read,
            skipped_lines=self.skipped_lines,
            accuracy=self._accuracy,
            # The screen already names the run: say "run.json: …", not the whole path.
            error="; ".join(e.replace(f"{self.run_dir.path}/", "") for e in errors),
        )

    def _failure(self, states: tuple[RankState, ...]) -> FailureView | None:
        """The root cause: summary.json's failure when written, else the first rank to fail."""
        summary_failure = (self._summary or {}).get("failure")
        if isinstance(summary_failure, dict):
            f = summary_failure
            error = str(f.get("error") or "")
            if not error and f.get("signal"):
                error = f"ended by {f['signal']}"
            elif not error and f.get("exitcode") is not None:
                error = f"exit code {f['exitcode']}"
            return FailureView(
                rank=f.get("rank"), error=error, traceback=str(f.get("traceback") or "")
            )
        failed = [s for s in states if s.state == "failed"]
        if not failed:
            return None
        reported = [s for s in failed if s.error]
        if reported:
            first = min(reported, key=lambda s: s.last_event_time or 0.0)
            return FailureView(rank=first.rank, error=first.error, traceback=first.traceback)
        first = failed[0]
        return FailureView(rank=first.rank, error=f"{first.reason} (no traceback reported)")

    def _eta(self, ranks: tuple[RankView, ...]) -> float | None:
        remaining = []
        for r in ranks:
            if r.state == "done":
                continue
            if r.epoch is None or not r.steps or not r.step_seconds or not r.epochs:
                return None
            steps_left = (r.steps - r.step) + (r.epochs - r.epoch - 1) * r.steps
            remaining.append(max(0, steps_left) * r.step_seconds)
        return max(remaining) if remaining else None


# ---- run listings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunListing:
    """One row of the runs screen."""

    run_id: str
    path: Path
    preset: str
    status: str
    devices: str
    created: float
    elapsed: float | None
    accuracy: float | None = None
    detail: str = ""


def list_run_listings(
    runs_dir: Path, *, clock: Clock = time.time, probe: ProcessProbe | None = None
) -> list[RunListing]:
    """Every run under ``runs_dir``, newest first, with an honest status (as ``RunReader``'s)."""
    from engine.core.rundir import list_runs

    probe = probe or ProcessProbe()
    now = clock()
    return [_listing(run_dir, now, probe) for run_dir in reversed(list_runs(runs_dir))]


def _listing(run_dir: RunDir, now: float, probe: ProcessProbe) -> RunListing:
    info: RunInfo | None = None
    detail = ""
    try:
        info = run_dir.read_run_info()
    except RunDirError as err:
        detail = str(err)
    try:
        summary = run_dir.read_summary()
    except RunDirError as err:
        summary, detail = None, str(err)
    accuracy = None
    elapsed: Any = None
    if summary is not None:
        status = str(summary.get("status", "?"))
        elapsed = summary.get("elapsed_seconds")
        acc = summary.get("test_accuracy")
        accuracy = float(acc) if isinstance(acc, (int, float)) else None
        detail = str(summary.get("reason", ""))
    elif info is None:
        status = UNREADABLE
    elif info.state in FINAL_STATES:
        status = info.state
    elif probe.alive(info.launcher):
        status, elapsed = (RUNNING if info.state == RUNNING else STARTING), now - info.created
    elif info.launcher is None and now - info.created < STARTING_GRACE_SECONDS:
        status, elapsed = STARTING, now - info.created
    elif any(probe.alive(r) for r in info.ranks):
        status, detail = ORPHANED, "launcher gone, some ranks still alive"
    else:
        status, detail = LOST, "launcher gone without a summary"
        settled = settle_lost_run(run_dir, alive=probe.alive, now=now)
        if settled is not None:
            status, detail = str(settled["status"]), str(settled["reason"])
    return RunListing(
        run_id=run_dir.run_id,
        path=run_dir.path,
        preset=info.preset if info else "",
        status=status,
        devices=info.devices if info else "",
        created=info.created if info else 0.0,
        elapsed=float(elapsed) if isinstance(elapsed, (int, float)) else None,
        accuracy=accuracy,
        detail=detail,
    )


def run_is_active(run_dir: RunDir, probe: ProcessProbe, now: float) -> bool:
    """Whether a run is still going (its launcher is alive and it has not ended)."""
    return _listing(run_dir, now, probe).status in (RUNNING, STARTING)
