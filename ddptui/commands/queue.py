"""``ddptui queue``: this machine's queue, every user's: who waits for what, since when, and why
it cannot start yet; the runs that hold their devices above it."""

from __future__ import annotations

import time
from pathlib import Path

import click

from ddptui.cli_common import echo, fail
from ddptui.cli_table import Column, output_width, render_table, wide_option, wrap_line
from engine.core.common import strict_json
from engine.core.common.formatting import format_duration
from engine.core.common.run_files import user_name
from engine.core.common.visible_text import visible
from engine.core.queue.claims import ClaimStoreError
from engine.core.queue.line import Verdict
from engine.core.queue.standing import line_at

COLUMNS = (
    Column("#", right=True),
    Column("RUN ID", shrink=3, min_width=12),
    Column("USER", shrink=1),
    Column("WANTS"),
    Column("SINCE", right=True),
    Column("WHAT", shrink=2, min_width=6),
)


def line_rows(verdicts: list[Verdict], now: float) -> list[list[str]]:
    return [
        [
            str(v.place) if v.place else "run",
            visible(v.claim.run_id, one_line=True),
            user_name(v.claim.uid),
            v.claim.want.describe(),
            format_duration(now - v.claim.queued_at),
            visible(v.claim.label, one_line=True) or "-",
        ]
        for v in verdicts
    ]


def line_text(verdicts: list[Verdict], width: int | None, now: float) -> list[str]:
    """The line as a table, each row's reason under it (wrapped to ``width``)."""
    if not verdicts:
        return ["the queue is empty"]
    table = render_table(COLUMNS, line_rows(verdicts, now), width)
    lines = [table[0]]
    for row, verdict in zip(table[1:], verdicts, strict=True):
        lines.append(row)
        lines += wrap_line(
            visible(verdict.said, one_line=True), width, indent="    ", hang="      "
        )
    return lines


def verdict_json(verdict: Verdict) -> dict[str, object]:
    return {
        **verdict.claim.to_json(),
        "user": user_name(verdict.claim.uid),
        "place": verdict.place,
        "may_start": verdict.may_start,
        "reason": verdict.reason,
    }


@click.command("queue")
@click.option(
    "--queue-store",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="The claim store (default $DDPTUI_CLAIMS_DIR or /tmp/ddptui-claims).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the line as JSON.")
@wide_option
def queue_command(queue_store: Path | None, as_json: bool, wide: bool) -> None:
    """This machine's queue of runs (`ddptui run --queue`), every user's, first in line first:
    what each waits for, since when, and why it cannot start yet. `ddptui kill RUN_ID` removes
    a queued run. The UI's Runs screen (r) shows the same line above the runs, and its k
    removes the highlighted queued run."""
    try:
        verdicts = line_at(queue_store)  # no store yet: nobody has queued, and nothing is made
    except ClaimStoreError as err:
        fail(str(err))
    if as_json:
        click.echo(strict_json.dumps([verdict_json(v) for v in verdicts], indent=2))
        return
    for line in line_text(verdicts, output_width(wide), time.time()):
        echo(line)
