"""The ``ddptui`` command line: a click group whose commands live one module each in
``ddptui.commands`` and are imported only when called, so ``ddptui --help`` and the TUI start fast.

With no command, ``ddptui`` opens the Textual app.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click

from ddptui.cli_common import checked_runs_dir

# command name -> (module in ddptui.commands, attribute, one-line help shown by --help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("run", "run_command", "Launch a preset or your own script and follow it to the end."),
    "presets": ("presets", "presets_command", "List presets and whether each can run here."),
    "runs": ("runs", "runs_command", "List runs: state, age, devices, stalled ranks."),
    "show": ("show", "show_command", "One run: config, per-rank states, summary, failure."),
    "diff": ("diff", "diff_command", "Two runs compared: why B is slower or faster than A."),
    "rm": ("runs", "rm_command", "Remove ended runs' directories (asks first)."),
    "gpus": ("gpus", "gpus_command", "Every GPU and every process on it, named for what it is."),
    "ps": ("processes", "ps_command", "Distributed-training processes here, grouped into jobs."),
    "kill": ("kill", "kill_command", "Stop exactly the processes of one run."),
    "resume": (
        "resume",
        "resume_command",
        "Go on with a failed, killed or lost run from its newest checkpoint.",
    ),
    "queue": (
        "queue",
        "queue_command",
        "This machine's queue: who waits for which devices, and why.",
    ),
    "stacks": (
        "stacks",
        "stacks_command",
        "Every rank's stack, and which rank the others wait for.",
    ),
    "clean": ("processes", "clean_command", "Stop orphaned training jobs (asks first)."),
    "bench": ("bench", "bench_command", "Run a suite of presets and print the speedup table."),
    "results": ("results", "results_command", "Recorded benches: list, show one, compare two."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module, attribute, _ = entry
        command: click.Command = getattr(
            importlib.import_module(f"ddptui.commands.{module}"), attribute
        )
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Uses the registry's help lines, so --help does not import every command module.
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="ddptui")
@click.option(
    "--runs-dir",
    type=click.Path(path_type=Path),
    default=None,
    callback=checked_runs_dir(write=False),
    help="Runs the UI shows and starts (default: runs, or $DDPTUI_RUNS_DIR).",
)
@click.option(
    "--screen",
    type=click.Choice(["launch", "runs", "processes", "gpus", "results"]),
    default="launch",
    show_default=True,
    help="The screen the UI opens on (gpus: every GPU and who holds it).",
)
@click.pass_context
def main(ctx: click.Context, runs_dir: Path | None, screen: str) -> None:
    """Launch, watch, compare and clean up PyTorch data-parallel training runs.

    \b
    Quick start (no GPU needed):
      ddptui run cpu-demo          train the embedded default on 2 CPU ranks
      ddptui presets               what can run on this machine
      ddptui                       open the terminal UI
      ddptui --screen gpus         open it on the GPUs: every GPU and who holds it
    """
    if ctx.invoked_subcommand is None:
        from ddptui.app import run_app

        run_app(runs_dir, screen)
