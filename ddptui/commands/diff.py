"""``ddptui diff RUN_A RUN_B``: why one run is slower (or faster) than another, in one sentence,
with what differs in their config and environment, their figures as ratios and their step split
part by part per rank. ``ddptui diff RUN``: against the newest completed run of its preset.

Reads only the two run directories (``engine.core.runs.compare``), so it works on any ended run,
long after the UI that started it is gone.
"""

from __future__ import annotations

from pathlib import Path

import click

from ddptui.cli_common import echo, fail, read_runs_dir_option
from ddptui.cli_table import terminal_width
from engine.core.common import strict_json
from engine.core.runs.rundir import RunDirError, find_run


@click.command("diff")
@click.argument("run_a")
@click.argument("run_b", required=False)
@read_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="The comparison as JSON, for scripts.")
def diff_command(run_a: str, run_b: str | None, runs_dir: Path, as_json: bool) -> None:
    """Compare two runs and say why B is slower or faster than A.

    RUN_A and RUN_B are run ids or any unique part of one (the random suffix, say), or a
    preset's name for its newest run, as `ddptui show` takes them. Given one run only, it is B,
    and A is the newest completed run of the same preset before it.

    \b
    The report says, in this order:
      the sentence   how much slower or faster B is, the step part that moved
                     most, and the config key or environment variable that
                     most likely did it (or "within noise" when the difference
                     is under the runs' own step-time spread)
      config         each key whose resolved value differs (A, then B)
      environment    torch / CUDA / NCCL, NCCL_* and thread variables, threads
                     per rank, GPUs and clocks (environment.json; "not
                     recorded" for runs from before it was kept)
      figures        images/s, epoch time, data wait, accuracy as B/A
      step split     ms per step of data, forward, backward, sync, optimizer
                     and other, per rank

    \b
    Examples:
      ddptui diff 3f9a 7c21          two runs by their suffixes
      ddptui diff cpu-demo           cpu-demo's newest run against the one before
      ddptui diff 3f9a 7c21 --json   for a script

    Exit codes: 0 compared, 2 bad input (an unknown or ambiguous id, a run directory of
    another user, a file written by a newer ddptui, no completed run to compare with).
    """
    from engine.core.runs.compare.compared_run import previous_completed_run, read_compared_run
    from engine.core.runs.compare.run_diff import diff_runs

    try:
        b_dir = find_run(runs_dir, run_b if run_b is not None else run_a)
        a_dir = find_run(runs_dir, run_a) if run_b is not None else previous_completed_run(b_dir)
        if a_dir.path == b_dir.path:
            fail(f"{run_a!r} and {run_b!r} are the same run ({a_dir.run_id}); name two runs")
        diff = diff_runs(read_compared_run(a_dir), read_compared_run(b_dir))
    except RunDirError as err:
        fail(str(err))
    if as_json:
        click.echo(strict_json.dumps(diff.to_json(), indent=2))
        return
    from ddptui.run_diff_text import diff_lines

    echo("\n".join(diff_lines(diff, terminal_width())))
