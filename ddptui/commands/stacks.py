"""``ddptui stacks RUN_ID``: every rank's stack, what each was doing and which rank the others wait
for; ``ddptui stacks --pid PID``: the stack of any Python process of yours (py-spy)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from ddptui import exit_codes
from ddptui.cli_common import echo, fail, read_runs_dir_option
from ddptui.cli_table import (
    cell_text,
    cut_middle,
    echo_wrapped,
    fit_line,
    output_width,
    wide_option,
)
from ddptui.stack_report import diagnosis_lines, flight_recorder_lines
from engine.core.backends.local.snapshot import request_flight_recorder_dumps
from engine.core.backends.registry import backend_for
from engine.core.common import strict_json
from engine.core.procs.process_identity import identify
from engine.core.runs.observer import observe_run
from engine.core.runs.run_handle import RunHandle, observe_handle
from engine.core.runs.rundir import RunDirError, find_run
from engine.core.stacks.capture import capture_stack
from engine.core.stacks.diagnosis import read_activity
from engine.core.stacks.snapshot import RankDiagnosis, StackSnapshot


def _process_stack(pid: int) -> StackSnapshot:
    ref = identify(pid)
    if ref is None:
        fail(f"--pid {pid}: no such process")
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        owner = None
    if owner is not None and owner != os.getuid() and os.getuid() != 0:
        fail(f"--pid {pid} belongs to another user; ddptui reads only your own processes")
    stack = capture_stack(ref, None)
    if not stack.method:
        fail(f"--pid {pid}: no stack: {stack.problem}", exit_codes.FAILED)
    activity, detail, frame = read_activity(stack, distributed=True)
    rank = RankDiagnosis(
        rank=-1, pid=pid, activity=activity, detail=detail, frame=frame,
        method=stack.method, stack=stack.text, threads=stack.threads,
    )  # fmt: skip
    return StackSnapshot(time=0.0, reason=f"pid {pid} ({stack.process_state})", ranks=(rank,))


def _as_json(snapshot: StackSnapshot, run_id: str | None) -> dict[str, Any]:
    data = snapshot.to_json()
    data["run_id"] = run_id
    if run_id is None:
        for r in data["ranks"]:
            r["rank"] = None
    return data


NATIVE_HINT = "--native shows them"


def _print(lines: list[str], width: int | None) -> None:
    """Stack lines fitted to the terminal: a frame keeps its function and its file:line (the
    middle of its path gives way); a sentence wraps."""
    for line in lines:
        if width is None or len(line) <= width:
            echo(fit_line(line, None))
        elif line.startswith("    "):
            echo(cut_middle(cell_text(line), width))
        else:
            echo_wrapped(line, width, indent="", hang="      ")


@click.command("stacks")
@click.argument("run_id", required=False)
@click.option("--pid", type=int, help="Any Python process of yours, instead of a run (py-spy).")
@click.option("--native", is_flag=True, help="Every native (C/C++) frame, not folded to a count.")
@read_runs_dir_option
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: culprit_rank and ranks.")
def stacks_command(
    run_id: str | None, pid: int | None, native: bool, runs_dir: Path, wide: bool, as_json: bool
) -> None:
    """Every rank's stack: a fresh snapshot of a running run (py-spy with native frames where it
    may attach, else the faulthandler dump every rank registers), or the last one stored for an
    ended run. Only a rank proved to be the run's is asked (its own environment carries the run's
    marker and this run directory, its pid and start time are run.json's, and it belongs to the
    run directory's owner); any other is listed as left alone. Says what each rank was doing
    (stepping in its own code, waiting on its peers in a collective or in backward, stopped by a
    signal, failed, crashed, finished, gone) and names a culprit only on evidence: the rank the
    others wait for, or the one that crashed or failed first.

    \b
    Examples:
      ddptui stacks 3f9a                          # any unique part of a run id
      ddptui stacks 20261203-1228 --json          # {"culprit_rank": 1, "ranks": [...]}
      ddptui stacks --pid 4242                    # a foreign job's process (from ddptui ps)

    Exit codes: 0 shown, 1 no stack could be taken (or no rank proved to be the run's), 2 bad
    input.
    """
    if (run_id is None) == (pid is None):
        fail("give a RUN_ID or --pid PID (one of them)")
    if pid is not None:
        snapshot = _process_stack(pid)
        if as_json:
            click.echo(strict_json.dumps(_as_json(snapshot, None), indent=2))
        else:
            shown = diagnosis_lines(snapshot, full=True, native=native, fold_hint=NATIVE_HINT)
            _print(shown, output_width(wide))
        return
    assert run_id is not None
    try:
        run_dir = find_run(runs_dir, run_id)
    except RunDirError as err:
        fail(str(err))
    # One look at the run (run.json, its ranks looked up and proved), taken by its backend too;
    # without a readable run.json only a stored snapshot can be shown.
    try:
        handle: RunHandle | None = observe_handle(run_dir)
    except RunDirError:
        handle = None
    state = handle.state if handle is not None else observe_run(run_dir)
    taken = None
    if handle is not None and not state.final:
        backend = backend_for(handle.info)
        taken = backend.snapshot(run_dir, reason="on demand", handle=handle)
    if taken is not None and not taken.proved:
        why = "; ".join(r.problem for r in taken.ranks)
        fail(
            f"run {run_dir.run_id}: none of its ranks is provably the run's, so none was asked "
            f"for its stack ({why})",
            exit_codes.FAILED,
        )
    if taken is not None:
        request_flight_recorder_dumps(run_dir)
    stored = taken or state.diagnosis
    if stored is None:
        why = "none of its ranks is alive" if not state.final else f"it ended {state.status}"
        fail(f"run {run_dir.run_id}: no stack snapshot was taken and {why}", exit_codes.FAILED)
    if as_json:
        click.echo(strict_json.dumps(_as_json(stored, run_dir.run_id), indent=2))
        return
    lines = diagnosis_lines(stored, full=True, native=native, fold_hint=NATIVE_HINT)
    if taken is None:
        lines.insert(0, f"run {run_dir.run_id} is {state.status}: its last stored snapshot")
    dumps = flight_recorder_lines(run_dir)
    if dumps:
        lines += ["", *dumps]
    _print(lines, output_width(wide))
