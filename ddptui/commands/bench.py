"""``ddptui bench``: run a suite's rows one after another, print the speedup table, record it.

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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import click

from ddptui import exit_codes
from ddptui.run_options import collect_overrides, override_options
from ddptui.terminal_progress import ProgressPrinter, follow_run
from engine.core import gpus
from engine.core.config import ConfigError, RunConfig
from engine.core.devices import parse_device_spec
from engine.core.machine_info import MachineInfo, collect_machine_info
from engine.core.result_history import HistoryError, RecordedRun, ResultHistory, default_db_path
from engine.core.rundir import RunDirError
from engine.core.speedup_table import (
    FORMATS,
    RowResult,
    SpeedupTable,
    build_speedup_table,
    failure_reason,
)
from engine.core.suites import (
    ResolvedRow,
    Suite,
    list_suites,
    load_suite,
    resolve_rows,
    suite_of_presets,
)
from engine.core.summary import RunSummary

INTERRUPTED = "the bench was interrupted (Ctrl-C) before this row ran"


@dataclass
class BenchState:
    """What the rows left behind, and whether Ctrl-C asked the bench to stop."""

    results: list[RowResult] = field(default_factory=list)
    runs: list[RecordedRun] = field(default_factory=list)
    interrupted: bool = False


def nominal_shape(config: RunConfig) -> tuple[str, int, int]:
    """(devices, device count, global batch) as the preset asks, for a row that cannot be planned
    here: ``devices.spec = "4"`` still reads as 4 GPUs and a DDP global batch of 4 x batch."""
    try:
        spec = parse_device_spec(config.devices.spec)
    except ConfigError:
        return config.devices.spec, 0, 0
    if spec.kind == "count":
        devices, count = f"{spec.count} GPU{'s' if spec.count != 1 else ''}", spec.count
    elif spec.kind == "gpus":
        devices, count = "gpu:" + ",".join(map(str, spec.gpu_indices)), len(spec.gpu_indices)
    elif spec.kind == "cpu":
        devices, count = f"cpu:{spec.count}", spec.count
    else:
        return config.devices.spec, 0, 0
    batch = config.training.batch_size
    return devices, count, batch * count if config.strategy.name == "ddp" else batch


def skipped_row(resolved: ResolvedRow, reason: str) -> RowResult:
    devices, count, global_batch = nominal_shape(resolved.config)
    if resolved.plan is not None:
        devices = resolved.plan.devices.describe()
        count = resolved.plan.device_count
        global_batch = resolved.plan.global_batch
    return RowResult(
        label=resolved.label,
        preset=resolved.row.preset,
        strategy=resolved.config.strategy.name,
        devices=devices,
        device_count=count,
        precision=resolved.config.precision.mode,
        global_batch=global_batch,
        skipped=reason,
    )


def run_once(
    resolved: ResolvedRow, runs_dir: Path, out: TextIO, state: BenchState
) -> tuple[RunSummary | None, str, str]:
    """Run one repeat of a row to its end: (summary or None, run directory, why there is none)."""
    from engine.core.run_start import start_run  # here, so `ddptui bench --help` stays light

    try:
        started = start_run(resolved.config, runs_dir)
    except (ConfigError, RunDirError, OSError) as err:
        return None, "", f"it could not start: {err}"
    printer = ProgressPrinter(started.run_dir, resolved.config.training.epochs, out=out)
    if follow_run(
        started, printer, on_interrupt="stopping the run and the bench (wait for the table)"
    ):
        state.interrupted = True
    path = str(started.run_dir.path)
    try:
        data = started.run_dir.read_summary()
    except RunDirError as err:
        return None, path, str(err)
    if data is None:
        return (
            None,
            path,
            f"the launcher exited with code {started.process.returncode} without writing "
            f"summary.json; see {started.run_dir.launcher_log_path}",
        )
    return RunSummary.from_json(data), path, ""


def run_rows(rows: list[ResolvedRow], runs_dir: Path, repeat: int, out: TextIO) -> BenchState:
    """Every row in turn, ``repeat`` times each; a failed row does not stop the others."""
    state = BenchState()
    total = len(rows)
    for index, resolved in enumerate(rows, start=1):
        head = f"[{index}/{total}] {resolved.label} ({resolved.row.preset})"
        if state.interrupted:
            state.results.append(skipped_row(resolved, INTERRUPTED))
            continue
        if resolved.skipped or resolved.plan is None:
            out.write(f"{head}: skipped: {resolved.skipped}\n")
            state.results.append(skipped_row(resolved, resolved.skipped))
            continue
        plan = resolved.plan
        summaries: list[RunSummary] = []
        for attempt in range(1, repeat + 1):
            which = f" run {attempt}/{repeat}" if repeat > 1 else ""
            out.write(
                f"{head}{which}: {plan.config.strategy.name} {plan.config.precision.mode} on "
                f"{plan.devices.describe()}, global batch {plan.global_batch}\n"
            )
            out.flush()
            summary, run_dir, problem = run_once(resolved, runs_dir, out, state)
            if summary is None:
                summary = _unfinished(resolved, run_dir, problem)
            summaries.append(summary)
            state.runs.append(RecordedRun(resolved.label, attempt, run_dir, summary))
            out.write(f"{head}{which}: {_outcome(summary)}\n")
            if summary.status != "completed" or state.interrupted:
                break  # a failed repeat fails the row; the next row still runs
        state.results.append(
            RowResult(
                label=resolved.label,
                preset=resolved.row.preset,
                strategy=plan.config.strategy.name,
                devices=plan.devices.describe(),
                device_count=plan.device_count,
                precision=plan.config.precision.mode,
                global_batch=plan.global_batch,
                summaries=tuple(summaries),
            )
        )
    return state


def _unfinished(resolved: ResolvedRow, run_dir: str, problem: str) -> RunSummary:
    """A stand-in summary for a run that left none, so the row is failed with the reason."""
    plan = resolved.plan
    assert plan is not None
    now = time.time()
    return RunSummary(
        run_id=Path(run_dir).name if run_dir else "",
        preset=resolved.config.name,
        status="failed",
        strategy=resolved.config.strategy.name,
        precision=resolved.config.precision.mode,
        model=resolved.config.model.name,
        dataset=resolved.config.data.dataset,
        devices=plan.devices.describe(),
        device_count=plan.device_count,
        world_size=plan.world_size,
        global_batch=plan.global_batch,
        started=now,
        finished=now,
        reason=problem,
    )


def _outcome(summary: RunSummary) -> str:
    last = summary.last_epoch
    if summary.status == "completed" and last is not None:
        return (
            f"completed: {last.steady_images_per_s:,.0f} img/s steady, epoch "
            f"{last.steady_epoch_seconds:.2f} s without warm-up"
        )
    return f"{summary.status}: {failure_reason(summary)}"


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


def _fail(message: str) -> None:
    click.echo(f"ddptui: {message}", err=True)
    sys.exit(exit_codes.BAD_INPUT)


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
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="markdown",
    show_default=True,
    help="Table format.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the table, in --format, to this file.",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results database (default: results.sqlite3 in $DDPTUI_DATA_DIR, $XDG_DATA_HOME/ddptui "
    "or ~/.local/share/ddptui).",
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
    fmt: str,
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
        _fail("give either --suite NAME or preset names, not both")
    if not suite and not presets:
        names = ", ".join(s.name for s in list_suites()) or "none found"
        _fail(f"give --suite NAME (suites: {names}) or one or more preset names")
    if out is not None and not out.parent.exists():
        _fail(f"--out {out}: the directory {out.parent} does not exist")
    try:
        overrides = collect_overrides(set_values, **shortcuts)
        the_suite = load_suite(suite) if suite else suite_of_presets(list(presets))
        rows = resolve_rows(the_suite, gpus.gpu_count(), overrides)
    except ConfigError as err:
        _fail(str(err))
    db_path = db if db is not None else default_db_path()
    history: ResultHistory | None = None
    if not no_record and db_path.exists():
        # Refuse a newer or foreign database now, not after an hour of training.
        try:
            history = ResultHistory(db_path, create=False)
        except HistoryError as err:
            _fail(str(err))
    elif not no_record and not _creatable(db_path):
        _fail(f"--db {db_path}: cannot create the results database there")
    command = command_line(ctx.params)
    try:
        # Before the first row, so the torch probe never competes with a timed run.
        machine = collect_machine_info()
        state = run_rows(rows, runs_dir, repeat, sys.stderr)
        table = build_speedup_table(
            state.results,
            title=_title(the_suite),
            baseline=the_suite.baseline,
            header_lines=(f"Machine: {_machine_line(machine)}", f"Command: `{command}`"),
        )
        _print_table(table, fmt, out)
        if not no_record:
            history = _record(history, db_path, the_suite, command, machine, table, state)
    finally:
        if history is not None:
            history.close()
    failed = any(r.status == "failed" for r in table.rows)
    sys.exit(exit_codes.FAILED if failed or state.interrupted else exit_codes.OK)


def _machine_line(machine: MachineInfo) -> str:
    parts = [machine.host, f"{machine.cpu_model} ({machine.cpu_count} cores)"]
    parts.append(f"GPUs {machine.gpu_summary}")
    if machine.gpu_driver and machine.gpus:
        parts.append(f"driver {machine.gpu_driver}")
    if machine.torch:
        parts.append(f"torch {machine.torch}, CUDA {machine.cuda}, NCCL {machine.nccl}")
    return ", ".join(parts)


def _print_table(table: SpeedupTable, fmt: str, out: Path | None) -> None:
    text = table.render(fmt)
    if out is not None:
        out.write_text(text, encoding="utf-8")
        click.echo(f"table written to {out}", err=True)
    click.echo(text, nl=False)


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
        click.echo("not recorded in the results history: the bench was interrupted", err=True)
        return history
    if not state.runs:
        click.echo("not recorded in the results history: no row ran on this machine", err=True)
        return history
    if history is None:
        try:
            history = ResultHistory(db_path)
        except HistoryError as err:
            click.echo(f"ddptui: not recorded in the results history: {err}", err=True)
            return None
    bench_id = history.record(
        title=_title(suite), command=command, machine=machine, table=table, runs=state.runs
    )
    click.echo(
        f"recorded as bench {bench_id} in {history.path} (ddptui results show {bench_id})",
        err=True,
    )
    return history
