"""The launcher's attempts: one after another, until one ends the run.

``run_attempts`` runs the first attempt (a new run's, or the one ``ddptui resume`` prepared), and
after each failed one asks ``engine.core.runs.restart_policy`` whether to start again
(``supervision.max_restarts``). A restart waits its back-off (a Ctrl-C or ``ddptui kill`` then
ends the run as killed), moves the attempt's files below ``attempts/<n>/``
(``engine.core.runs.attempts``), and starts the ranks again with:

- ``DDPTUI_ATTEMPT`` the attempt's number, and ``TORCHELASTIC_RESTART_COUNT`` one less, as
  torchrun sets it;
- ``DDPTUI_RESUME_FROM`` the newest checkpoint (``engine.core.runs.resume_point``): the engine's
  ranks go on from it, a script gets it after its ``script.resume_arg``; unset with none (step 0);
- ``DDPTUI_CHECKPOINT_DIR``, where a script writes the checkpoints a restart is pointed at.

Each rank's log gets a line saying which attempt begins. The attempt itself (record its start,
start and supervise the ranks, build its summary) is the launcher's (``engine.train.launch``); how
the run's end is written down too, once, when no restart follows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from engine.core.common.statuses import RunStatus
from engine.core.config.schema import RunConfig
from engine.core.procs.run_leftovers import outliving_now
from engine.core.procs.run_proof import RunMarker
from engine.core.runs.attempts import archive_attempt
from engine.core.runs.events import RestartScheduled
from engine.core.runs.restart_policy import RESTARTABLE, RestartDecision, decide_restart
from engine.core.runs.resume_point import resume_point
from engine.core.runs.rundir import RunDir, RunDirError
from engine.core.runs.stop_request import read_stop_request
from engine.core.runs.summary import AttemptStart
from engine.train.attempt import AttemptBegin, AttemptEnd, begin_attempt

WAIT_STEP_SECONDS = 0.1


def first_attempt(run_dir: RunDir, config: RunConfig) -> AttemptBegin:
    """The attempt this launcher begins with: run.json's (``ddptui resume`` numbered it and moved
    the one before away), from the newest checkpoint; a new run's first, from step 0."""
    try:
        number = run_dir.read_run_info().attempt
    except RunDirError:
        number = 1
    if number <= 1:
        return AttemptBegin(1)
    return AttemptBegin(number, AttemptStart.RESUME, resume_point(run_dir, config))


def waited(seconds: float, stop_requests: list[str]) -> bool:
    """Wait ``seconds`` unless a stop is asked for meanwhile; True when the wait was whole."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop_requests:
            return False
        time.sleep(WAIT_STEP_SECONDS)
    return not stop_requests


def decide(run_dir: RunDir, config: RunConfig, end: AttemptEnd, restarts: int) -> RestartDecision:
    """The restart policy's word on the attempt that just ended."""
    sup = config.supervision
    return decide_restart(
        end.summary.attempts,
        max_restarts=sup.max_restarts,
        restarts_done=restarts,
        backoff_seconds=sup.restart_backoff_seconds,
        resume_from=resume_point(run_dir, config),
    )


def stopped_while_waiting(run_dir: RunDir, end: AttemptEnd, signal_name: str) -> AttemptEnd:
    """The run's end when a stop came while it waited to restart: killed, saying so."""
    asked = read_stop_request(run_dir)
    who = asked.sentence if asked else f"the launcher received {signal_name}"
    reason = (
        f"{who} while it waited to restart (attempt {end.summary.attempt}: {end.summary.reason})"
    )
    summary = replace(end.summary, status=RunStatus.KILLED, reason=reason)
    return replace(end, status=RunStatus.KILLED, info=replace(end.info, state=RunStatus.KILLED),
                   summary=summary)  # fmt: skip


def said(end: AttemptEnd, why: str) -> AttemptEnd:
    """``end`` with ``why`` added to its summary's reason (why the run did not go on)."""
    return replace(end, summary=replace(end.summary, reason=f"{end.summary.reason}; {why}"))


def proved_gone(run_dir: RunDir, decision: RestartDecision, attempt: int) -> RestartDecision:
    """``decision``, unless a process of the attempt outlived its stop: then no restart."""
    left = outliving_now(RunMarker.of_dir(run_dir.path)) if decision.restart else []
    if not left:
        return decision
    pids = ", ".join(str(p.pid) for p in left[:5])
    why = f"not restarting: pid {pids} of attempt {attempt} is still alive after its stop"
    return replace(decision, restart=False, why=why)


def scheduled(end: AttemptEnd, decision: RestartDecision, max_restarts: int) -> RestartScheduled:
    """The launcher's word that the attempt that ended starts again."""
    ended = end.summary.attempts[-1]
    return RestartScheduled(
        attempt=ended.attempt,
        reason=end.summary.reason,
        global_step=ended.reached_step if ended.step_exact else None,
        in_seconds=decision.delay,
        from_step=decision.from_step,
        from_where=decision.where,
        restart=decision.number,
        max_restarts=max_restarts,
    )


def run_attempts(
    run_dir: RunDir,
    config: RunConfig,
    ranks: tuple[int, ...],
    attempt: Callable[[AttemptBegin, list[str]], AttemptEnd],
    finish: Callable[[AttemptEnd], None],
) -> RunStatus:
    """Run ``attempt`` (given how it begins and the stop requests the launcher receives) until
    one ends the run, restarting as the policy decides; ``finish`` writes the run's end."""
    stop_requests: list[str] = []
    current = first_attempt(run_dir, config)
    restarts = 0
    while True:
        begin_attempt(run_dir, current, ranks, script=config.script.given)
        end = attempt(current, stop_requests)
        decision = proved_gone(run_dir, decide(run_dir, config, end, restarts), current.number)
        if not decision.restart or stop_requests:
            restartable = end.status in RESTARTABLE and config.supervision.max_restarts > 0
            finish(said(end, decision.why) if restartable else end)
            return end.status
        end.events.write(scheduled(end, decision, config.supervision.max_restarts))
        if not waited(decision.delay, stop_requests):
            end = stopped_while_waiting(run_dir, end, stop_requests[0])
            finish(end)
            return end.status
        try:
            archive_attempt(run_dir, current.number, summary=end.summary, info=end.info)
        except RunDirError as err:  # the attempt's end stands; the restart never began
            finish(said(end, f"the restart could not begin: {err}"))
            return end.status
        end.events.close()
        current = AttemptBegin(current.number + 1, AttemptStart.RESTART, decision.resume_from)
        restarts += 1
