"""The one frame every modal of the app shares: a box at the centre of the screen (``Dialog >
Vertical``: its width, border and height set once here, a dialog overriding only what differs),
a bold ``.title``, and Escape to cancel (the dialog returns None)."""

from __future__ import annotations

from typing import ClassVar, TypeVar

from textual.binding import Binding, BindingType
from textual.screen import ModalScreen

ResultType = TypeVar("ResultType")


class Dialog(ModalScreen[ResultType]):
    """A modal whose content is one ``Vertical``, composed by the dialog itself."""

    DEFAULT_CSS = """
    Dialog { align: center middle; }
    Dialog > Vertical {
        width: 72; max-width: 95%; height: auto; max-height: 90%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    Dialog .title { text-style: bold; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def action_cancel(self) -> None:
        self.dismiss(None)
