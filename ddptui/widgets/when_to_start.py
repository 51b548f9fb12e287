"""The launch form's "when": start now, or when free: the run waits in this machine's queue
until its devices are free, in order (``ddptui run --queue``), and starts by itself then."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, Select

from ddptui.launch_form import NOW, WHEN_FREE

CHOICES = [("now", NOW), ("when free (queue)", WHEN_FREE)]


class WhenToStart(Horizontal):
    DEFAULT_CSS = """
    WhenToStart { height: auto; }
    """

    def compose(self) -> ComposeResult:
        yield Label("when", classes="field-label")
        yield Select(CHOICES, id="when", compact=True, allow_blank=False, value=NOW)

    def chosen(self) -> str:
        """The field as ``LaunchForm.when`` takes it: NOW or WHEN_FREE."""
        chosen = self.query_one("#when", Select).value
        return WHEN_FREE if chosen == WHEN_FREE else NOW
