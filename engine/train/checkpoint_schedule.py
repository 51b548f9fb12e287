"""When a rank takes a checkpoint between epoch ends (``training.checkpoint_every``).

Every rank of a DDP run must take it at the same step (the RNG states are gathered), so the
decision is a function of the step count only: every N global steps, or, for an interval given
as a time, every N steps with N fixed once from the run's own pace, measured over a few steps
after the attempt's first and agreed on by every rank (the slowest rank's pace: one all-reduce,
once).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.core.config.checkpoint_every import CheckpointEvery
from engine.train.rank_device import synchronized_clock

# The steps of an attempt over which its pace is measured: after its first few (compilation,
# cudnn's kernel search, the allocator's growth), which no later step repeats.
PACE_FROM_STEP = 5
PACE_TO_STEP = 25


class CheckpointSchedule:
    """``due(steps_done)`` after each optimizer step: whether a checkpoint is taken now."""

    def __init__(
        self,
        every: CheckpointEvery,
        *,
        device: torch.device,
        distributed: bool,
        first_global_step: int,
    ) -> None:
        self.interval = every.steps  # 0: not known yet (by time) or never (epoch ends only)
        self.seconds = every.seconds
        self.anchor = 0  # interval counts from here: global step 0, or where the pace was fixed
        self._device = device
        self._distributed = distributed
        self._first = first_global_step
        self._pace_start = 0.0

    def due(self, steps_done: int) -> bool:
        """``steps_done`` global steps are done (counted from the run's first)."""
        if self.seconds and not self.interval:
            self._measure_pace(steps_done - self._first, steps_done)
            return False
        return self.interval > 0 and (steps_done - self.anchor) % self.interval == 0

    def _measure_pace(self, taken: int, steps_done: int) -> None:
        if taken == PACE_FROM_STEP:
            self._pace_start = synchronized_clock(self._device)
        elif taken == PACE_TO_STEP:
            elapsed = torch.tensor(
                synchronized_clock(self._device) - self._pace_start,
                dtype=torch.float64,
                device=self._device,
            )
            if self._distributed:
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            per_step = max(float(elapsed.item()) / (PACE_TO_STEP - PACE_FROM_STEP), 1e-6)
            self.interval = max(1, int(self.seconds / per_step))
            self.anchor = steps_done
