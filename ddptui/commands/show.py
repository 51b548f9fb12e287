"""``ddptui show RUN_ID``: one run in full (config, every rank's state and step split, the
summary, the root cause of a failure).

It reads only the run directory (and checks whether its launcher is still alive), so it works
while the run goes on, after it ended, and after the UI that started it is gone.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ddptui.cli_common import echo, fail, read_runs_dir_option
from ddptui.cli_table import Column, render_table, terminal_width
from engine.core.backends.registry import backend_for
from engine.core.common import strict_json
from engine.core.common.formatting import format_duration
from engine.core.runs.rundir import RunDir, RunDirError, find_run

if TYPE_CHECKING:
    from engine.core.runs.rank_states import RankState
    from engine.core.runs.run_state import RunState
    from engine.core.runs.step_breakdown import StepBreakdown
    from engine.core.runs.summary import RunSummary


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


def _per_step(seconds: float | None, total: float) -> str:
    if seconds is None:
        return "-"
    share = f" {seconds / total:.0%}" if total > 0 else ""
    return f"{1000 * seconds:.1f}{share}"


def _split_lines(progress: RunState, width: int | None) -> list[str]:
    """Each rank's step split in milliseconds per step and share of the step, then the cause."""
    from engine.core.common.step_split import StepPart

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


def _attempt_lines(progress: RunState) -> list[str]:
    """Every attempt of a run started more than once: how each began and ended."""
    records = progress.attempts
    if progress.attempt <= 1 and len(records) <= 1:
        return []
    lines = [f"attempts   {max(progress.attempt, len(records))}"]
    lines += [f"  {a.describe()}" for a in records]
    if progress.summary is None:  # the attempt going on now
        lines.append(f"  attempt {progress.attempt} {progress.status}")
    return lines


def _summary_lines(summary: RunSummary) -> list[str]:
    lines = [
        f"summary    {summary.status} after {summary.elapsed_seconds:.1f} s"
        + (f": {summary.reason}" if summary.reason else "")
    ]
    several = len(summary.attempts) > 1
    for e in summary.epochs:
        acc = e.test_accuracy
        whose = ""
        if several or e.first_step:
            whose = (
                f" (attempt {e.attempt}"
                + (f", from its step {e.first_step}" if e.first_step else "")
                + ")"
            )
        lines.append(
            f"  epoch {e.epoch + 1}: {e.seconds:.1f} s, {e.steady_images_per_s:,.0f} img/s, "
            f"loss {e.train_loss:.4f}"
            + (f", test accuracy {100 * acc:.1f}%" if acc is not None else "")
            + whose
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
    preset's name for that preset's newest run. Shows its config, its attempts when it was
    restarted or resumed (how each began, from which step, and how it ended), each rank's state
    (running, stalled, straggler, failed, done, stopped) with epoch (counted from 1), step, loss,
    images/s and time since its last event, each rank's step split (data wait, forward,
    backward, sync, optimizer, other) with the run's bottleneck, the summary figures and, for a
    failed run, the root cause with its traceback. The ranks, stacks and split are the current
    attempt's; an earlier attempt's files are in the run directory's attempts/<n>/.

    Exit codes: 0 shown, 2 bad input (unknown run id; an unreadable run.json is shown as far as
    it can be, then named on stderr).
    """
    from ddptui.stack_report import diagnosis_lines, flight_recorder_lines
    from engine.core.runs.observer import observe_run
    from engine.core.runs.settle import settle_observed

    try:
        run_dir = find_run(runs_dir, run_id)
    except RunDirError as err:
        fail(str(err))
    now = time.time()
    # one look at the run; a run found lost is written down as such (its summary)
    progress = settle_observed(observe_run(run_dir, now))
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
            *backend_for(progress.info).describe(progress),
            *_config_lines(progress),
            *_attempt_lines(progress),
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
