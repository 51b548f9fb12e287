"""One row per rank: rank, device, pid, epoch, a steps bar, loss, images/s, age of its last report,
state (the culprit of a stuck run marked ◀). Renders fixed-width lines (cheap to redraw a few times a second); up / down pick the rank
whose log the run screen shows. Folded (a small terminal, or ``f``), it is one line per state
naming its ranks, so many ranks leave the log tail some room."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import reactive

from ddptui import text_figures
from ddptui.widgets.list_cursor import CursorList
from engine.core.common import formatting
from engine.core.common.statuses import RankStatus
from engine.core.runs.rank_states import RankState

STATE_STYLES = {
    RankStatus.RUNNING: "green",
    RankStatus.DONE: "bold blue",
    RankStatus.STARTING: "dim",
    RankStatus.STALLED: "bold yellow",
    RankStatus.STRAGGLER: "bold magenta",
    RankStatus.FAILED: "bold red",
    RankStatus.STOPPED: "red",
}
HEADERS = ("rank", "device", "pid", "epoch", "steps", "loss", "img/s", "last", "state")
RIGHT = (True, False, True, True, True, True, True, True, False)
STEPS = HEADERS.index("steps")
WIDE_FROM = 110  # terminals this wide also get a "why" column
CULPRIT_MARK = " ◀"  # after the state of the rank the others wait for (the diagnosis says so)


class RankTable(CursorList, can_focus=True):
    """The ranks of one run. Set ``ranks``, ``epochs`` and ``now``; ``selected`` is the highlighted
    rank; up / down go round the ranks."""

    WRAPS = True
    DEFAULT_CSS = """
    RankTable { height: 2; }
    RankTable:focus { background: $boost; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Rank", show=False),
        Binding("down", "move(1)", "Rank", show=False),
    ]

    # No layout on change: a relayout re-renders every auto-height widget on the screen, which
    # is most of the UI's CPU at 2 updates a second. The height follows the rank count instead.
    ranks: reactive[tuple[RankState, ...]] = reactive(())
    epochs: reactive[int] = reactive(0)
    # A script that reports no images/s: its rate column is optimizer steps a second.
    steps_only: reactive[bool] = reactive(False)
    now: reactive[float] = reactive(0.0)
    selected: reactive[int | None] = reactive(None)
    folded: reactive[bool] = reactive(False)
    # The rank the others wait for (the latest stack snapshot's culprit), marked while ranks are
    # stuck: stalled ranks otherwise look alike.
    culprit: reactive[int | None] = reactive(None)

    class RankSelected(Message):
        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def watch_ranks(self, old: tuple[RankState, ...], new: tuple[RankState, ...]) -> None:
        self.fit()

    def watch_folded(self) -> None:
        self.fit()

    def line_count(self, folded: bool | None = None) -> int:
        """Lines it takes: a header and a rank each, or (folded) a header and a state each (a
        node each, in a run across nodes)."""
        if self.folded if folded is None else folded:
            if _nodes(self.ranks):
                return 1 + len(_nodes(self.ranks))
            return 1 + len({r.state for r in self.ranks})
        return 1 + len(self.ranks)

    def fit(self) -> None:
        count = self.line_count()
        if self.styles.height is None or self.styles.height.value != count:
            self.styles.height = count

    def cursor_rows(self) -> int:
        return len(self.ranks)

    def cursor_index(self) -> int:
        numbers = [r.rank for r in self.ranks]
        return numbers.index(self.selected) if self.selected in numbers else 0

    def cursor_to(self, index: int) -> None:
        self.selected = self.ranks[index].rank
        self.post_message(self.RankSelected(self.selected))

    def render(self) -> Group:
        if self.folded:
            return self._folded(self.size.width or 80)
        return self._lines(self.size.width or 80)

    def _folded(self, width: int) -> Group:
        """A line per state: how many ranks, which, and the reason of the first that has one;
        across nodes, a line per node with its ranks' states."""
        head = Text(no_wrap=True, overflow="ellipsis", style="bold")
        head.append(f"{len(self.ranks)} ranks, folded to fit (f unfolds)")
        lines = [head]
        if _nodes(self.ranks):
            return Group(*lines, *self._by_node())
        for state in RankStatus:
            ranks = [r for r in self.ranks if r.state == state]
            if not ranks:
                continue
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append(f"{state!s:<9}", style=STATE_STYLES.get(state, ""))
            line.append(f" {len(ranks):>3}  ranks ")
            line.append(
                " ".join(f"{r.rank}{CULPRIT_MARK}" if r.rank == self.culprit else str(r.rank)
                         for r in ranks),
                style="bold",
            )  # fmt: skip
            lines.append(self._group_line_end(line, ranks, 9))
        return Group(*lines)

    def _by_node(self) -> list[Text]:
        lines = []
        for node in _nodes(self.ranks):
            ranks = [r for r in self.ranks if r.node == node]
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append(f"{node:<10}", style="bold")
            line.append(f" {len(ranks):>3} ranks ")
            line.append(" ".join(str(r.rank) for r in ranks), style="bold")
            for state in RankStatus:
                count = sum(1 for r in ranks if r.state == state)
                if count:
                    line.append(f"  {count} {state}", style=STATE_STYLES.get(state, ""))
            lines.append(self._group_line_end(line, ranks, 10))
        return lines

    def _group_line_end(self, line: Text, ranks: list[RankState], label_width: int) -> Text:
        """A folded line's end: the first reason among its ranks, and its label underlined
        where the selected rank is one of them."""
        why = next((r.reason for r in ranks if r.reason), "")
        if why:
            line.append(f"  {why}", style="dim")
        if any(r.rank == self.selected for r in ranks):
            line.stylize("underline", 0, label_width)
        return line

    def _lines(self, width: int) -> Group:
        """Fixed-width text lines, not a Rich Table: this redraws twice a second, and laying out a
        Table (measuring and padding every cell) cost more than everything else on the screen."""
        wide = width >= WIDE_FROM
        across = bool(_nodes(self.ranks))  # a node column, in a run across nodes
        rows: list[tuple[list[str], RankState]] = []
        for r in self.ranks:
            epoch = f"{r.epoch + 1}/{self.epochs}" if r.epoch is not None and self.epochs else "-"
            # Only a rank that should still report has a meaningful silence.
            reported = r.last_event_time
            last = formatting.format_age(self.now - reported) if r.state.live and reported else "-"
            cells = [
                str(r.rank),
                r.device,
                str(r.pid) if r.pid else "-",
                epoch,
                _steps_cell(r),
                text_figures.loss(r.loss),
                _steps_per_s(r) if self.steps_only else text_figures.rate(r.images_per_s),
                last,
                f"{r.state}{CULPRIT_MARK}" if r.rank == self.culprit else str(r.state),
            ]
            if across:
                cells.insert(1, r.node or "?")
            rows.append((cells, r))
        headers = [("step/s" if h == "img/s" and self.steps_only else h) for h in HEADERS]
        right = list(RIGHT)
        steps = STEPS
        if across:
            headers.insert(1, "node")
            right.insert(1, False)
            steps += 1
        widths = [len(h) for h in headers]
        for cells, _ in rows:
            widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
        fixed = sum(widths) - widths[steps] + 2 * len(headers)
        why_width = max(0, width - fixed - 24) if wide else 0
        bar_width = max(3, width - fixed - widths[steps] - (why_width + 2 if why_width else 0))
        header = Text(no_wrap=True, overflow="crop", style="bold")
        for i, h in enumerate(headers):
            size = widths[i] + (bar_width + 1 if i == steps else 0)
            header.append(_cell(h, size, right[i]) + "  ")
        if why_width:
            header.append("why")
        lines = [header]
        for cells, r in rows:
            line = Text(no_wrap=True, overflow="crop")
            for i, cell in enumerate(cells):
                if i == steps:
                    line.append(
                        text_figures.bar(r.step or 0, r.steps or 0, bar_width) + " ", style="cyan"
                    )
                style = STATE_STYLES.get(r.state, "") if i == len(cells) - 1 else ""
                line.append(_cell(cell, widths[i], right[i]), style=style)
                line.append("  ")
            if why_width:
                line.append(r.reason[:why_width], style="dim")
            if r.rank == self.selected:
                self.mark_cursor(line)
            lines.append(line)
        return Group(*lines)


def _steps_cell(r: RankState) -> str:
    """Steps done of the epoch's; a script with no progress bar: its optimizer steps so far."""
    if r.steps:
        return f"{r.step or 0}/{r.steps}"
    return str(r.global_step) if r.global_step else "-"


def _steps_per_s(r: RankState) -> str:
    return f"{1 / r.step_seconds:.1f}" if r.step_seconds else "-"


def _cell(text: str, width: int, right: bool) -> str:
    return text.rjust(width) if right else text.ljust(width)


def _nodes(ranks: tuple[RankState, ...]) -> list[str]:
    """The nodes of a run across nodes, in their ranks' order; [] on one machine."""
    return list(dict.fromkeys(r.node for r in ranks if r.node))
