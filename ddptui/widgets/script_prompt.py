"""Asks for the user's own training script, as ``ddptui run`` takes it: a path to a ``.py`` file
or ``-m package.module``, and the script's own arguments. Enter in the script field moves to the
arguments, Enter there checks and returns the run's config; a script that cannot be found is said
in the dialog, which stays open. Escape cancels (returns None).

Nothing is imported: finding the file or the module is all the check does (``engine.core.config.user_code``).
"""

from __future__ import annotations

import shlex

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Label, Static

from ddptui.script_target import script_config
from ddptui.widgets.dialog import Dialog
from engine.core.config.schema import ConfigError, RunConfig


def script_from_fields(target: str, arguments: str) -> RunConfig:
    """The run config for what the two fields say; ConfigError names what is wrong."""
    if not target.strip():
        raise ConfigError("give a script: path/to/train.py or -m package.module")
    try:
        args = tuple(shlex.split(arguments))
    except ValueError as err:  # an unclosed quote
        raise ConfigError(f"the arguments cannot be split as a shell would: {err}") from None
    config = script_config(target, args)
    if config is None:
        raise ConfigError(f"{target.strip()!r} is neither a .py file nor -m package.module")
    from engine.core.config.user_code import check_script_exists

    check_script_exists(config)
    return config


class ScriptPrompt(Dialog[RunConfig | None]):
    DEFAULT_CSS = """
    ScriptPrompt > Vertical { width: 76; }
    ScriptPrompt .title { margin-bottom: 1; }
    ScriptPrompt Input { margin-bottom: 1; }
    ScriptPrompt #script-problem { height: auto; }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(
                "Your own training script, started like torchrun: one process per device, "
                "with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.",
                classes="title",
            )
            yield Label("Script: path/to/train.py, or -m package.module")
            yield Input(placeholder="train.py", id="script-target")
            yield Label("Its arguments, as you would type them after the script")
            yield Input(placeholder="--epochs 2 --lr 0.1", id="script-arguments")
            yield Static("Enter: next field, then use it · Esc: cancel", id="script-problem")

    def on_mount(self) -> None:
        self.query_one("#script-target", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.input.id == "script-target":
            self.query_one("#script-arguments", Input).focus()
            return
        target = self.query_one("#script-target", Input).value
        arguments = self.query_one("#script-arguments", Input).value
        try:
            config = script_from_fields(target, arguments)
        except ConfigError as err:
            self.query_one("#script-problem", Static).update(Text(f"✗ {err}", style="bold red"))
            self.query_one("#script-target", Input).focus()
            return
        self.dismiss(config)
