"""The tail of one rank's log under the root cause of a failure: the first rank to fail, its error
and the end of its traceback, pinned above the log so scrolling never hides it.

Each part is redrawn only when it changed, and only a change in its line count causes a relayout:
a relayout re-renders every auto-height widget on the screen, which is most of the UI's CPU when
it happens on every poll.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from engine.core.runs.summary import Failure

TRACEBACK_LINES = 6
NOTICES = 2


def failure_message(failure: Failure) -> str:
    """Its error, or how its process ended when it reported none."""
    if failure.error.strip():
        return failure.error.strip()
    if failure.signal:
        return f"ended by {failure.signal}"
    if failure.exitcode is not None:
        return f"exit code {failure.exitcode}"
    return "(no message)"


class TailLines(Widget):
    """The last lines that fit, like ``tail``: no scrolling, so what is shown depends only on the
    lines and the height (the whole log is in the run directory)."""

    DEFAULT_CSS = "TailLines { height: 1fr; }"

    lines: reactive[tuple[Text, ...]] = reactive(())

    def render(self) -> Group:
        height = max(1, self.size.height)
        return Group(*self.lines[-height:])


class LogTail(Vertical):
    DEFAULT_CSS = """
    LogTail { height: 1fr; min-height: 4; }
    LogTail > #failure { height: 0; }
    LogTail > #notices { height: 0; }
    LogTail > #log-title { height: 1; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._failure: Failure | None = None
        self._said_above = False
        self._notices: tuple[str, ...] = ()
        self._body: tuple[str, tuple[str, ...]] | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="failure", markup=False)
        yield Static("", id="notices", markup=False)
        yield Static("", id="log-title", markup=False)
        yield TailLines(id="log-body")

    def show(
        self,
        title: str,
        lines: tuple[str, ...],
        failure: Failure | None,
        notices: tuple[str, ...] = (),
        *,
        said_above: bool = False,
    ) -> None:
        """The log's last lines under the root cause of a failure; ``said_above``: the root cause
        is already said on the screen (an ended run's summary), so only its traceback is pinned."""
        if (failure, said_above) != (self._failure, self._said_above):
            self._failure, self._said_above = failure, said_above
            self._show_failure(failure, said_above)
        shown_notices = notices[-NOTICES:]
        if shown_notices != self._notices:
            self._notices = shown_notices
            view = self.query_one("#notices", Static)
            view.styles.height = len(shown_notices)
            view.update(
                Group(
                    *[
                        Text(f"• {n}", style="yellow", no_wrap=True, overflow="ellipsis")
                        for n in shown_notices
                    ]
                )
            )
        if (title, lines) != self._body:
            self._show_body(title, lines)

    def _show_failure(self, failure: Failure | None, said_above: bool) -> None:
        view = self.query_one("#failure", Static)
        tb = [line for line in (failure.traceback if failure else "").splitlines() if line.strip()]
        if failure is None or (said_above and not tb):
            view.styles.height = 0
            view.update("")
            return
        who = "the run" if failure.who == "the launcher" else failure.who  # "rank 1 on n2" too
        if said_above:
            head = Text(f"{who}'s traceback:", style="bold red")
        else:
            head = Text(f"root cause: {who} failed: ", style="bold red")
            head.append(failure_message(failure), style="red")
        parts = [head]
        if len(tb) > TRACEBACK_LINES:
            parts.append(Text(f"  … {len(tb) - TRACEBACK_LINES} traceback lines above", "dim"))
        parts.extend(Text(line, style="red") for line in tb[-TRACEBACK_LINES:])
        view.styles.height = "auto"
        view.styles.max_height = TRACEBACK_LINES + 3
        view.update(Group(*parts))

    def _show_body(self, title: str, lines: tuple[str, ...]) -> None:
        if self._body is None or title != self._body[0]:
            self.query_one("#log-title", Static).update(Text(title, style="bold dim"), layout=False)
        # Cropped, not wrapped: cheaper to draw, and one log line stays one screen line.
        body = tuple(Text(line, no_wrap=True, overflow="crop") for line in lines)
        self.query_one(TailLines).lines = body or (Text("(no output yet)", style="dim"),)
        self._body = (title, lines)
