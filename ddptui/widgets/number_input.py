"""A whole-number field that leaves letters to the screen's keys."""

from __future__ import annotations

from textual import events
from textual.widgets import Input


class NumberInput(Input):
    """A whole-number field that lets letters through to the screen's keys: ``s`` starts the run
    while the cursor is in it (it could never type a letter anyway)."""

    def check_consume_key(self, key: str, character: str | None) -> bool:
        return character is not None and (character.isdigit() or character in "+-")

    def on_key(self, event: events.Key) -> None:
        # Textual runs this class's key handler before Input's own; preventing the default stops
        # Input's, and the key bubbles up to the screen's bindings.
        if event.is_printable and not self.check_consume_key(event.key, event.character):
            event.prevent_default()
