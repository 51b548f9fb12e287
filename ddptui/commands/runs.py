"""``ddptui runs`` (every run in the runs directory; ``--prune`` removes ended ones),
``ddptui rm RUN...`` (remove ended runs) and ``ddptui show RUN_ID`` (one run in full).

Listing and showing read only the run directories (and check whether a launcher is still alive),
so they work while a run goes on, after it ended, and after the UI that started it is gone.
Removing never touches a run that is going (``engine.core.ops.run_removal``).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ddptui import exit_codes
from ddptui.cli_common import echo, fail, read_runs_dir_option
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
    from engine.core.runs.observer import RunState
    from engine.core.runs.rank_states import RankState
    from engine.core.runs.step_breakdown import StepBreakdown
    from engine.core.runs.summary import RunSummary

# Imports inside the functions below keep ``ddptui runs`` from loading what only ``show`` and
# removing need (the observer, config parsing, stack reports): start-up is most of a listing.


def _stalled_cell(run: RunListing) -> str:
    parts = []
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
    and which ranks are stalled or straggling; --json for scripts (`ddptui show RUN --json` has a
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
        runs = RunCatalog(runs_dir, cache_file=listing_cache_path(runs_dir)).list()
    except RunDirError as err:
        fail(str(err))
    now = time.time()
    if prune:
        from engine.core.ops.run_removal import prune_selection

        wanted = {RunStatus(s) for s in states}
        chosen = prune_selection(runs, now=now, older_than=older_than, states=wanted, keep=keep)
        _remove([RunDir(r.path) for r in chosen], yes=yes, dry_run=dry_run, all_users=all_users,
                as_json=as_json, what="prune")  # fmt: skip
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
            _stalled_cell(r),
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
    run_dirs: list[RunDir], *, yes: bool, dry_run: bool, all_users: bool, as_json: bool, what: str
) -> None:
    """Show what would go and what may not, ask, remove; exit 1 when something stayed."""
    from engine.core.ops.run_removal import plan_removal, remove_runs

    width = terminal_width()

    def say(line: str) -> None:
        if not as_json:
            echo_wrapped(line, width, hang="    ")

    plan = plan_removal(run_dirs, allow_other_users=all_users)
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
        if yes or _confirmed(question, err=as_json):
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


def _confirmed(question: str, *, err: bool) -> bool:
    try:
        return click.confirm(question, default=False, err=err)
    except click.Abort:  # Ctrl-D, or no terminal to ask on
        return False


def _removal_json(plan: RemovalPlan, result: RemovalResult | None) -> dict[str, Any]:
    return {
        "remove": [asdict(r) for r in plan.remove],
        "refused": [{"run_id": run_id, "reason": why} for run_id, why in plan.refused],
        "removed": None if result is None else list(result.removed),
        "failed": None
        if result is None
        else [{"run_id": run_id, "reason": why} for run_id, why in result.failed],
    }


# ---- ddptui show ---------------------------------------------------------------------------------


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


RANK_COLUMNS = (
    Column("RANK", right=True),
    Column("PID", right=True),
    Column("STATE"),
    Column("EPOCH", right=True),
    Column("STEP", right=True),
    Column("LOSS", right=True),
    Column("IMG/S", right=True),
    Column("LAST EVENT", right=True),
    Column("NOTE", shrink=0, min_width=10),
)


def _rank_rows(ranks: tuple[RankState, ...], now: float, width: int | None) -> list[str]:
    across = any(r.node for r in ranks)  # a run across nodes: each rank's node
    rows: list[tuple[object, ...]] = []
    for r in ranks:
        # a script's steps in an epoch are known only where a progress bar said them
        step = "-" if r.step is None else f"{r.step}/{r.steps}" if r.steps else str(r.step)
        last = (
            "-" if r.last_event_time is None else f"{format_duration(now - r.last_event_time)} ago"
        )
        rows.append(
            (
                r.rank,
                r.pid or "-",
                r.state,
                "-" if r.epoch is None else r.epoch + 1,  # counted from 1, as every screen does
                step,
                _num(r.loss, ".4f"),
                _num(r.images_per_s, ",.0f"),
                last,
                r.reason or "-",
            )
        )
        if across:
            rows[-1] = (rows[-1][0], r.node or "?", *rows[-1][1:])
    columns: tuple[Column, ...] = RANK_COLUMNS
    if across:
        columns = (RANK_COLUMNS[0], Column("NODE"), *RANK_COLUMNS[1:])
    return render_table(columns, rows, width, indent=2)


def _slurm_lines(progress: RunState) -> list[str]:
    """A run on Slurm: its job, and each node with its ranks and whether it proved itself
    clean at its end."""
    view = progress.slurm
    if view is None:
        return []
    job = view.job
    said = f" ({job.state}{': ' + job.reason if job.reason else ''})" if job else ""
    where = "step of your allocation, " if view.in_allocation else ""
    nodes = []
    for name, record in sorted(view.nodes.items(), key=lambda item: item[1].node_rank):
        ranks = ",".join(map(str, record.global_ranks)) or "-"
        proof = record.proof
        checked = "" if proof is None else (" verified" if proof.clean else " NOT clean")
        nodes.append(f"{name} (ranks {ranks}, {record.state}{checked})")
    return [
        f"slurm      {where}job {view.job_id or '-'}{said}; "
        + ("; ".join(nodes) or "no node launcher yet")
    ]


def _per_step(seconds: float | None, total: float) -> str:
    if seconds is None:
        return "-"
    share = f" {seconds / total:.0%}" if total > 0 else ""
    return f"{1000 * seconds:.1f}{share}"


def _split_lines(progress: RunState, width: int | None) -> list[str]:
    """Each rank's step split in milliseconds per step and share of the step, then the cause."""
    from engine.core.runs.step_breakdown import StepPart

    split: tuple[StepBreakdown, ...] = progress.step_breakdown
    if not split:
        return []
    which = "the whole run" if progress.final else "recent steps"
    clock = "GPU time" if any(b.clock == "cuda" for b in split) else "wall time"
    columns = [
        Column("RANK", right=True),
        Column("STEP", right=True),
        *(Column(p.value.upper(), right=True) for p in StepPart),
        Column("TIMED", right=True),
    ]
    rows = []
    for b in split:
        parts = b.parts()
        rows.append(
            (
                str(b.rank),
                f"{1000 * b.total:.1f}",
                *(_per_step(parts.get(part), b.total) for part in StepPart),
                f"{b.timed}/{b.steps}",
            )
        )
    lines = [f"step split   ms per step and share, {which}, {clock} (sync -: in backward)"]
    lines += render_table(columns, rows, width, indent=2)
    if progress.bottleneck is not None:
        lines.append(f"bottleneck {progress.bottleneck.sentence}")
    return lines


def _config_lines(progress: RunState) -> list[str]:
    from engine.core.config.schema import ConfigError
    from engine.core.runs.rank_states import Thresholds

    try:
        c = RunDir(progress.path).load_config()
    except ConfigError as err:
        return [f"config     {err}"]
    if c.script.given:  # the script has its own epochs, batch, model and data
        args = f" {shlex.join(c.script.args)}" if c.script.args else ""
        return [
            f"script     {c.script.label}{args}",
            "           one process per device, started like torchrun",
            f"supervise  {Thresholds.of(c).describe()}",
        ]
    faults = f", faults {', '.join(c.faults)}" if c.faults else ""
    steps = f", {c.training.max_steps} steps/epoch" if c.training.max_steps else ""
    return [
        f"preset     {c.name}: {c.strategy.name} {c.precision.mode} {c.model.name} on "
        f"{c.data.dataset}",
        f"training   {c.training.epochs} epoch(s), batch {c.training.batch_size} per process"
        f"{steps}{faults}",
        f"supervise  {Thresholds.of(c).describe()}",
    ]


def _summary_lines(summary: RunSummary) -> list[str]:
    lines = [
        f"summary    {summary.status} after {summary.elapsed_seconds:.1f} s"
        + (f": {summary.reason}" if summary.reason else "")
    ]
    for e in summary.epochs:
        acc = e.test_accuracy
        lines.append(
            f"  epoch {e.epoch + 1}: {e.seconds:.1f} s, {e.steady_images_per_s:,.0f} img/s, "
            f"loss {e.train_loss:.4f}"
            + (f", test accuracy {100 * acc:.1f}%" if acc is not None else "")
        )
    if summary.strategy == "script":
        if summary.global_steps is not None:
            lines.append(f"steps      {summary.global_steps:,} optimizer steps on rank 0")
        said = [f"{k} {v:g}" for k, v in summary.reported.items() if isinstance(v, (int, float))]
        if said:
            lines.append(f"reported   {', '.join(said)} (rank 0's last ddptui.report)")
    lines.extend(f"warning    {w}" for w in summary.warnings)
    lines.extend(f"leftover   {w}" for w in summary.leftovers)
    failure = summary.failure
    if failure:
        how = []
        if failure.exitcode is not None:
            how.append(f"exit code {failure.exitcode}")
        if failure.signal:
            how.append(failure.signal)
        who = failure.who
        lines.append(
            f"failure    {who}" + (f" ({', '.join(how)})" if how else "") + f": {failure.error}"
        )
        if failure.traceback:
            lines.extend("  " + line for line in failure.traceback.rstrip().splitlines())
    return lines


@click.command("show")
@click.argument("run_id")
@read_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable state of the run.")
def show_command(run_id: str, runs_dir: Path, as_json: bool) -> None:
    """Show one run: RUN_ID is its id or any unique part of one (its random suffix, say), or a
    preset's name for that preset's newest run. Shows its config, each rank's state (running,
    stalled, straggler, failed, done, stopped) with epoch (counted from 1), step, loss, images/s
    and time since its last event, each rank's step split (data wait, forward, backward, sync,
    optimizer, other) with the run's bottleneck, the summary figures and, for a failed run, the
    root cause with its traceback.

    Exit codes: 0 shown, 2 bad input (unknown run id; an unreadable run.json is shown as far as
    it can be, then named on stderr).
    """
    from ddptui.stack_report import diagnosis_lines, flight_recorder_lines
    from engine.core.runs.observer import observe_run

    try:
        run_dir = find_run(runs_dir, run_id)
    except RunDirError as err:
        fail(str(err))
    now = time.time()
    progress = observe_run(run_dir, now)
    if as_json:
        click.echo(strict_json.dumps(progress.to_json(), indent=2))
    else:
        launcher = ""
        if progress.info is not None and progress.info.launcher is not None:
            alive = "running" if progress.launcher_alive else "gone"
            launcher = f"   launcher pid {progress.info.launcher.pid} ({alive})"
        created = (
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(progress.created))} "
            f"({format_duration(now - progress.created)} ago)"
            if progress.created
            else "-"
        )
        lines = [
            f"run        {progress.run_id}   ({progress.path})",
            f"state      {progress.status}{launcher}"
            + (f": {progress.reason}" if progress.reason and not progress.summary else ""),
            f"devices    {progress.devices or '-'}, world size {progress.world_size or '-'}",
            f"created    {created}",
            *_slurm_lines(progress),
            *_config_lines(progress),
            "",
            *(
                _rank_rows(progress.ranks, now, terminal_width())
                if progress.ranks
                else ["  no rank has reported"]
            ),
        ]
        split = _split_lines(progress, terminal_width())
        if split:
            lines += ["", *split]
        if progress.summary:
            lines += ["", *_summary_lines(progress.summary)]
        if progress.diagnosis is not None:
            lines += ["", *diagnosis_lines(progress.diagnosis)]
            lines.append(f"  the full stacks: ddptui stacks {progress.run_id}")
        fr = flight_recorder_lines(run_dir)
        if fr:
            lines += ["", *fr]
        echo("\n".join(lines))
    if progress.unsaved:
        echo(f"ddptui: note: {progress.unsaved}", err=True)
    if progress.problem:
        fail(progress.problem)
