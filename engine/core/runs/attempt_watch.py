"""What a run observer knows of a run's attempts (``engine.core.runs.attempts``): which attempt
the files at the top of the run directory are of (run.json's ``attempt``), the records of the
earlier ones (read once per attempt, from the summary the one before ended with), and a restart
its launcher scheduled and has not begun yet. Plain Python, no I/O but those summaries.

When run.json names a new attempt, the events, stacks and summary an observer read are the last
attempt's, moved below ``attempts/``: ``moved_on`` says so once, and the observer reads the new
attempt's from their start.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.core.runs.attempts import earlier_records
from engine.core.runs.event_notices import restart_notice
from engine.core.runs.events import Event, RestartScheduled, RunStarted
from engine.core.runs.rundir import RunDir, RunInfo
from engine.core.runs.summary import AttemptRecord, RunSummary


class AttemptWatch:
    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.number: int | None = None  # the attempt the observer's files are of
        self.earlier: tuple[AttemptRecord, ...] = ()
        self.restart: RestartScheduled | None = None
        self.started: RunStarted | None = None  # this attempt's, once its launcher wrote it

    def moved_on(self, info: RunInfo | None) -> bool:
        """Take run.json's attempt; True when it is a later one than the files read so far."""
        number = info.attempt if info is not None else 1
        if number == self.number:
            return False
        later = self.number is not None
        self.number, self.restart, self.started = number, None, None
        self.earlier = earlier_records(self.run_dir, number)
        return later

    def feed(self, events: Iterable[Event]) -> None:
        for e in events:
            if isinstance(e, RestartScheduled):
                self.restart = e
            elif isinstance(e, RunStarted):
                self.started = e

    def restarting(self) -> str:
        """Why a run whose ranks ended still runs: the restart its launcher waits to begin."""
        return f"restarting: {restart_notice(self.restart)}" if self.restart else ""

    def records(self, summary: RunSummary | None) -> tuple[AttemptRecord, ...]:
        """Every attempt known: the summary's (an ended run), else the earlier ones."""
        if summary is not None and summary.attempts:
            return summary.attempts
        return self.earlier
