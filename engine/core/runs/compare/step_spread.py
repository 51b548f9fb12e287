"""What a run's step reports say when it is compared: how much its step time varies on its own
(the yardstick of "within noise", ``engine.core.runs.compare.diff_cause``) and its steady step
split, without the start-up every rank's first report holds.

From each rank's step reports (``StepProgress``, a mean over the steps since the previous
report), the spread is the interquartile range over the median: warm-up steps and a stray slow
report move it little. The steady split is each rank's step-split reports
(``StepBreakdownReported``) folded as the summary folds them (``StepBreakdownFold``), its first
report left out: that one holds the DataLoader workers' start and the first, slow steps, which
in a short run outweigh everything else (summary.json's split keeps them; a comparison of two
speeds measured in steady state must not).

Reading is bounded whatever a run's length: the event file is scanned in chunks and at most
``SAMPLES_MAX`` step reports and ``SPLIT_SAMPLES_MAX`` step-split reports, evenly spaced, are parsed, so two runs of 100k events each
are compared in well under a second.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.core.common.run_files import UnsafeRunFile, open_in_run
from engine.core.runs.events import (
    EVENT_LINE_MAX_BYTES,
    EVENTS_FILE_MAX_BYTES,
    READ_CHUNK_BYTES,
    StepBreakdownReported,
    StepProgress,
    UnknownEvent,
    event_from_json,
)
from engine.core.runs.step_breakdown import StepBreakdown, StepBreakdownFold

SAMPLES_MAX = 2048
# Step-split reports parsed a rank: their mean is what is kept, which a few hundred evenly
# spaced reports give as well as all of them (and folding one costs far more than a step time).
SPLIT_SAMPLES_MAX = 256
# Fewer reports than this on every rank: too few to say how the step time varies.
MIN_REPORTS = 4
# Fewer step-split reports than this on a rank, its first left out: no steady split of the run.
MIN_STEADY_REPORTS = 2
_STEP_MARK = b'"' + StepProgress.type.encode() + b'"'
_SPLIT_MARK = b'"' + StepBreakdownReported.type.encode() + b'"'


class _EvenSample:
    """Keeps every ``stride``-th of the lines it is offered, halving what it holds (and doubling
    the stride) whenever it holds twice ``most``: an even sample of any number of lines
    in bounded memory."""

    def __init__(self, most: int = SAMPLES_MAX) -> None:
        self.lines: list[bytes] = []
        self.stride = 1
        self.seen = 0
        self.most = most

    def offer(self, line: bytes) -> None:
        if self.seen % self.stride == 0:
            self.lines.append(line)
            if len(self.lines) >= 2 * self.most:
                self.lines = self.lines[::2]
                self.stride *= 2
        self.seen += 1


@dataclass
class _RankLines:
    """An even sample of one rank's step reports and of its step-split reports after its
    first."""

    steps: _EvenSample
    splits: _EvenSample
    first_split_seen: bool = False

    def offer(self, line: bytes) -> None:
        if _STEP_MARK in line:
            self.steps.offer(line)
        elif _SPLIT_MARK in line:
            if self.first_split_seen:
                self.splits.offer(line)
            self.first_split_seen = True


def _rank_lines(run_path: Path, path: Path) -> _RankLines:
    """The samples of one event file (empty where it cannot be read or is over
    ``EVENTS_FILE_MAX_BYTES``)."""
    found = _RankLines(_EvenSample(), _EvenSample(SPLIT_SAMPLES_MAX))
    partial = b""
    try:
        with open_in_run(run_path, path) as f:
            if os.fstat(f.fileno()).st_size > EVENTS_FILE_MAX_BYTES:
                return found
            while chunk := f.read(READ_CHUNK_BYTES):
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                if len(partial) > EVENT_LINE_MAX_BYTES:
                    partial = b""
                for line in lines:
                    if len(line) <= EVENT_LINE_MAX_BYTES:
                        found.offer(line)
    except (OSError, UnsafeRunFile):
        return _RankLines(_EvenSample(), _EvenSample())
    return found


def _step_seconds(lines: Iterable[bytes]) -> list[float]:
    found = []
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict) or data.get("type") != StepProgress.type:
            continue
        seconds = data.get("step_seconds")
        if isinstance(seconds, (int, float)) and seconds > 0:
            found.append(float(seconds))
    return found


def relative_spread(seconds: list[float]) -> float | None:
    """Interquartile range over the median of ``seconds``; None for fewer than MIN_REPORTS."""
    if len(seconds) < MIN_REPORTS:
        return None
    q1, median, q3 = statistics.quantiles(seconds, n=4)
    return (q3 - q1) / median if median > 0 else None


def _split_reports(lines: Iterable[bytes]) -> list[StepBreakdownReported]:
    found = []
    for line in lines:
        try:
            event = event_from_json(line.decode("utf-8", errors="replace"))
        except UnknownEvent:
            continue
        if isinstance(event, StepBreakdownReported):
            found.append(event)
    return found


@dataclass(frozen=True)
class StepReports:
    """What a run's step reports say: the largest relative spread of any rank's step time
    (0.05: 5 %; None where no rank reported enough steps), and each rank's steady step split
    (() where a rank has too few reports to leave its first out: the summary's split then)."""

    spread: float | None
    steady_split: tuple[StepBreakdown, ...]


def read_step_reports(run_path: Path, rank_event_paths: Iterable[Path]) -> StepReports:
    spreads = []
    fold = StepBreakdownFold()
    steady = True
    for path in rank_event_paths:
        lines = _rank_lines(run_path, path)
        spread = relative_spread(_step_seconds(lines.steps.lines))
        if spread is not None:
            spreads.append(spread)
        reports = _split_reports(lines.splits.lines)
        steady = steady and len(reports) >= MIN_STEADY_REPORTS
        fold.feed_all(reports)
    return StepReports(
        spread=max(spreads) if spreads else None,
        steady_split=fold.whole_run() if steady else (),
    )


def step_time_spread(run_path: Path, rank_event_paths: Iterable[Path]) -> float | None:
    """The largest relative spread of any rank's step reports (``StepReports.spread``)."""
    return read_step_reports(run_path, rank_event_paths).spread
