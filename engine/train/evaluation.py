"""Evaluation on the full test set: each rank scores its shard (``engine.train.data.TestBatches``)
and the counts are summed over the ranks, so every rank returns the figures of the whole set."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from engine.train.image_split import Batch
from engine.train.rank_device import autocast


@dataclass(frozen=True)
class EvalResult:
    correct: int
    loss_sum: float
    samples: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.samples if self.samples else 0.0

    @property
    def loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else 0.0


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    device: torch.device,
    precision: str = "fp32",
    channels_last: bool = False,
    distributed: bool = False,
) -> EvalResult:
    """Correct predictions and summed loss over this rank's shard, summed over all ranks when
    ``distributed``: every rank returns the figures of the whole test set.

    Pass the unwrapped module under DDP: ranks may hold different numbers of test batches, and
    DDP's forward would wait for the others.
    """
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # correct, loss sum, samples
    for images, labels in batches:
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with autocast(precision, device):
            logits = model(images)
        loss = nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        totals[0] += (logits.argmax(dim=1) == labels).sum()
        totals[1] += loss.double()
        totals[2] += labels.shape[0]
    if distributed:
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    model.train(was_training)
    correct, loss_sum, samples = totals.tolist()
    return EvalResult(correct=round(correct), loss_sum=loss_sum, samples=round(samples))


def broadcast_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics), so every rank evaluates
    the model rank 0 checkpoints; without SyncBatchNorm each rank's statistics drift apart."""
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)
