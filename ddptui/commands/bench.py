"""``ddptui bench``: run a suite's rows one after another (``engine.core.bench.bench_runner``), print the
speedup table, record it.

Every row is planned before anything starts: bad input (an unknown suite or preset, a bad override,
a results database that cannot be used, an --out directory that does not exist) stops the bench
with one sentence and exit code 2; a row this machine cannot run is in the table as skipped with
the planner's reason. Rows then run in turn through the same launcher as ``ddptui run``, with their
progress on stderr, so stdout holds only the table.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any, TextIO

import click

from ddptui import exit_codes
from ddptui.cli_common import echo, fail
from ddptui.cli_table import output_width, wide_option
from ddptui.run_options import collect_overrides, override_options
from ddptui.speedup_text import chosen_format, format_option, speedup_lines
from ddptui.terminal_progress import ProgressPrinter, follow_with_progress
from engine.core.backends.local.start import StartedRun
from engine.core.bench.bench_runner import BenchState, Follow, run_rows
from engine.core.bench.result_history import HistoryError, ResultHistory, default_db_path
from engine.core.bench.speedup_table import SpeedupTable
from engine.core.bench.table_compute import build_speedup_table
from engine.core.common.statuses import RowStatus
from engine.core.config.schema import ConfigError
from engine.core.config.suites import Suite, list_suites, load_suite, suite_of_presets
from engine.core.host import gpus
from engine.core.host.machine_info import MachineInfo, collect_machine_info
from engine.core.ops.follower import FollowResult
from engine.core.plan.suite_plan import resolve_rows


def follow_on(out: TextIO) -> Follow:
    """How a bench follows each row's run: its progress on ``out`` (stderr), as ``ddptui run``."""

    def follow(started: StartedRun) -> FollowResult:
        printer = ProgressPrinter(started.run_dir, started.plan.config.training.epochs, out=out)
        return follow_with_progress(
            started, printer, on_interrupt="stopping the run and the bench (wait for the table)"
        )

    return follow


def command_line(params: dict[str, Any]) -> str:
    """The bench as one command a reader can paste to reproduce it."""
    parts = ["ddptui", "bench"]
    if params.get("suite"):
        parts += ["--suite", params["suite"]]
    parts += list(params.get("presets") or ())
    for item in params.get("set_values") or ():
        parts += ["--set", item]
    for name in ("devices", "epochs", "max_steps", "batch_size", "precision", "data", "model"):
        if params.get(name) is not None:
            parts += [f"--{name.replace('_', '-')}", str(params[name])]
    if params.get("seed") is not None:
        parts += ["--seed", str(params["seed"])]
    if (params.get("repeat") or 1) > 1:
        parts += ["--repeat", str(params["repeat"])]
    return shlex.join(parts)


def _title(suite: Suite) -> str:
    return suite.name if suite.path is not None else f"presets {suite.name}"


@click.command("bench")
@click.argument("presets", nargs=-1)
@click.option(
    "--suite", help="A suite name from presets/suites (seed-table, cpu-scaling) or a .toml path."
)
@override_options
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Runs per row; the table shows the median and the spread.",
)
@format_option
@wide_option
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the table, in --format (whole), to this file.",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results database (default: $DDPTUI_RESULTS_DB, else results.sqlite3 in "
    "$DDPTUI_DATA_DIR, $XDG_DATA_HOME/ddptui or ~/.local/share/ddptui).",
)
@click.option("--no-record", is_flag=True, help="Do not add this bench to the results database.")
@click.pass_context
def bench_command(
    ctx: click.Context,
    presets: tuple[str, ...],
    suite: str | None,
    set_values: tuple[str, ...],
    runs_dir: Path,
    repeat: int,
    fmt: str | None,
    wide: bool,
    out: Path | None,
    db: Path | None,
    no_record: bool,
    **shortcuts: Any,
) -> None:
    """Run a suite (or PRESETs, the first being the baseline) and print the speedup table.

    \b
    Examples:
      ddptui bench --suite cpu-scaling                    # no GPU needed
      ddptui bench --suite seed-table                     # the tutorial's table, on 4 GPUs
      ddptui bench --suite seed-table --data synthetic --repeat 3 --format csv --out t.csv
      ddptui bench seed-single fast-ddp --epochs 2

    Overrides (--set, --devices, --epochs, ...) apply to every row, after the suite's own. Rows this
    machine cannot run are listed as skipped with the reason. Progress goes to stderr, the table to
    stdout. Each bench is recorded with this machine's description (`ddptui results`).
    Exit code 0 when every row that could run completed, 1 when a row failed or Ctrl-C stopped the
    bench, 2 for bad input (nothing started).
    """
    if suite and presets:
        fail("give either --suite NAME or preset names, not both")
    if not suite and not presets:
        names = ", ".join(s.name for s in list_suites()) or "none found"
        fail(f"give --suite NAME (suites: {names}) or one or more preset names")
    if out is not None and not out.parent.exists():
        fail(f"--out {out}: the directory {out.parent} does not exist")
    try:
        overrides = collect_overrides(set_values, **shortcuts)
        the_suite = load_suite(suite) if suite else suite_of_presets(list(presets))
        rows = resolve_rows(the_suite, gpus.gpu_count(), overrides)
    except ConfigError as err:
        fail(str(err))
    db_path = db if db is not None else default_db_path()
    history: ResultHistory | None = None
    if not no_record and db_path.exists():
        # Refuse a newer or foreign database now, not after an hour of training.
        try:
            history = ResultHistory(db_path, create=False)
        except HistoryError as err:
            fail(str(err))
    elif not no_record and not _creatable(db_path):
        fail(f"--db {db_path}: cannot create the results database there")
    command = command_line(ctx.params)
    try:
        # Before the first row, so the torch probe never competes with a timed run.
        machine = collect_machine_info()
        state = run_rows(rows, runs_dir, repeat, sys.stderr, follow_on(sys.stderr))
        table = build_speedup_table(
            state.results,
            title=_title(the_suite),
            baseline=the_suite.baseline,
            header_lines=(f"Machine: {_machine_line(machine)}", f"Command: `{command}`"),
        )
        _print_table(table, chosen_format(fmt, False), output_width(wide), out)
        if not no_record:
            history = _record(history, db_path, the_suite, command, machine, table, state)
    finally:
        if history is not None:
            history.close()
    failed = any(r.status == RowStatus.FAILED for r in table.rows)
    sys.exit(exit_codes.FAILED if failed or state.interrupted else exit_codes.OK)


def _machine_line(machine: MachineInfo) -> str:
    parts = [machine.host, f"{machine.cpu_model} ({machine.cpu_count} cores)"]
    parts.append(f"GPUs {machine.gpu_summary}")
    if machine.gpu_driver and machine.gpus:
        parts.append(f"driver {machine.gpu_driver}")
    if machine.torch:
        parts.append(f"torch {machine.torch}, CUDA {machine.cuda}, NCCL {machine.nccl}")
    return ", ".join(parts)


def _print_table(table: SpeedupTable, fmt: str, width: int | None, out: Path | None) -> None:
    if out is not None:
        out.write_text("\n".join(speedup_lines(table, fmt, None)) + "\n", encoding="utf-8")
        echo(f"table written to {out}", err=True)
    echo("\n".join(speedup_lines(table, fmt, width)))


def _creatable(path: Path) -> bool:
    """The database's directory exists and is writable, or can be made."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent.is_dir() and os.access(parent, os.W_OK)


def _record(
    history: ResultHistory | None,
    db_path: Path,
    suite: Suite,
    command: str,
    machine: MachineInfo,
    table: SpeedupTable,
    state: BenchState,
) -> ResultHistory | None:
    """Add the bench to the history; returns the open history for the caller to close."""
    if state.interrupted:
        echo("not recorded in the results history: the bench was interrupted", err=True)
        return history
    if not state.runs:
        echo("not recorded in the results history: no row ran on this machine", err=True)
        return history
    if history is None:
        try:
            history = ResultHistory(db_path)
        except HistoryError as err:
            echo(f"ddptui: not recorded in the results history: {err}", err=True)
            return None
    bench_id = history.record(
        title=_title(suite), command=command, machine=machine, table=table, runs=state.runs
    )
    echo(
        f"recorded as bench {bench_id} in {history.path} (ddptui results show {bench_id})",
        err=True,
    )
    return history
