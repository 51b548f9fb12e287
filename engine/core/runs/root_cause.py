"""The root cause of a run's failure, decided in one place for every writer and reader: the
launcher's summary (``engine.train.supervisor``), the settler's and torchrun's
(``engine.core.runs.summarize``) and readers while no summary says it (the run observer, through
``RankStateTracker.root_failure``). The rank states label a rank failed or stopped by the same
``stopped`` rule.

Pure logic over how each rank ended (``RankEnd``, from its events and the launcher's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.common.statuses import RunStatus
from engine.core.runs.events import RankExited, RankFailed
from engine.core.runs.summary import Failure

STOP_SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT")


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended, as far as the events tell."""

    rank: int
    failure: RankFailed | None = None  # the error it reported
    exited: RankExited | None = None  # how its process ended (the launcher reaped it)
    finished: bool = False  # it reported the end of its work
    signalled_at: float | None = None  # when the launcher first signalled it to stop

    @property
    def exited_badly(self) -> bool:
        return self.exited is not None and self.exited.exitcode != 0 and not self.finished

    def failed_at(self) -> float | None:
        """When it first showed a failure: its report, or its bad exit."""
        times = [self.failure.time] if self.failure is not None else []
        if self.exited is not None and self.exited_badly:
            times.append(self.exited.time)
        return min(times) if times else None


def stopped(
    end: RankEnd, ends: Sequence[RankEnd], status: RunStatus | None, recorded: bool
) -> bool:
    """It ended because it was stopped, not by a fault of its own: the launcher signalled it to
    stop before it exited (``StopSignalled``), or it ended by a stop signal in a killed run (the
    killer stops a run whose launcher is gone). Where the launcher did not record its signals
    (``recorded`` False: older runs), a stop-signal exit after another rank failed counts too."""
    if end.exited is None:
        return False
    if end.signalled_at is not None and end.signalled_at <= end.exited.time:
        return True
    if end.exited.signal not in STOP_SIGNALS:
        return False
    if status == RunStatus.KILLED:
        return True
    if recorded:
        return False
    earlier = [t for o in ends if o is not end and (t := o.failed_at()) is not None]
    return any(t < end.exited.time for t in earlier)


def root_failure(
    ends: Sequence[RankEnd], status: RunStatus | None, recorded: bool
) -> Failure | None:
    """The rule: a rank that exited badly without reporting an error and was not stopped comes
    first (the first of them to exit), since its peers' errors follow from its disappearance;
    else, when every rank reported the same error, no one rank (``every_rank``: the run's
    configuration or code); else the first error a rank reported; else there is none.
    ``status`` is the run's final
    status when known; ``recorded``: the launcher names every rank it stops."""
    crashed = [
        e
        for e in ends
        if e.exited_badly and e.failure is None and not stopped(e, ends, status, recorded)
    ]
    if crashed:
        first = min(crashed, key=lambda e: (e.exited.time if e.exited else 0.0, e.rank))
        assert first.exited is not None
        code, sig = first.exited.exitcode, first.exited.signal
        how = f"code {code}" if code is not None else sig or "an unknown status"
        return Failure(
            rank=first.rank,
            exitcode=code,
            signal=sig,
            error=f"rank {first.rank} exited with {how} without reporting an error",
        )
    reported = [e for e in ends if e.failure is not None]
    if not reported:
        return None
    first = min(reported, key=lambda e: (e.failure.time if e.failure else 0.0, e.rank))
    assert first.failure is not None
    if (
        len(reported) == len(ends) > 1
        and len({e.failure.error for e in reported if e.failure}) == 1
    ):
        # not one rank's fault: every rank met the same error (a configuration, the code)
        return Failure(
            rank=None,
            error=f"every rank failed with the same error: {first.failure.error}",
            traceback=first.failure.traceback,
            every_rank=True,
        )
    return Failure(
        rank=first.rank,
        exitcode=first.exited.exitcode if first.exited else None,
        signal=first.exited.signal if first.exited else None,
        error=first.failure.error,
        traceback=first.failure.traceback,
    )
