"""``ddptui runs`` (every run in the runs directory; ``--prune`` removes ended ones) and
``ddptui rm RUN...`` (remove ended runs); ``ddptui show`` is ``ddptui.commands.show``.

Listing reads only the run directories (and checks whether a launcher is still alive), so it
works while a run goes on, after it ended, and after the UI that started it is gone.
Removing never touches a run that is going (``engine.core.ops.run_removal``).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ddptui import exit_codes
from ddptui.cli_common import confirmed, echo, fail, read_runs_dir_option
from ddptui.cli_table import (
    Column,
    cut_middle,
    echo_wrapped,
    fit_line,
    output_width,
    render_table,
    terminal_width,
    wide_option,
)
from engine.core.common import strict_json
from engine.core.common.formatting import format_bytes, format_duration
from engine.core.common.statuses import RunStatus
from engine.core.runs.run_listing import RunCatalog, RunListing, listing_cache_path
from engine.core.runs.rundir import RunDir, RunDirError, find_run

if TYPE_CHECKING:
    from engine.core.ops.run_removal import RemovalPlan, RemovalResult

# Imports inside the functions below keep ``ddptui runs`` from loading what only removing needs
# (config parsing, the removal plan): start-up is most of a listing.


def _note_cell(run: RunListing) -> str:
    """Its attempt when it was restarted or resumed, and its stalled and straggling ranks."""
    parts = [f"attempt {run.attempt}"] if run.attempt > 1 else []
    if run.stalled_ranks:
        parts.append("stalled " + ",".join(map(str, run.stalled_ranks)))
    if run.straggler_ranks:
        parts.append("straggling " + ",".join(map(str, run.straggler_ranks)))
    return "; ".join(parts) or "-"


# The preset is in the run id, so it goes first; then the note, then the devices.
RUN_COLUMNS = (
    Column("RUN ID", fit=cut_middle),
    Column("PRESET", shrink=0, min_width=0),
    Column("STATE"),
    Column("AGE", right=True),
    Column("DEVICES", shrink=2, min_width=7),
    Column("RANKS", right=True),
    Column("NOTE", shrink=1, min_width=10),
)
STATE_CHOICES = [str(s) for s in RunStatus]
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Duration(click.ParamType):
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` or plain seconds, as seconds."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip().lower()
        unit = DURATION_UNITS.get(text[-1:])
        number = text[:-1] if unit is not None else text
        try:
            seconds = float(number) * (unit or 1)
        except ValueError:
            self.fail(f"{value!r} is not a duration such as 90s, 30m, 12h or 7d", param, ctx)
        if seconds < 0:
            self.fail(f"{value!r}: a duration cannot be negative", param, ctx)
        return seconds


@click.command("runs")
@read_runs_dir_option
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(STATE_CHOICES),
    help="Only runs in this state (repeat for more); with --prune, remove runs in it.",
)
@click.option(
    "--prune", is_flag=True, help="Remove ended runs: those --older-than, --state, --keep say."
)
@click.option(
    "--older-than", type=Duration(), help="With --prune: runs started longer ago (7d, 12h)."
)
@click.option(
    "--keep", type=click.IntRange(min=0), help="With --prune: leave the newest N of them."
)
@click.option("--dry-run", is_flag=True, help="With --prune: only list what would be removed.")
@click.option("--yes", "-y", is_flag=True, help="With --prune: do not ask; for scripts.")
@click.option("--all-users", is_flag=True, help="With --prune, as root: other users' runs too.")
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
def runs_command(
    runs_dir: Path,
    states: tuple[str, ...],
    prune: bool,
    older_than: float | None,
    keep: int | None,
    dry_run: bool,
    yes: bool,
    all_users: bool,
    wide: bool,
    as_json: bool,
) -> None:
    """List the runs in the runs directory, oldest first: id, preset, state, age, devices, ranks,
    its attempt when it was restarted or resumed (`ddptui show` lists them), and which ranks are
    stalled or straggling; --json for scripts (`ddptui show RUN --json` has a
    run's ranks and summary).

    \b
    States: starting, running, completed, failed, killed; orphaned (its launcher is gone but
    ranks are still alive: see `ddptui ps` / `ddptui clean`); lost (the launcher is gone and
    left no summary); unreadable (run.json is corrupt).

    \b
    Pruning removes run directories, asking first (--yes does not ask, --dry-run only lists):
      ddptui runs --prune --older-than 7d       ended runs started over a week ago
      ddptui runs --prune --state failed        every failed run
      ddptui runs --prune --keep 20             all ended runs but the newest 20
    The options combine (every one must hold). A run that is going is never removed.
    Exit codes: 0 done, 1 declined or a run could not be removed, 2 bad input.
    """
    if not prune and (older_than is not None or keep is not None or dry_run or yes or all_users):
        fail("--older-than, --keep, --dry-run, --yes and --all-users go with --prune")
    if prune and not (states or older_than is not None or keep is not None):
        fail("say which runs --prune removes: --older-than, --state or --keep")
    if all_users and os.getuid() != 0:
        fail("--all-users needs root: only root may remove other users' runs")
    try:
        # a run found lost is written down as such (its summary), as every reader shows it
        runs = RunCatalog(runs_dir, cache_file=listing_cache_path(runs_dir), settle=True).list()
    except RunDirError as err:
        fail(str(err))
    now = time.time()
    if prune:
        from engine.core.ops.run_removal import prune_selection

        wanted = {RunStatus(s) for s in states}
        chosen = prune_selection(runs, now=now, older_than=older_than, states=wanted, keep=keep)
        _remove([RunDir(r.path) for r in chosen], yes=yes, dry_run=dry_run, all_users=all_users,
                as_json=as_json, what="prune",
                observed={r.run_id: r.status for r in chosen})  # fmt: skip
        return
    if states:
        runs = [r for r in runs if r.status in states]
    if as_json:
        click.echo(strict_json.dumps([r.to_json() for r in runs], indent=2))
        return
    _print_runs(runs, runs_dir, states, now, output_width(wide))


def _print_runs(
    runs: list[RunListing], runs_dir: Path, states: tuple[str, ...], now: float, width: int | None
) -> None:
    if not runs:
        where = "" if runs_dir.is_dir() else " (it does not exist)"
        which = f" {' or '.join(states)}" if states else ""
        echo(fit_line(f"No{which} runs in {runs_dir}{where}.", width))
        return
    rows = [
        (
            r.run_id,
            r.preset or "-",
            r.status,
            format_duration(now - r.created) if r.created else "-",
            r.devices or "-",
            r.world_size or "-",
            _note_cell(r),
        )
        for r in runs
    ]
    for line in render_table(RUN_COLUMNS, rows, width):
        echo(line)
    for r in runs:
        if r.problem:
            echo_wrapped(f"{r.run_id}: {r.problem}", width, indent="  ", hang="    ")
        if r.unsaved:
            echo_wrapped(f"{r.run_id}: note: {r.unsaved}", width, indent="  ", hang="    ")


# ---- removing runs -------------------------------------------------------------------------------


@click.command("rm")
@click.argument("run_ids", nargs=-1, required=True)
@read_runs_dir_option
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask; for scripts.")
@click.option("--all-users", is_flag=True, help="As root: other users' runs too.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan and result.")
def rm_command(
    run_ids: tuple[str, ...],
    runs_dir: Path,
    dry_run: bool,
    yes: bool,
    all_users: bool,
    as_json: bool,
) -> None:
    """Remove the run directories of ended runs RUN_IDS (each an id or any unique part of one),
    after showing them and asking. A run that is going (starting, running, orphaned, or any
    process carrying its run marker) is never removed: stop it first with `ddptui kill`.

    Exit codes: 0 removed (or nothing to do), 1 declined, refused or not removed, 2 bad input
    (an unknown run id: nothing was removed).
    """
    if all_users and os.getuid() != 0:
        fail("--all-users needs root: only root may remove other users' runs")
    try:
        found = {d.run_id: d for d in (find_run(runs_dir, run_id) for run_id in run_ids)}
    except RunDirError as err:
        fail(str(err))
    _remove(list(found.values()), yes=yes, dry_run=dry_run, all_users=all_users,
            as_json=as_json, what="rm")  # fmt: skip


def _remove(
    run_dirs: list[RunDir],
    *,
    yes: bool,
    dry_run: bool,
    all_users: bool,
    as_json: bool,
    what: str,
    observed: dict[str, RunStatus] | None = None,
) -> None:
    """Show what would go and what may not, ask, remove; exit 1 when something stayed.
    ``observed``: the runs' statuses as the caller's listing has them (not observed again)."""
    from engine.core.ops.run_removal import plan_removal, remove_runs

    width = terminal_width()

    def say(line: str) -> None:
        if not as_json:
            echo_wrapped(line, width, hang="    ")

    plan = plan_removal(run_dirs, allow_other_users=all_users, observed=observed)
    if not plan.remove and not plan.refused:
        say("No run to remove." if what == "rm" else "No run matches; nothing to remove.")
    for run in plan.remove:
        say(f"remove {run.run_id}  ({run.status}, {format_bytes(run.size_bytes)})")
    for run_id, why in plan.refused:
        say(f"keep {run_id}: {why}")
    result: RemovalResult | None = None
    declined = False
    if plan.remove and not dry_run:
        count = f"{len(plan.remove)} run{'s' if len(plan.remove) != 1 else ''}"
        question = f"Remove {count} ({format_bytes(plan.size_bytes)})?"
        if yes or confirmed(question, err=as_json):
            result = remove_runs(plan)
            say(f"removed {len(result.removed)}")
            for run_id, why in result.failed:
                say(f"  could not remove {run_id}: {why}")
        else:
            declined = True
            click.echo("Nothing removed.", err=as_json)
    if as_json:
        click.echo(strict_json.dumps(_removal_json(plan, result), indent=2))
    stayed = bool(plan.refused) or declined or (result is not None and not result.ok)
    sys.exit(exit_codes.FAILED if stayed else exit_codes.OK)


def _removal_json(plan: RemovalPlan, result: RemovalResult | None) -> dict[str, Any]:
    return {
        "remove": [asdict(r) for r in plan.remove],
        "refused": [{"run_id": run_id, "reason": why} for run_id, why in plan.refused],
        "removed": None if result is None else list(result.removed),
        "failed": None
        if result is None
        else [{"run_id": run_id, "reason": why} for run_id, why in result.failed],
    }
