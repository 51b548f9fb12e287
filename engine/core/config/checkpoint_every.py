"""``training.checkpoint_every``: how often a run of the engine's workload writes its checkpoint
between epoch ends (every epoch's end always writes one).

Plain Python; the training loop (``engine.train.checkpoint_schedule``) acts on it.

- ``"500"``: every 500 optimizer steps (global steps, counted from the run's first);
- ``"90s"``, ``"10m"``, ``"2h"``: about that often, as a number of steps fixed once from the
  run's own pace, the same on every rank (ranks must agree on the step: the checkpoint is taken
  together);
- ``"epoch"``: at epoch ends only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.core.common.config_error import ConfigError

DEFAULT_CHECKPOINT_EVERY = "10m"
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_SPEC = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")


@dataclass(frozen=True)
class CheckpointEvery:
    """Either ``steps`` (> 0) or ``seconds`` (> 0), or neither: epoch ends only."""

    steps: int = 0
    seconds: float = 0.0

    @property
    def label(self) -> str:
        if self.steps:
            return f"every {self.steps:,} steps"
        if self.seconds:
            return f"about every {self.seconds:g} s"
        return "at epoch ends"


def parse_checkpoint_every(text: str) -> CheckpointEvery:
    """The interval ``text`` names; ConfigError (one sentence naming the key) otherwise."""
    if text.strip() == "epoch":
        return CheckpointEvery()
    match = _SPEC.match(text)
    number = float(match.group(1)) if match else 0.0
    unit = match.group(2) if match else ""
    if match is None or number <= 0 or (not unit and not number.is_integer()):
        raise ConfigError(
            f"training.checkpoint_every is {text!r}; expected a number of steps (500), a time "
            "(90s, 10m, 2h) or epoch",
            key="training.checkpoint_every",
            reason="training.checkpoint_every is not steps, a time or epoch",
        )
    if not unit:
        return CheckpointEvery(steps=int(number))
    return CheckpointEvery(seconds=number * _UNIT_SECONDS[unit])
