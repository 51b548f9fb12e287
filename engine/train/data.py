"""Input pipelines: the batches a rank trains and evaluates on.

Data sets (``data.dataset``), loaded as an ``engine.train.image_split.ImageSplit`` by
``load_split``: ``synthetic`` (``engine.train.synthetic_data``: embedded, CIFAR-shaped, the same
for every run and rank) and ``cifar10`` (``engine.train.cifar10``). A ``data.factory`` gives the
user's own (``engine.train.user_factories``).

Pipelines (``data.pipeline``):

- ``torchvision``: the tutorial's PIL transforms in a DataLoader (train: RandomCrop(32, padding=4),
  RandomHorizontalFlip, ToTensor, Normalize(0.5, 0.5); test: ToTensor + Normalize only).
- ``tensor``: the whole split as one uint8 tensor on the training device; each batch is indexed from
  it and augmented with batched tensor ops. The augmentation of a sample is a function of
  (seed, epoch, sample index) only, so it does not depend on how samples are split across ranks.

Sampling is a ``DistributedSampler(shuffle=True, seed=training.seed, drop_last=True)`` with
``set_epoch`` every epoch, for every strategy: ``single`` and ``dataparallel`` use one replica, so a
single process with batch 2b sees, step for step, exactly the union of what two DDP ranks with
batch b see. Incomplete last batches are dropped, so every step has the full batch.

Evaluation covers the whole test set once: rank r takes samples r, r + world_size, ... (no padding,
no duplicates), and the training loop all-reduces the counts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from engine.core.config.schema import RunConfig
from engine.train.cifar10 import cifar10_dataset, cifar10_split
from engine.train.image_split import Batch, ImageSplit
from engine.train.models import num_classes
from engine.train.rank_bootstrap import bind_dataloader_worker
from engine.train.synthetic_data import synthetic_split
from engine.train.user_factories import user_datasets

CROP_PADDING = 4


def load_split(
    config: RunConfig, train: bool, *, rank: int = 0, distributed: bool = False
) -> ImageSplit:
    """One split of the configured data set, in host memory."""
    if config.data.dataset == "synthetic":
        size = config.data.train_size if train else config.data.test_size
        return synthetic_split(train, size)
    return cifar10_split(config, train, rank=rank, distributed=distributed)


# ---- sampling --------------------------------------------------------------------------------


def epoch_indices(size: int, epoch: int, seed: int, rank: int, world_size: int) -> list[int]:
    """The samples rank ``rank`` of ``world_size`` trains on in ``epoch``, in order.

    Exactly what ``DistributedSampler(shuffle=True, seed=seed, drop_last=True)`` yields after
    ``set_epoch(epoch)``; with world_size 1 it is the whole permutation that the ranks share out.
    """
    sampler = make_train_sampler(size, seed, rank, world_size)
    sampler.set_epoch(epoch)
    return list(sampler)


class PositionedSampler(DistributedSampler[int]):
    """A ``DistributedSampler`` that can start an epoch part-way: ``skip`` samples of its order
    left out, for a run resumed from a checkpoint taken inside an epoch. Its order is still a
    function of (seed, epoch) only."""

    skip = 0

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.skip :])


def make_train_sampler(size: int, seed: int, rank: int, world_size: int) -> PositionedSampler:
    # DistributedSampler only needs len(); a range stands in for the data set.
    return PositionedSampler(
        cast(Dataset[int], range(size)),
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
        seed=seed,
        drop_last=True,
    )


def test_shard(size: int, rank: int, world_size: int) -> range:
    """Test samples evaluated by one rank: every sample exactly once across the ranks."""
    return range(rank, size, world_size)


# ---- tensor-pipeline augmentation ------------------------------------------------------------

_HASH_MASK = 0x7FFF_FFFF  # 31 bits: products of two masked values stay inside int64


def _mix(values: torch.Tensor) -> torch.Tensor:
    """An integer hash (int64 tensor in, 31-bit values out) that is identical on every device."""
    h = values & _HASH_MASK
    for multiplier in (0x2C1B3C6D, 0x297A2D39, 0x3C6EF372):
        h = ((h ^ (h >> 15)) * multiplier) & _HASH_MASK
    return h ^ (h >> 13)


def augmentation_params(
    indices: torch.Tensor, seed: int, epoch: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Crop offsets (0 .. 2 * padding, in padded coordinates) and flip flags of each sample.

    A pure function of (seed, epoch, sample index): the same sample gets the same crop and flip
    on any rank and any device.
    """
    key = (seed * 1_000_003 + epoch) & _HASH_MASK
    h = _mix(indices.to(torch.int64) * 0x9E37 + _mix(torch.tensor(key, device=indices.device)))
    span = 2 * CROP_PADDING + 1
    dy = h % span
    dx = (h // span) % span
    flip = ((h // (span * span)) % 2).bool()
    return dy, dx, flip


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 -> float in [-1, 1]: ToTensor followed by Normalize(mean 0.5, std 0.5)."""
    return images.float().div_(127.5).sub_(1.0)


def augment(images: torch.Tensor, indices: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
    """Random crop with 4-pixel zero padding + horizontal flip of a uint8 batch, then normalise.

    Matches ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip`` (padding is black, as in the
    PIL pipeline), done as one gather on the images' device.
    """
    batch, channels, height, width = images.shape
    dy, dx, flip = augmentation_params(indices, seed, epoch)
    padded = F.pad(images, (CROP_PADDING, CROP_PADDING, CROP_PADDING, CROP_PADDING))
    ar_h = torch.arange(height, device=images.device)
    ar_w = torch.arange(width, device=images.device)
    rows = dy[:, None] + ar_h  # (B, H)
    cols = dx[:, None] + torch.where(flip[:, None], width - 1 - ar_w, ar_w)  # (B, W)
    b = torch.arange(batch, device=images.device)[:, None, None, None]
    c = torch.arange(channels, device=images.device)[None, :, None, None]
    cropped = padded[b, c, rows[:, None, :, None], cols[:, None, None, :]]
    return normalize(cropped)


# ---- pipelines -------------------------------------------------------------------------------


class TrainBatches:
    """The training batches of one rank, epoch by epoch. ``epoch(e)`` yields batches on the
    device; ``epoch(e, start_step=k)`` the same epoch's batches from its step k on (a resumed
    run), exactly those the whole epoch would have yielded from there."""

    steps_per_epoch: int
    batch_size: int
    sampler: PositionedSampler

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        raise NotImplementedError


class TensorTrainBatches(TrainBatches):
    """The whole split on the device as uint8; batches indexed and augmented there."""

    def __init__(
        self,
        split: ImageSplit,
        *,
        batch_size: int,
        seed: int,
        rank: int,
        world_size: int,
        device: torch.device,
        max_steps: int = 0,
    ) -> None:
        self.split = split.to(device)
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.sampler = make_train_sampler(len(split), seed, rank, world_size)
        steps = len(self.sampler) // batch_size
        self.steps_per_epoch = min(steps, max_steps) if max_steps > 0 else steps

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)
        order = torch.tensor(list(self.sampler), dtype=torch.int64, device=self.device)
        for step in range(start_step, self.steps_per_epoch):
            indices = order[step * self.batch_size : (step + 1) * self.batch_size]
            images = augment(self.split.images[indices], indices, self.seed, epoch)
            yield images, self.split.labels[indices]


class _PilImages(Dataset[tuple[Any, int]]):
    """An in-memory split served as PIL images, like ``torchvision.datasets.CIFAR10`` does."""

    def __init__(self, split: ImageSplit, transform: Any) -> None:
        self.data = split.images.permute(0, 2, 3, 1).contiguous().numpy()  # HWC, as CIFAR10.data
        self.targets = split.labels.tolist()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from PIL import Image

        return self.transform(Image.fromarray(self.data[index])), self.targets[index]


def torchvision_transform(train: bool) -> Any:
    from torchvision import transforms

    normalize_t = transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    if train:
        return transforms.Compose(
            [
                transforms.RandomCrop(32, padding=CROP_PADDING),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize_t,
            ]
        )
    return transforms.Compose([transforms.ToTensor(), normalize_t])


def torchvision_dataset(
    config: RunConfig, train: bool, *, rank: int = 0, distributed: bool = False
) -> Dataset[Any]:
    transform = torchvision_transform(train)
    if config.data.dataset == "synthetic":
        return _PilImages(load_split(config, train), transform)
    return cast(
        Dataset[Any],
        cifar10_dataset(config, train, transform=transform, rank=rank, distributed=distributed),
    )


def _loader_options(config: RunConfig, device: torch.device) -> dict[str, Any]:
    workers = config.data.num_workers
    return {
        "num_workers": workers,
        "pin_memory": config.data.pin_memory and device.type == "cuda",
        "persistent_workers": workers > 0,
        "worker_init_fn": bind_dataloader_worker,  # a worker dies with its rank
    }


class TorchvisionTrainBatches(TrainBatches):
    """The tutorial's DataLoader with PIL transforms, copied to the device batch by batch."""

    def __init__(
        self,
        dataset: Dataset[Any],
        config: RunConfig,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        seed = config.training.seed
        self.device = device
        self.batch_size = batch_size
        self.sampler = make_train_sampler(len(cast(Sequence[Any], dataset)), seed, rank, world_size)
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            drop_last=True,
            # Worker augmentation seeds differ per rank but repeat from run to run.
            generator=torch.Generator().manual_seed(seed * 1_000 + rank),
            **_loader_options(config, device),
        )
        steps = len(self.loader)
        max_steps = config.training.max_steps
        self.steps_per_epoch = min(steps, max_steps) if max_steps > 0 else steps
        self._non_blocking = device.type == "cuda"

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        self.sampler.set_epoch(epoch)
        # The loader's workers read the sampler as they go: the skipped batches are never loaded.
        self.sampler.skip = start_step * self.batch_size
        batches = iter(self.loader)
        for _ in range(start_step, self.steps_per_epoch):
            images, labels = next(batches)
            yield (
                images.to(self.device, non_blocking=self._non_blocking),
                labels.to(self.device, non_blocking=self._non_blocking),
            )
        del batches  # with persistent workers, the next epoch's iterator resets them


_user_splits: dict[str, tuple[Any, Any]] = {}


def user_splits(config: RunConfig) -> tuple[Any, Any]:
    """The user's (train, test) data sets, made once per process for both pipelines."""
    key = f"{config.data.factory}:{sorted(config.data.factory_args.items())}"
    if key not in _user_splits:
        _user_splits[key] = user_datasets(config.data, num_classes(config.model))
    return _user_splits[key]


def make_train_batches(
    config: RunConfig,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    device: torch.device,
    distributed: bool,
) -> TrainBatches:
    """The configured training pipeline for one rank. ``world_size`` 1 for single / dataparallel."""
    if config.data.factory:  # the user's data: through a DataLoader, sampled as the built-ins
        train, _ = user_splits(config)
        return TorchvisionTrainBatches(
            train, config, batch_size=batch_size, rank=rank, world_size=world_size, device=device
        )
    if config.data.pipeline == "tensor":
        split = load_split(config, True, rank=rank, distributed=distributed)
        return TensorTrainBatches(
            split,
            batch_size=batch_size,
            seed=config.training.seed,
            rank=rank,
            world_size=world_size,
            device=device,
            max_steps=config.training.max_steps,
        )
    dataset = torchvision_dataset(config, True, rank=rank, distributed=distributed)
    return TorchvisionTrainBatches(
        dataset, config, batch_size=batch_size, rank=rank, world_size=world_size, device=device
    )


class TestBatches:
    """One rank's shard of the full test set, without augmentation, as device batches."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        config: RunConfig,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device,
        distributed: bool,
    ) -> None:
        self.device = device
        self.batch_size = batch_size
        self.loader: DataLoader[Any] | None = None
        self.split: ImageSplit | None = None
        if config.data.pipeline == "tensor" and not config.data.factory:
            split = load_split(config, False, rank=rank, distributed=distributed)
            self.size = len(split)
            shard = torch.tensor(test_shard(self.size, rank, world_size), dtype=torch.int64)
            self.split = ImageSplit(split.images[shard], split.labels[shard]).to(device)
        else:
            dataset = (
                user_splits(config)[1]
                if config.data.factory
                else torchvision_dataset(config, False, rank=rank, distributed=distributed)
            )
            self.size = len(cast(Sequence[Any], dataset))
            shard_set = Subset(dataset, list(test_shard(self.size, rank, world_size)))
            options = _loader_options(config, device)
            options["persistent_workers"] = False  # evaluation runs once an epoch
            self.loader = DataLoader(shard_set, batch_size=batch_size, shuffle=False, **options)

    def __iter__(self) -> Iterator[Batch]:
        if self.split is not None:
            for start in range(0, len(self.split), self.batch_size):
                stop = start + self.batch_size
                yield normalize(self.split.images[start:stop]), self.split.labels[start:stop]
            return
        assert self.loader is not None
        non_blocking = self.device.type == "cuda"
        for images, labels in self.loader:
            yield (
                images.to(self.device, non_blocking=non_blocking),
                labels.to(self.device, non_blocking=non_blocking),
            )
