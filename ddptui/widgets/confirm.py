"""A modal question with one key per answer; Escape always cancels (returns None). And the
all-users toggle of the screens that stop processes, which asks before it turns on."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Static

from ddptui.actions import may_stop_other_users
from ddptui.widgets.dialog import Dialog

Choice = tuple[str, str, str]  # (key, label, value)


class ConfirmDialog(Dialog[str | None]):
    """``choices`` are (key, label, value); the dialog returns the value chosen, or None."""

    DEFAULT_CSS = """
    ConfirmDialog > Vertical { width: 70; border: thick $warning; }
    ConfirmDialog .body { margin: 1 0; }
    ConfirmDialog Horizontal { height: auto; align-horizontal: right; }
    ConfirmDialog Button { margin-left: 1; }
    """

    def __init__(self, title: str, body: str, choices: list[Choice]) -> None:
        super().__init__()
        self.title_text = title
        self.body_text = body
        self.choices = choices

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="title", markup=False)
            yield Static(self.body_text, classes="body", markup=False)
            with Horizontal():
                for key, label, value in self.choices:
                    yield Button(f"{label} ({key})", id=f"choice-{value}", compact=True)
                yield Button("Cancel (esc)", id="choice-", compact=True)

    def on_key(self, event: events.Key) -> None:
        # Each dialog has its own answer keys, so they are handled here rather than bound on the
        # class (the app's keys do not reach a modal screen: its `l` is an answer, not Launch).
        value = next((value for key, _, value in self.choices if key == event.key), None)
        if value is not None:
            event.stop()
            self.action_choose(value)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        assert event.button.id is not None
        self.action_choose(event.button.id.removeprefix("choice-"))

    def action_choose(self, value: str) -> None:
        self.dismiss(value or None)


def confirm_kill(run_id: str, grace: float, *, queued: bool = False) -> ConfirmDialog:
    """Stop a run; one still in the machine's queue (``queued``) is taken out of it."""
    if queued:
        return ConfirmDialog(
            f"Remove run {run_id} from the queue?",
            "It has not started: its waiter gets SIGTERM, its claim leaves the line, and the run "
            "is recorded as killed while queued.",
            [("y", "Remove it", "kill")],
        )
    return ConfirmDialog(
        f"Stop run {run_id}?",
        "Every process of this run (launcher, ranks, data workers) gets SIGTERM, then SIGKILL "
        f"after {grace:.0f} s if it is still there. Training progress since the last checkpoint is lost.",
        [("y", "Stop the run", "kill")],
    )


class AllUsersToggle:
    """For a screen whose keys stop processes: as root, ``a`` lets them reach other users'
    processes too, after a confirmation; ``a`` again turns it off. Nobody else is offered it.

    The screen sets ``ALL_USERS_QUESTION`` (title, body) and has ``_show_head`` to say the state.
    """

    ALL_USERS_QUESTION: tuple[str, str] = ("", "")
    all_users = False

    @staticmethod
    def root() -> bool:
        """Whether this user may stop other users' processes at all (root)."""
        return may_stop_other_users()

    def _show_head(self) -> None:
        raise NotImplementedError

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "all_users":  # offered to root only: nobody else may stop others' processes
            return self.root()
        return True

    def action_all_users(self) -> None:
        screen: Any = self
        if not self.root():
            screen.notify("Only root may stop other users' processes.", severity="warning")
            return
        if self.all_users:
            self.all_users = False
            self._show_head()
            return
        title, body = self.ALL_USERS_QUESTION
        dialog = ConfirmDialog(
            title,
            f"{body} Until you turn it off again (a), or leave the app.",
            [("y", "Allow all users", "all")],
        )

        def chosen(answer: str | None) -> None:
            if answer == "all":
                self.all_users = True
                self._show_head()

        screen.app.push_screen(dialog, chosen)
