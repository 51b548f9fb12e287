"""Running a bench: a suite's rows one after another, each through the same launcher as
``ddptui run``, into the rows of a speedup table. Plain Python.

Rows that could not be planned are skipped rows with the planner's reason; a failed row does not
stop the next one; Ctrl-C stops the running row and lists the rest as skipped. How a run is
followed (what is printed meanwhile) is the caller's: ``follow`` gets each started run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from engine.core.backends.local.start import StartedRun, start_run
from engine.core.bench.result_history import RecordedRun
from engine.core.bench.speedup_table import RowResult
from engine.core.bench.table_compute import failure_reason
from engine.core.bench.table_rows import planned_row, skipped_row, unfinished_summary
from engine.core.common.statuses import RunStatus
from engine.core.config.schema import ConfigError
from engine.core.host.outside_load import OutsideLoad
from engine.core.ops.follower import FollowResult
from engine.core.plan.suite_plan import ResolvedRow
from engine.core.runs.rundir import RunDirError
from engine.core.runs.summary import RunSummary

INTERRUPTED = "the bench was interrupted (Ctrl-C) before this row ran"

# Follows one started run to its end (printing progress as it likes) and says how it ended.
Follow = Callable[[StartedRun], FollowResult]


@dataclass
class BenchState:
    """What the rows left behind, and whether Ctrl-C asked the bench to stop."""

    results: list[RowResult] = field(default_factory=list)
    runs: list[RecordedRun] = field(default_factory=list)
    interrupted: bool = False


def run_once(
    resolved: ResolvedRow, runs_dir: Path, follow: Follow, state: BenchState
) -> tuple[RunSummary, str]:
    """Run one repeat of a row to its end: (its summary, its run directory or "")."""
    plan = resolved.plan
    assert plan is not None
    load = OutsideLoad()
    try:
        started = start_run(resolved.config, runs_dir)
    except (ConfigError, RunDirError, OSError) as err:
        return unfinished_summary("", resolved.config, plan, f"it could not start: {err}"), ""
    result = follow(started)
    if result.interrupted:
        state.interrupted = True
    path = str(started.run_dir.path)
    ended = result.state
    if ended.summary is not None:
        return replace(ended.summary, outside_load_cores=round(load.cores(), 3)), path
    why = ended.problem or ended.reason or f"it ended {ended.status} without a summary"
    if ended.status == RunStatus.ORPHANED:
        why = f"{ended.reason}; see {started.run_dir.launcher_log_path}"
    return unfinished_summary(started.run_id, resolved.config, plan, why), path


def outcome_line(summary: RunSummary) -> str:
    last = summary.table_epoch
    if summary.status == RunStatus.COMPLETED and last is not None:
        return (
            f"completed: {last.steady_images_per_s:,.0f} img/s steady, epoch "
            f"{last.steady_epoch_seconds:.2f} s without warm-up"
        )
    return f"{summary.status}: {failure_reason(summary)}"


def run_rows(
    rows: list[ResolvedRow], runs_dir: Path, repeat: int, out: TextIO, follow: Follow
) -> BenchState:
    """Every row in turn, ``repeat`` times each; a failed row does not stop the others. Progress
    lines go to ``out``."""
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
            summary, run_dir = run_once(resolved, runs_dir, follow, state)
            summaries.append(summary)
            state.runs.append(RecordedRun(resolved.label, attempt, run_dir, summary))
            out.write(f"{head}{which}: {outcome_line(summary)}\n")
            if summary.status != RunStatus.COMPLETED or state.interrupted:
                break  # a failed repeat fails the row; the next row still runs
        state.results.append(planned_row(resolved, plan, tuple(summaries)))
    return state
