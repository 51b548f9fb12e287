"""The tail of one rank's log under the root cause of a failure: the first rank to fail, its error
and the end of its traceback, pinned above the log so scrolling never hides it."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from ddptui.watch import FailureView

TRACEBACK_LINES = 6


class LogTail(Vertical):
    DEFAULT_CSS = """
    LogTail { height: 1fr; min-height: 4; }
    LogTail > #failure { height: auto; max-height: 9; display: none; }
    LogTail > #failure.shown { display: block; }
    LogTail > #notices { height: auto; max-height: 3; }
    LogTail > VerticalScroll { height: 1fr; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._shown: tuple[object, ...] = ()

    def compose(self) -> ComposeResult:
        yield Static("", id="failure", markup=False)
        yield Static("", id="notices", markup=False)
        with VerticalScroll(id="log-lines", can_focus=True):
            yield Static("", id="log-body", markup=False)

    def show(
        self,
        title: str,
        lines: tuple[str, ...],
        failure: FailureView | None,
        notices: tuple[str, ...] = (),
    ) -> None:
        key = (title, lines, failure, notices)
        if key == self._shown:
            return  # nothing new: no redraw
        self._shown = key
        failure_view = self.query_one("#failure", Static)
        if failure is not None:
            who = f"rank {failure.rank}" if failure.rank is not None else "the run"
            head = Text(f"root cause: {who} failed: ", style="bold red")
            head.append(failure.error.strip() or "(no message)", style="red")
            parts = [head]
            tb = [line for line in failure.traceback.rstrip().splitlines() if line.strip()]
            if len(tb) > TRACEBACK_LINES:
                parts.append(Text(f"  … {len(tb) - TRACEBACK_LINES} traceback lines above", "dim"))
            parts.extend(Text(line, style="red") for line in tb[-TRACEBACK_LINES:])
            failure_view.update(Group(*parts))
            failure_view.add_class("shown")
        else:
            failure_view.remove_class("shown")
        self.query_one("#notices", Static).update(
            Group(
                *[
                    Text(f"• {n}", style="yellow", no_wrap=True, overflow="ellipsis")
                    for n in notices[-2:]
                ]
            )
        )
        body: list[Text] = [Text(title, style="bold dim")]
        body.extend(Text(line) for line in lines)
        if not lines:
            body.append(Text("(no output yet)", style="dim"))
        scroller = self.query_one("#log-lines", VerticalScroll)
        at_end = scroller.scroll_y >= scroller.max_scroll_y - 1
        self.query_one("#log-body", Static).update(Group(*body))
        if at_end:
            scroller.call_after_refresh(scroller.scroll_end, animate=False)
