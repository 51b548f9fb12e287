"""Fault injection specs ``KIND:RANK:STEP`` (plain Python; the training loop acts on them)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.common.config_error import ConfigError

FAULT_KINDS = (
    "crash",
    "exit",
    "hang",
    "hang-collective",
    "hang-setup",
    "hang-eval",
    "sigstop",
    "slow",
    "oom",
    "kill-launcher",
)


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
