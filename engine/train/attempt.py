"""One attempt of a run, as its launcher records it: how it begins and how it ends.

An attempt begins (``AttemptBegin``) with its environment set for every rank it starts (its
number, ``TORCHELASTIC_RESTART_COUNT`` as torchrun sets it, the checkpoint it goes on from, where a
script keeps its checkpoints), a line in each rank's log for a later attempt, run.json with no
ranks yet and the ``RunStarted`` event (``record_start``). It ends (``AttemptEnd``) with run.json's
final state, its summary and the launcher's events of it, which ``write_final_state`` writes down
when no restart follows (``engine.train.restarts``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace

import psutil

from engine.core.common.disk_space import WriteFailed
from engine.core.common.run_environment import (
    ATTEMPT_ENV,
    CHECKPOINT_DIR_ENV,
    RESTART_COUNT_ENV,
    RESUME_FROM_ENV,
)
from engine.core.common.run_files import SpaceReserve, make_dirs, open_private
from engine.core.common.statuses import RunStatus
from engine.core.config.schema import RunConfig
from engine.core.host.oom_evidence import oom_baseline
from engine.core.plan.run_plan import RunPlan
from engine.core.procs.process_identity import ProcessRef
from engine.core.runs.events import Event, EventWriter, RunFinished, RunStarted
from engine.core.runs.resume_point import ResumePoint
from engine.core.runs.rundir import RunDir, RunInfo
from engine.core.runs.summary import AttemptStart, RunSummary


class LauncherEvents(EventWriter):
    """The launcher's events, best effort: a full disk must not end the supervision of ranks
    that still run (summary.json, written from the space reserve, says how the run ended)."""

    refused = ""  # the first write the disk refused, as one sentence

    def write(self, event: Event) -> None:
        try:
            super().write(event)
        except WriteFailed as err:
            self.refused = self.refused or str(err)


@dataclass(frozen=True)
class AttemptBegin:
    """How an attempt of the run begins: its number (from 1), how, and the checkpoint it goes on
    from (None: step 0)."""

    number: int
    start: AttemptStart = AttemptStart.FIRST
    resume_from: ResumePoint | None = None

    def environment(self, run_dir: RunDir) -> dict[str, str]:
        """What every rank of this attempt inherits (RESUME_FROM_ENV is removed without one)."""
        env = {
            ATTEMPT_ENV: str(self.number),
            RESTART_COUNT_ENV: str(self.number - 1),
            CHECKPOINT_DIR_ENV: str(run_dir.layout.script_checkpoints.resolve()),
        }
        if self.resume_from is not None:
            env[RESUME_FROM_ENV] = str(self.resume_from.path.resolve())
        return env

    def banner(self) -> str:
        """The line each rank's log gets as a later attempt begins."""
        how = "a restart" if self.start == AttemptStart.RESTART else "ddptui resume"
        where = self.resume_from.describe() if self.resume_from else "step 0 (no checkpoint)"
        return f"==== ddptui: attempt {self.number} ({how}), going on from {where} ====\n"


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended, as the launcher would write it down: its status, run.json's final
    state, its summary (every attempt so far in it) and the launcher's events of it."""

    status: RunStatus
    info: RunInfo
    summary: RunSummary
    events: LauncherEvents


def begin_attempt(
    run_dir: RunDir, attempt: AttemptBegin, ranks: tuple[int, ...], *, script: bool
) -> None:
    """Set the attempt's environment (before any rank starts; a ``script``'s checkpoints folder
    made) and, for a later attempt, say in each rank's log (appended to) which attempt begins."""
    os.environ.pop(RESUME_FROM_ENV, None)
    os.environ.update(attempt.environment(run_dir))
    if script:
        with contextlib.suppress(OSError):
            make_dirs(run_dir.layout.script_checkpoints)
    if attempt.number <= 1:
        return
    line = attempt.banner().encode()
    for rank in ranks:
        with contextlib.suppress(OSError):
            fd = open_private(run_dir.rank_log_path(rank), "append")
            try:
                os.write(fd, line)
            finally:
                os.close(fd)


def record_start(
    run_dir: RunDir,
    config: RunConfig,
    plan: RunPlan,
    *,
    world_size: int,
    node_rank: int,
    nnodes: int,
    attempt: AttemptBegin,
) -> tuple[RunInfo, LauncherEvents]:
    """run.json as the run (``attempt`` of it) starts, with no ranks yet, and the RunStarted
    event; the space reserve set aside where no ``ddptui run`` made it. Returns the run info the
    final state builds on and the launcher's events."""
    info = run_dir.read_run_info() if run_dir.run_json_path.exists() else None
    me = psutil.Process()
    begun = RunInfo.begun(
        run_dir.run_id,
        config.name,
        world_size=world_size,
        devices=plan.devices.describe(),
        state=RunStatus.RUNNING,
        created=info.created if info else None,
    )
    base = replace(
        begun,
        launcher=ProcessRef(me.pid, me.create_time()),
        pgid=os.getpgid(0),
        node_rank=node_rank,
        nnodes=nnodes,
        oom_baseline=oom_baseline(),
        placement=info.placement if info else None,  # the backend's own keys, as it wrote them
        attempt=attempt.number,
    )
    run_dir.make_missing_dirs()
    reserve = SpaceReserve(run_dir.path)
    if not reserve.path.exists():  # started by hand (another node): set it aside now
        with contextlib.suppress(WriteFailed):
            reserve.make()
    run_dir.write_run_info(base)
    resumed = attempt.resume_from
    events = LauncherEvents(run_dir.launcher_events_path)
    events.write(
        RunStarted(
            run_id=run_dir.run_id,
            world_size=world_size,
            launcher_pid=me.pid,
            devices=plan.devices.describe(),
            stops_recorded=True,
            attempt=attempt.number,
            started_by="" if attempt.number == 1 else attempt.start.value,
            resumed_from_step=resumed.global_step if resumed else None,
            resumed_from_epoch=resumed.epoch if resumed else None,
        )
    )
    return base, events


def write_final_state(
    run_dir: RunDir, info: RunInfo, summary: RunSummary, events: LauncherEvents
) -> None:
    """summary.json first (what every reader goes by), then run.json's final state, then the
    RunFinished event, from the room the space reserve gives back. Raises WriteFailed when even
    then the summary does not fit; the follower (or the next reader) then says so."""
    SpaceReserve(run_dir.path).release()
    if events.refused:
        note = f"the launcher could not record all its events: {events.refused}"
        summary = replace(summary, warnings=(*summary.warnings, note))
    run_dir.write_summary(summary)
    with contextlib.suppress(WriteFailed):
        run_dir.write_run_info(info)
    events.write(RunFinished(status=summary.status, reason=summary.reason))
    events.close()


def final_info(base: RunInfo, status: RunStatus, processes: dict[int, psutil.Process]) -> RunInfo:
    """run.json as the attempt ended: its status and its ranks (a rank gone and reaped keeps its
    pid with no start time)."""

    def started(p: psutil.Process) -> float:
        try:
            return p.create_time()
        except psutil.Error:
            return 0.0

    return replace(
        base,
        state=status,
        ranks=tuple(ProcessRef(p.pid, started(p)) for p in processes.values()),
        global_ranks=tuple(processes),
    )
