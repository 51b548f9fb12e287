"""``ddptui runs`` (every run in the runs directory) and ``ddptui show RUN_ID`` (one run in full).

Both read only the run directories (and check whether a launcher is still alive), so they work
while a run goes on, after it ended, and after the UI that started it is gone.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from ddptui.cli_common import aligned_columns, fail, read_runs_dir_option
from ddptui.stack_report import diagnosis_lines, flight_recorder_lines
from engine.core.common import strict_json
from engine.core.common.formatting import format_duration
from engine.core.config.schema import ConfigError
from engine.core.config.toml_io import load_config
from engine.core.runs.observer import RunState, observe_run
from engine.core.runs.rank_states import RankState, Thresholds
from engine.core.runs.rundir import RunDirError, find_run, list_runs
from engine.core.runs.step_breakdown import StepBreakdown, StepPart
from engine.core.runs.summary import RunSummary


def _stalled_cell(progress: RunState) -> str:
    parts = []
    if progress.stalled_ranks:
        parts.append("stalled " + ",".join(map(str, progress.stalled_ranks)))
    if progress.straggler_ranks:
        parts.append("straggling " + ",".join(map(str, progress.straggler_ranks)))
    return "; ".join(parts) or "-"


@click.command("runs")
@read_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
def runs_command(runs_dir: Path, as_json: bool) -> None:
    """List the runs in the runs directory, oldest first: id, preset, state, age, devices, ranks,
    and which ranks are stalled or straggling.

    \b
    States: starting, running, completed, failed, killed; orphaned (its launcher is gone but
    ranks are still alive: see `ddptui ps` / `ddptui clean`); lost (the launcher is gone and
    left no summary); unreadable (run.json is corrupt).
    """
    now = time.time()
    runs = [observe_run(r, now) for r in list_runs(runs_dir)]
    if as_json:
        click.echo(strict_json.dumps([r.to_json() for r in runs], indent=2))
        return
    if not runs:
        where = "" if runs_dir.is_dir() else " (it does not exist)"
        click.echo(f"No runs in {runs_dir}{where}.")
        return
    rows = [("RUN ID", "PRESET", "STATE", "AGE", "DEVICES", "RANKS", "STALLED / STRAGGLING")]
    for r in runs:
        rows.append(
            (
                r.run_id,
                r.preset or "-",
                r.status,
                format_duration(now - r.created) if r.created else "-",
                r.devices or "-",
                str(r.world_size or "-"),
                _stalled_cell(r),
            )
        )
    for line in aligned_columns(rows):
        click.echo(line.rstrip())
    problems = [r for r in runs if r.problem]
    for r in problems:
        click.echo(f"  {r.run_id}: {r.problem}")
    for r in runs:
        if r.unsaved:
            click.echo(f"  {r.run_id}: note: {r.unsaved}")


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _rank_rows(ranks: tuple[RankState, ...], now: float) -> list[str]:
    rows = [("RANK", "PID", "STATE", "EPOCH", "STEP", "LOSS", "IMG/S", "LAST EVENT", "NOTE")]
    for r in ranks:
        step = "-" if r.step is None else f"{r.step}/{r.steps if r.steps is not None else '?'}"
        last = (
            "-" if r.last_event_time is None else f"{format_duration(now - r.last_event_time)} ago"
        )
        rows.append(
            (
                str(r.rank),
                str(r.pid or "-"),
                r.state,
                "-" if r.epoch is None else str(r.epoch),
                step,
                _num(r.loss, ".4f"),
                _num(r.images_per_s, ",.0f"),
                last,
                r.reason,
            )
        )
    return ["  " + line.rstrip() for line in aligned_columns(rows)]


def _per_step(seconds: float | None, total: float) -> str:
    if seconds is None:
        return "-"
    share = f" {seconds / total:.0%}" if total > 0 else ""
    return f"{1000 * seconds:.1f}{share}"


def _split_lines(progress: RunState) -> list[str]:
    """Each rank's step split in milliseconds per step and share of the step, then the cause."""
    split: tuple[StepBreakdown, ...] = progress.step_breakdown
    if not split:
        return []
    which = "the whole run" if progress.final else "recent steps"
    clock = "GPU time" if any(b.clock == "cuda" for b in split) else "wall time"
    rows = [("RANK", "STEP", *(p.value.upper() for p in StepPart), "TIMED")]
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
    lines += ["  " + line.rstrip() for line in aligned_columns(rows)]
    if progress.bottleneck is not None:
        lines.append(f"bottleneck {progress.bottleneck.sentence}")
    return lines


def _config_lines(progress: RunState) -> list[str]:
    path = progress.path / "config.toml"
    try:
        c = load_config(path)
    except ConfigError as err:
        return [f"config     {err}"]
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
            f"  epoch {e.epoch}: {e.seconds:.1f} s, {e.steady_images_per_s:,.0f} img/s, "
            f"loss {e.train_loss:.4f}"
            + (f", test accuracy {100 * acc:.1f}%" if acc is not None else "")
        )
    lines.extend(f"warning    {w}" for w in summary.warnings)
    failure = summary.failure
    if failure:
        how = []
        if failure.exitcode is not None:
            how.append(f"exit code {failure.exitcode}")
        if failure.signal:
            how.append(failure.signal)
        who = f"rank {failure.rank}" if failure.rank is not None else "the launcher"
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
    """Show one run (an id or a unique prefix): its config, each rank's state (running, stalled,
    straggler, failed, done, stopped) with epoch, step, loss, images/s and time since its last
    event, each rank's step split (data wait, forward, backward, sync, optimizer, other) with the
    run's bottleneck, the summary figures and, for a failed run, the root cause with its traceback.

    Exit codes: 0 shown, 2 bad input (unknown run id; an unreadable run.json is shown as far as
    it can be, then named on stderr).
    """
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
            *_config_lines(progress),
            "",
            *(_rank_rows(progress.ranks, now) if progress.ranks else ["  no rank has reported"]),
        ]
        split = _split_lines(progress)
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
        click.echo("\n".join(lines))
    if progress.unsaved:
        click.echo(f"ddptui: note: {progress.unsaved}", err=True)
    if progress.problem:
        fail(progress.problem)
