"""What every data set of the engine is in memory: an ``ImageSplit`` of CIFAR-shaped uint8 images
(``IMAGE_SHAPE``, ``NUM_CLASSES`` classes) and int64 labels, and the ``Batch`` a pipeline yields."""

from __future__ import annotations

from dataclasses import dataclass

import torch

NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)

Batch = tuple[torch.Tensor, torch.Tensor]  # float images (B, 3, 32, 32) normalised, int64 labels


@dataclass(frozen=True)
class ImageSplit:
    """One split of a data set in memory: uint8 images (N, 3, 32, 32) and int64 labels (N,)."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device) -> ImageSplit:
        return ImageSplit(self.images.to(device), self.labels.to(device))
