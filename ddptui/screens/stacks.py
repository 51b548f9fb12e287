"""Every rank's stack for one run: what each rank was doing, which rank the others wait for, and
the full stacks, culprit first, each rank's main thread first with its native frames folded to a
count (``n`` shows them). Opens on the run's last snapshot; ``t`` takes a fresh one of a live run
(in a thread worker: py-spy may take a second per rank)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Footer, Header, Static

from ddptui.messages import StacksTaken
from ddptui.screens.base import DdptuiScreen
from ddptui.stack_report import diagnosis_lines
from engine.core.common.visible_text import visible
from engine.core.runs.rundir import RunDir
from engine.core.stacks.snapshot import StackSnapshot


class StacksScreen(DdptuiScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("t", "take", "Take now"),
        Binding("n", "native", "Native"),
        Binding("escape", "back", "Back"),
    ]

    def __init__(self, run_dir: RunDir, snapshot: StackSnapshot | None) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.snapshot = snapshot
        self.taking = False
        self.native = False  # native frames folded to a count, as `ddptui stacks` prints them

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="stacks-head")
        with VerticalScroll(id="stacks-body"):
            yield Static("", id="stacks-text", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"Stacks · {visible(self.run_dir.run_id, one_line=True)}"
        self._show()

    def _show(self, note: str = "") -> None:
        head = Text()
        snapshot = self.snapshot
        if snapshot is None:
            head.append("No stack snapshot of this run yet", style="bold")
            head.append(" · t takes one now (a live run)", style="dim")
            body = ""
        else:
            head.append(snapshot.summary_line(), style="bold")
            hint = "n shows them"
            body = "\n".join(
                diagnosis_lines(snapshot, full=True, native=self.native, fold_hint=hint)
            )
        if note:
            head.append(f" · {note}", style="yellow")
        self.query_one("#stacks-head", Static).update(head)
        self.query_one("#stacks-text", Static).update(body)

    def action_take(self) -> None:
        if self.taking:
            return
        self.taking = True
        self._show("taking every rank's stack…")
        self.take_stacks()

    @work(thread=True, exclusive=True, exit_on_error=False, group="stacks")
    def take_stacks(self) -> None:
        try:
            snapshot = self.ddptui.actions.take_stacks(self.run_dir)
        except Exception as err:  # shown, and the user may try again
            self.post_message(StacksTaken(None, f"{type(err).__name__}: {err}"))
            return
        self.post_message(StacksTaken(snapshot, "" if snapshot else "no rank of it is alive"))

    def on_stacks_taken(self, message: StacksTaken) -> None:
        self.taking = False
        if message.snapshot is not None:
            self.snapshot = message.snapshot
        self._show(message.problem)

    def action_native(self) -> None:
        self.native = not self.native
        self._show()

    def action_back(self) -> None:
        self.app.pop_screen()
