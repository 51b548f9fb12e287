"""The ``cifar10`` data set: ``torchvision.datasets.CIFAR10`` under
``engine.core.plan.run_plan.dataset_root(config)``, downloaded by rank 0 alone when ``data.download``
asks for it. torchvision is imported only when a run uses it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from engine.core.config.schema import RunConfig
from engine.core.plan.run_plan import dataset_root
from engine.train.image_split import ImageSplit


def cifar10_dataset(
    config: RunConfig,
    train: bool,
    *,
    transform: Any = None,
    rank: int = 0,
    distributed: bool = False,
) -> Any:
    """``torchvision.datasets.CIFAR10`` for one split.

    With ``data.download``, rank 0 downloads (once) while the others wait at a barrier, then every
    rank opens the files on disk.
    """
    from torchvision.datasets import CIFAR10

    root = str(dataset_root(config))
    if config.data.download and distributed:
        if rank == 0:
            CIFAR10(root, train=train, download=True)
        dist.barrier()
        return CIFAR10(root, train=train, transform=transform, download=False)
    return CIFAR10(root, train=train, transform=transform, download=config.data.download)


def cifar10_split(
    config: RunConfig, train: bool, *, rank: int = 0, distributed: bool = False
) -> ImageSplit:
    """One CIFAR-10 split in host memory, as uint8 (N, 3, 32, 32) images and int64 labels."""
    dataset = cifar10_dataset(config, train, rank=rank, distributed=distributed)
    images = torch.from_numpy(np.ascontiguousarray(dataset.data)).permute(0, 3, 1, 2).contiguous()
    return ImageSplit(images=images, labels=torch.as_tensor(dataset.targets, dtype=torch.int64))
