"""Taking a run's stacks from outside its launcher: ``ddptui kill`` (before it signals anything),
``ddptui stacks`` and the UI's stacks view. Plain Python.

The ranks are the ones run.json names (pid + start time), each with when it last reported, as the
run observer reads them; the snapshot itself is ``engine.core.stacks.diagnosis.take_snapshot``.
"""

from __future__ import annotations

import os

from engine.core.procs.process_identity import ProcessProbe
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir
from engine.core.stacks.diagnosis import RankTarget, take_snapshot
from engine.core.stacks.snapshot import StackSnapshot


def snapshot_run(
    run_dir: RunDir, *, reason: str, probe: ProcessProbe | None = None, save: bool = True
) -> StackSnapshot | None:
    """Every rank's stack now, what each was doing and the culprit; stored in the run directory
    (where it may be written). None when run.json names no rank or none of them is alive."""
    probe = probe or ProcessProbe()
    state = RunObserver(run_dir, probe=probe, settle=False).observe()
    info = state.info
    if info is None or not info.ranks or not any(probe.alive(r) for r in info.ranks):
        return None
    reported = {r.rank: r.last_event_time for r in state.ranks}
    targets = [RankTarget(rank, ref, reported.get(rank)) for rank, ref in info.ranked()]
    return take_snapshot(
        run_dir.path, targets, reason=reason, distributed=info.world_size > 1, save=save
    )


def request_flight_recorder_dumps(run_dir: RunDir) -> int:
    """Ask every NCCL rank of a live run for its flight-recorder dump now: its watchdog dumps when
    a byte is written into its debug pipe (``flight-recorder/pipe_rank_<r>.pipe``). Returns how
    many ranks were asked; gloo ranks have no pipe (they dump when a collective times out)."""
    asked = 0
    try:
        pipes = sorted(run_dir.flight_recorder_dir.glob("pipe_rank_*"))
    except OSError:
        return 0
    for pipe in pipes:
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:  # no reader: that rank is gone
            continue
        try:
            os.write(fd, b"1\n")
            asked += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked
