"""Following a run this process started, to its end: ``ddptui run`` and each row of ``ddptui bench``.

The follower is the launcher's parent, so it alone knows how the launcher ended (its exit status).
It observes the run (``engine.core.runs.observer``) until the launcher exits, forwarding Ctrl-C to it as
one SIGTERM (the launcher then stops the ranks and writes a ``killed`` summary). A launcher that
exited without a summary (SIGKILL, out of memory) is settled here as ``lost``, once its ranks had a
moment to end: their parent-death signal ends them at once on Linux, the watchdog within a second
elsewhere. It returns once nothing carrying the run's marker is left (within the same moment).
Plain Python.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.backends.local.start import StartedRun
from engine.core.common.statuses import RunStatus, StopRequester
from engine.core.procs.run_proof import RunMarker, marked_processes
from engine.core.runs.observer import RunObserver
from engine.core.runs.run_state import RunState
from engine.core.runs.settle import settle_observed
from engine.core.runs.stop_request import request_stop

# How long ranks may take to end after their launcher did, before the run is left unsettled
# (orphaned ranks, for `ddptui clean`).
RANKS_END_SECONDS = 10.0
# Half a second, as the Run screen: often enough for a progress line, and the follower stays
# below half a percent of a core, taken from the ranks on a busy machine.
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class FollowResult:
    interrupted: bool  # Ctrl-C was pressed while following
    state: RunState  # the last observation: how the run ended (its summary, a lost one included)


def follow_run(
    started: StartedRun,
    on_state: Callable[[RunState], None],
    *,
    on_interrupt: Callable[[], None] = lambda: None,
    poll_seconds: float = POLL_SECONDS,
    ranks_end_seconds: float = RANKS_END_SECONDS,
) -> FollowResult:
    """Observe a started run until its launcher exits, calling ``on_state`` with every
    observation; settle it as lost if the launcher left no summary. Returns how it ended.

    The first Ctrl-C sends the launcher SIGTERM and calls ``on_interrupt``; the wait goes on until
    the launcher is done, so the summary it writes is there when this returns.
    """
    observer = RunObserver(started.run_dir, launcher_poll=started.poll)
    interrupted = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            on_interrupt()
            request_stop(started.run_dir, StopRequester.CTRL_C)
            started.process.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGINT, stop)
    try:
        while started.poll() is None:
            on_state(observer.observe())
            time.sleep(poll_seconds)
        state = observer.observe()
        deadline = time.monotonic() + ranks_end_seconds
        while state.status == RunStatus.ORPHANED and time.monotonic() < deadline:
            time.sleep(poll_seconds)
            state = observer.observe()
        # and whatever else the run started (multiprocessing's resource tracker, a DataLoader
        # worker): `ddptui run` returns when nothing of the run is left, where it can tell
        while (
            marked_processes(RunMarker.of_dir(started.run_dir.path)) and time.monotonic() < deadline
        ):
            time.sleep(poll_seconds)
        # the launcher's exit status (or its scheduler's end of the job) is known here: a run that
        # ended with no summary (lost) is written down, the one write of following
        state = settle_observed(state)
        on_state(state)
    finally:
        signal.signal(signal.SIGINT, previous)
    return FollowResult(interrupted=interrupted, state=state)
