"""``ddptui results``: the benches recorded so far, one again, or two side by side."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from ddptui.cli_common import echo, fail
from engine.core.bench.result_history import (
    BenchRecord,
    HistoryError,
    ResultHistory,
    default_db_path,
)
from engine.core.bench.table_compare import comparison_markdown
from engine.core.bench.table_render import FORMATS, markdown_table, render_table, table_markdown

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
@click.pass_context
def list_command(ctx: click.Context, db: Path | None) -> None:
    """List recorded benches, newest first."""
    db = db if db is not None else ctx.obj
    path = db if db is not None else default_db_path()
    echo(f"results history: {path} (--db or $DDPTUI_RESULTS_DB to use another)")
    if not path.exists():
        echo("no benches recorded yet (the file does not exist); run `ddptui bench`")
        return
    with _open(db) as history:
        listings = history.list()
    if not listings:
        echo("no benches recorded yet")
        return
    rows = [
        (
            str(b.id),
            _when(b.created),
            b.title,
            b.host,
            b.gpus,
            f"{b.completed_rows}/{b.rows}",
        )
        for b in listings
    ]
    for line in markdown_table(("id", "when", "bench", "host", "GPUs", "rows done"), rows):
        echo(line)


@results_command.command("show")
@click.argument("bench_id", type=int)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="markdown", show_default=True)
@DB_OPTION
@click.pass_context
def show_command(ctx: click.Context, bench_id: int, fmt: str, db: Path | None) -> None:
    """Print bench BENCH_ID's table again, with the machine it ran on."""
    with _open(db if db is not None else ctx.obj) as history:
        record = _get(history, bench_id)
    if fmt != "markdown":
        echo(render_table(record.table, fmt), nl=False)
        return
    echo(f"# bench {record.id}: {record.title}, {_when(record.created)}\n")
    echo(table_markdown(record.table), nl=False)
    echo("\nMachine:\n")
    for line in markdown_table(("", ""), record.machine.describe()):
        echo(line)
    if record.runs:
        echo("\nRuns: " + ", ".join(f"{r.row_label}: {r.run_dir}" for r in record.runs))


@results_command.command("compare")
@click.argument("a_id", type=int)
@click.argument("b_id", type=int)
@DB_OPTION
@click.pass_context
def compare_command(ctx: click.Context, a_id: int, b_id: int, db: Path | None) -> None:
    """Two benches side by side: A = A_ID, B = B_ID; rows are matched by label."""
    with _open(db if db is not None else ctx.obj) as history:
        a = _get(history, a_id)
        b = _get(history, b_id)
    echo(f"# A = bench {a.id} ({a.title}, {_when(a.created)})")
    echo(f"# B = bench {b.id} ({b.title}, {_when(b.created)})\n")
    machines: list[Any] = [
        (name, value_a, value_b, "" if value_a == value_b else "differs")
        for (name, value_a), (_, value_b) in zip(
            a.machine.describe(), b.machine.describe(), strict=True
        )
    ]
    for line in markdown_table(("machine", "A", "B", ""), machines):
        echo(line)
    echo("")
    for line in comparison_markdown(a.table, b.table):
        echo(line)
    echo(
        "\n- B vs A is B's images/s over A's, minus 1; speedups are each bench's own, over its "
        "own baseline."
    )
    if a.table.baseline != b.table.baseline:
        echo(
            f"- The baselines differ (A: {a.table.baseline!r}, B: {b.table.baseline!r}), so the "
            "speedup columns are not comparable."
        )
