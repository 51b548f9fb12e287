"""``ddptui resume RUN``: go on with a failed, killed or lost run from its newest checkpoint, in
its own run directory, as its next attempt, and follow it to its result line."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ddptui.cli_common import echo, fail, follow_options, read_runs_dir_option
from ddptui.terminal_progress import ProgressPrinter, follow_with_progress, followed_to_the_end
from engine.core.ops.resume import ResumeRefused, resume_run
from engine.core.runs.rundir import RunDirError, find_run


@click.command("resume")
@click.argument("run_id")
@read_runs_dir_option
@follow_options("the next attempt")
def resume_command(run_id: str, runs_dir: Path, as_json: bool, detach: bool) -> None:
    """Go on with run RUN_ID (its id or any unique part of one, or a preset's name for that
    preset's newest run) after it failed, was killed (ddptui kill, Ctrl-C) or was lost (its
    launcher died), from its newest checkpoint, and follow it as `ddptui run` does.

    \b
    It continues in the same run directory as the run's next attempt: the attempt that ended
    is kept below attempts/<n>/ (its run.json, summary.json, events, stacks), the logs go on
    with a line saying where the new attempt begins, and summary.json ends up naming every
    attempt (`ddptui show RUN` lists them). The engine's ranks go on from checkpoint.pt and take
    exactly the steps an uninterrupted run would (training.checkpoint_every says how often one
    is written; every epoch end writes one); your script is started again with
    TORCHELASTIC_RESTART_COUNT set and, where its preset names the option
    (script.resume_arg = "--resume"), that option and the newest file it wrote in
    $DDPTUI_CHECKPOINT_DIR. With no checkpoint it begins again at step 0.

    \b
    Examples:
      ddptui kill 3f9a && ddptui resume 3f9a
      ddptui resume cpu-demo            # the newest cpu-demo run
      ddptui resume 3f9a --detach       # start it and return

    A run on a scheduler's nodes is submitted to it again as a new job, also
    after it lost a node, reached its time limit or was cancelled.

    Refused, with nothing started or changed: a run that is going (or still has a process
    carrying its marker), another user's run, a completed run, a run whose config.toml no
    longer loads or no longer fits where it runs, and a checkpoint of another model or another
    number of ranks. Exit codes: 0 completed, 1 failed or killed again, 2 refused (bad input).
    """
    try:
        started, planned = resume_run(find_run(runs_dir, run_id))
    except (ResumeRefused, RunDirError) as err:
        fail(str(err))
    if detach:
        echo(started.run_id)
        return
    echo(f"run {started.run_id}: going on as {planned.describe()}", err=as_json)
    config = planned.config
    epochs = 0 if config.script.given else config.training.epochs
    printer = ProgressPrinter(started.run_dir, epochs, out=sys.stderr if as_json else sys.stdout)
    result = follow_with_progress(
        started, printer, on_interrupt="stopping the run; wait for its summary"
    )
    sys.exit(followed_to_the_end(started, result, as_json))
