"""Where each rank's step goes: one stacked bar per rank (data wait, forward, backward, sync,
optimizer, other), its length the rank's step time against the slowest rank's, and a legend.

Everything shown is the run observer's ``step_breakdown`` (``engine.core.runs.step_breakdown``);
the slow rank is the one its bottleneck names. Fixed-width text lines, redrawn only when the
split changes.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from engine.core.common.step_split import StepPart
from engine.core.runs.step_breakdown import Bottleneck, StepBreakdown

PART_STYLES = {
    StepPart.DATA: "yellow",
    StepPart.FORWARD: "cyan",
    StepPart.BACKWARD: "blue",
    StepPart.SYNC: "red",
    StepPart.OPTIMIZER: "green",
    StepPart.OTHER: "bright_black",
}
BLOCK = "█"


def stacked_bar(split: StepBreakdown, width: int) -> Text:
    """``width`` cells split between the parts by their seconds (cells by the rounded running
    total, so the parts always fill exactly the bar)."""
    bar = Text()
    total = split.total
    if total <= 0 or width <= 0:
        return bar
    done = 0.0
    for part, seconds in split.parts().items():
        start = round(done / total * width)
        done += seconds
        cells = round(done / total * width) - start
        if cells > 0:
            bar.append(BLOCK * cells, style=PART_STYLES[part])
    return bar


def split_lines(
    split: tuple[StepBreakdown, ...], bottleneck: Bottleneck | None, width: int
) -> list[Text]:
    """A line per rank, "r1 ███▒▒… 36.0 ms  data 94%", then the legend."""
    longest = max((b.total for b in split), default=0.0)
    lines = []
    for b in split:
        slow = bottleneck is not None and bottleneck.rank == b.rank
        line = Text(no_wrap=True, overflow="crop")
        line.append(f"r{b.rank:<3}", style="bold magenta" if slow else "bold")
        top_part, top_seconds = max(b.parts().items(), key=lambda item: item[1])
        tail = f" {1000 * b.total:7.1f} ms  {top_part} {top_seconds / b.total:.0%}"
        room = max(4, width - 4 - len(tail) - 2)
        cells = round(room * b.total / longest) if longest > 0 else 0
        line.append(stacked_bar(b, cells))
        line.append(" " * (room - cells))
        line.append(tail, style="magenta" if slow else "dim")
        if slow:
            line.append(" ◀", style="bold magenta")
        lines.append(line)
    legend = Text(no_wrap=True, overflow="ellipsis", style="dim")
    legend.append("step: ")
    timed_sync = any(b.sync is not None for b in split)
    for part, style in PART_STYLES.items():
        if part == StepPart.SYNC and not timed_sync:
            continue
        legend.append(BLOCK, style=style)
        legend.append(f" {part}  ")
    if split and not timed_sync:
        legend.append("(the sync is in backward)")
    return [*lines, legend]


class StepSplitPanel(Widget):
    """The ranks' step split; ``show`` sets it (its height follows the rank count)."""

    DEFAULT_CSS = "StepSplitPanel { height: 0; }"

    split: reactive[tuple[StepBreakdown, ...]] = reactive((), layout=False)
    bottleneck: reactive[Bottleneck | None] = reactive(None, layout=False)

    def show(self, split: tuple[StepBreakdown, ...], bottleneck: Bottleneck | None) -> None:
        if (split, bottleneck) == (self.split, self.bottleneck):
            return
        lines = len(split) + 1 if split else 0
        if self.styles.height is None or self.styles.height.value != lines:
            self.styles.height = lines
        self.split, self.bottleneck = split, bottleneck

    def render(self) -> Group:
        if not self.split:
            return Group()
        return Group(*split_lines(self.split, self.bottleneck, self.size.width or 80))
