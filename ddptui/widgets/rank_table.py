"""One row per rank: rank, device, pid, epoch, a steps bar, loss, images/s, age of its last report,
state. Renders a Rich table (cheap to redraw a few times a second); up / down pick the rank whose
log the run screen shows."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from ddptui.watch import RankView
from ddptui.widgets import figures

STATE_STYLES = {
    "running": "green",
    "done": "bold blue",
    "starting": "dim",
    "stalled": "bold yellow",
    "straggler": "bold magenta",
    "failed": "bold red",
    "stopped": "red",
    "killed": "red",
    "lost": "bold red",
}
# Widths of everything but the steps bar, columns and gaps included (see _table).
FIXED_WIDTH = 63
WIDE_FROM = 110  # terminals this wide also get a "why" column


class RankTable(Widget, can_focus=True):
    """The ranks of one run. Set ``ranks`` and ``now``; ``selected`` is the highlighted rank."""

    DEFAULT_CSS = """
    RankTable { height: auto; min-height: 2; }
    RankTable:focus { background: $boost; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Rank", show=False),
        Binding("down", "move(1)", "Rank", show=False),
    ]

    ranks: reactive[tuple[RankView, ...]] = reactive((), layout=True)
    now: reactive[float] = reactive(0.0)
    selected: reactive[int | None] = reactive(None)

    class RankSelected(Message):
        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def action_move(self, delta: int) -> None:
        if not self.ranks:
            return
        numbers = [r.rank for r in self.ranks]
        current = numbers.index(self.selected) if self.selected in numbers else 0
        self.selected = numbers[(current + delta) % len(numbers)]
        self.post_message(self.RankSelected(self.selected))

    def render(self) -> Table:
        return self._table(self.size.width or 80)

    def _table(self, width: int) -> Table:
        wide = width >= WIDE_FROM
        table = Table(
            box=None,
            padding=(0, 1),
            pad_edge=False,
            expand=True,
            show_edge=False,
            header_style="bold",
        )
        table.add_column("rank", justify="right", no_wrap=True)
        table.add_column("device", no_wrap=True)
        table.add_column("pid", justify="right", no_wrap=True)
        table.add_column("epoch", justify="right", no_wrap=True)
        table.add_column("steps", no_wrap=True, ratio=1)
        table.add_column("loss", justify="right", no_wrap=True)
        table.add_column("img/s", justify="right", no_wrap=True)
        table.add_column("last", justify="right", no_wrap=True)
        table.add_column("state", no_wrap=True)
        why_width = 0
        if wide:
            why_width = 30
            table.add_column("why", no_wrap=True, width=why_width, overflow="ellipsis")
        steps_width = max(8, width - FIXED_WIDTH - why_width - (2 if wide else 0))
        for r in self.ranks:
            count = f"{r.step}/{r.steps}" if r.steps else "-"
            bar_width = max(3, steps_width - len(count) - 1)
            steps = Text(figures.bar(r.step, r.steps, bar_width), style="cyan")
            steps.append(f" {count}", style="")
            epoch = f"{r.epoch + 1}/{r.epochs}" if r.epoch is not None and r.epochs else "-"
            # Only a rank that should still report has a meaningful silence.
            live = r.state in ("running", "stalled", "straggler", "starting")
            last = figures.age(self.now - r.last_report) if live and r.last_report else "-"
            state_style = STATE_STYLES.get(r.state, "")
            row: list[str | Text] = [
                str(r.rank),
                r.device,
                str(r.pid) if r.pid else "-",
                epoch,
                steps,
                figures.loss(r.loss),
                figures.rate(r.images_per_s),
                last,
                Text(r.state, style=state_style),
            ]
            if wide:
                row.append(Text(r.detail, style="dim"))
            selected = r.rank == self.selected
            table.add_row(
                *row, style=("reverse" if self.has_focus else "underline") if selected else None
            )
        return table

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
