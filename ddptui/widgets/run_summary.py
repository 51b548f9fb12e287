"""How a finished run ended: its status, test accuracy, epoch time, images/s and data wait, each
attempt of a restarted or resumed run, the root cause of a failure or the diagnosis of a lost or
killed run, and its curves per epoch: loss,
accuracy and throughput. Charts (plotext, through textual-plotext) where the terminal has room,
sparklines where it has not.

Everything shown comes from the run's summary (``engine.core.runs.summary.RunSummary``) and the run
observer's root cause; nothing is computed here beyond formatting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from ddptui import text_figures
from ddptui.widgets.log_tail import failure_message
from engine.core.common import formatting
from engine.core.common.statuses import RunStatus
from engine.core.runs.run_state import RunState

CHART_HEIGHT = 12
CHARTS_FROM = (100, 40)  # (columns, rows) from which charts replace sparklines

# A run's status word, styled the same on every screen.
STATUS_STYLES = {
    RunStatus.QUEUED: "bold yellow",
    RunStatus.PENDING: "bold yellow",
    RunStatus.RUNNING: "bold green",
    RunStatus.STARTING: "bold",
    RunStatus.COMPLETED: "bold blue",
    RunStatus.FAILED: "bold red",
    RunStatus.KILLED: "bold red",
    RunStatus.LOST: "bold red",
    RunStatus.ORPHANED: "bold red",
    RunStatus.UNREADABLE: "bold red",
    RunStatus.CANCELLED: "bold red",
    RunStatus.TIMEOUT: "bold red",
    RunStatus.NODE_FAILURE: "bold red",
}


def summary_lines(run: RunState) -> list[Text]:
    """The figures line, then the root cause or the diagnosis (when it did not complete)."""
    summary = run.summary
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append(str(run.status), style=STATUS_STYLES.get(run.status, "bold"))
    last = summary.last_epoch if summary is not None else None
    if last is not None:
        epochs = len(summary.epochs) if summary is not None else 0
        if last.test_accuracy is not None:
            head.append(f" · acc {last.test_accuracy:.1%}")
        head.append(f" · epoch {formatting.format_duration(last.seconds)}")
        head.append(f" · {text_figures.rate(last.steady_images_per_s)} img/s")
        if last.seconds:
            head.append(f" · data wait {last.data_wait_seconds / last.seconds:.0%}")
        head.append(f" · {epochs} epoch{'s' if epochs != 1 else ''}", style="dim")
    elif run.script:  # a script has its own epochs: what it did is its steps and reports
        steps = summary.global_steps if summary is not None else None
        if steps is not None:
            head.append(f" · {steps:,} optimizer steps")
        if run.accuracy is not None:
            head.append(f" · reported acc {run.accuracy:.1%}")
    elif run.accuracy is not None:
        head.append(f" · acc {run.accuracy:.1%}")
    else:
        head.append(" · no epoch finished", style="dim")
    if run.elapsed is not None:
        head.append(f" · {formatting.format_duration(run.elapsed)} in all", style="dim")
    lines = [head]
    if len(run.attempts) > 1:  # a restarted or resumed run: how each attempt began and ended
        lines += [Text(a.describe(), style="dim", no_wrap=True, overflow="ellipsis")
                  for a in run.attempts]  # fmt: skip
    if run.status != RunStatus.COMPLETED:
        why = Text(no_wrap=True, overflow="ellipsis")
        if run.failure is not None:
            who = "the run" if run.failure.who == "the launcher" else run.failure.who
            why.append(f"root cause: {who}: ", style="bold red")
            why.append(failure_message(run.failure), style="red")
        elif run.reason:
            why.append("diagnosis: ", style="bold red")
            why.append(run.reason, style="red")
        if why.plain:
            lines.append(why)
    if summary is not None and summary.leftovers:
        more = len(summary.leftovers) - 1
        line = Text("leftover: ", style="bold yellow", no_wrap=True, overflow="ellipsis")
        line.append(summary.leftovers[0] + (f" (and {more} more)" if more else ""), style="yellow")
        lines.append(line)
    return lines


def series(run: RunState) -> dict[str, list[float]]:
    """Per epoch: training loss, test accuracy (%, where evaluated) and steady images/s."""
    epochs = run.summary.epochs if run.summary is not None else ()
    return {
        "loss": [e.train_loss for e in epochs],
        "accuracy %": [e.test_accuracy * 100 for e in epochs if e.test_accuracy is not None],
        "images/s": [e.steady_images_per_s for e in epochs],
    }


def sparkline_line(run: RunState, width: int) -> Text:
    """The three curves as sparklines between their first and last values, on one line: each
    covers every epoch (``resample``: more epochs than room, and a point is the mean of several),
    so its first and last values are the ones it draws."""
    line = Text(no_wrap=True, overflow="ellipsis")
    curves = [(name, values) for name, values in series(run).items() if values]
    if not curves:
        return line
    ends = [f" {_short(values[0])}→{_short(values[-1])}" for _, values in curves]
    labels = sum(len(name) + 1 + len(end) for (name, _), end in zip(curves, ends, strict=True))
    room = max(4, min(24, (width - labels - 2 * (len(curves) - 1)) // len(curves)))
    for i, ((name, values), end) in enumerate(zip(curves, ends, strict=True)):
        if i:
            line.append("  ")
        line.append(f"{name} ", style="bold")
        points = text_figures.resample(values, room)
        top = max(points) or 1.0
        line.append(text_figures.sparkline(points, max(2, len(points)), top), style="cyan")
        line.append(end, style="dim")
    return line


def _short(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    return f"{value:.3g}"


class RunSummaryPanel(Vertical):
    """Shown once a run has ended; ``show(run, charts)`` fills it."""

    DEFAULT_CSS = """
    RunSummaryPanel { height: auto; margin-bottom: 1; }
    RunSummaryPanel > #summary-text { height: auto; }
    RunSummaryPanel > #summary-sparks { height: 1; }
    RunSummaryPanel > #summary-charts { height: 12; }
    RunSummaryPanel > #summary-charts > * { width: 1fr; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._shown: tuple[Any, ...] | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="summary-text")
        yield Static("", id="summary-sparks")
        yield Horizontal(id="summary-charts")

    def show(self, run: RunState, charts: bool) -> None:
        key = (run.status, run.summary, run.failure, run.reason, charts, self.size.width)
        if key == self._shown:
            return
        self._shown = key
        width = self.size.width or 80
        self.query_one("#summary-text", Static).update(Group(*summary_lines(run)))
        curves = {name: values for name, values in series(run).items() if values}
        sparks = self.query_one("#summary-sparks", Static)
        holder = self.query_one("#summary-charts", Horizontal)
        holder.remove_children()
        if charts and curves:
            sparks.display = False
            holder.display = True
            holder.mount_all([_chart(name, values) for name, values in curves.items()])
        else:
            holder.display = False
            sparks.display = bool(curves)
            sparks.update(sparkline_line(run, width))


def _chart(name: str, values: Sequence[float]) -> Any:
    """A plotext line chart of one curve per epoch (imported only when a chart is drawn)."""
    from textual_plotext import PlotextPlot

    plot = PlotextPlot()
    plt = plot.plt
    epochs = [float(e) for e in range(1, len(values) + 1)]
    plt.plot(epochs, list(values), marker="braille")
    plt.scatter(epochs, list(values), marker="dot")
    plt.title(f"{name} per epoch")
    plt.xticks(epochs, [str(int(e)) for e in epochs])
    if name == "images/s":  # throughput from zero, so a small change looks small
        plt.ylim(0, max(values) * 1.15)
    return plot
