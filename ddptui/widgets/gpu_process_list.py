"""The processes on the GPUs, one line each, with a cursor: GPU, pid, user, GPU memory, CPU, host
memory, age, what it is and its command (the script name kept; the middle elided). Sorted by a
column the keys pick (as nvitop does: ``,`` and ``.`` move the sort column, ``/`` reverses it),
and narrowed to the rows a filter's text is in.

Fixed-width text lines, not a DataTable: it redraws every scan, and measuring a table's cells
cost more than the rest of the screen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from rich.console import Group
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import reactive

from ddptui import text_figures
from ddptui.widgets.list_cursor import CursorList
from engine.core.common import formatting
from engine.core.common.statuses import HolderKind
from engine.core.jobs.gpu_view import GpuProcessRow

KIND_STYLES = {
    HolderKind.DDPTUI: "green",
    HolderKind.FOREIGN: "cyan",
    HolderKind.ORPHANED: "bold red",
    HolderKind.WORKER: "blue",
    HolderKind.UNKNOWN: "yellow",
}
KIND_WORDS = {
    HolderKind.DDPTUI: "ddptui",
    HolderKind.FOREIGN: "foreign",
    HolderKind.ORPHANED: "orphaned",
    HolderKind.WORKER: "worker",
    HolderKind.UNKNOWN: "unknown",
}

# (name, header, width, right-aligned, sort key)
_Key = Callable[[GpuProcessRow], Any]
COLUMNS: tuple[tuple[str, str, int, bool, _Key], ...] = (
    ("gpu", "GPU", 3, True, lambda r: (_gpu(r), -(r.gpu_memory_bytes or 0))),
    ("pid", "PID", 7, True, lambda r: r.pid),
    ("user", "USER", 8, False, lambda r: (r.user, r.pid)),
    ("gpu mem", "GPU MEM", 8, True, lambda r: r.gpu_memory_bytes or -1),
    ("cpu", "CPU%", 5, True, lambda r: r.cpu_percent if r.cpu_percent is not None else -1.0),
    ("mem", "MEM", 6, True, lambda r: r.rss_bytes or -1),
    ("age", "AGE", 6, True, lambda r: r.age_seconds if r.age_seconds is not None else -1.0),
    ("kind", "KIND", 8, False, lambda r: (str(r.kind), _gpu(r))),
)
SORTS = tuple(c[0] for c in COLUMNS)


def _gpu(row: GpuProcessRow) -> int:
    return row.gpu_index if row.gpu_index is not None else 1 << 30


def matches(row: GpuProcessRow, text: str) -> bool:
    """Whether the filter ``text`` is in the row's pid, user, kind, job, what or command."""
    if not text:
        return True
    fields = (str(row.pid), row.user, str(row.kind), row.job_label, row.what, row.command)
    return text.casefold() in " ".join(fields).casefold()


def cells(row: GpuProcessRow) -> tuple[str, ...]:
    return (
        "cpu" if row.gpu_index is None else str(row.gpu_index),
        str(row.pid),
        row.user,
        row.memory_text,
        f"{row.cpu_percent:.0f}" if row.cpu_percent is not None else "-",
        formatting.short_bytes(row.rss_bytes),
        formatting.format_duration(row.age_seconds),
        KIND_WORDS.get(row.kind, str(row.kind)),
    )


class GpuProcessList(CursorList, can_focus=True):
    """Set ``rows``; ``sort`` / ``reverse`` order them; ``cursor`` is the selected row's index."""

    DEFAULT_CSS = """
    GpuProcessList { height: 1fr; }
    GpuProcessList:focus { background: $boost; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(-1)", "First", show=False),
        Binding("end", "edge(1)", "Last", show=False),
    ]

    rows: reactive[tuple[GpuProcessRow, ...]] = reactive(())
    # Only rows whose pid, user, kind, job, what or command contain it (case-insensitive).
    filter_text: reactive[str] = reactive("")
    sort: reactive[str] = reactive("gpu")
    reverse: reactive[bool] = reactive(False)
    cursor: reactive[int] = reactive(0)

    class Highlighted(Message):
        def __init__(self, row: GpuProcessRow | None) -> None:
            super().__init__()
            self.row = row

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ordered: list[GpuProcessRow] = []
        self._top = 0

    # -- order and selection ---------------------------------------------------------------

    def ordered(self) -> list[GpuProcessRow]:
        key = next(c[4] for c in COLUMNS if c[0] == self.sort)
        shown = [r for r in self.rows if matches(r, self.filter_text)]
        return sorted(shown, key=key, reverse=self.reverse)

    @property
    def selected(self) -> GpuProcessRow | None:
        if not self._ordered:
            return None
        return self._ordered[min(self.cursor, len(self._ordered) - 1)]

    def _reorder(self, keep: GpuProcessRow | None) -> None:
        self._ordered = self.ordered()
        if keep is not None:
            same = [
                i
                for i, r in enumerate(self._ordered)
                if (r.pid, r.gpu_index) == (keep.pid, keep.gpu_index)
            ]
            if same:
                self.set_reactive(GpuProcessList.cursor, same[0])
        self.set_reactive(GpuProcessList.cursor, min(self.cursor, max(0, len(self._ordered) - 1)))
        self.post_message(self.Highlighted(self.selected))

    def watch_rows(self, old: tuple[GpuProcessRow, ...], new: tuple[GpuProcessRow, ...]) -> None:
        previous = (
            self._ordered[self.cursor]
            if self._ordered and self.cursor < len(self._ordered)
            else None
        )
        self._reorder(previous)

    def watch_filter_text(self) -> None:
        self._reorder(self.selected)

    def watch_sort(self) -> None:
        self._reorder(self.selected)

    def watch_reverse(self) -> None:
        self._reorder(self.selected)

    def watch_cursor(self) -> None:
        self.post_message(self.Highlighted(self.selected))

    def cursor_rows(self) -> int:
        return len(self._ordered)

    def cursor_index(self) -> int:
        return self.cursor

    def cursor_to(self, index: int) -> None:
        self.cursor = index

    def action_page(self, direction: int) -> None:
        self.action_move(direction * max(1, self.size.height - 2))

    def action_edge(self, direction: int) -> None:
        self.action_move(-len(self._ordered) if direction < 0 else len(self._ordered))

    def cycle_sort(self, step: int) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + step) % len(SORTS)]

    # -- drawing -----------------------------------------------------------------------------

    def render(self) -> Group:
        width = self.size.width or 80
        height = max(2, self.size.height or 10)
        narrow = width < 100
        widths = [c[2] - (2 if narrow and c[0] == "user" else 0) for c in COLUMNS]
        fixed = sum(widths) + len(widths)
        command_width = max(10, width - fixed)
        header = Text(no_wrap=True, overflow="crop", style="bold")
        for (name, title, _, right, _), w in zip(COLUMNS, widths, strict=True):
            if name == self.sort:
                title = title + ("▼" if self.reverse else "▲")
            header.append((title.rjust(w) if right else title.ljust(w)) + " ")
        header.append("COMMAND")
        lines = [header]
        if not self._ordered:
            lines.append(Text("no process holds a GPU", style="dim"))
            return Group(*lines)
        room = height - 1
        if self.cursor < self._top:
            self._top = self.cursor
        elif self.cursor >= self._top + room:
            self._top = self.cursor - room + 1
        self._top = max(0, min(self._top, max(0, len(self._ordered) - room)))
        for index in range(self._top, min(len(self._ordered), self._top + room)):
            row = self._ordered[index]
            line = Text(no_wrap=True, overflow="crop")
            for i, (cell, w) in enumerate(zip(cells(row), widths, strict=True)):
                right = COLUMNS[i][3]
                text = cell[:w]
                style = ""
                if COLUMNS[i][0] == "kind":
                    style = KIND_STYLES.get(row.kind, "")
                elif COLUMNS[i][0] == "gpu mem" and not row.listed and row.gpu_index is not None:
                    style = "yellow"
                elif COLUMNS[i][0] == "user" and not row.own:
                    style = "dim"
                line.append(text.rjust(w) if right else text.ljust(w), style=style)
                line.append(" ")
            line.append(text_figures.short_command(row.command or "?", command_width), style="dim")
            if index == self.cursor:
                self.mark_cursor(line)
            lines.append(line)
        return Group(*lines)
