"""Taking a run's stacks from outside its launcher: ``ddptui kill`` (before it signals anything),
``ddptui stacks`` and the UI's stacks view. Plain Python.

The ranks are the ones run.json names (pid + start time) that prove to be the run's, each with
when it last reported, as the run observer reads them, all from the operation's one look at the
run (``engine.core.runs.run_handle``); the snapshot itself is
``engine.core.stacks.diagnosis.take_snapshot``.
"""

from __future__ import annotations

import os
import signal
import stat

from engine.core.common.run_files import refuse_writing
from engine.core.common.statuses import RankStatus
from engine.core.runs.rank_states import RankState
from engine.core.runs.run_handle import RunHandle
from engine.core.runs.rundir import RunDir
from engine.core.stacks.diagnosis import RankTarget, take_snapshot
from engine.core.stacks.snapshot import StackSnapshot


def snapshot_run(handle: RunHandle, *, reason: str, save: bool = True) -> StackSnapshot | None:
    """Every rank's stack now, what each was doing and the culprit; stored in the run directory
    (where this user may write it). None when run.json names no rank or none of them is alive.

    ``handle`` is the operation's one look at the run (``engine.core.runs.run_handle``): its
    run.json, which of its ranks were alive and proved to be the run's (``engine.core.procs
    .run_proof.prove``: its marker and this run directory in its own environment, its pid and
    start time, and the run directory's owner unless root asked for every user's), and its
    observation (when each rank last reported). Only a proved rank is asked for its stack; any
    other is in the snapshot with why not, and neither signalled nor read
    (``StackSnapshot.proved`` counts the ranks that were)."""
    info = handle.info
    if not info.ranks or not any(handle.alive(r) for r in info.ranks):
        return None
    ranks = {r.rank: r for r in handle.state.ranks}
    targets = []
    for rank, ref in info.ranked():
        why = handle.rank_refusals.get(rank, "")
        seen = ranks.get(rank)
        targets.append(
            RankTarget(
                rank,
                ref,
                seen.last_event_time if seen else None,
                seen.error if seen else "",
                refused=f"not provably the run's: {why}" if why else "",
                exitcode=_ended(seen),
            )
        )
    return take_snapshot(
        handle.run_dir.path,
        targets,
        reason=reason,
        distributed=info.world_size > 1,
        save=save and any(not t.refused for t in targets),
    )


def _ended(rank: RankState | None) -> int | None:
    """How a rank ended, as a wait status, once the events say it did (else None)."""
    if rank is None:
        return None
    if rank.state == RankStatus.DONE:
        return 0
    if rank.signal is not None:
        try:
            return -signal.Signals[rank.signal].value
        except KeyError:
            return -1
    return rank.exitcode


def request_flight_recorder_dumps(run_dir: RunDir) -> int:
    """Ask every NCCL rank of a live run for its flight-recorder dump now: its watchdog dumps when
    a byte is written into its debug pipe (``flight-recorder/pipe_rank_<r>.pipe``). Returns how
    many ranks were asked; gloo ranks have no pipe (they dump when a collective times out)."""
    asked = 0
    if refuse_writing(run_dir.path) or run_dir.flight_recorder_dir.is_symlink():
        return 0  # another user's run: nothing is written into their files
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
            if stat.S_ISFIFO(os.fstat(fd).st_mode):  # a pipe, never a file planted in its place
                os.write(fd, b"1\n")
                asked += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked
