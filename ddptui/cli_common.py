"""What the ``ddptui`` commands share, so that no command imports another: the ``--runs-dir``
option and its check, the one way a command refuses (``fail``: one sentence on stderr and an exit
code) and ``echo`` (every line a person reads, control characters made visible). Tables fitted to
the terminal are ``ddptui.cli_table``'s. Plain click; no textual."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from ddptui import exit_codes
from ddptui.runs_location import default_runs_dir
from engine.core.common.visible_text import visible
from engine.core.procs.stopping import STOP_GRACE_SECONDS


def echo(text: str, *, err: bool = False, nl: bool = True) -> None:
    """Print ``text`` for a person: every command's words pass through here (JSON output aside,
    which escapes them itself), so what a run directory, a command line or a log holds shows
    with its control characters made visible (``engine.core.common.visible_text``) and never
    acts on the terminal."""
    click.echo(visible(text), err=err, nl=nl)


def fail(message: str, code: int = exit_codes.BAD_INPUT) -> NoReturn:
    """End the command: ``ddptui: <message>`` on stderr, exit ``code`` (bad input by default)."""
    echo(f"ddptui: {message}", err=True)
    sys.exit(code)


def confirmed(question: str, *, err: bool = False) -> bool:
    """Ask a yes/no question (no by default); Ctrl-D, or no terminal to ask on, is a no."""
    try:
        return click.confirm(question, default=False, err=err)
    except click.Abort:
        return False


def checked_runs_dir(*, write: bool) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback for --runs-dir: a path that cannot be a runs directory (a name too long,
    inside /proc, not a directory, or, for commands that make runs, not writable) ends the command
    with one sentence and exit code 2 before anything happens."""

    def check(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is None:
            return value
        from engine.core.runs.rundir import (  # here: the UI starts faster
            RunDirError,
            check_runs_dir,
        )

        try:
            check_runs_dir(Path(value), write=write)
        except RunDirError as err:
            echo(f"ddptui: {err}", err=True)
            ctx.exit(exit_codes.BAD_INPUT)
        return value

    return check


def runs_dir_option(*, write: bool, description: str) -> Callable[[Any], Any]:
    """``--runs-dir`` (default ``default_runs_dir()``), checked before the command runs; ``write``
    for the commands that make runs."""
    return click.option(
        "--runs-dir",
        type=click.Path(path_type=Path),
        default=default_runs_dir,
        callback=checked_runs_dir(write=write),
        show_default="runs, or $DDPTUI_RUNS_DIR",
        help=description,
    )


# For the commands that read runs by id (runs, show, kill, stacks).
read_runs_dir_option = runs_dir_option(write=False, description="Where run directories are.")

# ps, clean and gpus find each run from its processes, wherever its directory lies, so a runs
# directory changes nothing there; --runs-dir is still accepted (and checked) for the scripts
# that pass it.
unused_runs_dir_option = click.option(
    "--runs-dir",
    type=click.Path(path_type=Path),
    default=None,
    hidden=True,
    expose_value=False,
    callback=checked_runs_dir(write=False),
)

# kill and clean: one default grace for every stop (engine.core.procs.stopping).
grace_option = click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=STOP_GRACE_SECONDS,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)


def follow_options(started: str) -> Callable[[Any], Any]:
    """``--json`` and ``--detach`` of the commands that start a run and follow it to its end
    (run, resume); ``started``: what ``--detach`` starts, in its help."""

    def add(command: Any) -> Any:
        detach = click.option(
            "--detach", is_flag=True, help=f"Start {started}, print the run's id and return."
        )
        as_json = click.option(
            "--json",
            "as_json",
            is_flag=True,
            help="Print summary.json at the end instead of the progress and result line.",
        )
        return as_json(detach(command))

    return add
