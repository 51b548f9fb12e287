"""``ddptui kill``: stop exactly the processes of one run, through its backend (its live launcher
here, or its scheduler's cancel), and say what ended how.

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
from ddptui.kill_report import kill_report
from engine.core.backends.local.kill import KillResult
from engine.core.backends.registry import backend_for
from engine.core.common import strict_json
from engine.core.procs.stopping import KillRefused
from engine.core.runs.run_handle import observe_handle
from engine.core.runs.rundir import RunDirError, find_run, run_dir_owner


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
        handle = observe_handle(run_dir, allow_other_users=all_users)  # one look, passed down
        result = backend_for(handle.info).stop(
            run_dir, grace, allow_other_users=all_users, handle=handle
        )
    except (RunDirError, KillRefused) as err:
        fail(str(err))
    if as_json:
        click.echo(strict_json.dumps(_kill_json(result), indent=2))
    else:
        echo("\n".join(kill_report(result, grace)))
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
