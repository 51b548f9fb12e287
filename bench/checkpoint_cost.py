"""What a resumable checkpoint costs a run: seconds per checkpoint of resnet18 (CIFAR head) on the
CPU, the engine's (``engine.train.checkpoint``: model, SGD momentum, GradScaler, position, RNG
states, serialised in memory, written atomically and fsynced) against a plain
``torch.save(model.state_dict(), path)`` in the same process, interleaved, after real steps (so
the optimizer holds its momentum buffers); and its share of the run at the default interval
(``training.checkpoint_every = "10m"``: one checkpoint per 600 s of steps) and at one per epoch of
cpu-demo's size, from the step time measured here.

    .venv/bin/python bench/checkpoint_cost.py              # about a minute on 2 cores
    .venv/bin/python bench/checkpoint_cost.py --rounds 9 --batch 64

Run on demand; never as a timed test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from engine.core.config.schema import ModelConfig
from engine.train.checkpoint import (
    TrainingPosition,
    checkpoint_payload,
    gather_rng_states,
    save_checkpoint,
)
from engine.train.models import build_model


def train_steps(
    model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, batch: int
) -> float:
    """Median seconds of one SGD step on random CIFAR-shaped images."""
    criterion = nn.CrossEntropyLoss()
    images, labels = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) if len(times) > 1 else times[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    model = build_model(ModelConfig(name="resnet18"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    step_seconds = train_steps(model, optimizer, args.steps, args.batch)
    engine, plain = [], []
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir=".") as folder:
        for round_ in range(args.rounds):
            position = TrainingPosition(1, 0, 100 + round_, 100)
            for first in (True, False) if round_ % 2 == 0 else (False, True):
                path = Path(folder, "engine.pt" if first else "plain.pt")
                start = time.perf_counter()
                if first:
                    payload = checkpoint_payload(
                        raw_model=model,
                        optimizer=optimizer,
                        scaler=scaler,
                        position=position,
                        rng=gather_rng_states(0, 1, distributed=False),
                        model_label="resnet18",
                    )
                    save_checkpoint(payload, path)
                    engine.append(time.perf_counter() - start)
                else:
                    torch.save(model.state_dict(), path)
                    plain.append(time.perf_counter() - start)
        sizes = {p.name: p.stat().st_size for p in Path(folder).iterdir()}
    engine_s, plain_s = statistics.median(engine), statistics.median(plain)
    print(f"resnet18, batch {args.batch}: {step_seconds:.3f} s a step on the CPU")
    print(
        f"engine checkpoint {engine_s:.3f} s ({sizes['engine.pt'] / 2**20:.1f} MiB), "
        f"plain torch.save {plain_s:.3f} s ({sizes['plain.pt'] / 2**20:.1f} MiB), "
        f"median of {args.rounds}; min {min(engine):.3f} / {min(plain):.3f} s"
    )
    print(f"share of the run at one per 10 minutes: {engine_s / (600 + engine_s):.3%}")
    steps_per_epoch = 46  # cpu-demo's epoch on 2 ranks of 128: one per epoch at that size
    epoch_s = steps_per_epoch * step_seconds
    print(
        f"share at one per epoch of {steps_per_epoch} steps ({epoch_s:.1f} s): "
        f"{engine_s / (epoch_s + engine_s):.2%}"
    )


if __name__ == "__main__":
    main()
