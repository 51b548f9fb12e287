"""An epoch's figures: what one rank measured (``RankEpoch``) and what all ranks did together
(``GlobalEpoch``, from ``reduce_epoch``), so every rank's ``EpochEnded`` carries the same
``global_*`` values:

- ``global_seconds``: the slowest rank's device-synchronised epoch seconds (ranks wait for each
  other at every all-reduce, so the slowest rank is the epoch);
- ``global_data_wait_seconds``: the largest data wait of any rank;
- ``global_images``: images of all ranks;
- ``global_steady_images_per_s``: all ranks' images after the warm-up steps divided by the slowest
  rank's seconds for them;
- ``global_train_loss``: the mean of the ranks' mean losses (every rank runs the same steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class RankEpoch:
    """One epoch as this rank saw it."""

    steps: int
    images: int
    seconds: float
    data_wait_seconds: float
    warmup_steps: int
    steady_images: int
    steady_seconds: float
    train_loss: float
    first_step: int = 0  # the epoch's step it began at (an attempt resumed inside the epoch)

    @property
    def steady_images_per_s(self) -> float:
        return self.steady_images / self.steady_seconds if self.steady_seconds > 0 else 0.0


@dataclass(frozen=True)
class GlobalEpoch:
    """One epoch of all ranks (see the module docstring for how each figure is reduced)."""

    images: int
    seconds: float
    data_wait_seconds: float
    steady_images_per_s: float
    train_loss: float


def reduce_epoch(local: RankEpoch, device: torch.device, distributed: bool) -> GlobalEpoch:
    """The figures of all ranks; a collective every rank must call when ``distributed``."""
    if not distributed:
        return GlobalEpoch(
            local.images,
            local.seconds,
            local.data_wait_seconds,
            local.steady_images_per_s,
            local.train_loss,
        )
    maxima = torch.tensor(
        [local.seconds, local.data_wait_seconds, local.steady_seconds],
        dtype=torch.float64,
        device=device,
    )
    sums = torch.tensor(
        [local.images, local.steady_images, local.train_loss], dtype=torch.float64, device=device
    )
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    seconds, data_wait, steady_seconds = maxima.tolist()
    images, steady_images, loss_sum = sums.tolist()
    return GlobalEpoch(
        images=round(images),
        seconds=seconds,
        data_wait_seconds=data_wait,
        steady_images_per_s=steady_images / steady_seconds if steady_seconds > 0 else 0.0,
        train_loss=loss_sum / dist.get_world_size(),
    )
