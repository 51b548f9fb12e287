"""Every key of the screen underneath, in a modal (``?``): an 80-column footer has room for only
some of them, and a few (previous and next run, fold, details) are never in it.

The keys are read from the screen's active bindings when the dialog opens, so the list is never a
second copy to keep in step: the focused widget's keys first, then the screen's, then the app's.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Static

from ddptui.widgets.dialog import Dialog

KeyEntry = tuple[str, str]  # (the keys as the footer writes them, what they do)


def keys_of(screen: Screen[object]) -> list[KeyEntry]:
    """The screen's keys with a description, one entry per action (its keys joined), in the
    order Textual resolves them."""
    keys: dict[tuple[str, str], list[str]] = {}
    for active in screen.active_bindings.values():
        binding = active.binding
        if binding.system or not binding.description:
            continue
        shown = screen.app.get_key_display(binding)
        entry = keys.setdefault((binding.action, binding.description), [])
        if shown not in entry:
            entry.append(shown)
    return [(" ".join(shown), description) for (_, description), shown in keys.items()]


def columns(entries: list[KeyEntry], width: int) -> str:
    """The entries in as many columns as ``width`` holds, filled top to bottom."""
    key_width = max((len(k) for k, _ in entries), default=0)
    cells = [f"{k:>{key_width}}  {d}" for k, d in entries]
    cell_width = max((len(c) for c in cells), default=0) + 3
    count = max(1, min(3, width // max(cell_width, 1)))
    rows = -(-len(cells) // count)
    lines = []
    for row in range(rows):
        line = [cells[i].ljust(cell_width) for i in range(row, len(cells), rows)]
        lines.append("".join(line).rstrip())
    return "\n".join(lines)


class KeysDialog(Dialog[None]):
    DEFAULT_CSS = """
    KeysDialog > Vertical { width: auto; max-height: 95%; }
    KeysDialog .hint { color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close", show=False),
    ]

    def __init__(self, screen_name: str, entries: list[KeyEntry], width: int) -> None:
        super().__init__()
        self.screen_name = screen_name
        self.entries = entries
        self.width = width

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"Keys: {self.screen_name}", classes="title", markup=False)
            yield Static(columns(self.entries, self.width), id="keys-table", markup=False)
            yield Static("esc or ? closes", classes="hint")
