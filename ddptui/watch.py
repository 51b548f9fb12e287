"""What the UI's thread workers read: runs, as the run observer sees them, plus a rank's log tail,
and the machine's queue (its line as ``engine.core.queue.standing`` decides it).

Plain Python (no textual, no torch). The screens call these from ``@work(thread=True)`` workers and
post the results as messages (``ddptui.messages``); nothing here touches a widget. Every status,
rank state and root cause comes from ``engine.core.runs.observer``, the same place as ``ddptui runs``
and the launcher's own supervision; this module only adds what a screen shows beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

# Kept here for its importers; it lives apart so the app can start without this module.
from ddptui.gpu_history import GpuHistory as GpuHistory
from engine.core.common.config_error import ConfigError
from engine.core.common.run_files import tail_lines, user_name
from engine.core.procs.process_identity import ProcessProbe
from engine.core.runs.node_files import NodeGpus, read_node_gpus
from engine.core.runs.observer import RunObserver
from engine.core.runs.run_listing import RunCatalog, RunListing
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir, list_runs
from engine.core.runs.settle import Settler

if TYPE_CHECKING:  # the queue's modules load with the first read of the line
    from engine.core.queue.line import Verdict

Clock = Callable[[], float]


# ---- one run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunView:
    """What the run screen shows of one run: its observed state and the tail of one rank's log."""

    run: RunState
    log_rank: int | None = None
    log_path: Path | None = None
    log_lines: tuple[str, ...] = ()
    # A run across nodes: each node's GPUs, as its node launcher sampled them there.
    node_gpus: dict[str, NodeGpus] = field(default_factory=dict)


class RunReader:
    """One run directory for the run screen: a ``RunObserver`` (reading only what was appended
    since the last poll), the ``Settler`` that writes down the summary of a run it finds lost
    (a worker thread may write; the observer only reads), and the log tail of the rank on show.

    Safe to call from a worker thread: a poll that finds the previous one still running returns
    None (counted in ``busy_polls``) instead of waiting.
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
        # When this UI started the launcher, polling its Popen reaps it (no zombie left behind).
        self.observer = RunObserver(
            run_dir,
            clock=clock,
            probe=probe,
            launcher_poll=launcher_poll,
            measure_usage=True,
        )
        self.settler = Settler()
        self.log_line_count = log_lines
        self.busy_polls = 0
        self._lock = threading.Lock()

    def poll(self, log_rank: int | None = None) -> RunView | None:
        """Read what is new and return the whole view; None when another poll is in progress."""
        if not self._lock.acquire(blocking=False):
            self.busy_polls += 1
            return None
        try:
            run = self.settler.settle(self.observer.observe())
        finally:
            self._lock.release()
        if log_rank is None:
            failing = run.failure.rank if run.failure else None
            log_rank = failing if failing is not None else 0
        log_path = self.run_dir.rank_log_path(log_rank)
        return RunView(
            run=run,
            log_rank=log_rank,
            log_path=log_path,
            log_lines=tail_lines(log_path, self.log_line_count, run_path=self.run_dir.path),
            node_gpus=read_node_gpus(self.run_dir.path) if run.across_nodes else {},
        )


# ---- run listings --------------------------------------------------------------------------------


class RunLister:
    """Every run under a runs directory, newest first, through one ``RunCatalog`` kept between
    listings: an ended run is read once, a going one only for what its ranks appended."""

    def __init__(
        self, runs_dir: Path, *, clock: Clock = time.time, probe: ProcessProbe | None = None
    ) -> None:
        self.runs_dir = runs_dir
        self.catalog = RunCatalog(runs_dir, clock=clock, probe=probe, settle=True)

    def list(self) -> list[RunListing]:
        return list(reversed(self.catalog.list()))


def list_run_listings(
    runs_dir: Path, *, clock: Clock = time.time, probe: ProcessProbe | None = None
) -> list[RunListing]:
    """Every run under ``runs_dir``, newest first, with its observed status (one-shot)."""
    return RunLister(runs_dir, clock=clock, probe=probe).list()


def latest_active_run(runs_dir: Path, probe: ProcessProbe, now: float) -> RunDir | None:
    """The newest run under ``runs_dir`` that is still going (the run observer decides), or
    None. Reads and never writes; a run with its summary has ended and is passed over unread."""
    for run_dir in reversed(list_runs(runs_dir)):
        if run_is_active(run_dir, probe, now):
            return run_dir
    return None


def run_is_active(run_dir: RunDir, probe: ProcessProbe, now: float) -> bool:
    """Whether a run is still going. Safe on the UI thread: it reads and never writes. A run
    with its summary has ended (whatever the summary says, or if it cannot be read): passed over
    without reading its events."""
    if run_dir.summary_path.exists():
        return False
    observer = RunObserver(run_dir, clock=lambda: now, probe=probe)
    return observer.observe().active


# ---- the machine's queue -------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueView:
    """The Runs screen's queue: every live claim's verdict (holding first, then the line), the
    names of their owners, or the one sentence why the claim store cannot be read."""

    verdicts: tuple[Verdict, ...] = ()
    users: dict[int, str] = field(default_factory=dict)
    problem: str = ""


def read_queue_view(read_line: Callable[[], list[Verdict]]) -> QueueView:
    """``read_line()`` (``EngineActions.read_queue``) with each owner's name looked up here, in
    the worker: a user database may be slow to answer."""
    try:
        verdicts = tuple(read_line())
    except ConfigError as err:  # ClaimStoreError: an untrusted store, said where the line goes
        return QueueView(problem=str(err))
    return QueueView(verdicts, {uid: user_name(uid) for uid in {v.claim.uid for v in verdicts}})
