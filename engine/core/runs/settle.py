"""Writing the end of a run whose launcher cannot: the one writer of summary.json besides the launcher.

The launcher writes summary.json whatever happens to its ranks, but nothing runs in a process that
is SIGKILLed or killed by the out-of-memory killer, and under torchrun there is no ddptui launcher.
Those runs are settled here, once, by ``settle_run``:

- a ``lost`` run (the run observer found its launcher gone and nothing of it alive; the follower
  of ``ddptui run`` knows the launcher's exit status too): ``lost_summary`` says how the launcher
  ended and how far each rank got;
- a run stopped by ``ddptui kill`` or ``clean`` after its launcher was gone: ``killed_summary``;
- a torchrun run, whose rank 0 (or first failing rank) plays the launcher's part at its end.

Building a summary only reads; ``settle_run`` writes it and run.json's final state, unless a
summary is already there (the launcher or another settler was quicker). A disk that refuses the
write (full, read-only) is reported to the caller, never raised: readers still show the summary
they built.

The run observer only reads: a lost run it finds comes with the summary it built
(``RunState.unsettled``), and a ``Settler`` writes that down for the callers that ask for it
(the follower of ``ddptui run``, ``ddptui show`` and ``runs``, the UI's Run and Runs screens,
from their worker threads).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine.core.common.disk_space import write_failure
from engine.core.common.run_files import SpaceReserve, refuse_writing
from engine.core.common.statuses import RunStatus
from engine.core.config.schema import ConfigError
from engine.core.host.oom_evidence import sigkill_cause
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo
from engine.core.runs.summarize import build_summary
from engine.core.runs.summary import Failure, RankReached, RunSummary, exit_status

if TYPE_CHECKING:  # the observer builds its lost summary here: only its type is needed
    from engine.core.runs.run_state import RunState


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
        cause = sigkill_cause(pid, info.oom_baseline)
    error = f"{who} {how}" + (f"; {cause}" if cause else "")
    return Failure(rank=None, exitcode=exitcode, signal=signal_name, error=error)


def bare_summary(
    run_dir: RunDir, status: RunStatus, reason: str, info: RunInfo | None = None
) -> RunSummary:
    """A summary with what run.json says, for a run whose config cannot be read (``info``:
    run.json as the caller has read it)."""
    if info is None:
        try:
            info = run_dir.read_run_info()
        except RunDirError:
            info = None
    now = time.time()
    return RunSummary(
        run_id=run_dir.run_id,
        preset=info.preset if info else "",
        status=status,
        strategy="",
        precision="",
        model="",
        dataset="",
        devices=info.devices if info else "",
        device_count=0,
        world_size=info.world_size if info else 0,
        global_batch=0,
        started=info.created if info else now,
        finished=now,
        reason=reason,
    )


def lost_summary(
    run_dir: RunDir, info: RunInfo, reached: tuple[RankReached, ...], launcher_exit: int | None
) -> RunSummary:
    """The summary of a run whose launcher ended without writing one: how the launcher ended,
    how far each rank got (``reached``, from the run observer). A launcher that wrote its final
    state in run.json but died before the summary still said how it ended."""
    failure = launcher_end(info, launcher_exit)
    status = info.state if info.state.final else RunStatus.LOST
    try:
        summary = build_summary(run_dir, status, failure, failure.error, info=info)
    except (ConfigError, RunDirError, OSError):
        summary = replace(bare_summary(run_dir, status, failure.error, info), failure=failure)
    described = ", ".join(r.describe() for r in reached)
    return replace(
        summary,
        launcher_end=failure.error,
        ranks=reached,
        reason=f"{failure.error}; {described}" if described else failure.error,
    )


def killed_summary(run_dir: RunDir, reason: str) -> RunSummary:
    """The summary of a run stopped from outside after its launcher was gone."""
    try:
        return build_summary(run_dir, RunStatus.KILLED, reason=reason)
    except (ConfigError, RunDirError, OSError):
        # no readable config: the summary must still say what happened
        return bare_summary(run_dir, RunStatus.KILLED, reason)


def settle_run(run_dir: RunDir, summary: RunSummary) -> str:
    """Write ``summary`` and run.json's final state, unless a summary exists already.

    Returns "" when written (or when another writer was first), else one sentence saying why it
    could not be (a full or read-only disk, or another user's run directory, which only its owner
    writes): the caller shows it, the summary it holds stands.
    """
    if run_dir.summary_path.exists():
        return ""
    refused = refuse_writing(run_dir.path)
    if refused:
        return f"the summary was not saved: {refused}"
    SpaceReserve(run_dir.path).release()  # set aside at the start for exactly this write
    with contextlib.suppress(OSError):  # the file store of ranks that are gone
        run_dir.rendezvous_path.unlink(missing_ok=True)
    try:
        run_dir.write_summary(summary)
    except OSError as err:
        return _unwritten(run_dir.summary_path, err)
    try:
        info = run_dir.read_run_info()
    except RunDirError:
        return ""  # torchrun runs have no run.json; a corrupt one stays as it is
    if info.state != summary.status:
        try:
            run_dir.write_run_info(replace(info, state=summary.status))
        except OSError as err:
            return _unwritten(run_dir.run_json_path, err)
    return ""


def _unwritten(path: Path, err: OSError) -> str:
    """The summary shown here could not be saved: the path, why, and the free space."""
    sentence = write_failure(path, err)
    return f"{sentence}; shown here, not saved"


def record_killed(run_dir: RunDir, reason: str) -> bool:
    """Settle a run stopped from outside after its launcher was gone: summary.json with status
    killed and run.json's state, unless a summary is there already (the launcher wrote it while
    it was being stopped). True when this wrote the summary."""
    if run_dir.summary_path.exists():
        return False
    return not settle_run(run_dir, killed_summary(run_dir, reason)) and (
        run_dir.summary_path.exists()
    )


class Settler:
    """The explicit operation that writes down what observations found and no one wrote: a lost
    run's summary, or that of a placed run its backend says is over (``RunState.unsettled``; the
    observer never writes).

    Tries each run once: a disk that refuses the write is not asked again, and every later
    observation of that run handed to ``settle`` says why (``RunState.unsaved``). After writing, a
    state is what the run directory holds then (another settler may have been first: that is the
    truth), read back once, by design a look after acting. One caller at a time."""

    def __init__(self) -> None:
        self._refused: dict[Path, str] = {}  # run directory -> why its summary was not written

    def settle(self, state: RunState) -> RunState:
        if state.unsettled is None:
            return state
        refused = self._refused.get(state.path)
        if refused is None:
            run_dir = RunDir(state.path)
            refused = settle_run(run_dir, state.unsettled)
            try:
                written = run_dir.read_summary()
            except RunDirError:
                written = None
            if written is not None:
                return replace(
                    state,
                    status=written.status,
                    reason=written.reason,
                    summary=written,
                    failure=written.failure or state.failure,
                    unsettled=None,
                )
            self._refused[state.path] = refused
        return replace(state, unsaved=refused)


def settle_observed(state: RunState) -> RunState:
    """``Settler().settle``: one observation of one run, written down where it found an end
    no one wrote (a one-shot command's)."""
    return Settler().settle(state)
