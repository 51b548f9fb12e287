"""The one cursor of the UI's hand-drawn row lists (the GPU processes, a run's ranks): a row
under it that up / down move, drawn reversed while the list has focus and underlined when not.
Each list says how many rows it has and where its cursor is; this moves it and marks it."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.widget import Widget


class CursorList(Widget):
    """A widget of rows with a cursor. ``WRAPS``: past the last row is the first (and back);
    else the cursor stops at the ends."""

    WRAPS: ClassVar[bool] = False

    def cursor_rows(self) -> int:
        """How many rows the cursor may be on."""
        raise NotImplementedError

    def cursor_index(self) -> int:
        """The row the cursor is on (0 when it is on none yet)."""
        raise NotImplementedError

    def cursor_to(self, index: int) -> None:
        """Put the cursor on row ``index`` (always one of the rows)."""
        raise NotImplementedError

    def action_move(self, delta: int) -> None:
        count = self.cursor_rows()
        if not count:
            return
        index = self.cursor_index() + delta
        self.cursor_to(index % count if self.WRAPS else max(0, min(count - 1, index)))

    def mark_cursor(self, line: Text) -> None:
        """Draw ``line`` as the row under the cursor."""
        line.stylize("reverse" if self.has_focus else "underline")

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
