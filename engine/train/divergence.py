"""A loss that becomes NaN or infinite: found on the device, read only when the loop reports."""

from __future__ import annotations

import torch


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite (``training.on_divergence = "fail"``)."""


class DivergenceWatch:
    """Finds the first step whose loss is NaN or infinite. The step is kept on the device, so a
    GPU is not synchronised every step; ``check`` reads it when the loop reports anyway.

    ``training.on_divergence``: "fail" raises ``TrainingDiverged``; "warn" prints one warning
    (the summary then names the epochs whose loss was not finite) and lets training go on.
    """

    def __init__(self, device: torch.device, rank: int, mode: str) -> None:
        self.rank = rank
        self.mode = mode
        self.first_step = torch.full((), -1, dtype=torch.long, device=device)
        self.first_loss = torch.zeros((), dtype=torch.float32, device=device)
        self.reported = False

    def observe(self, loss: torch.Tensor, global_step: int) -> None:
        new = ~torch.isfinite(loss.detach()) & (self.first_step < 0)
        self.first_loss = torch.where(new, loss.detach().float(), self.first_loss)
        self.first_step.masked_fill_(new, global_step)

    def check(self, steps_per_epoch: int) -> None:
        if self.reported:
            return
        first = int(self.first_step.item())
        if first < 0:
            return
        epoch, step = divmod(first, max(1, steps_per_epoch))
        message = (
            f"training diverged at epoch {epoch + 1} step {step + 1} on rank {self.rank}: "
            f"the loss became {self.first_loss.item()}"
        )
        if self.mode == "fail":
            raise TrainingDiverged(message)
        self.reported = True
        print(f"warning: {message}; training.on_divergence = warn, so training goes on", flush=True)
