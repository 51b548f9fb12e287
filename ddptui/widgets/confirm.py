"""A modal question with one key per answer; Escape always cancels (returns None)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmDialog(ModalScreen[str | None]):
    """``choices`` are (key, label, value); the dialog returns the value chosen, or None."""

    DEFAULT_CSS = """
    ConfirmDialog { align: center middle; }
    ConfirmDialog > Vertical {
        width: 70; max-width: 95%; height: auto; max-height: 90%;
        border: thick $warning; background: $surface; padding: 0 1;
    }
    ConfirmDialog .title { text-style: bold; }
    ConfirmDialog .body { margin: 1 0; }
    ConfirmDialog Horizontal { height: auto; align-horizontal: right; }
    ConfirmDialog Button { margin-left: 1; }
    """

    def __init__(self, title: str, body: str, choices: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.title_text = title
        self.body_text = body
        self.choices = choices
        for key, label, value in choices:
            self._bindings.bind(key, f"choose('{value}')", label)
        self._bindings.bind("escape", "choose('')", "Cancel")

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="title", markup=False)
            yield Static(self.body_text, classes="body", markup=False)
            with Horizontal():
                for key, label, value in self.choices:
                    yield Button(f"{label} ({key})", id=f"choice-{value}", compact=True)
                yield Button("Cancel (esc)", id="choice-", compact=True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        assert event.button.id is not None
        self.action_choose(event.button.id.removeprefix("choice-"))

    def action_choose(self, value: str) -> None:
        self.dismiss(value or None)


def confirm_kill(run_id: str, grace: float) -> ConfirmDialog:
    return ConfirmDialog(
        f"Stop run {run_id}?",
        "Every process of this run (launcher, ranks, data workers) gets SIGTERM, then SIGKILL "
        f"after {grace:.0f} s if it is still there. Training progress since the last checkpoint is lost.",
        [("y", "Stop the run", "kill")],
    )
