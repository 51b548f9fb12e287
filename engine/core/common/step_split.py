"""The six parts of a training step, in the order they happen, and a split of seconds over them:
what a rank times (``engine.train.step_marks``), reports (``StepBreakdownReported``) and what the
run's readers fold (``engine.core.runs.step_breakdown``). One list of the parts, so a seventh is
added here and nowhere else.

``data``       from the end of the previous optimizer step to the first forward of this one
``forward``    the outermost forward calls of modules with parameters
``backward``   from the last forward to the optimizer step, with the gradient sync it waits for
               (unless timed on its own)
``sync``       the gradient sync backward waited for, where timed on its own; else None
``optimizer``  the optimizer step
``other``      the rest: between two forwards of one step, or a step whose forward was not seen
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from engine.core.common.statuses import Vocabulary


class StepPart(Vocabulary):
    """The parts of a step, in the order they happen (and are drawn)."""

    DATA = "data"
    FORWARD = "forward"
    BACKWARD = "backward"
    SYNC = "sync"
    OPTIMIZER = "optimizer"
    OTHER = "other"


@dataclass(frozen=True)
class StepSplit:
    """Seconds of each part of a step (or summed over steps); ``sync`` is None where the
    gradient sync was not timed apart from backward. Field names are ``StepPart`` values."""

    data: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    sync: float | None = None
    optimizer: float = 0.0
    other: float = 0.0

    @classmethod
    def of(cls, record: Any) -> StepSplit:
        """The split held by any record with one attribute per part (an event, a breakdown)."""
        return cls(**{part.value: getattr(record, part.value) for part in StepPart})

    def fields(self) -> dict[str, Any]:
        """The parts as keyword arguments, in step order (sync None where not timed)."""
        return asdict(self)

    def parts(self) -> dict[StepPart, float]:
        """Seconds of each part, in step order; sync only where it was timed."""
        found = ((StepPart(f.name), getattr(self, f.name)) for f in fields(self))
        return {part: seconds for part, seconds in found if seconds is not None}

    @property
    def total(self) -> float:
        """The parts added up."""
        return sum(self.parts().values())

    def times(self, steps: int) -> StepSplit:
        """Each part counted for ``steps`` steps."""
        return self._each(lambda seconds: seconds * steps)

    def mean_over(self, steps: int) -> StepSplit:
        """Each part's mean over ``steps`` steps (of a sum of them)."""
        return self._each(lambda seconds: seconds / steps)

    def plus(self, other: StepSplit) -> StepSplit:
        """Part by part; sync is timed in the sum where it was in either."""
        theirs = other.fields()
        added: dict[str, Any] = {name: _add(v, theirs[name]) for name, v in self.fields().items()}
        return StepSplit(**added)

    def _each(self, change: Callable[[float], float]) -> StepSplit:
        values: dict[str, Any] = {
            name: None if v is None else change(v) for name, v in self.fields().items()
        }
        return StepSplit(**values)


def _add(mine: float | None, theirs: float | None) -> float | None:
    if mine is None and theirs is None:
        return None
    return (mine or 0.0) + (theirs or 0.0)
