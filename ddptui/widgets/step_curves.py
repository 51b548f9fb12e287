"""A run's curves per step while it goes: loss (where the run reports one), step time and
images/s (steps/s for a script that counts no images), plotted with plotext (textual-plotext)
side by side, from the run observer's ``curves`` (``engine.core.runs.step_curves``).

textual-plotext is imported only when the panel first has points to draw, so the app starts
without it. A plot is redrawn at most once every ``REDRAW_SECONDS``, and never when its points
did not change: a few redraws a second of three plots would be most of the UI's CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.containers import Horizontal
from textual.widgets import Static

from engine.core.runs.step_curves import StepCurves

REDRAW_SECONDS = 1.0


def curve_series(curves: StepCurves) -> list[tuple[str, list[tuple[int, float]]]]:
    """(title, points) of each curve with points to draw, in the order they are shown."""
    label, rate = curves.rate()
    found = [
        ("loss by step", curves.loss()),
        ("step time (ms)", [(s, 1000 * t) for s, t in curves.step_time()]),
        (f"{label} by step", rate),
    ]
    return [(title, points) for title, points in found if points]


class StepCurvesPanel(Horizontal):
    """Set ``curves`` through ``show``; the plots follow."""

    DEFAULT_CSS = """
    StepCurvesPanel { height: 12; }
    StepCurvesPanel > * { width: 1fr; }
    StepCurvesPanel > #curves-empty { color: $text-muted; }
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._clock = clock
        self._shown: StepCurves | None = None
        self._drawn_at: float | None = None
        self._plots: dict[str, Any] = {}

    def show(self, curves: StepCurves) -> None:
        """Draw ``curves`` now, or at a later call when the last draw was too recent."""
        if curves is self._shown or curves == self._shown:
            return
        now = self._clock()
        if self._drawn_at is not None and now - self._drawn_at < REDRAW_SECONDS:
            return  # the next poll draws it (the run screen polls on after the run ends)
        self._drawn_at = now
        self._shown = curves
        series = curve_series(curves)
        if not series:
            if not self.query("#curves-empty"):
                self.mount(Static("no step reported yet", id="curves-empty"))
            return
        self.query("#curves-empty").remove()
        titles = [title for title, _ in series]
        if list(self._plots) != titles:
            self.remove_children()
            self._plots = {title: _plot() for title in titles}
            self.mount_all(self._plots.values())
        for title, points in series:
            _draw(self._plots[title], title, points)


def _plot() -> Any:
    from textual_plotext import PlotextPlot

    return PlotextPlot()


def _draw(plot: Any, title: str, points: list[tuple[int, float]]) -> None:
    plt = plot.plt
    plt.clear_data()
    steps = [float(s) for s, _ in points]
    values = [v for _, v in points]
    plt.plot(steps, values, marker="braille")
    plt.title(title)
    if not title.startswith("loss"):  # rates and times from zero, so a small change looks small
        plt.ylim(0, max(values) * 1.15 if max(values) > 0 else 1.0)
    plot.refresh()
