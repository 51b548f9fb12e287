"""How much a run's step time varies on its own: the yardstick of "within noise" when two runs are
compared (``engine.core.runs.compare.diff_cause``).

From each rank's step reports (``StepProgress``, a mean over the steps since the previous
report), the spread is the interquartile range over the median: warm-up steps and a stray slow
report move it little. Reading is bounded whatever a run's length: the event file is scanned in
chunks for step reports and at most ``SAMPLES_MAX`` of them, evenly spaced, are parsed, so two
runs of 100k events each are compared in well under a second.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from pathlib import Path

from engine.core.common.run_files import UnsafeRunFile, open_in_run
from engine.core.runs.events import (
    EVENT_LINE_MAX_BYTES,
    EVENTS_FILE_MAX_BYTES,
    READ_CHUNK_BYTES,
    StepProgress,
)

SAMPLES_MAX = 2048
# Fewer reports than this on every rank: too few to say how the step time varies.
MIN_REPORTS = 4
_STEP_MARK = b'"' + StepProgress.type.encode() + b'"'


class _EvenSample:
    """Keeps every ``stride``-th of the lines it is offered, halving what it holds (and doubling
    the stride) whenever it holds twice ``SAMPLES_MAX``: an even sample of any number of lines
    in bounded memory."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.stride = 1
        self.seen = 0

    def offer(self, line: bytes) -> None:
        if self.seen % self.stride == 0:
            self.lines.append(line)
            if len(self.lines) >= 2 * SAMPLES_MAX:
                self.lines = self.lines[::2]
                self.stride *= 2
        self.seen += 1


def _step_lines(run_path: Path, path: Path) -> list[bytes]:
    """An even sample of the step-report lines of one event file (none where it cannot be read
    or is over ``EVENTS_FILE_MAX_BYTES``)."""
    sample = _EvenSample()
    partial = b""
    try:
        with open_in_run(run_path, path) as f:
            if os.fstat(f.fileno()).st_size > EVENTS_FILE_MAX_BYTES:
                return []
            while chunk := f.read(READ_CHUNK_BYTES):
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                if len(partial) > EVENT_LINE_MAX_BYTES:
                    partial = b""
                for line in lines:
                    if _STEP_MARK in line and len(line) <= EVENT_LINE_MAX_BYTES:
                        sample.offer(line)
    except (OSError, UnsafeRunFile):
        return []
    return sample.lines


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


def step_time_spread(run_path: Path, rank_event_paths: Iterable[Path]) -> float | None:
    """The largest relative spread of any rank's step reports (0.05: 5 %), None where no rank
    reported enough steps."""
    spreads = [
        spread
        for path in rank_event_paths
        if (spread := relative_spread(_step_seconds(_step_lines(run_path, path)))) is not None
    ]
    return max(spreads) if spreads else None
