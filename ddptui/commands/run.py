"""``ddptui run PRESET``: launch a run and follow it to its result line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ddptui import exit_codes
from ddptui.run_options import collect_overrides, override_options
from ddptui.terminal_progress import ProgressPrinter, follow_with_progress, result_line
from engine.core import strict_json
from engine.core.config import ConfigError, apply_overrides
from engine.core.presets import load_preset
from engine.core.run_start import start_run
from engine.core.rundir import RunDirError
from engine.core.statuses import RunStatus


@click.command("run")
@click.argument("preset")
@override_options
@click.option(
    "--fault",
    "faults",
    multiple=True,
    metavar="KIND:RANK:STEP",
    help="Inject a fault for testing on RANK at global STEP (repeatable): crash (raise), exit "
    "(os._exit), hang, slow, oom (allocate until the kernel's OOM killer ends the rank) or "
    "kill-launcher (SIGKILL the launcher).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print summary.json instead of the progress and result line.",
)
@click.option(
    "--detach", is_flag=True, help="Start the run, print its id and return; it keeps running."
)
def run_command(
    preset: str,
    set_values: tuple[str, ...],
    runs_dir: Path,
    faults: tuple[str, ...],
    as_json: bool,
    detach: bool,
    **shortcuts: Any,
) -> None:
    """Launch PRESET (a name from `ddptui presets` or a .toml path) and follow it.

    \b
    Examples:
      ddptui run cpu-demo
      ddptui run cpu-demo --devices cpu:4 --epochs 1 --max-steps 50
      ddptui run seed-ddp --devices 0,2 --set optimizer.lr_scaling=linear
      ddptui run cpu-demo --fault crash:1:3        # watch a rank fail on purpose
      ddptui run cpu-demo --fault kill-launcher:0:5  # a launcher lost mid-run: summary "lost"
      ddptui run cpu-demo --devices cpu:16 --oversubscribe   # more than 4 ranks per core

    The run starts in its own session: closing this terminal does not stop it (see `ddptui runs`).
    Ctrl-C stops the run. Exit code 0 when the run completed, 1 when it failed or was killed,
    2 for bad input or a run whose ranks do not fit in this machine's cores, memory or GPUs
    (nothing started).
    """
    try:
        overrides = collect_overrides(set_values, **shortcuts)
        if faults:
            overrides["faults"] = list(faults)
        config = apply_overrides(load_preset(preset), overrides)
        started = start_run(config, runs_dir)
    except (ConfigError, RunDirError) as err:
        click.echo(f"ddptui: {err}", err=True)
        sys.exit(exit_codes.BAD_INPUT)
    for warning in started.warnings:
        click.echo(f"ddptui: warning: {warning}", err=True)
    if detach:
        click.echo(started.run_id)
        return
    out = sys.stderr if as_json else sys.stdout
    if not as_json:
        click.echo(
            f"run {started.run_id}: {config.strategy.name} {config.precision.mode} on "
            f"{started.plan.devices.describe()}, global batch {started.plan.global_batch}",
            file=out,
        )
    printer = ProgressPrinter(started.run_dir, config.training.epochs, out=out)
    result = follow_with_progress(
        started, printer, on_interrupt="stopping the run; wait for its summary"
    )
    ended = result.state
    summary = ended.summary
    if summary is None:
        click.echo(
            f"ddptui: the launcher exited without writing {started.run_dir.summary_path} "
            f"({ended.status}: {ended.reason or ended.problem}); see `ddptui ps` and "
            f"`ddptui clean`, and {started.run_dir.launcher_log_path}",
            err=True,
        )
        sys.exit(exit_codes.FAILED)
    if ended.unsaved:  # a lost run's summary that the disk refused: shown, not saved
        click.echo(f"ddptui: {ended.unsaved}", err=True)
    if as_json:
        click.echo(strict_json.dumps(summary.to_json(), indent=2))
    else:
        click.echo(result_line(summary, started.run_dir))
    sys.exit(exit_codes.OK if summary.status == RunStatus.COMPLETED else exit_codes.FAILED)
