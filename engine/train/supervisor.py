"""The launcher's watch over its ranks, from the moment they run until the last has exited.

Every ``POLL_SECONDS`` it reaps exits; every ``READ_SECONDS`` it reads the ranks' events and applies
the stall and straggler rules of ``engine.core.runs.rank_states`` (the one place they live):

- the first rank to fail is the root cause; the others get ``supervision.failure_grace_seconds``
  to exit, then SIGKILL (a rank stuck in a collective never exits by itself);
- a rank silent past its stall threshold is reported stalled (and every rank's stack taken once
  per stall), a rank whose step time is ``supervision.straggler_factor`` times the others' median
  is reported straggling, and with ``supervision.kill_stalled_after`` a stalled run is stopped;
- SIGTERM or SIGINT to the launcher stops the ranks (stacks first, then SIGTERM, grace, SIGKILL)
  and ends the run as killed.

``supervise`` returns how the run ended; ``engine.train.launch`` writes it down.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import psutil

from engine.core.common.run_files import tail_lines
from engine.core.common.statuses import RankStatus, RunStatus
from engine.core.config.schema import RunConfig
from engine.core.host.oom_evidence import OomBaseline, sigkill_cause
from engine.core.procs.process_identity import ProcessRef
from engine.core.procs.stopping import descendants
from engine.core.runs.events import (
    EventTail,
    EventWriter,
    RankExited,
    RankFailed,
    RankFinished,
    RankStalled,
    RankStraggling,
    StacksTaken,
    StopSignalled,
)
from engine.core.runs.rank_states import RankStateTracker, Thresholds
from engine.core.runs.rundir import RunDir
from engine.core.runs.stop_request import read_stop_request
from engine.core.runs.summary import Failure, exit_status
from engine.core.stacks.diagnosis import RankTarget, take_snapshot
from engine.core.stacks.snapshot import StackSnapshot, latest_snapshot
from engine.train.silence_probes import SilenceProbes

# Exits are reaped every POLL_SECONDS, so a dead rank stops its peers at once; the event files
# are read, and the stall and straggler rules applied, every READ_SECONDS, which keeps the
# launcher's own CPU (taken from the ranks on a busy machine) near torchrun's agent's.
POLL_SECONDS = 0.1
READ_SECONDS = 0.5
# A stop right after a snapshot (the stall's, or the one ``ddptui kill`` takes before it signals
# the launcher) does not take another: the ranks are already on their way down.
RECENT_SNAPSHOT_SECONDS = 15.0


@dataclass
class RankWatch:
    """What the launcher knows of one local rank's process; its state is the tracker's."""

    rank: int
    pid: int | None = None
    tail: EventTail | None = None
    finished: bool = False
    failed_event: RankFailed | None = None
    exitcode: int | None = None
    exited: bool = False
    stalled: bool = False  # reported stalled, and silent since
    stalled_since: float = 0.0  # when it was reported stalled
    straggling: bool = False  # reported straggling, and still so


class Supervisor:
    """Watches the local ranks of one run until every one has exited. Whether a rank is stalled or
    straggling is the run observer's rule (``RankStateTracker``), fed the same events readers
    see; the launcher reports what it finds as events and acts on it."""

    def __init__(
        self,
        run_dir: RunDir,
        config: RunConfig,
        ranks: list[int],
        events: EventWriter,
        oom_baseline: OomBaseline | None = None,
        error_of: Callable[[int], str] = lambda rank: "",
        take_stacks: Callable[[str], StackSnapshot | None] | None = None,
        stop_stalled: bool = False,
    ):
        self.run_dir = run_dir
        # A stalled rank stops the run once its stacks are taken (a restart follows), unless
        # supervision.kill_stalled_after asks to wait longer.
        self.stop_stalled = stop_stalled
        # Whose stacks a snapshot takes: this launcher's ranks, or (a node launcher of a run
        # across nodes) every rank of the run, through ``take_stacks``.
        self.take_stacks = take_stacks
        self.error_of = error_of  # what a rank that could not report raised, by rank
        self.oom_baseline = oom_baseline
        self.config = config
        self.events = events
        self.watches = {
            r: RankWatch(rank=r, tail=EventTail(run_dir.rank_events_path(r), run_dir.path))
            for r in ranks
        }
        self.tracker = RankStateTracker(
            world_size=len(ranks),
            thresholds=Thresholds.of(config),
            run_started=time.time(),
            stops_recorded=True,  # enforce_stop names every rank it signals
        )
        self.stop_reason = ""  # why the launcher stopped the ranks, when it did
        self.stop_status: RunStatus | None = None
        self.stop_deadline: float | None = None
        self.stall_kill_rank: int | None = None
        self.stop_signal_sent: signal.Signals | None = None
        self.processes: dict[int, psutil.Process] = {}
        self.distributed = config.strategy.name == "ddp"
        self.started = time.time()
        self.stall_episode = False  # a snapshot was taken since a rank went stalled
        self.probes = SilenceProbes(run_dir.path, distributed=self.distributed)
        # ranks a probe found stalled while their peers waited on them: (when, why)
        self.stalled_culprits: dict[int, tuple[float, str]] = {}
        self._snapshot_thread: threading.Thread | None = None
        self._snapshot_done: list[StackSnapshot] = []

    # -- stacks ------------------------------------------------------------------------------
    def _targets(self) -> list[RankTarget]:
        reported = {s.rank: s.last_event_time for s in self.tracker.states()}
        targets = []
        for rank, proc in sorted(self.processes.items()):
            try:
                ref = ProcessRef(proc.pid, proc.create_time())
            except psutil.Error:  # gone and reaped: a ref no process has
                ref = ProcessRef(proc.pid, -1.0)
            w = self.watches[rank]
            error = w.failed_event.error if w.failed_event is not None else ""
            ended = w.exitcode if w.exited else None
            targets.append(RankTarget(rank, ref, reported.get(rank), error, exitcode=ended))
        return targets

    def _take(self, reason: str) -> None:
        if self.take_stacks is not None:
            taken = self.take_stacks(reason)
        else:
            taken = take_snapshot(
                self.run_dir.path, self._targets(), reason=reason, distributed=self.distributed
            )
        if taken is not None:
            self._snapshot_done.append(taken)

    def snapshot_in_background(self, reason: str) -> None:
        """Every rank's stack, taken while supervision goes on (py-spy may take a second)."""
        if self._snapshot_busy():
            return
        self.probes.interrupt()
        self._snapshot_thread = threading.Thread(
            target=self._take, args=(reason,), name="stack-snapshot", daemon=True
        )
        self._snapshot_thread.start()

    def snapshot_now(self, reason: str) -> None:
        """Every rank's stack before the launcher stops them, unless one was just taken (by the
        stall snapshot, or by ``ddptui kill`` before it signalled this launcher)."""
        if self._snapshot_thread is not None:
            self._snapshot_thread.join()
        latest = latest_snapshot(self.run_dir.path)
        if latest is not None and time.time() - latest.time < RECENT_SNAPSHOT_SECONDS:
            return
        if any(not w.exited for w in self.watches.values()):
            self._take(reason)

    def report_snapshots(self) -> None:
        """Say in the launcher's events what the snapshots taken meanwhile found."""
        while self._snapshot_done:
            snapshot = self._snapshot_done.pop(0)
            self.events.write(
                StacksTaken(
                    path=snapshot.path,
                    reason=snapshot.reason,
                    culprit_rank=snapshot.culprit_rank,
                    summary=snapshot.summary_line(),
                )
            )

    def culprit_note(self, root_rank: int | None) -> str:
        """The latest snapshot of this run, when it names a culprit other than the root cause."""
        latest = latest_snapshot(self.run_dir.path)
        if latest is None or latest.time < self.started or latest.culprit is None:
            return ""
        if latest.culprit_rank == root_rank:
            return ""
        return f"{latest.culprit.describe()} ({latest.culprit_reason})"

    # -- reading the ranks ------------------------------------------------------------------
    def read_events(self) -> None:
        for w in self.watches.values():
            assert w.tail is not None
            for e in w.tail.read_new():
                self.tracker.feed(e)
                if isinstance(e, RankFailed):
                    w.failed_event = e
                elif isinstance(e, RankFinished):
                    w.finished = True

    def apply_probes(self, now: float) -> None:
        """Flag the ranks a probe found stalled (``engine.train.silence_probes``), unless they
        spoke since it began: the stall, its stacks and its culprit, at once."""
        verdicts = self.probes.verdicts()
        if not verdicts:  # almost always: the ranks' states are not worked out for nothing
            return
        states = {s.rank: s for s in self.tracker.states(now=now, launcher_alive=True)}
        for verdict, heard in verdicts:
            w, state = self.watches.get(verdict.rank), states.get(verdict.rank)
            if w is None or state is None or w.exited or w.stalled:
                continue
            if state.last_event_time != heard:
                continue  # it spoke meanwhile
            silent = round(state.silent_seconds or 0.0, 1)
            stalled = RankStalled(rank=w.rank, silent_seconds=silent, why=verdict.why)
            self.events.write(stalled)
            self.tracker.feed(stalled)
            self._snapshot_done.append(verdict.snapshot)
            w.stalled, w.stalled_since, self.stall_episode = True, now, True
            self.stalled_culprits.setdefault(w.rank, (now, verdict.why))

    def check_health(self, now: float) -> None:
        sup = self.config.supervision
        self.apply_probes(now)
        states = {
            s.rank: s for s in self.tracker.states(now=now, launcher_alive=True, judge_silence=True)
        }
        for w in self.watches.values():
            state = states.get(w.rank)
            if w.exited or w.finished or state is None:
                continue
            stalled = state.state == RankStatus.STALLED
            silent = state.silent_seconds or 0.0
            if stalled and not w.stalled:
                self.events.write(RankStalled(rank=w.rank, silent_seconds=round(silent, 1)))
                w.stalled_since = now
                if not self.stall_episode:
                    self.stall_episode = True
                    self.snapshot_in_background("stall")
            w.stalled = stalled
            if stalled and self.stop_deadline is None and self._stall_over(w, now):
                self.stall_kill_rank = w.rank
                by = (
                    "supervision.kill_stalled_after"
                    if sup.kill_stalled_after > 0
                    else "supervision.max_restarts, to restart it"
                )
                self.begin_stop(
                    RunStatus.FAILED,
                    f"rank {w.rank} reported nothing for {silent:.0f} s; stopped by {by}",
                )
            behind = state.state == RankStatus.STRAGGLER
            if behind and not w.straggling:
                self.events.write(
                    RankStraggling(
                        rank=w.rank,
                        step_seconds=round(state.step_seconds or 0.0, 4),
                        others_median_step_seconds=round(state.peers_step_seconds or 0.0, 4),
                    )
                )
            w.straggling = behind
        if not any(w.stalled for w in self.watches.values()):
            self.stall_episode = False  # the next stall gets its own snapshot
        if not self._snapshot_busy():
            live = {r for r, w in self.watches.items() if not (w.exited or w.finished or w.stalled)}
            self.probes.consider(states, live, self._targets)

    def _stall_over(self, w: RankWatch, now: float) -> bool:
        """Whether rank ``w``, stalled, has been so long enough to stop the run."""
        after = self.config.supervision.kill_stalled_after
        if after <= 0 and not self.stop_stalled:
            return False
        return now - w.stalled_since >= after

    def _snapshot_busy(self) -> bool:
        return self._snapshot_thread is not None and self._snapshot_thread.is_alive()

    def reap(self, processes: dict[int, psutil.Process]) -> None:
        for rank, proc in processes.items():
            w = self.watches[rank]
            if w.exited:
                continue
            try:
                code = proc.wait(timeout=0)
            except psutil.TimeoutExpired:
                continue
            except psutil.NoSuchProcess:
                code = None
            w.exited = True
            w.exitcode = code
            w.pid = proc.pid
            exitcode, signal_name = exit_status(code)
            exited = RankExited(rank=rank, pid=proc.pid, exitcode=exitcode, signal=signal_name)
            self.events.write(exited)
            self.tracker.feed(exited)

    # -- stopping ---------------------------------------------------------------------------
    def begin_stop(
        self, status: RunStatus, reason: str, *, stacks: bool = True, grace: float | None = None
    ) -> None:
        """Take every rank's stack (unless ``stacks`` is False), then ask every live rank to stop;
        after the grace period (``supervision.failure_grace_seconds`` unless ``grace``) the rest
        are killed."""
        if self.stop_deadline is not None:
            return
        self.probes.close()  # its py-spy must not meet the stop's
        if stacks:
            self.snapshot_now("before stop")
            self.report_snapshots()
        self.stop_status, self.stop_reason = status, reason
        wait = self.config.supervision.failure_grace_seconds if grace is None else grace
        self.stop_deadline = time.monotonic() + wait

    def enforce_stop(self, processes: dict[int, psutil.Process]) -> None:
        """SIGTERM once when the stop begins, SIGKILL once the grace period is over; each time
        the launcher's events say which ranks and processes got it (``StopSignalled``)."""
        if self.stop_deadline is None:
            return
        overdue = time.monotonic() >= self.stop_deadline
        if self.stop_signal_sent == (signal.SIGKILL if overdue else signal.SIGTERM):
            return
        sig = signal.SIGKILL if overdue else signal.SIGTERM
        live = {r: p for r, p in processes.items() if not self.watches[r].exited}
        signalled = []
        for target in [*live.values(), *descendants(live.values())]:
            with contextlib.suppress(psutil.Error):
                target.send_signal(sig)
                signalled.append(target.pid)
        self.stop_signal_sent = sig
        if live:
            stop = StopSignalled(
                signal=sig.name,
                ranks=tuple(sorted(live)),
                pids=tuple(signalled),
                reason=self.stop_reason,
            )
            self.events.write(stop)
            self.tracker.feed(stop)

    def stall_root(self) -> tuple[int, str]:
        """(rank, error) a stopped stall is blamed on: the rank its stacks name as the one the
        others wait on, else the first rank found stalled (a waiting peer may fall silent first)."""
        assert self.stall_kill_rank is not None
        latest = latest_snapshot(self.run_dir.path)
        named = latest.culprit_rank if latest is not None and latest.time >= self.started else None
        if named is None or named == self.stall_kill_rank:
            return self.stall_kill_rank, self.stop_reason
        why = latest.culprit_reason if latest is not None else ""
        return named, f"rank {named} stalled ({why}); {self.stop_reason}"

    def stalled_first(self, cause: Failure | None) -> Failure | None:
        """A rank found stalled while its peers waited on it, before any rank failed, is the root
        cause of their failures (a collective's timeout): not the peer that timed out first."""
        if cause is None or not self.stalled_culprits:
            return cause
        rank, (when, why) = min(self.stalled_culprits.items(), key=lambda kv: kv[1][0])
        failed = [w.failed_event.time for w in self.watches.values() if w.failed_event is not None]
        if rank == cause.rank or (failed and min(failed) < when):
            return cause
        then = f"; {cause.who} then failed: {cause.error}" if cause.rank is not None else ""
        return Failure(
            rank=rank,
            error=f"rank {rank} stalled: {why}{then}",
            traceback=_log_tail(self.run_dir, rank),
        )

    def root_cause(self) -> Failure | None:
        """The root cause as the rank rules decide it (``RankStateTracker.root_failure``), with
        what only the launcher knows of a rank that died without a report: the error its spawn
        left, whether the kernel's OOM killer sent its SIGKILL, and the end of its log."""
        cause = self.tracker.root_failure()
        if cause is None or cause.rank is None or cause.rank not in self.watches:
            return cause
        w = self.watches[cause.rank]
        if w.failed_event is not None:
            return cause
        error = self.error_of(w.rank) or cause.error
        if cause.signal == "SIGKILL" and w.pid is not None:
            why = sigkill_cause(w.pid, self.oom_baseline)
            error += f"; {why}" if why else ""
        return replace(cause, error=error, traceback=_log_tail(self.run_dir, w.rank))


def _with_note(reason: str, note: str) -> str:
    return f"{reason}; stacks before the stop: {note}" if note else reason


def _log_tail(run_dir: RunDir, rank: int, lines: int = 40) -> str:
    """The end of a rank's log, read from its end only, however large the log has grown."""
    return "\n".join(tail_lines(run_dir.rank_log_path(rank), lines, run_path=run_dir.path))


def supervise(
    run_dir: RunDir,
    config: RunConfig,
    processes: dict[int, psutil.Process],
    events: EventWriter,
    oom_baseline: OomBaseline | None = None,
    error_of: Callable[[int], str] = lambda rank: "",
    take_stacks: Callable[[str], StackSnapshot | None] | None = None,
    signal_stop_grace: float | None = None,
    *,
    stop_requests: list[str] | None = None,
    stop_stalled: bool = False,
) -> tuple[RunStatus, Failure | None, str]:
    """Watch the ranks until all have exited; returns (status, root cause, reason).

    ``take_stacks`` takes the run's stacks instead of this launcher's own ranks' (a node
    launcher). ``signal_stop_grace``: a SIGTERM to this launcher stops its ranks with this grace
    and no snapshot first (a node launcher that its scheduler is ending: it has the scheduler's
    grace only, and ``ddptui kill`` took the stacks before it cancelled the job).
    ``stop_requests``: the signals received, shared with a caller that goes on after this returns
    (a restart's wait), whose requests stop the ranks at once. ``stop_stalled``: a stalled rank
    stops the run (its stacks taken first) without waiting for
    ``supervision.kill_stalled_after``."""
    sup = Supervisor(
        run_dir, config, sorted(processes), events, oom_baseline, error_of, take_stacks,
        stop_stalled,
    )  # fmt: skip
    sup.processes = processes
    requested: list[str] = [] if stop_requests is None else stop_requests

    def on_signal(signum: int, _frame: object) -> None:
        requested.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    last_read = 0.0
    while True:
        now = time.time()
        fresh = now - last_read >= READ_SECONDS or bool(requested)
        if fresh:
            sup.read_events()
            last_read = now
        sup.reap(processes)
        if requested and sup.stop_deadline is None:
            asked = read_stop_request(run_dir)
            sup.begin_stop(
                RunStatus.KILLED,
                asked.sentence if asked else f"the launcher received {requested[0]}",
                stacks=signal_stop_grace is None,
                grace=signal_stop_grace,
            )
        failed = [
            w
            for w in sup.watches.values()
            if (w.exited and w.exitcode != 0) or w.failed_event is not None
        ]
        if failed and sup.stop_deadline is None:
            first = failed[0].rank
            sup.begin_stop(RunStatus.FAILED, f"rank {first} failed; the other ranks were stopped")
        if fresh and sup.stop_deadline is None:
            sup.check_health(now)
        sup.report_snapshots()
        sup.enforce_stop(processes)
        if all(w.exited for w in sup.watches.values()):
            break
        time.sleep(POLL_SECONDS)
    sup.probes.close()
    sup.read_events()
    sup.report_snapshots()
    return how_it_ended(sup, run_dir)


def how_it_ended(sup: Supervisor, run_dir: RunDir) -> tuple[RunStatus, Failure | None, str]:
    """Once every rank has exited: (status, root cause, reason) of the run, from what the
    supervision saw (a stop asked for, a stall it stopped, the first failure) and the exit codes."""
    if sup.stop_status == RunStatus.KILLED:
        return RunStatus.KILLED, None, _with_note(sup.stop_reason, sup.culprit_note(None))
    if sup.stall_kill_rank is not None:
        rank, error = sup.stall_root()
        return (
            RunStatus.FAILED,
            Failure(rank=rank, error=error, traceback=_log_tail(run_dir, rank)),
            _with_note(error, sup.culprit_note(rank)),
        )
    cause = sup.stalled_first(sup.root_cause())
    if cause is not None:
        if cause.every_rank:  # no one rank's doing: a snapshot's "failed first" is no culprit
            return RunStatus.FAILED, cause, cause.error
        reason = f"rank {cause.rank} failed: {cause.error}"
        return RunStatus.FAILED, cause, _with_note(reason, sup.culprit_note(cause.rank))
    if all(w.exitcode == 0 for w in sup.watches.values()):
        return RunStatus.COMPLETED, None, ""
    return RunStatus.FAILED, None, "a rank ended without finishing"
