"""A bare, hand-written PyTorch training loop: the baseline ``bench/engine_overhead.py`` holds the
engine to. It is the tutorial's loop and nothing else: no events, no supervision, no lr schedule.

- Started by ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK in the environment) it is the tutorial's
  DDP script: ``init_process_group(init_method="env://")``, a ``DistributedSampler`` with
  ``set_epoch`` every epoch, ``DistributedDataParallel(model)``.
- Started plainly (``python bench/plain_ddp.py``) it is the tutorial's single-process loop.

Only the model and the data come from the engine (``engine.train.models.build_model``,
``engine.train.synthetic_data.synthetic_split`` + ``engine.train.data.augment``), so the comparison is of the training
loops, on the same model, batch, images and augmentation. Throughput is measured the way the engine
measures it: the last epoch, after the first ``--warmup-steps`` steps, all ranks' images over the
slowest rank's seconds. Rank 0 prints one JSON line.

    python bench/plain_ddp.py --threads 2
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 bench/plain_ddp.py --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.core.config.schema import ModelConfig
from engine.train.data import augment
from engine.train.models import build_model
from engine.train.synthetic_data import synthetic_split


def plain_training(
    *,
    model_name: str,
    batch_size: int,
    train_size: int,
    epochs: int,
    warmup_steps: int,
    lr: float,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[int, float, float]:
    """The tutorial's loop. Returns this rank's (images, seconds) of the last epoch after the
    warm-up steps, and the last loss. Under torchrun the process group must be up."""
    torch.manual_seed(seed)
    model: nn.Module = build_model(ModelConfig(name=model_name))
    if dist.is_available() and dist.is_initialized():
        model = DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    data = synthetic_split(True, train_size)
    sampler: DistributedSampler[int] = DistributedSampler(
        range(train_size),  # type: ignore[arg-type]
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
        seed=seed,
        drop_last=True,
    )
    steps = len(sampler) // batch_size

    steady_images, steady_seconds = 0, 0.0
    loss = torch.zeros(())
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.int64)
        model.train()
        start = time.perf_counter()
        for step in range(steps):
            indices = order[step * batch_size : (step + 1) * batch_size]
            images = augment(data.images[indices], indices, seed, epoch)
            labels = data.labels[indices]
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            if step + 1 == warmup_steps:
                start = time.perf_counter()
        steady_seconds = time.perf_counter() - start
        steady_images = (steps - warmup_steps) * batch_size
    return steady_images, steady_seconds, float(loss.item())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--batch-size", type=int, default=128, help="per process")
    parser.add_argument("--train-size", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group(backend="gloo", init_method="env://")
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        rank, world_size = 0, 1

    steady_images, steady_seconds, loss = plain_training(
        model_name=args.model,
        batch_size=args.batch_size,
        train_size=args.train_size,
        epochs=args.epochs,
        warmup_steps=args.warmup_steps,
        lr=args.lr,
        seed=args.seed,
        rank=rank,
        world_size=world_size,
    )
    if distributed:
        figures = torch.tensor([steady_seconds], dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        steady_seconds = float(figures.item())
        steady_images *= world_size
        dist.destroy_process_group()
    if rank == 0:
        print(
            json.dumps(
                {
                    "world_size": world_size,
                    "threads": torch.get_num_threads(),
                    "steady_images_per_s": steady_images / steady_seconds,
                    "last_loss": loss,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
