"""Whether a run whose attempt just ended starts again, after how long, and from where: the one
decision behind ``supervision.max_restarts`` (``ddptui run --max-restarts N``).

Plain Python, with no process or file of its own: whoever can start the run again asks here with
the run's attempts so far (``engine.core.runs.attempts``) and the checkpoint it would go on from
(``engine.core.runs.resume_point``), then acts on the answer: the local launcher restarts its
ranks; a backend that places ranks elsewhere (a job resubmitted after a node failure) asks
the same question with the same records.

The rules, in order:

- only a failed attempt restarts (a failing rank, a rank stalled past the stall rule, a rank the
  OOM killer ended) or one that lost a node (``node-failure``: its scheduler counted a node of
  it down); a completed run is done, and a killed one was stopped on purpose;
- at most ``max_restarts`` restarts per start of the run (``ddptui run`` or ``ddptui resume``);
- a failure that repeats the previous attempt's, the same error at the same step (known
  exactly: the step the failing rank was taking), stops restarting: it would only fail again;
- the first restart waits ``backoff_seconds``, each next one twice as long as the one before,
  never more than ``MAX_BACKOFF_SECONDS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from engine.core.common.statuses import RunStatus
from engine.core.runs.resume_point import ResumePoint
from engine.core.runs.summary import AttemptRecord, AttemptStart

MAX_BACKOFF_SECONDS = 300.0
SAME_FAILURE = "the same error at the same step twice"
# How an attempt may end and be started again.
RESTARTABLE = frozenset({RunStatus.FAILED, RunStatus.NODE_FAILURE})


@dataclass(frozen=True)
class RestartDecision:
    """What happens after an attempt ended: ``restart`` in ``delay`` seconds from ``resume_from``
    (None: step 0), as restart number ``number``; ``why`` says so, or why not, in one sentence."""

    restart: bool
    why: str
    delay: float = 0.0
    number: int = 0
    resume_from: ResumePoint | None = None

    @property
    def from_step(self) -> int | None:
        return self.resume_from.global_step if self.resume_from is not None else None

    @property
    def where(self) -> str:
        """Where the next attempt goes on from, in words."""
        if self.resume_from is None:
            return "step 0 (no checkpoint yet)"
        return self.resume_from.describe()


def same_failure(earlier: AttemptRecord, later: AttemptRecord) -> bool:
    """Both failed with the same error at the same known step."""
    a, b = earlier.failure, later.failure
    return (
        earlier.status == later.status == RunStatus.FAILED
        and earlier.step_exact
        and later.step_exact
        and earlier.reached_step == later.reached_step
        and a is not None
        and b is not None
        and a.error == b.error
    )


def restarts_made(attempts: Sequence[AttemptRecord]) -> int:
    """The restarts this start of the run made so far: the attempts a restart began since the
    last one that ``ddptui run`` or ``ddptui resume`` began."""
    made = 0
    for record in reversed(attempts):
        if record.start != AttemptStart.RESTART:
            break
        made += 1
    return made


def backoff(restarts_done: int, backoff_seconds: float) -> float:
    """The wait before restart number ``restarts_done + 1``."""
    return min(MAX_BACKOFF_SECONDS, backoff_seconds * 2**restarts_done)


def decide_restart(
    attempts: Sequence[AttemptRecord],
    *,
    max_restarts: int,
    restarts_done: int,
    backoff_seconds: float,
    resume_from: ResumePoint | None,
) -> RestartDecision:
    """The decision after the last of ``attempts`` ended; ``restarts_done``: the restarts this
    start of the run already made."""
    last = attempts[-1]
    if last.status not in RESTARTABLE:
        return RestartDecision(False, f"attempt {last.attempt} {last.status}")
    if max_restarts <= 0:
        return RestartDecision(False, "supervision.max_restarts is 0: a failure ends the run")
    if restarts_done >= max_restarts:
        times = f"{restarts_done} restart{'s' if restarts_done != 1 else ''}"
        return RestartDecision(
            False, f"it failed again after {times}, all that --max-restarts {max_restarts} allows"
        )
    if len(attempts) >= 2 and same_failure(attempts[-2], last):
        where = f"step {last.reached_step:,}" if last.reached_step is not None else "?"
        error = last.failure.error if last.failure is not None else ""
        return RestartDecision(
            False,
            f"not restarting: {SAME_FAILURE} (attempts {attempts[-2].attempt} and "
            f"{last.attempt} failed at {where}: {error})",
        )
    number = restarts_done + 1
    delay = backoff(restarts_done, backoff_seconds)
    decision = RestartDecision(True, "", delay=delay, number=number, resume_from=resume_from)
    return replace(
        decision, why=f"restart {number} of {max_restarts} in {delay:g} s, from {decision.where}"
    )
