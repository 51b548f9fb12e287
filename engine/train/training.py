"""The training loop of one rank, top to bottom (in the style of nanoGPT's train.py and torchvision's
classification reference).

``train_rank`` runs in every rank process after the worker has read the plan and, for ``ddp``, joined
the process group. It reports through typed events only; rank 0 alone writes files other than its
own events and log (the checkpoint). Figures an epoch reports are reduced across ranks before they
are reported, so every rank's ``EpochEnded`` carries the same ``global_*`` values:

- ``global_seconds``: the slowest rank's device-synchronised epoch seconds (ranks wait for each
  other at every all-reduce, so the slowest rank is the epoch);
- ``global_data_wait_seconds``: the largest data wait of any rank;
- ``global_images``: images of all ranks;
- ``global_steady_images_per_s``: all ranks' images after the warm-up steps divided by the slowest
  rank's seconds for them;
- ``global_train_loss``: the mean of the ranks' mean losses (every rank runs the same steps).
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from engine.core.common.run_files import PRIVATE_FILE_MODE, write_atomic
from engine.core.config.schema import ConfigError, ModelConfig
from engine.core.plan.run_plan import RunPlan, lr_at_step
from engine.core.runs.events import (
    CheckpointSaved,
    EpochEnded,
    EpochStarted,
    Evaluation,
    EventWriter,
    PhaseStarted,
    StepProgress,
)
from engine.core.runs.rundir import RunDir
from engine.train.data import Batch, TestBatches, TrainBatches, make_train_batches
from engine.train.faults import FaultInjector
from engine.train.models import build_model, prepare_model

# ---- devices and precision -------------------------------------------------------------------


def pick_device(plan: RunPlan, local_rank: int) -> torch.device:
    """The device this rank computes on: ``cuda:<local_rank>`` for DDP on GPUs, ``cuda:0`` for
    single and dataparallel (the first GPU of CUDA_VISIBLE_DEVICES), else the CPU."""
    if plan.devices.kind != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"the run plans CUDA GPUs ({plan.devices.describe()}) but torch.cuda.is_available() is "
            "false in this process; check the driver and CUDA_VISIBLE_DEVICES"
        )
    index = local_rank if plan.config.strategy.name == "ddp" else 0
    return torch.device("cuda", index)


def gpu_index(device: torch.device) -> int | None:
    """NVML index of the card behind ``device``: its CUDA_VISIBLE_DEVICES entry (the launcher sets
    CUDA_DEVICE_ORDER=PCI_BUS_ID, so the orders agree); None on the CPU or for a UUID entry."""
    if device.type != "cuda":
        return None
    index = device.index or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if index < len(entries) and entries[index].isdigit():
        return int(entries[index])
    return None


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[object]:
    """fp16: CUDA autocast to float16 (with a GradScaler); bf16: autocast to bfloat16 on CUDA or the
    CPU; fp32: nothing. fp16 without CUDA is refused, as plan_run does before a run starts."""
    if precision == "fp16":
        if device.type != "cuda":
            raise ConfigError(
                "precision fp16 needs CUDA (autocast + GradScaler), and this rank runs on the "
                f"{device.type}; use bf16 or fp32"
            )
        return torch.autocast("cuda", dtype=torch.float16)
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a clock read after it measures the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synchronized_clock(device: torch.device) -> float:
    synchronize(device)
    return time.perf_counter()


# ---- collectives ----------------------------------------------------------------------------


def set_collective_timeout(seconds: float) -> None:
    """From now on a collective that waits ``seconds`` fails this rank instead of hanging (the
    process group was made with a longer timeout for setup)."""
    c10d = dist.distributed_c10d
    setter = getattr(c10d, "set_timeout", None) or getattr(c10d, "_set_pg_timeout", None)
    if setter is not None:  # torch < 2.7 has neither: the setup timeout stays
        setter(timedelta(seconds=seconds))


# ---- divergence ------------------------------------------------------------------------------


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


# ---- epoch figures ---------------------------------------------------------------------------


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

    @property
    def steady_images_per_s(self) -> float:
        return self.steady_images / self.steady_seconds if self.steady_seconds > 0 else 0.0


@dataclass(frozen=True)
class GlobalEpoch:
    images: int
    seconds: float
    data_wait_seconds: float
    steady_images_per_s: float
    train_loss: float


def reduce_epoch(local: RankEpoch, device: torch.device, distributed: bool) -> GlobalEpoch:
    """The figures of all ranks (see the module docstring for how each is reduced)."""
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


# ---- evaluation ------------------------------------------------------------------------------


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


def save_checkpoint(model: nn.Module, path: Path) -> int:
    """``state_dict`` of the unwrapped model, written atomically and readable by its owner only;
    returns its size in bytes. A failed write (a full disk) leaves no temporary file and raises
    WriteFailed naming the path and the free space."""
    # Serialised in memory first: torch's writer turns a full disk into a RuntimeError that no
    # longer says which errno it was.
    data = io.BytesIO()
    torch.save(model.state_dict(), data)
    write_atomic(path, data.getvalue(), PRIVATE_FILE_MODE)
    return path.stat().st_size


# ---- the loop --------------------------------------------------------------------------------


def wrap_model(model: nn.Module, plan: RunPlan, device: torch.device) -> nn.Module:
    """The strategy: DDP (gradients all-reduced in backward), DataParallel, or the model itself."""
    strategy = plan.config.strategy.name
    if strategy == "ddp":
        return DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=plan.config.ddp.gradient_as_bucket_view,
        )
    if strategy == "dataparallel":
        if device.type != "cuda":
            raise ConfigError(
                "strategy dataparallel needs CUDA GPUs (nn.DataParallel splits batches across "
                "GPUs); use ddp for several CPU ranks"
            )
        return nn.DataParallel(model, device_ids=list(range(plan.device_count)))
    return model


def train_rank(
    run_dir: RunDir,
    plan: RunPlan,
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    events: EventWriter,
    model_factory: Callable[[ModelConfig], nn.Module] = build_model,
) -> None:
    """Train one rank as ``plan`` says. For ``ddp`` the process group must be initialised.

    ``model_factory`` builds the unwrapped model after the seed is set (so every rank starts from
    the same weights); the default is the configured model. Tests pass a SmallCNN without
    BatchNorm.
    """
    config = plan.config
    training = config.training
    precision = config.precision.mode
    distributed = config.strategy.name == "ddp"
    is_main = rank == 0
    device = pick_device(plan, local_rank)
    faults = FaultInjector(config.faults, rank)
    divergence = DivergenceWatch(device, rank, training.on_divergence)
    autocast(precision, device)  # refuses fp16 without CUDA before any work
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest kernels once

    # Model: the same initial weights on every rank (DDP broadcasts rank 0's anyway).
    torch.manual_seed(training.seed)
    raw_model = model_factory(config.model)
    raw_model = prepare_model(
        raw_model,
        config.model,
        device=device,
        sync_batchnorm=distributed and config.ddp.sync_batchnorm,
    )
    model = wrap_model(raw_model, plan, device)
    # Host-side randomness from here on (PIL augmentation without workers) differs per rank.
    torch.manual_seed(training.seed + 1 + rank)

    # Data: DDP ranks share out every epoch; single and dataparallel are one replica.
    data_rank, data_world = (rank, world_size) if distributed else (0, 1)
    train_batches: TrainBatches = make_train_batches(
        config,
        batch_size=training.batch_size,
        rank=data_rank,
        world_size=data_world,
        device=device,
        distributed=distributed,
    )
    if train_batches.steps_per_epoch == 0:
        raise ConfigError(
            f"training.batch_size {training.batch_size} is more than the "
            f"{len(train_batches.sampler)} training images each of the {data_world} "
            "replica(s) gets per epoch, so an epoch has no full batch; use a smaller batch or "
            "more data"
        )
    test_batches = (
        TestBatches(
            config,
            batch_size=training.batch_size,
            rank=data_rank,
            world_size=data_world,
            device=device,
            distributed=distributed,
        )
        if training.evaluate
        else None
    )

    if distributed:  # setup is over (a download barrier may have waited minutes)
        set_collective_timeout(config.ddp.timeout_seconds)

    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=plan.base_lr,
        momentum=config.optimizer.momentum,
        weight_decay=config.optimizer.weight_decay,
    )
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    criterion = nn.CrossEntropyLoss()
    channels_last = config.model.channels_last
    print(
        f"rank {rank}/{world_size} on {device}: {config.model.label}, {config.strategy.name}, "
        f"{precision}, {train_batches.steps_per_epoch} steps/epoch of {training.batch_size}",
        flush=True,
    )

    global_step = 0
    for epoch in range(training.epochs):
        steps = train_batches.steps_per_epoch
        warmup = min(training.warmup_steps, steps - 1) if steps > 1 else 0
        events.write(EpochStarted(rank=rank, epoch=epoch, steps=steps))
        model.train()
        loss_sum = torch.zeros((), device=device)
        images_seen = steady_images = 0
        data_wait = 0.0
        epoch_start = steady_start = synchronized_clock(device)
        last_report, images_at_report, step_at_report = time.perf_counter(), 0, 0
        batches: Iterator[Batch] = train_batches.epoch(epoch)
        for step in range(steps):
            faults.at_step(global_step)

            fetch_start = time.perf_counter()
            images, labels = next(batches)
            data_wait += time.perf_counter() - fetch_start
            if channels_last:
                images = images.contiguous(memory_format=torch.channels_last)

            lr = lr_at_step(plan, global_step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            with autocast(precision, device):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            faults.before_backward(global_step)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

            loss_sum += loss.detach().float()
            divergence.observe(loss, global_step)
            batch_images = labels.shape[0]
            images_seen += batch_images
            if step >= warmup:
                steady_images += batch_images
            global_step += 1
            if step + 1 == warmup:
                steady_start = synchronized_clock(device)

            now = time.perf_counter()
            if now - last_report >= training.report_interval or step + 1 == steps:
                divergence.check(steps)
                elapsed = max(now - last_report, 1e-9)
                events.write(
                    StepProgress(
                        rank=rank,
                        epoch=epoch,
                        step=step + 1,
                        steps=steps,
                        global_step=global_step,
                        loss=loss.item(),
                        images_per_s=(images_seen - images_at_report) / elapsed,
                        step_seconds=elapsed / (step + 1 - step_at_report),
                        lr=lr,
                    )
                )
                last_report, images_at_report, step_at_report = now, images_seen, step + 1

        epoch_end = synchronized_clock(device)
        local = RankEpoch(
            steps=steps,
            images=images_seen,
            seconds=epoch_end - epoch_start,
            data_wait_seconds=data_wait,
            warmup_steps=warmup,
            steady_images=steady_images,
            steady_seconds=epoch_end - steady_start,
            train_loss=loss_sum.item() / steps if steps else 0.0,
        )
        reduced = reduce_epoch(local, device, distributed)
        events.write(
            EpochEnded(
                rank=rank,
                epoch=epoch,
                steps=steps,
                images=local.images,
                seconds=local.seconds,
                data_wait_seconds=local.data_wait_seconds,
                warmup_steps=warmup,
                steady_images_per_s=local.steady_images_per_s,
                train_loss=local.train_loss,
                global_images=reduced.images,
                global_seconds=reduced.seconds,
                global_data_wait_seconds=reduced.data_wait_seconds,
                global_steady_images_per_s=reduced.steady_images_per_s,
                global_train_loss=reduced.train_loss,
            )
        )
        print(
            f"epoch {epoch + 1}/{training.epochs}: {steps} steps, {reduced.seconds:.2f} s "
            f"(data {reduced.data_wait_seconds:.2f} s), {reduced.steady_images_per_s:.0f} img/s, "
            f"train loss {reduced.train_loss:.4f}",
            flush=True,
        )

        if test_batches is not None:
            events.write(PhaseStarted(rank=rank, phase="evaluation"))
            eval_start = synchronized_clock(device)
            if distributed:
                broadcast_buffers(raw_model)
            # DataParallel splits test batches across its GPUs; DDP evaluates the bare module.
            eval_model = model if config.strategy.name == "dataparallel" else raw_model
            result = evaluate(
                eval_model,
                test_batches,
                device=device,
                precision=precision,
                channels_last=channels_last,
                distributed=distributed,
            )
            events.write(
                Evaluation(
                    rank=rank,
                    epoch=epoch,
                    accuracy=result.accuracy,
                    loss=result.loss,
                    samples=result.samples,
                    seconds=synchronized_clock(device) - eval_start,
                )
            )
            print(
                f"  test accuracy {result.accuracy:.2%} on {result.samples} images, "
                f"loss {result.loss:.4f}",
                flush=True,
            )

    if training.checkpoint and is_main:
        events.write(PhaseStarted(rank=rank, phase="checkpoint"))
        path = run_dir.checkpoint_path
        size = save_checkpoint(raw_model, path)
        events.write(CheckpointSaved(rank=rank, path=str(path), bytes=size))
