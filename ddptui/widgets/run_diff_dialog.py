"""Two runs compared, in a dialog: the report ``ddptui diff`` prints (``ddptui.run_diff_text``),
scrollable, for the Runs screen's marked runs and the Results screen's marked rows. ``read_diff``
is what their thread workers call; it never raises."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from ddptui.messages import RunsCompared
from ddptui.run_diff_text import diff_lines
from ddptui.widgets.dialog import Dialog

if TYPE_CHECKING:
    from textual.screen import Screen

    from engine.core.runs.compare.run_diff import RunDiff
    from engine.core.runs.rundir import RunDir

REPORT_WIDTH = 80


def read_diff(a: RunDir | None, b: RunDir) -> RunsCompared:
    """A compared with B (A None: the newest completed run of B's preset before it), as the
    message the screens show; a run that cannot be compared is the message's one sentence."""
    from engine.core.runs.compare.compared_run import previous_completed_run, read_compared_run
    from engine.core.runs.compare.run_diff import diff_runs
    from engine.core.runs.rundir import RunDirError

    try:
        a = a if a is not None else previous_completed_run(b)
        if a.path == b.path:
            return RunsCompared(None, f"{a.run_id} is one run: mark another to compare it with")
        return RunsCompared(diff_runs(read_compared_run(a), read_compared_run(b)))
    except (RunDirError, OSError) as err:
        return RunsCompared(None, str(err))


def show_comparison(screen: Screen[Any], message: RunsCompared) -> None:
    """What the Runs and Results screens do with a comparison: the dialog, or its one sentence
    as a warning."""
    if message.diff is None:
        screen.notify(message.problem, severity="warning")
        return
    screen.app.push_screen(RunDiffDialog(message.diff))


class RunDiffDialog(Dialog[None]):
    """The comparison of two runs; Escape closes it."""

    DEFAULT_CSS = """
    RunDiffDialog > Vertical { width: 86; height: 90%; }
    RunDiffDialog VerticalScroll { height: 1fr; }
    """

    def __init__(self, diff: RunDiff) -> None:
        super().__init__()
        self.diff = diff

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Two runs compared (Escape closes)", classes="title")
            with VerticalScroll():
                yield Static(self.report_text(), id="diff-report", markup=False)

    def report_text(self) -> str:
        width = min(REPORT_WIDTH, max(40, self.app.size.width - 8))
        return "\n".join(diff_lines(self.diff, width))
