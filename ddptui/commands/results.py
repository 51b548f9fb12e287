"""``ddptui results``: the benches recorded so far, one again, or two side by side."""

from __future__ import annotations

import time
from pathlib import Path

import click

from ddptui.cli_common import echo, fail
from ddptui.cli_table import (
    Column,
    echo_wrapped,
    output_width,
    render_table,
    wide_option,
    wrap_line,
)
from ddptui.speedup_text import chosen_format, format_option, pairs_lines, speedup_lines
from engine.core.bench.result_history import (
    BenchRecord,
    HistoryError,
    ResultHistory,
    default_db_path,
)
from engine.core.bench.table_compare import COMPARE_COLUMNS, compare_tables, comparison_markdown

DB_OPTION = click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results database (default: $DDPTUI_RESULTS_DB, else results.sqlite3 in "
    "$DDPTUI_DATA_DIR, $XDG_DATA_HOME/ddptui or ~/.local/share/ddptui).",
)


def _open(db: Path | None) -> ResultHistory:
    try:
        return ResultHistory(db if db is not None else default_db_path(), create=False)
    except HistoryError as err:
        fail(str(err))


def _get(history: ResultHistory, bench_id: int) -> BenchRecord:
    try:
        return history.get(bench_id)
    except HistoryError as err:
        fail(str(err))


def _when(created: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(created))


@click.group("results", invoke_without_command=True)
@DB_OPTION
@click.pass_context
def results_command(ctx: click.Context, db: Path | None) -> None:
    """Benches recorded by `ddptui bench`, with the machine each ran on.

    \b
      ddptui results                   list them (the same as `ddptui results list`)
      ddptui results show 3            print bench 3's table again
      ddptui results compare 3 7       benches 3 and 7 side by side
    """
    ctx.obj = db
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_command, db=db)


@results_command.command("list")
@DB_OPTION
@wide_option
@click.pass_context
def list_command(ctx: click.Context, db: Path | None, wide: bool = False) -> None:
    """List recorded benches, newest first."""
    db = db if db is not None else ctx.obj
    path = db if db is not None else default_db_path()
    width = output_width(wide)
    echo_wrapped(f"results history: {path} (--db or $DDPTUI_RESULTS_DB to use another)", width)
    if not path.exists():
        echo_wrapped("no benches recorded yet (the file does not exist); run `ddptui bench`", width)
        return
    with _open(db) as history:
        listings = history.list()
    if not listings:
        echo("no benches recorded yet")
        return
    rows = [
        (str(b.id), _when(b.created), b.title, b.host, b.gpus, f"{b.completed_rows}/{b.rows}")
        for b in listings
    ]
    headers = ("id", "when", "bench", "host", "GPUs", "rows done")
    for line in pairs_lines(headers, rows, chosen_format(None, False), width, wrap=2):
        echo(line)


@results_command.command("show")
@click.argument("bench_id", type=int)
@format_option
@wide_option
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
@DB_OPTION
@click.pass_context
def show_command(
    ctx: click.Context, bench_id: int, fmt: str | None, wide: bool, as_json: bool, db: Path | None
) -> None:
    """Print bench BENCH_ID's table again, with the machine it ran on."""
    with _open(db if db is not None else ctx.obj) as history:
        record = _get(history, bench_id)
    fmt = chosen_format(fmt, as_json)
    if fmt in ("csv", "json"):
        echo("\n".join(speedup_lines(record.table, fmt, None)))
        return
    width = output_width(wide)
    heading = f"bench {record.id}: {record.title}, {_when(record.created)}"
    lines = [*wrap_line(f"# {heading}" if fmt == "markdown" else heading, width), ""]
    lines += speedup_lines(record.table, fmt, width)
    lines += ["", "Machine:", ""]
    lines += pairs_lines(("", ""), record.machine.describe(), fmt, width)
    if record.runs:
        lines.append("")
        lines += wrap_line(
            "Runs: " + ", ".join(f"{r.row_label}: {r.run_dir}" for r in record.runs),
            width,
            hang="  ",
        )
    echo("\n".join(lines))


COMPARE_FITTING = {"row": Column("row", shrink=0, min_width=8)}


@results_command.command("compare")
@click.argument("a_id", type=int)
@click.argument("b_id", type=int)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(("table", "markdown")),
    default=None,
    help="table: fitted to the terminal (the default on one); markdown (the default to a file or "
    "a pipe).",
)
@wide_option
@DB_OPTION
@click.pass_context
def compare_command(
    ctx: click.Context, a_id: int, b_id: int, fmt: str | None, wide: bool, db: Path | None
) -> None:
    """Two benches side by side: A = A_ID, B = B_ID; rows are matched by label."""
    with _open(db if db is not None else ctx.obj) as history:
        a = _get(history, a_id)
        b = _get(history, b_id)
    fmt = chosen_format(fmt, False)
    width = output_width(wide)
    mark = "# " if fmt == "markdown" else ""
    lines = wrap_line(f"{mark}A = bench {a.id} ({a.title}, {_when(a.created)})", width)
    lines += wrap_line(f"{mark}B = bench {b.id} ({b.title}, {_when(b.created)})", width)
    lines.append("")
    machines = [
        (name, value_a, value_b, "same" if value_a == value_b else "differs")
        for (name, value_a), (_, value_b) in zip(
            a.machine.describe(), b.machine.describe(), strict=True
        )
    ]
    lines += pairs_lines(("machine", "A", "B", "A vs B"), machines, fmt, width, wrap=(1, 2))
    lines.append("")
    compared = [c.cells() for c in compare_tables(a.table, b.table)]
    if fmt == "markdown":
        lines += comparison_markdown(a.table, b.table)
    else:
        columns = [COMPARE_FITTING.get(h, Column(h, right=True)) for h in COMPARE_COLUMNS]
        lines += render_table(columns, compared, width)
    lines.append("")
    notes = [
        "B vs A is B's images/s over A's, minus 1; speedups are each bench's own, over its own "
        "baseline."
    ]
    if a.table.baseline != b.table.baseline:
        notes.append(
            f"The baselines differ (A: {a.table.baseline!r}, B: {b.table.baseline!r}), so the "
            "speedup columns are not comparable."
        )
    for note in notes:
        lines += wrap_line(note, width, indent="- ", hang="  ")
    echo("\n".join(lines))
