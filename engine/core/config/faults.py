"""Fault injection specs ``KIND:RANK:STEP[:ATTEMPTS]`` (plain Python; the training loop acts on them).

A fault fires in a run's first attempt only: a restarted or resumed attempt goes on without it,
as a transient fault (a crashed GPU, a lost node) would not come back. ``ATTEMPTS`` asks for it
again: a number (it fires in the first N attempts) or ``every`` (it fires in every attempt, as a
bad sample or a bug at that step would).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.common.config_error import ConfigError

# Each kind and what it does, in a few words (``ddptui run --help`` lists them all from here).
FAULT_EFFECTS = {
    "crash": "raise an error",
    "exit": "os._exit(3)",
    "hang": "block forever before the step's forward",
    "hang-collective": "block forever before the step's backward, its peers in the all-reduce",
    "hang-setup": "block forever in setup, after joining the process group (STEP unused)",
    "hang-eval": "block forever as the evaluation after epoch STEP (from 0) starts",
    "sigstop": "stop itself with SIGSTOP: alive, running nothing until SIGCONT",
    "slow": "sleep every step from then on",
    "oom": "allocate until the kernel's OOM killer ends the rank",
    "kill-launcher": "SIGKILL the launcher",
}
FAULT_KINDS = tuple(FAULT_EFFECTS)
EVERY_ATTEMPT = "every"  # the 4th field that makes a fault fire in every attempt


@dataclass(frozen=True)
class Fault:
    # What each kind does is in engine.train.faults (one function each).
    kind: str
    rank: int
    # global step (counted from 0 across epochs) at which it fires; the epoch (from 0) whose
    # evaluation a hang-eval blocks; nothing for a hang-setup (it blocks the rank's setup)
    step: int
    # the attempts (from the first) it fires in; None: every attempt
    attempts: int | None = 1

    def fires_in(self, attempt: int) -> bool:
        """Whether it fires in the run's attempt ``attempt`` (1 for the first)."""
        return self.attempts is None or attempt <= self.attempts


def parse_fault(text: str) -> Fault:
    parts = text.split(":")
    attempts = parts[3] if len(parts) == 4 else "1"
    if (
        len(parts) not in (3, 4)
        or parts[0] not in FAULT_KINDS
        or not (parts[1].isdigit() and parts[2].isdigit())
        or not (attempts == EVERY_ATTEMPT or (attempts.isdigit() and int(attempts) > 0))
    ):
        raise ConfigError(
            f"fault {text!r} is not KIND:RANK:STEP[:ATTEMPTS] with KIND one of "
            f"{', '.join(FAULT_KINDS)} and ATTEMPTS a count or {EVERY_ATTEMPT}",
            key="faults",
            reason=f"fault {text!r} is not KIND:RANK:STEP[:ATTEMPTS]",
        )
    return Fault(
        kind=parts[0],
        rank=int(parts[1]),
        step=int(parts[2]),
        attempts=None if attempts == EVERY_ATTEMPT else int(attempts),
    )
