"""``ddptui kill``: stop exactly the processes of one run, through its backend (its live launcher
or Slurm), and say what ended how.

Exit codes: 0 stopped (or nothing to stop), 1 a process survived or the question was declined, 2
bad input (unknown run id, unreadable run.json, a process that is not yours to stop): nothing was
signalled.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from ddptui import exit_codes
from ddptui.cli_common import confirmed, echo, fail, grace_option, read_runs_dir_option
from engine.core.backends.local.kill import KillResult
from engine.core.backends.registry import backend_of
from engine.core.common import strict_json
from engine.core.common.statuses import KillOutcome
from engine.core.procs.stopping import KillRefused
from engine.core.runs.rundir import RunDirError, find_run, run_dir_owner


def _kill_report(result: KillResult, grace: float) -> list[str]:
    lines = []
    if result.outcome == KillOutcome.ALREADY_FINISHED:
        lines.append(
            f"run {result.run_id} already finished ({result.status_before}); nothing to stop."
        )
    elif result.outcome == KillOutcome.NOTHING_RUNNING:
        recorded = (
            "recorded it as killed"
            if result.summary_written
            else f"its summary was not written: {result.unwritten}"
            if result.unwritten
            else "its summary was already there"
        )
        lines.append(
            f"run {result.run_id}: no process of it is left (state was {result.status_before}); "
            f"{recorded}."
        )
    elif result.job_id and not result.targets:
        lines.append(
            f"run {result.run_id}: Slurm job {result.job_id} cancelled while it was "
            f"{result.status_before}, before any node launcher had started"
        )
    else:
        roles = ", ".join(f"{t.role} (pid {t.pid})" for t in result.targets)
        job = f" (Slurm job {result.job_id}, cancelled)" if result.job_id else ""
        lines.append(f"run {result.run_id}{job}: stopping {roles}")
        if result.status_before.final:
            lines.append(
                f"  it had already finished ({result.status_before}); these were leftovers"
            )
        stop = result.stop
        if stop is not None:
            extra = len(stop.stopped) - len(result.targets)
            if extra > 0:
                lines.append(f"  and {extra} of their child processes")
            if result.by_launcher and result.job_id:
                lines.append("  each node launcher stopped its ranks and checked its node")
            elif result.by_launcher:
                lines.append("  its launcher stopped its ranks and wrote the summary")
            lines.extend(_how_stopped(result, grace))
            if stop.survivors:
                lines.append(f"  still alive after SIGKILL: {', '.join(map(str, stop.survivors))}")
            else:
                lines.append("  none left")
            lines.extend(f"  not stopped: {why}" for _, why in stop.refused)
            lines.extend(f"  {why}" for _, why in stop.left_alone)
    lines.extend(f"  {s}" for s in result.skipped)
    if result.verification:
        lines.append(f"  {result.verification}")
    lines.extend(f"  a rank's daemon: {d}" for d in result.daemons)
    if result.gpu_check:
        lines.append(f"  {result.gpu_check}")
    if result.summary_written:
        lines.append("  summary.json: killed")
    elif result.unwritten and result.outcome == KillOutcome.STOPPED:
        lines.append(f"  summary.json not written: {result.unwritten}")
    return lines


def _how_stopped(result: KillResult, grace: float) -> list[str]:
    """Which process ended on SIGTERM and which needed SIGKILL, each named (its role in the run,
    else its pid), as the launcher's events or the killer's own stop say it."""
    assert result.stop is not None
    roles = {t.pid: t.role for t in result.targets}

    def named(pids: tuple[int, ...]) -> str:
        return ", ".join(
            f"{roles[pid]} (pid {pid})" if roles.get(pid) not in (None, "marked") else f"pid {pid}"
            for pid in pids
        )

    stop = result.stop
    lines = []
    if stop.terminated:
        lines.append(f"  ended on SIGTERM: {named(stop.terminated)}")
    if stop.killed:
        given = result.grace_seconds or grace
        lines.append(f"  needed SIGKILL, {given:g} s after SIGTERM: {named(stop.killed)}")
    lines.append(f"  {stop.seconds:.1f} s in all")
    return lines


@click.command("kill")
@click.argument("run_id")
@grace_option
@click.option(
    "--all-users",
    is_flag=True,
    help="As root: also stop another user's run, or processes of the run that belong to other "
    "users (asks first when the run directory is another user's).",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask; for scripts.")
@read_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def kill_command(
    run_id: str, grace: float, all_users: bool, yes: bool, runs_dir: Path, as_json: bool
) -> None:
    """Stop exactly the processes of run RUN_ID (its id or any unique part of one, such as its
    random suffix, or a preset's name for that preset's newest run).

    \b
    Only what is provably the run's: processes whose own environment carries the run's marker
    (DDPTUI_RUN_ID and this run directory as DDPTUI_RUN_DIR: a run of the same id elsewhere is
    another run), owned by the run directory's owner, the launcher and ranks run.json names also
    by pid and start time (so a reused pid or a process run.json merely names is never hit), and
    their children carrying the marker too: SIGTERM,
    SIGKILL after --grace seconds, then a check that none is left (and, with NVML, that their
    GPU memory was released). summary.json records the run as killed. A finished run is left
    alone. Another user's run directory is refused; as root, --all-users stops it after asking.

    Exit codes: 0 stopped (or nothing to stop), 1 a process survived or the question was
    declined, 2 bad input (unknown run, unreadable run.json, another user's run or process):
    nothing was signalled.
    """
    if all_users and os.getuid() != 0:
        fail("--all-users needs root: only root may stop other users' processes")
    try:
        run_dir = find_run(runs_dir, run_id)
        owner = run_dir_owner(run_dir)
        if owner is not None and all_users and not yes:
            _confirm_or_stop(
                f"Run {run_dir.run_id} belongs to user {owner}. Stop its processes as root?",
                err=as_json,
            )
        result = backend_of(run_dir).stop(run_dir, grace, allow_other_users=all_users)
    except (RunDirError, KillRefused) as err:
        fail(str(err))
    if as_json:
        click.echo(strict_json.dumps(_kill_json(result), indent=2))
    else:
        echo("\n".join(_kill_report(result, grace)))
    sys.exit(exit_codes.OK if result.ok else exit_codes.FAILED)


def _confirm_or_stop(question: str, *, err: bool) -> None:
    """Ask; anything but yes (Ctrl-D, no terminal) stops with nothing signalled, exit 1."""
    if not confirmed(question, err=err):
        echo("Nothing stopped.", err=err)
        sys.exit(exit_codes.FAILED)


def _kill_json(result: KillResult) -> dict[str, Any]:
    data = asdict(result)
    data["ok"] = result.ok
    return data
