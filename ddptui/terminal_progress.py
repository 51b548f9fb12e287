"""Print a followed run's progress on a plain terminal (``ddptui run``, ``ddptui bench``).

One status line rewritten in place on a terminal, a line every few seconds when the output is a
file or pipe, and one line per finished epoch either way. The rank figures come from the run
observer's states (``engine.core.ops.follower`` hands them over); the epoch lines from rank 0's
epoch-end and evaluation events.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

import click

from ddptui import exit_codes
from ddptui.cli_common import echo
from ddptui.stack_report import diagnosis_lines, flight_recorder_lines
from engine.core.backends.local.start import StartedRun
from engine.core.common import strict_json
from engine.core.common.statuses import RankStatus, RunStatus
from engine.core.common.visible_text import visible
from engine.core.ops.follower import FollowResult, follow_run
from engine.core.runs.events import EpochEnded, Evaluation, EventTail, RankFailed
from engine.core.runs.rank_states import StepReport
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir
from engine.core.runs.summary import RunSummary


class ProgressPrinter:
    def __init__(self, run_dir: RunDir, epochs: int, out: TextIO = sys.stdout) -> None:
        self.run_dir = run_dir
        self.epochs = epochs
        self.out = out
        self.tty = out.isatty()
        self.tails: dict[int, EventTail] = {}
        self.state: RunState | None = None
        self.epoch_lines: dict[int, str] = {}
        self.last_plain_print = 0.0
        self.line_open = False
        self.stalled_said: set[int] = set()
        self.stacks_said = ""  # the path of the last stack snapshot printed
        self.started = time.time()
        self.waiting_said = ""  # a run a scheduler places: the last pending / starting line
        self.attempt: int | None = None  # the attempt whose events the tails read
        self.restart_said = ""

    def show(self, state: RunState | None = None) -> None:
        """Print what is new: epoch lines from rank 0's events, then the status line."""
        if state is not None:
            self.state = state
            self._waiting(state)
            self._attempts(state)
        for rank, path in self.run_dir.rank_event_paths().items():
            tail = self.tails.setdefault(rank, EventTail(path, self.run_dir.path))
            for event in tail.read_new():
                if isinstance(event, EpochEnded) and rank == 0:
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
        self._stalls()
        reports = self._reports()
        for epoch in sorted(self.epoch_lines):
            # without evaluation, the epoch line stands alone once the next epoch is under way
            if any(p.epoch > epoch for p in reports.values()):
                self._print_line(self.epoch_lines.pop(epoch))
        self._status(reports)

    def _attempts(self, state: RunState) -> None:
        """A line when the launcher schedules a restart, and when a later attempt begins (its
        events are new files: read from their start)."""
        if state.status == RunStatus.RUNNING and state.reason and state.reason != self.restart_said:
            self.restart_said = state.reason
            self._print_line(state.reason)
        if state.attempt != self.attempt:
            if self.attempt is not None:
                self.tails.clear()
                self.epoch_lines.clear()
                self.stalled_said.clear()
                self._print_line(f"attempt {state.attempt} started")
            self.attempt = state.attempt

    def _waiting(self, state: RunState) -> None:
        """A run a scheduler places: a line whenever it waits for another reason, or starts."""
        if state.placement is None or state.status not in (RunStatus.PENDING, RunStatus.STARTING):
            return
        line = f"{state.status}: {state.reason}" if state.reason else str(state.status)
        if line != self.waiting_said:
            self.waiting_said = line
            self._print_line(line)

    def _stalls(self) -> None:
        """A line when a rank is flagged stalled, and the diagnosis once its stacks are taken."""
        state = self.state
        if state is None:
            return
        stalled = {r.rank: r for r in state.ranks if r.state == RankStatus.STALLED}
        for rank in sorted(set(stalled) - self.stalled_said):
            on = f" on {stalled[rank].node}" if stalled[rank].node else ""
            self._print_line(f"rank {rank}{on} stalled: {stalled[rank].reason}")
        self.stalled_said = set(stalled)
        stacks = state.diagnosis
        if stacks is not None and stacks.time >= self.started and stacks.path != self.stacks_said:
            self.stacks_said = stacks.path
            self._print_line(f"stacks ({stacks.reason}): {stacks.summary_line()}")
            if stacks.culprit is not None:
                self._print_line(f"  culprit: {stacks.culprit.who} ({stacks.culprit_reason})")

    def _reports(self) -> dict[int, StepReport]:
        """Each rank's latest step report with figures (an epoch start has none yet)."""
        if self.state is None:
            return {}
        return {
            r.rank: r.report
            for r in self.state.ranks
            if r.report is not None and r.report.step_seconds is not None
        }

    def _label(self, rank: int) -> str:
        """ "r1", or "r1@n2" in a run across nodes."""
        node = next((r.node for r in self.state.ranks if r.rank == rank), "") if self.state else ""
        return f"r{rank}@{node}" if node else f"r{rank}"

    def _status(self, reports: dict[int, StepReport]) -> None:
        if not reports:
            return
        parts = [f"{self._label(r)} {_figures(p)}" for r, p in sorted(reports.items())]
        epoch = max(p.epoch for p in reports.values()) + 1
        of = f"/{self.epochs}" if self.epochs else ""
        line = f"epoch {epoch}{of}  " + " | ".join(parts)
        if self.tty:
            self.out.write("\r\x1b[2K" + visible(line, one_line=True)[:200])
            self.out.flush()
            self.line_open = True
        elif time.monotonic() - self.last_plain_print >= 5.0:
            self._print_line(line)
            self.last_plain_print = time.monotonic()

    def _print_line(self, text: str) -> None:
        if self.line_open:
            self.out.write("\r\x1b[2K")
            self.line_open = False
        self.out.write(visible(text) + "\n")  # the run's words: shown, never acted on
        self.out.flush()

    def finish(self) -> None:
        self.show()
        for epoch in sorted(self.epoch_lines):
            self._print_line(self.epoch_lines.pop(epoch))
        if self.line_open:
            self.out.write("\n")
            self.line_open = False


def _figures(p: StepReport) -> str:
    """One rank's figures: the engine's, or as many as a script gave (steps at least)."""
    where = f"{p.step}/{p.steps}" if p.steps else f"step {p.global_step or p.step}"
    if p.loss is not None:
        rate = f" {p.images_per_s:,.0f} img/s" if p.images_per_s is not None else ""
        return f"{where} loss {p.loss:.3f}{rate}"
    per_s = 1 / p.step_seconds if p.step_seconds else 0.0
    return f"{where} {per_s:.1f} steps/s"


def result_line(summary: RunSummary, run_dir: RunDir) -> str:
    """The one line that ends ``ddptui run``."""
    if summary.strategy == "script":
        head = f"{summary.status}: {summary.model} on {summary.devices}"
    else:
        how = f"{summary.strategy}, {summary.precision}"
        head = f"{summary.status}: {summary.preset} ({how}) on {summary.devices}"
    last = summary.last_epoch
    figures = []
    if summary.strategy == "script" and summary.global_steps is not None:
        figures.append(f"{summary.global_steps:,} optimizer steps on rank 0")
    if last is not None:
        if last.test_accuracy is not None:
            figures.append(f"test accuracy {last.test_accuracy:.1%}")
        figures.append(f"{last.steady_images_per_s:,.0f} img/s steady")
        figures.append(f"epoch {last.steady_epoch_seconds:.1f} s without warm-up")
    figures.append(f"elapsed {summary.elapsed_seconds:.1f} s")
    text = f"{head}: " + ", ".join(figures)
    if summary.failure is not None:
        text += f"\n  root cause ({summary.failure.who}): {summary.failure.error}"
        if summary.ranks:
            text += "\n  " + ", ".join(r.describe() for r in summary.ranks)
    if summary.reason and (summary.failure is None or len(summary.attempts) > 1):
        text += f"\n  {summary.reason}"  # a restarted run's says why it stopped restarting
    if len(summary.attempts) > 1:
        text += "".join(f"\n  {a.describe()}" for a in summary.attempts)
    for warning in summary.warnings:
        text += f"\n  warning: {warning}"
    for leftover in summary.leftovers:
        text += f"\n  leftover: {leftover}"
    if summary.bottleneck:
        text += f"\n  step: {summary.bottleneck} (ddptui show {run_dir.run_id}: every rank's split)"
    if summary.diagnosis is not None and summary.status != RunStatus.COMPLETED:
        text += "\n  " + "\n  ".join(diagnosis_lines(summary.diagnosis))
    for line in flight_recorder_lines(run_dir):
        text += f"\n  {line}"
    return text + f"\n  run directory: {run_dir.path}"


def follow_with_progress(
    started: StartedRun, printer: ProgressPrinter, *, on_interrupt: str
) -> FollowResult:
    """Follow a started run to its end (``engine.core.ops.follower``), printing its progress; Ctrl-C
    stops the run, printing ``on_interrupt``."""

    def interrupted() -> None:
        printer.out.write(f"\n{on_interrupt}\n")

    result = follow_run(started, printer.show, on_interrupt=interrupted)
    printer.finish()
    return result


def followed_to_the_end(started: StartedRun, result: FollowResult, as_json: bool) -> int:
    """What ``ddptui run`` and ``ddptui resume`` say once the run they followed ended: its result
    line (its summary.json with ``as_json``), or why there is none; the exit code they end with."""
    ended = result.state
    summary = ended.summary
    if summary is None:
        echo(
            f"ddptui: the launcher exited without writing {started.run_dir.summary_path} "
            f"({ended.status}: {ended.reason or ended.problem}); see `ddptui ps` and "
            f"`ddptui clean`, and {started.run_dir.launcher_log_path}",
            err=True,
        )
        return exit_codes.FAILED
    if ended.unsaved:  # a lost run's summary that the disk refused: shown, not saved
        echo(f"ddptui: {ended.unsaved}", err=True)
    if as_json:
        click.echo(strict_json.dumps(summary.to_json(), indent=2))
    else:
        echo(result_line(summary, started.run_dir))
    return exit_codes.OK if summary.status == RunStatus.COMPLETED else exit_codes.FAILED
