"""What a rank of the user's own script reports, with no change to the script: step events from the
global optimizer hook, the epoch fraction and rate of the progress bars it prints (tqdm's
``n/total [..., rate]``), and the metrics it chooses to give ``ddptui.report(**metrics)``.

Standard library only (with ``engine.core.runs.events`` and the ``StepReporter`` that throttles the step
events of every rank, ``engine.core.runs.step_reporter``): ``ddptui.report`` imports this in the user's
process, which must not pull in textual, and torch only when the script itself imports it. One
``ScriptReporter`` per rank process (``install``); outside a ddptui run there is none, and
``report`` does nothing.
"""

from __future__ import annotations

import re
import threading
from typing import Any, TextIO

from engine.core.runs.events import EventWriter, MetricsReported, PhaseStarted
from engine.core.runs.step_reporter import StepReporter

# tqdm's bar: "  40%|████      | 400/1000 [00:12<00:18, 33.2it/s]" (any unit, either way round).
_BAR = re.compile(r"(\d+)/(\d+) \[[^\]\n]*?(?:,\s*([0-9.]+)\s*([A-Za-z]+/s|s/[A-Za-z]+))?[,\]]")


class ScriptReporter:
    """Folds optimizer steps, progress bars and reported metrics into step events, throttled by
    the rank's ``StepReporter`` (the one the engine's loop uses too)."""

    def __init__(self, events: EventWriter, rank: int, report_interval: float) -> None:
        self.events = events
        self.rank = rank
        self.steps = 0  # optimizer steps so far
        self.lr: float | None = None
        self.bar: tuple[int, int] | None = None  # (n, total) of the latest bar
        self.bars_done = 0  # bars that reached their total: the epochs, for a bar per epoch
        self.metrics: dict[str, float] = {}
        # The hook, the bars and report() may come from any of the script's threads.
        self._lock = threading.Lock()
        self._step_reports = StepReporter(events, rank, report_interval)

    # -- what the rank learns ------------------------------------------------------------------

    def on_step(self, lr: float | None = None) -> None:
        """One optimizer step (the global step hook)."""
        with self._lock:
            self.steps += 1
            self.lr = lr if lr is not None else self.lr
            if self.steps == 1:  # time steps from the first one on, not from the script's start
                self._step_reports.restart()
                # word that training began (its pace not known yet): the rank is heard from
                # here, not only from its start, so a hang in its first steps is judged from now
                self.events.write(PhaseStarted(rank=self.rank, phase="warmup"))
                return
            if self._step_reports.step_done():
                self._report()

    def on_bar(self, n: int, total: int) -> None:
        with self._lock:
            if self.bar is not None and n < self.bar[0] and self.bar[0] >= self.bar[1] > 0:
                self.bars_done += 1  # the previous bar finished and a new one began
            self.bar = (n, total)

    def on_metrics(self, metrics: dict[str, Any]) -> None:
        """``ddptui.report(**metrics)``: numbers only; the event keeps them all."""
        numbers = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        with self._lock:
            self.metrics.update(numbers)
            self.events.write(MetricsReported(rank=self.rank, metrics=numbers))

    # -- what it says --------------------------------------------------------------------------

    def _report(self) -> None:
        """The step event, where the bars and the script's own figures place it."""
        step, steps = self.bar if self.bar is not None else (self.steps, 0)
        self._step_reports.report(
            epoch=int(self.metrics.get("epoch", self.bars_done)),
            step=step,
            steps=steps,
            global_step=self.steps,
            loss=self.metrics.get("loss"),
            lr=self.lr,
            images_per_s=self.metrics.get("images_per_s"),
        )

    def flush(self) -> None:
        """The last steps, however soon after the previous report."""
        with self._lock:
            if self._step_reports.pending_steps > 0:
                self._report()


class BarReader:
    """Stands in for ``sys.stdout`` / ``sys.stderr``: passes every write through and tells the
    reporter about the last progress bar in it."""

    def __init__(self, stream: TextIO, reporter: ScriptReporter) -> None:
        self._stream = stream
        self._reporter = reporter

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        if "/" in text and "[" in text:
            found = _BAR.findall(text)
            if found:
                n, total = found[-1][0], found[-1][1]
                self._reporter.on_bar(int(n), int(total))
        return written

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...
        return getattr(self._stream, name)


_current: ScriptReporter | None = None


def install(reporter: ScriptReporter) -> None:
    global _current
    _current = reporter


def current() -> ScriptReporter | None:
    """This process's reporter: set in a rank of a ddptui script run, None anywhere else."""
    return _current
