"""Fault injection specs ``KIND:RANK:STEP`` (plain Python; the training loop acts on them)."""

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


@dataclass(frozen=True)
class Fault:
    # What each kind does is in engine.train.faults (one function each).
    kind: str
    rank: int
    # global step (counted from 0 across epochs) at which it fires; the epoch (from 0) whose
    # evaluation a hang-eval blocks; nothing for a hang-setup (it blocks the rank's setup)
    step: int


def parse_fault(text: str) -> Fault:
    parts = text.split(":")
    if (
        len(parts) != 3
        or parts[0] not in FAULT_KINDS
        or not (parts[1].isdigit() and parts[2].isdigit())
    ):
        raise ConfigError(
            f"fault {text!r} is not KIND:RANK:STEP with KIND one of {', '.join(FAULT_KINDS)}",
            key="faults",
            reason=f"fault {text!r} is not KIND:RANK:STEP",
        )
    return Fault(kind=parts[0], rank=int(parts[1]), step=int(parts[2]))
