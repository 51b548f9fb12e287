"""The summary of a run whose launcher ended without writing one: a ``lost`` run. Plain Python.

The launcher writes summary.json whatever happens to its ranks, but nothing can run in a process
that is SIGKILLed or killed by the out-of-memory killer. Whoever next follows or reads such a run
(the ``ddptui run`` follower, ``ddptui runs`` / ``show``, the UI) calls ``settle_lost_run``: once
neither the launcher nor any rank is alive, it writes summary.json with status ``lost``, how the
launcher ended (its signal when the caller was its parent and saw it, and whether the kernel's
OOM killer is the likely cause) and how far each rank got; run.json's state becomes ``lost``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engine.core.config import ConfigError
from engine.core.events import read_events
from engine.core.oom_evidence import sigkill_cause
from engine.core.rank_states import RankStateTracker
from engine.core.rundir import FINAL_STATES, LOST, ProcessRef, RunDir, RunDirError, RunInfo
from engine.core.summary import Failure, RankReached, build_summary, exit_status

# A launcher records itself in run.json within seconds of its start; a run.json that names none
# this long after it was made belongs to a launcher that died first.
LAUNCHER_START_GRACE_SECONDS = 30.0


def launcher_end(info: RunInfo, launcher_exit: int | None) -> Failure:
    """How the launcher ended, as a Failure with no rank. ``launcher_exit`` is its wait status
    (negative: killed by that signal) when the caller is its parent, else None (unknown)."""
    pid = info.launcher.pid if info.launcher else None
    who = (
        f"the launcher (pid {pid})"
        if pid is not None
        else "the launcher, before it recorded itself,"
    )
    exitcode, signal_name = exit_status(launcher_exit)
    if signal_name is not None:
        how = f"was killed by {signal_name} before it could write a summary"
    elif exitcode is not None:
        how = f"exited with code {exitcode} without writing a summary"
    else:
        how = "ended without writing a summary"
    cause = ""
    if pid is not None and signal_name in (None, "SIGKILL"):
        cause = sigkill_cause(pid, info.oom_kills_at_start)
    error = f"{who} {how}" + (f"; {cause}" if cause else "")
    return Failure(rank=None, exitcode=exitcode, signal=signal_name, error=error)


def ranks_reached(run_dir: RunDir, world_size: int) -> tuple[RankReached, ...]:
    """How far each rank got, from every event file of the run."""
    tracker = RankStateTracker(world_size=world_size)
    paths = [run_dir.launcher_events_path, *run_dir.rank_event_paths().values()]
    for path in paths:
        tracker.feed_all(read_events(path))
    return tuple(
        RankReached(
            rank=s.rank,
            state=s.state,
            epoch=s.epoch,
            step=s.step,
            steps=s.steps,
            global_step=s.global_step,
        )
        for s in tracker.states(launcher_alive=False, run_status=LOST)
    )


def settle_lost_run(
    run_dir: RunDir,
    *,
    launcher_exit: int | None = None,
    launcher_exited: bool = False,
    alive: Callable[[ProcessRef], bool] | None = None,
    now: float | None = None,
) -> dict[str, Any] | None:
    """Write the ``lost`` summary of ``run_dir`` if it has none and nothing of it is alive; return
    it, or None when there is nothing to settle (a summary exists, something still runs, or the
    run cannot be read). A run.json that never named a launcher is lost when the caller saw the
    launcher exit (``launcher_exited``: it was its parent), or ``LAUNCHER_START_GRACE_SECONDS``
    after it was made (``now``, default the clock)."""
    if alive is None:
        from engine.core.process_table import ref_alive

        alive = ref_alive
    if run_dir.summary_path.exists():
        return None
    try:
        info = run_dir.read_run_info()
    except RunDirError:
        return None
    known_exit = launcher_exit is not None or launcher_exited
    now = time.time() if now is None else now
    recent = now - info.created < LAUNCHER_START_GRACE_SECONDS
    if info.launcher is None and not known_exit and recent:
        return None
    if info.launcher is not None and alive(info.launcher):
        return None
    if any(alive(r) for r in info.ranks):
        return None  # orphaned, not lost: `ddptui clean` ends them
    failure = launcher_end(info, launcher_exit)
    # A launcher that wrote its final state but died before the summary still said how it ended.
    status = info.state if info.state in FINAL_STATES else LOST
    reached = ranks_reached(run_dir, info.world_size)
    try:
        summary = build_summary(run_dir, status, failure, failure.error)
    except (ConfigError, RunDirError, OSError):
        return None
    summary = replace(
        summary,
        launcher_end=failure.error,
        ranks=reached,
        reason=f"{failure.error}; " + ", ".join(r.describe() for r in reached)
        if reached
        else failure.error,
    )
    data = summary.to_json()
    if run_dir.summary_path.exists():  # the launcher or another reader was quicker
        return None
    run_dir.write_summary(data)
    run_dir.write_run_info(replace(info, state=status))
    return run_dir.read_summary()
