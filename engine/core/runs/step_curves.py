"""A run's per-step curves while it goes: loss (where known), step time and images/s (or steps/s
where no rank counts images), one point per step report of the run's lowest reporting rank.

Plain Python, pure: the run observer feeds it the step events it reads and the Run screen plots
what ``curves()`` returns. A long run keeps its whole length at a coarser grain: past
``MAX_POINTS`` points every other one is dropped, so the memory and the drawing stay bounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.core.runs.events import Event, StepProgress

MAX_POINTS = 800


@dataclass(frozen=True)
class StepPoint:
    """One step report: where the run was and how fast it went since the previous report."""

    global_step: int
    loss: float | None
    step_seconds: float
    images_per_s: float | None


@dataclass(frozen=True)
class StepCurves:
    """The points of one rank's step reports, oldest first."""

    rank: int | None = None
    points: tuple[StepPoint, ...] = ()

    def loss(self) -> list[tuple[int, float]]:
        return [
            (p.global_step, p.loss)
            for p in self.points
            if p.loss is not None and math.isfinite(p.loss)
        ]

    def step_time(self) -> list[tuple[int, float]]:
        return [(p.global_step, p.step_seconds) for p in self.points if p.step_seconds > 0]

    def rate(self) -> tuple[str, list[tuple[int, float]]]:
        """("images/s", its points) where the rank counts images, else ("steps/s", ...)."""
        images = [(p.global_step, p.images_per_s) for p in self.points if p.images_per_s]
        if images:
            return "images/s", [(s, v) for s, v in images if v is not None]
        return "steps/s", [(s, 1.0 / t) for s, t in self.step_time()]


@dataclass
class StepCurveFold:
    """Folds step events into the curves of the lowest rank that reports steps."""

    rank: int | None = None
    _points: list[StepPoint] = field(default_factory=list)
    _curves: StepCurves | None = None  # what curves() returned, until a point arrives

    def feed(self, event: Event) -> None:
        if not isinstance(event, StepProgress):
            return
        if self.rank is None or event.rank < self.rank:
            if self.rank is not None:  # a lower rank spoke late: its curve, from now on
                self._points.clear()
            self.rank = event.rank
        if event.rank != self.rank:
            return
        self._points.append(
            StepPoint(event.global_step, event.loss, event.step_seconds, event.images_per_s)
        )
        if len(self._points) > MAX_POINTS:
            self._points = self._points[::2] if len(self._points) % 2 else self._points[1::2]
        self._curves = None

    def feed_all(self, events: list[Event]) -> None:
        for e in events:
            self.feed(e)

    def curves(self) -> StepCurves:
        if self._curves is None:
            self._curves = StepCurves(self.rank, tuple(self._points))
        return self._curves
