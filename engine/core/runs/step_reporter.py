"""The one place a rank's step report is built and throttled: ``StepReporter``.

Every rank reports its steps through one: the engine's training loop
(``engine.train.training``) after each step, a rank of the user's own script from its global
optimizer step hook (``engine.core.runs.script_reporting``). The reporter counts the steps (and,
where the caller knows them, the images) since its last report and says when
``training.report_interval`` seconds have passed; the caller then gives what only it knows (the
loss, the lr, where in the epoch it is) and the reporter writes one ``StepProgress`` with the mean
seconds per step and the images per second of the steps since the previous report.

Standard library only (with ``engine.core.runs.events``): a script rank builds one before the
script imports torch, and the engine's loop calls it every step, so it costs a clock read and a
few additions a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.core.runs.events import EventWriter, StepProgress

# A report right after the previous one must not divide by zero.
_SHORTEST_WINDOW_SECONDS = 1e-9


class StepReporter:
    """Counts one rank's steps and writes a ``StepProgress`` at most every ``interval`` seconds.

    ``step_done`` after every step says whether a report is due; ``report`` writes it, due or
    not (an epoch's last step, a script's end), and starts the next window. ``restart`` starts a
    window without reporting: steps and time before it are in no report. Not thread-safe: a
    caller whose steps come from several threads holds its own lock around it.
    """

    def __init__(
        self,
        events: EventWriter,
        rank: int,
        interval: float,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.events = events
        self.rank = rank
        self.interval = interval
        self._clock = clock
        self._window_start = clock()
        self._window_steps = 0
        self._window_images: int | None = None  # None: the caller counts no images

    def restart(self) -> None:
        """Start a new window now, reporting nothing (an epoch's start, a script's first step)."""
        self._window_start = self._clock()
        self._window_steps = 0
        self._window_images = None

    def step_done(self, images: int | None = None) -> bool:
        """One step ended (with ``images`` images, where the caller counts them); True when
        ``interval`` seconds have passed since the window started, so a report is due."""
        self._window_steps += 1
        if images is not None:
            self._window_images = (self._window_images or 0) + images
        return self._clock() - self._window_start >= self.interval

    @property
    def pending_steps(self) -> int:
        """Steps done since the last report (or restart): what a final report would cover."""
        return self._window_steps

    def report(
        self,
        *,
        epoch: int,
        step: int,
        steps: int,
        global_step: int,
        loss: float | None,
        lr: float | None,
        images_per_s: float | None = None,
    ) -> StepProgress:
        """Write the ``StepProgress`` of the steps since the last report and start the next
        window; returns the event. ``images_per_s`` is the caller's figure (a script's own
        ``ddptui.report``); without one it is the images counted by ``step_done`` over the
        window's seconds, or None when none were counted."""
        now = self._clock()
        elapsed = max(now - self._window_start, _SHORTEST_WINDOW_SECONDS)
        if images_per_s is None and self._window_images is not None:
            images_per_s = self._window_images / elapsed
        event = StepProgress(
            rank=self.rank,
            epoch=epoch,
            step=step,
            steps=steps,
            global_step=global_step,
            loss=loss,
            images_per_s=images_per_s,
            step_seconds=elapsed / self._window_steps if self._window_steps > 0 else 0.0,
            lr=lr,
        )
        self.events.write(event)
        self._window_start = now
        self._window_steps = 0
        self._window_images = None
        return event
