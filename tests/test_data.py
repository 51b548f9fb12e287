"""Data sets (engine.train.synthetic_data), augmentation, sampling and pipelines (engine.train.data),
in one process."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from engine.core.config.schema import RunConfig
from engine.core.config.toml_io import apply_overrides
from engine.train import data
from engine.train.image_split import ImageSplit
from engine.train.synthetic_data import synthetic_split

CPU = torch.device("cpu")


def make_config(**overrides: object) -> RunConfig:
    base = {"data.dataset": "synthetic", "data.train_size": 600, "data.test_size": 101}
    return apply_overrides(RunConfig(name="test"), {**base, **overrides})


# ---- synthetic data set ----------------------------------------------------------------------


def test_synthetic_split_is_cifar_shaped_and_deterministic() -> None:
    split = synthetic_split(True, 1000)
    again = synthetic_split(True, 1000)
    assert split.images.shape == (1000, 3, 32, 32)
    assert split.images.dtype == torch.uint8
    assert split.labels.dtype == torch.int64
    assert set(split.labels.tolist()) == set(range(10))
    assert torch.equal(split.images, again.images)
    assert torch.equal(split.labels, again.labels)
    # A longer split starts with the shorter one: train_size only truncates the draw.
    assert torch.equal(synthetic_split(True, 1500).labels[:1000], split.labels)


def test_synthetic_data_does_not_depend_on_the_training_seed() -> None:
    torch.manual_seed(1)
    a = synthetic_split(False, 200)
    torch.manual_seed(2)
    b = synthetic_split(False, 200)
    assert torch.equal(a.images, b.images)


def test_synthetic_train_and_test_are_different_draws() -> None:
    train = synthetic_split(True, 500)
    test = synthetic_split(False, 500)
    assert not torch.equal(train.images, test.images)
    # Same distribution: the per-channel means agree to a grey level or two.
    assert torch.allclose(
        train.images.float().mean(dim=(0, 2, 3)), test.images.float().mean(dim=(0, 2, 3)), atol=3
    )


def test_synthetic_50k_is_generated_in_well_under_a_second() -> None:
    synthetic_split(False, 10)  # the class bank is made once per process
    start = time.perf_counter()
    split = synthetic_split(True, 50_000)
    seconds = time.perf_counter() - start
    assert len(split) == 50_000
    # ~0.2 s measured on 2 cores; the bound leaves room for a loaded CI machine.
    assert seconds < 1.0, f"50,000 synthetic images took {seconds:.2f} s"


def test_mean_colour_does_not_tell_the_class() -> None:
    """A nearest-class-mean classifier on the mean colour is near chance (10 %)."""
    train = synthetic_split(True, 5000)
    test = synthetic_split(False, 2000)
    colour = train.images.float().mean(dim=(2, 3))
    centroids = torch.stack([colour[train.labels == c].mean(0) for c in range(10)])
    test_colour = test.images.float().mean(dim=(2, 3))
    predicted = torch.cdist(test_colour, centroids).argmin(dim=1)
    accuracy = (predicted == test.labels).float().mean().item()
    assert accuracy < 0.2


def test_a_linear_model_of_the_pixels_does_not_tell_the_class() -> None:
    """Ridge regression on raw pixels (one-hot targets, solved in its dual form) stays near
    chance: the class is a texture at a random phase, which takes spatial features to see."""
    train = synthetic_split(True, 2000)
    test = synthetic_split(False, 1000)
    x = data.normalize(train.images).flatten(1)
    dual = torch.linalg.solve(x @ x.T + 10.0 * torch.eye(len(x)), F.one_hot(train.labels).float())
    scores = data.normalize(test.images).flatten(1) @ (x.T @ dual)
    assert (scores.argmax(dim=1) == test.labels).float().mean().item() < 0.2


def test_class_signal_survives_crop_and_flip() -> None:
    """Class templates stay closer to their own class than to any other after augmentation: the
    nearest class-mean of augmented, mean-removed images is mostly right."""
    train = synthetic_split(True, 3000)
    x = data.augment(train.images, torch.arange(3000), seed=0, epoch=0)
    x = x - x.mean(dim=(2, 3), keepdim=True)
    # Power spectrum: phase-free, so it compares textures whatever their shift.
    spectrum = torch.fft.rfft2(x).abs().flatten(1)
    centroids = torch.stack([spectrum[train.labels == c].mean(0) for c in range(10)])
    predicted = torch.cdist(spectrum, centroids).argmin(dim=1)
    assert (predicted == train.labels).float().mean().item() > 0.6


def test_load_split_uses_configured_sizes() -> None:
    config = make_config()
    assert len(data.load_split(config, True)) == 600
    assert len(data.load_split(config, False)) == 101


# ---- tensor augmentation ---------------------------------------------------------------------


def test_augment_shapes_and_range() -> None:
    images = synthetic_split(True, 64).images
    out = data.augment(images, torch.arange(64), seed=0, epoch=0)
    assert out.shape == (64, 3, 32, 32)
    assert out.dtype == torch.float32
    assert out.min() >= -1.0 and out.max() <= 1.0


def test_augment_is_random_crop_with_padding_and_flip() -> None:
    images = synthetic_split(True, 32).images
    indices = torch.arange(100, 132)
    out = data.augment(images, indices, seed=3, epoch=2)
    dy, dx, flip = data.augmentation_params(indices, seed=3, epoch=2)
    padded = F.pad(images, (4, 4, 4, 4))
    for i in range(32):
        expected = padded[i, :, dy[i] : dy[i] + 32, dx[i] : dx[i] + 32]
        if flip[i]:
            expected = expected.flip(-1)
        assert torch.equal(out[i], data.normalize(expected))
    # Crops range over the 9 x 9 offsets, and both flips occur.
    params = data.augmentation_params(torch.arange(5000), seed=0, epoch=0)
    assert set(params[0].tolist()) == set(range(9)) == set(params[1].tolist())
    assert 0.4 < params[2].float().mean().item() < 0.6


def test_augmentation_depends_on_seed_epoch_and_index_only() -> None:
    images = synthetic_split(True, 16).images
    indices = torch.arange(500, 516)
    whole = data.augment(images, indices, seed=0, epoch=1)
    # The same samples in another batch composition (other order, split in two) are augmented alike.
    order = torch.randperm(16)
    first, second = order[:5], order[5:]
    part_a = data.augment(images[first], indices[first], seed=0, epoch=1)
    part_b = data.augment(images[second], indices[second], seed=0, epoch=1)
    assert torch.equal(whole[first], part_a)
    assert torch.equal(whole[second], part_b)
    # Another epoch or seed gives other crops.
    assert not torch.equal(whole, data.augment(images, indices, seed=0, epoch=2))
    assert not torch.equal(whole, data.augment(images, indices, seed=1, epoch=1))


def test_normalize_matches_to_tensor_and_normalize() -> None:
    from PIL import Image

    images = synthetic_split(False, 4).images
    transform = data.torchvision_transform(train=False)
    for i in range(4):
        pil = Image.fromarray(images[i].permute(1, 2, 0).numpy())
        torch.testing.assert_close(transform(pil), data.normalize(images[i]))


# ---- sampling --------------------------------------------------------------------------------


def test_ranks_partition_each_epoch_and_order_changes() -> None:
    size, world = 1001, 2
    for epoch in range(3):
        whole = data.epoch_indices(size, epoch, seed=5, rank=0, world_size=1)
        shards = [
            data.epoch_indices(size, epoch, seed=5, rank=r, world_size=world) for r in range(2)
        ]
        assert set(shards[0]).isdisjoint(shards[1])
        assert len(shards[0]) == len(shards[1]) == 500  # drop_last: no padding duplicates
        # The ranks share out the one-replica permutation: its first 1000 samples.
        assert set(shards[0]) | set(shards[1]) == set(whole[:1000])
        assert sorted(whole) == list(range(size))
    assert data.epoch_indices(size, 0, 5, 0, 2) != data.epoch_indices(size, 1, 5, 0, 2)
    assert data.epoch_indices(size, 0, 5, 0, 1) != data.epoch_indices(size, 0, 6, 0, 1)


def test_single_batch_is_the_union_of_the_ranks_batches() -> None:
    """Step k of one process with batch 2b holds exactly the samples of step k on 2 ranks of b."""
    split = synthetic_split(True, 500)
    split = ImageSplit(split.images, torch.arange(500))  # label = sample index
    single = data.TensorTrainBatches(split, batch_size=32, seed=7, rank=0, world_size=1, device=CPU)
    ranks = [
        data.TensorTrainBatches(split, batch_size=16, seed=7, rank=r, world_size=2, device=CPU)
        for r in range(2)
    ]
    assert single.steps_per_epoch == ranks[0].steps_per_epoch == 15
    for epoch in range(2):
        rank_batches = [list(r.epoch(epoch)) for r in ranks]
        for step, (images, labels) in enumerate(single.epoch(epoch)):
            parts = [rank_batches[r][step] for r in range(2)]
            assert set(labels.tolist()) == set(parts[0][1].tolist()) | set(parts[1][1].tolist())
            # Augmentation follows the sample, whichever rank gets it.
            by_index = {int(i): img for i, img in zip(labels, images, strict=True)}
            for part_images, part_labels in parts:
                for img, i in zip(part_images, part_labels, strict=True):
                    assert torch.equal(img, by_index[int(i)])


def test_max_steps_truncates_each_epoch() -> None:
    split = synthetic_split(True, 500)
    batches = data.TensorTrainBatches(
        split, batch_size=10, seed=0, rank=0, world_size=1, device=CPU, max_steps=3
    )
    assert batches.steps_per_epoch == 3
    assert len(list(batches.epoch(0))) == 3


def test_test_shards_cover_each_sample_once() -> None:
    for size, world in ((1001, 2), (10, 3), (7, 4)):
        seen = [i for r in range(world) for i in data.test_shard(size, r, world)]
        assert sorted(seen) == list(range(size))


@pytest.mark.parametrize("pipeline", ["tensor", "torchvision"])
def test_test_batches_shard_the_full_test_set(pipeline: str) -> None:
    config = make_config(**{"data.pipeline": pipeline, "data.num_workers": 0})
    counts = []
    for rank in range(2):
        batches = data.TestBatches(
            config, batch_size=16, rank=rank, world_size=2, device=CPU, distributed=False
        )
        shapes = [images.shape[0] for images, _ in batches]
        counts.append(sum(shapes))
    assert counts == [51, 50]


def test_test_pipelines_agree_and_do_not_augment() -> None:
    tensor = make_config(**{"data.pipeline": "tensor"})
    pil = make_config(**{"data.pipeline": "torchvision", "data.num_workers": 0})
    a = list(
        data.TestBatches(tensor, batch_size=64, rank=0, world_size=1, device=CPU, distributed=False)
    )
    b = list(
        data.TestBatches(pil, batch_size=64, rank=0, world_size=1, device=CPU, distributed=False)
    )
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        torch.testing.assert_close(xa, xb)
        assert torch.equal(ya, yb)


def test_torchvision_train_pipeline_yields_augmented_batches() -> None:
    config = make_config(**{"data.pipeline": "torchvision", "data.num_workers": 0})
    batches = data.make_train_batches(
        config, batch_size=32, rank=0, world_size=1, device=CPU, distributed=False
    )
    assert batches.steps_per_epoch == 600 // 32
    images, labels = next(iter(batches.epoch(0)))
    assert images.shape == (32, 3, 32, 32) and labels.shape == (32,)
    assert images.min() >= -1.0 and images.max() <= 1.0


def test_torchvision_pipeline_with_workers_ends_them() -> None:
    config = make_config(**{"data.pipeline": "torchvision", "data.num_workers": 1})
    batches = data.make_train_batches(
        config, batch_size=100, rank=0, world_size=1, device=CPU, distributed=False
    )
    for epoch in range(2):
        assert len(list(batches.epoch(epoch))) == 6
    assert isinstance(batches, data.TorchvisionTrainBatches)
    del batches  # persistent workers end with the loader; the process reaper checks
