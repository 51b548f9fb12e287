"""The Runs screen's queue: this machine's line, every user's (as ``ddptui queue`` lists it), in a
few lines above the runs: who waits for what, since when, and why it cannot start yet; the runs
that hold their claims on one line above. Hidden while the line is empty."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ddptui.watch import QueueView
from engine.core.common.formatting import format_duration

WAITING_SHOWN = 3  # waiting runs drawn at most (an 80x24 screen keeps rows for the runs)


def queue_text(queue: QueueView, now: float) -> RenderableType | None:
    """The line as drawn, or None when there is nothing to draw. ``queue`` is made visible
    already (``ddptui.messages.shown``)."""
    if queue.problem:
        return Text(f"Queue: {queue.problem}", style="bold red")
    if not queue.verdicts:
        return None
    waiting = [v for v in queue.verdicts if v.place]
    holding = [v for v in queue.verdicts if not v.place]
    title = Text.assemble(("Queue", "bold"), f" · {len(waiting)} waiting")
    if len(waiting) > WAITING_SHOWN:
        title.append(f" ({len(waiting) - WAITING_SHOWN} more: ddptui queue)", style="dim")
    title.append(" · k on a queued run removes it", style="dim")
    lines: list[RenderableType] = [title]
    if holding:
        held = Text("  on their claims: ", style="dim", no_wrap=True, overflow="ellipsis")
        held.append(
            "; ".join(f"{v.claim.run_id} ({_user(queue, v.claim.uid)}) {v.said}" for v in holding)
        )
        lines.append(held)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=3, justify="right", no_wrap=True)
    grid.add_column(ratio=1)
    for verdict in waiting[:WAITING_SHOWN]:
        claim = verdict.claim
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(claim.run_id, style="bold")
        head.append(f"  {_user(queue, claim.uid)}  wants {claim.want.describe()}")
        head.append(f"  for {format_duration(now - claim.queued_at)}")
        if claim.label:
            head.append(f"  {claim.label}", style="dim")
        why = Text(verdict.said, style="green" if verdict.may_start else "yellow")
        grid.add_row(f"#{verdict.place}", Group(head, why))
    lines.append(grid)
    return Group(*lines)


def _user(queue: QueueView, uid: int) -> str:
    return queue.users.get(uid, f"uid {uid}")


class QueueLine(Static):
    """The queue above the runs; ``show`` draws a newer reading."""

    DEFAULT_CSS = """
    QueueLine { height: auto; max-height: 10; display: none; border-bottom: solid $panel; }
    """

    def show(self, queue: QueueView, now: float) -> None:
        drawn = queue_text(queue, now)
        self.display = drawn is not None
        if drawn is not None:
            self.update(drawn)
