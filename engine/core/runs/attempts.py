"""A run's attempts: its first start, each restart after a failure (``supervision.max_restarts``)
and each ``ddptui resume``, all in the same run directory, kept apart.

The top of the run directory is always the current attempt's: run.json (its ``attempt``), the
events, the stacks, the flight recorder, environment.json and, once it ended, summary.json. As
attempt n+1 starts, ``archive_attempt`` moves attempt n's into ``attempts/<n>/`` (run.json is
copied: the next attempt rewrites it), under the same names, so every reader of the top level
(the observer, ``ddptui runs``' cache, kill and the proof of processes, an older ddptui) sees
one attempt as it always saw one run, and nothing of attempt n is lost. Logs are appended to
(each attempt starts with a line saying which it is) and the checkpoint stays where it is: it is
what the next attempt goes on from.

summary.json holds every attempt (``RunSummary.attempts``), each with how it began, from which
step, how it ended and at which step; its epochs are the earlier attempts' up to where the last
one resumed, then the last one's, each tagged with its attempt. ``with_attempts`` builds those
for whoever writes a summary (the launcher, the settler, a torchrun rank). Plain Python.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from dataclasses import replace

from engine.core.common.run_environment import STACKS_DIR
from engine.core.common.run_files import (
    DIR_MODE,
    make_dirs,
    read_run_bytes,
    refuse_writing,
    write_atomic,
)
from engine.core.common.run_layout import (
    ENVIRONMENT_NAME,
    EVENTS_DIR,
    FLIGHT_RECORDER_DIR,
    GPUS_DIR,
    NODES_DIR,
    STOP_REQUEST_NAME,
    SUMMARY_NAME,
)
from engine.core.common.statuses import RunStatus
from engine.core.runs.events import Event, RankFailed, RunStarted, StepProgress
from engine.core.runs.placement import watch_for
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo
from engine.core.runs.summary import AttemptRecord, AttemptStart, EpochFigures, RunSummary

# What an attempt leaves at the top of the run directory that the next one must not mix with its
# own: moved below attempts/<n>/ as the next begins (with the files of its own that the backend
# placing the run names: its watch's ``attempt_files``). nodes/ and gpus/: a run across nodes.
ARCHIVED = (EVENTS_DIR, STACKS_DIR, FLIGHT_RECORDER_DIR, SUMMARY_NAME, ENVIRONMENT_NAME,
            STOP_REQUEST_NAME, NODES_DIR, GPUS_DIR)  # fmt: skip


# How a run ends that a next attempt may go on from (``ddptui resume``, the UI's R): failed,
# killed, lost, and the ends a scheduler gives a run (a node lost, its time limit, a cancel).
RESUMABLE = frozenset(
    {
        RunStatus.FAILED,
        RunStatus.KILLED,
        RunStatus.LOST,
        RunStatus.NODE_FAILURE,
        RunStatus.TIMEOUT,
        RunStatus.CANCELLED,
    }
)
# What every surface that refuses a resume says of RESUMABLE.
RESUMABLE_SAID = (
    "only a run that failed, was killed, was lost or was ended by its scheduler goes on"
)


class AttemptTaken(RunDirError):
    """attempts/<n>/ exists: another ddptui began the next attempt of this run first."""


def archive_attempt(
    run_dir: RunDir,
    number: int,
    *,
    summary: RunSummary | None = None,
    info: RunInfo | None = None,
) -> None:
    """Move attempt ``number``'s files below ``attempts/<number>/`` (run.json copied) and make a
    fresh events directory for the next. ``summary`` and ``info``: the attempt's end as its
    launcher holds it (a restart: never written at the top, where readers would take the run for
    ended), written there instead. Only the run directory's owner does this (RunDirError, one
    sentence, otherwise); AttemptTaken when the folder exists (another ddptui is starting the
    next attempt). A file that is not there is not archived (an attempt that never began)."""
    refused = refuse_writing(run_dir.path)
    if refused:
        raise RunDirError(refused)
    attempts = run_dir.layout.attempts_dir
    if os.path.islink(attempts):
        raise RunDirError(f"{attempts} is a symbolic link: nothing is moved through it")
    target = run_dir.layout.attempt(number).path
    try:
        make_dirs(attempts, DIR_MODE)
        os.mkdir(target, DIR_MODE)
    except FileExistsError:
        raise AttemptTaken(
            f"{target} exists: attempt {number + 1} of run {run_dir.run_id} was begun by "
            "another ddptui"
        ) from None
    except OSError as err:
        raise RunDirError(f"{target} cannot be made ({err.strerror})") from None
    archived = RunDir(target)
    try:
        if info is not None:
            archived.write_run_info(info)
        else:
            write_atomic(
                archived.run_json_path, read_run_bytes(run_dir.path, run_dir.run_json_path)
            )
        if summary is not None:
            archived.write_summary(summary)
        for name in (*ARCHIVED, *_placement_files(info or run_dir.read_run_info())):
            if "/" in name:  # a backend's own file in its own folder: the folder made first
                make_dirs((target / name).parent, DIR_MODE)
            with contextlib.suppress(FileNotFoundError):
                os.rename(run_dir.path / name, target / name)
        run_dir.make_missing_dirs()
    except OSError as err:
        raise RunDirError(f"attempt {number} could not be moved to {target} ({err})") from None


def _placement_files(info: RunInfo) -> tuple[str, ...]:
    """The files of one attempt that the backend placing the run keeps (none on this machine)."""
    watch = watch_for(info)
    return watch.attempt_files if watch is not None else ()


def archived_attempts(run_dir: RunDir) -> list[int]:
    """The numbers of the attempts below ``attempts/``, in order (no link followed)."""
    try:
        st = os.lstat(run_dir.layout.attempts_dir)
        if not stat.S_ISDIR(st.st_mode):
            return []
        with os.scandir(run_dir.layout.attempts_dir) as entries:
            found = [int(e.name) for e in entries if e.name.isdigit() and not e.is_symlink()]
    except OSError:
        return []
    return sorted(found)


def earlier_summary(run_dir: RunDir, attempt: int) -> RunSummary | None:
    """The summary attempt ``attempt - 1`` ended with (it holds every attempt before it), or None
    when there is none to read (a first attempt, or an attempt that ended with no summary)."""
    if attempt <= 1:
        return None
    try:
        return run_dir.read_summary(run_dir.layout.attempt(attempt - 1).summary)
    except RunDirError:
        return None


def earlier_records(run_dir: RunDir, attempt: int) -> tuple[AttemptRecord, ...]:
    """Attempts 1 .. ``attempt - 1`` as the last of them recorded them; an attempt whose summary
    is missing (its launcher was lost and no one settled it) is named as lost."""
    previous = earlier_summary(run_dir, attempt)
    records = {r.attempt: r for r in previous.attempts} if previous else {}
    if previous is not None and previous.attempt not in records:  # a summary from before attempts
        records[previous.attempt] = AttemptRecord(
            previous.attempt, previous.status, previous.started, previous.finished,
            reason=previous.reason, failure=previous.failure,
        )  # fmt: skip
    for number in range(1, attempt):
        records.setdefault(
            number, AttemptRecord(number, RunStatus.LOST, 0.0, 0.0, reason="no summary was left")
        )
    return tuple(records[n] for n in sorted(records) if n < attempt)


def attempt_started(launcher_events: Sequence[Event]) -> RunStarted | None:
    """This attempt's RunStarted (the last a launcher wrote)."""
    started = [e for e in launcher_events if isinstance(e, RunStarted)]
    return started[-1] if started else None


def reached_step(summary: RunSummary, ranks: dict[int, list[Event]]) -> tuple[int | None, bool]:
    """Where an attempt ended: (global step, exact). Exact when its root-cause rank said at which
    step it failed; else the furthest step any rank reported (the reports are throttled)."""
    failure = summary.failure
    if failure is not None and failure.rank is not None:
        failed = [e for e in ranks.get(failure.rank, []) if isinstance(e, RankFailed)]
        if failed and failed[-1].global_step is not None:
            return failed[-1].global_step, True
    reported = [e.global_step for events in ranks.values() for e in events
                if isinstance(e, StepProgress)]  # fmt: skip
    return (max(reported) if reported else None), False


def this_attempt(
    summary: RunSummary,
    started: RunStarted | None,
    ranks: dict[int, list[Event]],
    attempt: int,
    where: str = "",
) -> AttemptRecord:
    """The record of the attempt ``summary`` ends (``where``: its nodes, placed elsewhere)."""
    step, exact = reached_step(summary, ranks)
    start = AttemptStart(started.started_by) if started and started.started_by else None
    return AttemptRecord(
        attempt=attempt,
        status=summary.status,
        started=started.time if started else summary.started,
        finished=summary.finished,
        start=start or (AttemptStart.FIRST if attempt == 1 else AttemptStart.RESTART),
        from_step=started.resumed_from_step if started else None,
        reached_step=step,
        step_exact=exact,
        reason=summary.reason if summary.status != RunStatus.COMPLETED else "",
        failure=summary.failure,
        where=where,
    )


def kept_epochs(
    previous: RunSummary | None, started: RunStarted | None
) -> tuple[EpochFigures, ...]:
    """The earlier attempts' epochs this attempt did not train again: those before the epoch it
    resumed in (none when it began again from step 0)."""
    if previous is None or started is None or started.resumed_from_epoch is None:
        return ()
    return tuple(e for e in previous.epochs if e.epoch < started.resumed_from_epoch)


def with_attempts(
    run_dir: RunDir,
    summary: RunSummary,
    launcher_events: Sequence[Event],
    ranks: dict[int, list[Event]],
    attempt: int,
    where: str = "",
) -> RunSummary:
    """``summary`` (of attempt ``attempt``, built from its own events) as the whole run's: every
    attempt's record, the earlier attempts' epochs it kept, and the run's start. ``where``: the
    nodes it ran on, when a backend placed it elsewhere."""
    started = attempt_started(launcher_events)
    earlier = earlier_records(run_dir, attempt)
    previous = earlier_summary(run_dir, attempt)
    mine = tuple(replace(e, attempt=attempt) for e in summary.epochs)
    first = min([r.started for r in earlier if r.started > 0] + [summary.started])
    return replace(
        summary,
        attempt=attempt,
        attempts=(*earlier, this_attempt(summary, started, ranks, attempt, where)),
        epochs=(*kept_epochs(previous, started), *mine),
        started=first,
        elapsed_seconds=max(0.0, summary.finished - first),
    )
