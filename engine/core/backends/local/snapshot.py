"""Taking a run's stacks from outside its launcher: ``ddptui kill`` (before it signals anything),
``ddptui stacks`` and the UI's stacks view. Plain Python.

The ranks are the ones run.json names (pid + start time) that prove to be the run's, each with
when it last reported, as the run observer reads them; the snapshot itself is
``engine.core.stacks.diagnosis.take_snapshot``.
"""

from __future__ import annotations

import os
import signal
import stat

from engine.core.common.run_files import refuse_writing
from engine.core.common.statuses import RankStatus
from engine.core.procs.process_identity import ProcessProbe
from engine.core.procs.run_proof import RunMarker, directory_owner, prove
from engine.core.runs.observer import RunObserver
from engine.core.runs.rank_states import RankState
from engine.core.runs.run_handle import RunHandle
from engine.core.runs.rundir import RunDir
from engine.core.stacks.diagnosis import RankTarget, take_snapshot
from engine.core.stacks.snapshot import StackSnapshot


def snapshot_run(
    run_dir: RunDir,
    *,
    reason: str,
    probe: ProcessProbe | None = None,
    save: bool = True,
    all_users: bool = False,
    handle: RunHandle | None = None,
) -> StackSnapshot | None:
    """Every rank's stack now, what each was doing and the culprit; stored in the run directory
    (where this user may write it). None when run.json names no rank or none of them is alive.

    Only a rank proved to be the run's (``engine.core.procs.run_proof.prove``: its marker and
    this run directory in its own environment, its pid and start time, and the run directory's
    owner unless ``all_users``) is asked for its stack; any other is in the snapshot with why
    not, and neither signalled nor read (``StackSnapshot.proved`` counts the ranks that were).
    With ``handle`` (a kill's one look at the run), its run.json and proofs are used, not read
    and proved again."""
    probe = probe or ProcessProbe()
    observer = RunObserver(run_dir, probe=probe, settle=False, info=handle.info if handle else None)
    state = observer.observe()
    info = state.info
    if info is None or not info.ranks or not any(probe.alive(r) for r in info.ranks):
        return None
    ranks = {r.rank: r for r in state.ranks}
    marker = RunMarker.of_dir(run_dir.path)
    owner = None if all_users else directory_owner(run_dir.path)
    targets = []
    for rank, ref in info.ranked():
        why = handle.rank_refusals.get(rank, "") if handle else prove(ref, marker, owner)[1]
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
        run_dir.path,
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
