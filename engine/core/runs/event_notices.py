"""What the log pane and the follower say about a run's events that are not a rank's progress:
an evaluation, a checkpoint, a rank's bad exit, the launcher's stall and straggler reports, a
stack snapshot, the run's end. One phrase per event, or "" for an event they leave unsaid.
Plain Python, no state: ``engine.core.runs.rank_states.RankStateTracker`` keeps the latest.
"""

from __future__ import annotations

from pathlib import Path

from engine.core.runs.events import (
    CheckpointSaved,
    Evaluation,
    Event,
    NodeFinished,
    RankExited,
    RankStalled,
    RankStraggling,
    RestartScheduled,
    RunFinished,
    RunStarted,
    StacksTaken,
)


def restart_notice(e: RestartScheduled) -> str:
    """ "attempt 1 failed at step 4,812 (rank 3 failed: ...); restart 1 of 3 in 2 s, from step
    4,800 (epoch 3, step 12 of 1,600)"."""
    where = f" at step {e.global_step:,}" if e.global_step is not None else ""
    return (
        f"attempt {e.attempt} failed{where} ({e.reason}); restart {e.restart} of "
        f"{e.max_restarts} in {e.in_seconds:g} s, from {e.from_where}"
    )


def event_notice(e: Event) -> str:
    """The phrase for ``e``; "" when the event is progress (shown elsewhere) or not worth a line."""
    if isinstance(e, Evaluation) and e.rank == 0:
        return f"epoch {e.epoch + 1}: test accuracy {e.accuracy:.1%} on {e.samples} images"
    if isinstance(e, CheckpointSaved):
        return f"rank {e.rank} saved {Path(e.path).name}"
    if isinstance(e, RankExited) and (e.exitcode != 0 or e.signal):
        how = f"signal {e.signal}" if e.signal else f"exit code {e.exitcode}"
        return f"rank {e.rank} (pid {e.pid}) exited: {how}"
    if isinstance(e, RankStalled):
        why = f": {e.why}" if e.why else ""
        return f"launcher: rank {e.rank} silent for {e.silent_seconds:.0f} s{why}"
    if isinstance(e, RankStraggling):
        return (
            f"launcher: rank {e.rank} straggling ({e.step_seconds:.2f} s a step, "
            f"others {e.others_median_step_seconds:.2f} s)"
        )
    if isinstance(e, StacksTaken):
        return f"stacks ({e.reason}): {e.summary}"
    if isinstance(e, NodeFinished):
        return f"node {e.node}: {e.status}" + (f": {e.reason}" if e.reason else "")
    if isinstance(e, RestartScheduled):
        return restart_notice(e)
    if isinstance(e, RunStarted) and e.attempt > 1:
        start = f"step {e.resumed_from_step:,}" if e.resumed_from_step is not None else "step 0"
        return f"attempt {e.attempt} started ({e.started_by}), from {start}"
    if isinstance(e, RunFinished):
        return f"run {e.status}" + (f": {e.reason}" if e.reason else "")
    return ""
