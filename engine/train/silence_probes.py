"""The launcher's probes of silent ranks, one at a time, in a thread beside supervision.

A rank silent past its pace (``RankState.probe_after``, in any phase) is probed
(``engine.core.stacks.stall_probe.probe_stall``: two stack snapshots, its peers waiting on it,
idle at one line); a verdict counts only if the rank said nothing since the probe began. A rank
still silent after a probe that found nothing is probed again, soon at first (a rank that was
busy starting may hang a moment later), then ever less often (a long slow phase is probed a few
times a minute at most): ``FIRST_REPEAT_SECONDS``, doubling up to ``LAST_REPEAT_SECONDS``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from engine.core.runs.rank_states import RankState
from engine.core.stacks.diagnosis import RankTarget
from engine.core.stacks.stall_probe import StallVerdict, probe_stall

FIRST_REPEAT_SECONDS = 6.0  # from one probe's start to the next, while the rank stays silent
LAST_REPEAT_SECONDS = 60.0


class SilenceProbes:
    def __init__(self, run_dir_path: Path, *, distributed: bool) -> None:
        self.run_dir_path = run_dir_path
        self.distributed = distributed
        self._thread: threading.Thread | None = None
        self._cancelled = threading.Event()
        self._closed = False
        self._done: list[tuple[StallVerdict, float | None]] = []  # (verdict, last event then)
        # rank: (its last event, when it was last probed, probes since it last spoke)
        self._last_probe: dict[int, tuple[float | None, float, int]] = {}

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def consider(
        self, states: dict[int, RankState], live: set[int], targets: Callable[[], list[RankTarget]]
    ) -> None:
        """Start a probe of the first of ``live`` ranks silent past its pace, unless one runs."""
        if self.busy or not self.distributed or self._closed:
            return
        now = time.monotonic()
        for rank in sorted(live):
            state = states.get(rank)
            if state is None or state.silent_seconds is None or state.probe_after is None:
                continue
            if state.silent_seconds < state.probe_after:
                continue
            heard, when, tries = self._last_probe.get(rank, (None, 0.0, 0))
            if heard != state.last_event_time:  # it spoke since: a fresh silence
                tries = 0
            wait = min(LAST_REPEAT_SECONDS, FIRST_REPEAT_SECONDS * 2 ** max(0, tries - 2))
            if tries and now - when < wait:
                continue
            self._last_probe[rank] = (state.last_event_time, now, tries + 1)
            self._start(rank, state.last_event_time, targets())
            return

    def _start(self, rank: int, heard: float | None, targets: list[RankTarget]) -> None:
        def probe() -> None:
            verdict = probe_stall(
                self.run_dir_path,
                targets,
                rank,
                distributed=True,
                sleep=self._cancelled.wait,
            )
            if verdict is not None and not self._cancelled.is_set():
                self._done.append((verdict, heard))

        self._thread = threading.Thread(target=probe, name="silence-probe", daemon=True)
        self._thread.start()

    def verdicts(self) -> list[tuple[StallVerdict, float | None]]:
        """The verdicts found since the last call, each with the rank's last event time when its
        probe began (a rank that spoke since is not stalled)."""
        found, self._done = self._done, []
        return found

    def interrupt(self) -> None:
        """End the probe under way at its next wait, and wait for it (before a snapshot of the
        launcher's own: two py-spy attaching to one rank get in each other's way)."""
        if self._thread is not None:
            self._cancelled.set()
            self._thread.join()
            self._thread = None
        if not self._closed:
            self._cancelled.clear()

    def close(self) -> None:
        """No more probes (the ranks are being stopped, or have ended)."""
        self._closed = True
        self.interrupt()
