"""Follow a run's event files and print its progress on a plain terminal (``ddptui run``).

One status line rewritten in place on a terminal, a line every few seconds when the output is a
file or pipe, and one line per finished epoch either way.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import TYPE_CHECKING, TextIO

from engine.core.events import EpochEnded, Evaluation, EventTail, RankFailed, StepProgress
from engine.core.lost_runs import settle_lost_run
from engine.core.rundir import RunDir
from engine.core.summary import RunSummary

# How long ranks may take to end after their launcher did, before the run is left unsettled
# (orphaned ranks, for `ddptui clean`): the parent-death signal ends them at once on Linux, the
# watchdog within a second elsewhere.
RANKS_END_SECONDS = 10.0

if TYPE_CHECKING:
    from engine.core.run_start import StartedRun


class ProgressPrinter:
    def __init__(self, run_dir: RunDir, epochs: int, out: TextIO = sys.stdout) -> None:
        self.run_dir = run_dir
        self.epochs = epochs
        self.out = out
        self.tty = out.isatty()
        self.tails: dict[int, EventTail] = {}
        self.latest: dict[int, StepProgress] = {}
        self.epoch_lines: dict[int, str] = {}
        self.last_plain_print = 0.0
        self.line_open = False

    def poll(self) -> None:
        for rank, path in self.run_dir.rank_event_paths().items():
            tail = self.tails.setdefault(rank, EventTail(path))
            for event in tail.read_new():
                if isinstance(event, StepProgress):
                    self.latest[rank] = event
                elif isinstance(event, EpochEnded) and rank == 0:
                    share = (
                        event.global_data_wait_seconds / event.global_seconds
                        if event.global_seconds
                        else 0
                    )
                    self.epoch_lines[event.epoch] = (
                        f"epoch {event.epoch + 1}/{self.epochs}: {event.global_seconds:.1f} s "
                        f"(data wait {share:.0%}), {event.global_steady_images_per_s:,.0f} img/s steady, "
                        f"train loss {event.global_train_loss:.3f}"
                    )
                elif isinstance(event, Evaluation) and rank == 0:
                    line = self.epoch_lines.pop(
                        event.epoch, f"epoch {event.epoch + 1}/{self.epochs}"
                    )
                    self._print_line(f"{line}, test accuracy {event.accuracy:.1%}")
                elif isinstance(event, RankFailed):
                    self._print_line(f"rank {event.rank} failed: {event.error}")
        for epoch in sorted(self.epoch_lines):
            # without evaluation, the epoch line stands alone once the next epoch is under way
            if any(p.epoch > epoch for p in self.latest.values()):
                self._print_line(self.epoch_lines.pop(epoch))
        self._status()

    def _status(self) -> None:
        if not self.latest:
            return
        parts = [
            f"r{r} {p.step}/{p.steps} loss {p.loss:.3f} {p.images_per_s:,.0f} img/s"
            for r, p in sorted(self.latest.items())
        ]
        epoch = max(p.epoch for p in self.latest.values()) + 1
        line = f"epoch {epoch}/{self.epochs}  " + " | ".join(parts)
        if self.tty:
            self.out.write("\r\x1b[2K" + line[:200])
            self.out.flush()
            self.line_open = True
        elif time.monotonic() - self.last_plain_print >= 5.0:
            self._print_line(line)
            self.last_plain_print = time.monotonic()

    def _print_line(self, text: str) -> None:
        if self.line_open:
            self.out.write("\r\x1b[2K")
            self.line_open = False
        self.out.write(text + "\n")
        self.out.flush()

    def finish(self) -> None:
        self.poll()
        for epoch in sorted(self.epoch_lines):
            self._print_line(self.epoch_lines.pop(epoch))
        if self.line_open:
            self.out.write("\n")
            self.line_open = False


def result_line(summary: RunSummary, run_dir: RunDir) -> str:
    """The one line that ends ``ddptui run``."""
    head = f"{summary.status}: {summary.preset} ({summary.strategy}, {summary.precision}) on {summary.devices}"
    last = summary.last_epoch
    figures = []
    if last is not None:
        if last.test_accuracy is not None:
            figures.append(f"test accuracy {last.test_accuracy:.1%}")
        figures.append(f"{last.steady_images_per_s:,.0f} img/s steady")
        figures.append(f"epoch {last.steady_epoch_seconds:.1f} s without warm-up")
    figures.append(f"elapsed {summary.elapsed_seconds:.1f} s")
    text = f"{head}: " + ", ".join(figures)
    if summary.failure is not None:
        where = f"rank {summary.failure.rank}" if summary.failure.rank is not None else "launcher"
        text += f"\n  root cause ({where}): {summary.failure.error}"
        if summary.ranks:
            text += "\n  " + ", ".join(r.describe() for r in summary.ranks)
    elif summary.reason:
        text += f"\n  {summary.reason}"
    return text + f"\n  run directory: {run_dir.path}"


def follow_run(started: StartedRun, printer: ProgressPrinter, *, on_interrupt: str) -> bool:
    """Print a started run's progress until its launcher exits; returns whether Ctrl-C was pressed.

    Ctrl-C sends the launcher SIGTERM once (it stops the ranks and writes a ``killed`` summary)
    and prints ``on_interrupt``; the wait goes on until the launcher is done.
    """
    interrupted = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            printer.out.write(f"\n{on_interrupt}\n")
            started.process.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGINT, stop)
    try:
        while started.poll() is None:
            printer.poll()
            time.sleep(0.2)
        printer.finish()
        if not started.run_dir.summary_path.exists():
            settle_after_launcher(started)
    finally:
        signal.signal(signal.SIGINT, previous)
    return interrupted


def settle_after_launcher(started: StartedRun, wait_seconds: float = RANKS_END_SECONDS) -> None:
    """The launcher exited without a summary (SIGKILL, out of memory): give its ranks a moment to
    end (their parent-death signal ends them at once), then write the ``lost`` summary naming the
    launcher's exit status, which only this process, its parent, knows."""
    code = started.poll()
    deadline = time.monotonic() + wait_seconds
    while True:
        settled = settle_lost_run(started.run_dir, launcher_exit=code, launcher_exited=True)
        done = settled is not None or started.run_dir.summary_path.exists()
        if done or time.monotonic() >= deadline:
            return
        time.sleep(0.2)
