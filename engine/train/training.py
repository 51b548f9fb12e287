"""The training loop of one rank, top to bottom (in the style of nanoGPT's train.py and torchvision's
classification reference).

``train_rank`` runs in every rank process after the worker has read the plan and, for ``ddp``, joined
the process group::

    setup = set_up_rank(...)                    model, data, optimizer: the same on every rank
    for epoch in range(epochs):
        figures = train_one_epoch(setup, ...)   steps, throttled step reports (StepReporter)
        report_epoch(setup, ...)                figures reduced across ranks, then reported
        evaluate_epoch(setup, ...)              the whole test set, counted across ranks
    save_checkpoint_on_main(setup, ...)         rank 0 only

It reports through typed events only; rank 0 alone writes files other than its own events and log
(the checkpoint). Figures an epoch reports are reduced across ranks before they are reported
(``engine.train.epoch_figures``), so every rank's ``EpochEnded`` carries the same ``global_*`` values.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from engine.core.common.run_files import PRIVATE_FILE_MODE, write_atomic
from engine.core.config.schema import ConfigError, ModelConfig, RunConfig
from engine.core.plan.run_plan import RunPlan, lr_at_step
from engine.core.runs.events import (
    CheckpointSaved,
    EpochEnded,
    EpochStarted,
    Evaluation,
    EventWriter,
    PhaseStarted,
)
from engine.core.runs.rundir import RunDir
from engine.core.runs.step_reporter import StepReporter
from engine.train.data import TestBatches, TrainBatches, make_train_batches
from engine.train.divergence import DivergenceWatch
from engine.train.epoch_figures import RankEpoch, reduce_epoch
from engine.train.evaluation import broadcast_buffers, evaluate
from engine.train.faults import FaultInjector
from engine.train.image_split import Batch
from engine.train.models import build_model, prepare_model
from engine.train.rank_device import autocast, pick_device, synchronized_clock
from engine.train.step_timing import StepTimer, step_timer_for_rank

# ---- collectives ----------------------------------------------------------------------------


def set_collective_timeout(seconds: float) -> None:
    """From now on a collective that waits ``seconds`` fails this rank instead of hanging (the
    process group was made with a longer timeout for setup)."""
    c10d = dist.distributed_c10d
    setter = getattr(c10d, "set_timeout", None) or getattr(c10d, "_set_pg_timeout", None)
    if setter is not None:  # torch < 2.7 has neither: the setup timeout stays
        setter(timedelta(seconds=seconds))


# ---- checkpoint ------------------------------------------------------------------------------


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


# ---- setup -----------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class RankSetup:
    """What one rank trains with, made once by ``set_up_rank``."""

    plan: RunPlan
    rank: int
    world_size: int
    device: torch.device
    raw_model: nn.Module  # unwrapped: what DDP evaluates and rank 0 checkpoints
    model: nn.Module  # wrapped for the strategy: what trains
    train_batches: TrainBatches
    test_batches: TestBatches | None  # None without training.evaluate
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    criterion: nn.Module
    faults: FaultInjector
    divergence: DivergenceWatch
    step_reports: StepReporter
    events: EventWriter
    step_timer: StepTimer  # the step's parts, timed with global hooks (when on)

    @property
    def config(self) -> RunConfig:
        return self.plan.config

    @property
    def distributed(self) -> bool:
        return self.plan.config.strategy.name == "ddp"

    @property
    def precision(self) -> str:
        return self.plan.config.precision.mode


def build_rank_model(
    plan: RunPlan,
    device: torch.device,
    *,
    rank: int,
    model_factory: Callable[[ModelConfig], nn.Module],
) -> tuple[nn.Module, nn.Module]:
    """(the unwrapped model, the model wrapped for the strategy), from the same initial weights
    on every rank (DDP broadcasts rank 0's anyway)."""
    config = plan.config
    torch.manual_seed(config.training.seed)
    raw_model = prepare_model(
        model_factory(config.model),
        config.model,
        device=device,
        sync_batchnorm=config.strategy.name == "ddp" and config.ddp.sync_batchnorm,
    )
    model = wrap_model(raw_model, plan, device)
    # Host-side randomness from here on (PIL augmentation without workers) differs per rank.
    torch.manual_seed(config.training.seed + 1 + rank)
    return raw_model, model


def make_rank_batches(
    config: RunConfig, device: torch.device, *, rank: int, world_size: int
) -> tuple[TrainBatches, TestBatches | None]:
    """This rank's training batches and its shard of the test set (None without evaluation).
    DDP ranks share out every epoch; single and dataparallel are one replica."""
    training = config.training
    distributed = config.strategy.name == "ddp"
    data_rank, data_world = (rank, world_size) if distributed else (0, 1)
    train_batches = make_train_batches(
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
    return train_batches, test_batches


def set_up_rank(
    plan: RunPlan,
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    events: EventWriter,
    model_factory: Callable[[ModelConfig], nn.Module],
) -> RankSetup:
    """Device, model, data and optimizer of one rank, in the order that keeps every rank's
    initial weights and data the same; prints the rank's one-line description."""
    config = plan.config
    training = config.training
    device = pick_device(plan, local_rank)
    faults = FaultInjector(config.faults, rank)
    divergence = DivergenceWatch(device, rank, training.on_divergence)
    autocast(config.precision.mode, device)  # refuses fp16 without CUDA before any work
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest kernels once
    faults.in_setup()
    raw_model, model = build_rank_model(plan, device, rank=rank, model_factory=model_factory)
    train_batches, test_batches = make_rank_batches(
        config, device, rank=rank, world_size=world_size
    )
    if config.strategy.name == "ddp":  # setup is over (a download barrier may have waited minutes)
        set_collective_timeout(config.ddp.timeout_seconds)
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=plan.base_lr,
        momentum=config.optimizer.momentum,
        weight_decay=config.optimizer.weight_decay,
    )
    setup = RankSetup(
        plan=plan,
        rank=rank,
        world_size=world_size,
        device=device,
        raw_model=raw_model,
        model=model,
        train_batches=train_batches,
        test_batches=test_batches,
        optimizer=optimizer,
        scaler=torch.amp.GradScaler("cuda", enabled=config.precision.mode == "fp16"),
        criterion=nn.CrossEntropyLoss(),
        faults=faults,
        divergence=divergence,
        step_reports=StepReporter(events, rank, training.report_interval),
        events=events,
        step_timer=step_timer_for_rank(
            training.step_timing, events, rank, training.report_interval, model, device
        ),
    )
    print(
        f"rank {rank}/{world_size} on {device}: {config.model.label}, {config.strategy.name}, "
        f"{config.precision.mode}, {train_batches.steps_per_epoch} steps/epoch of "
        f"{training.batch_size}",
        flush=True,
    )
    return setup


# ---- one epoch -------------------------------------------------------------------------------


def train_step(setup: RankSetup, batch: Batch, global_step: int) -> tuple[torch.Tensor, float]:
    """One optimizer step on ``batch``; returns its loss (on the device) and its lr."""
    images, labels = batch
    if setup.config.model.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    lr = lr_at_step(setup.plan, global_step)
    for group in setup.optimizer.param_groups:
        group["lr"] = lr
    with autocast(setup.precision, setup.device):
        loss = setup.criterion(setup.model(images), labels)
    setup.optimizer.zero_grad(set_to_none=True)
    setup.faults.before_backward(global_step)
    setup.scaler.scale(loss).backward()
    setup.scaler.step(setup.optimizer)
    setup.scaler.update()
    return loss, lr


def train_one_epoch(setup: RankSetup, epoch: int, first_global_step: int) -> RankEpoch:
    """Every step of ``epoch`` (global steps from ``first_global_step``), with throttled step
    reports; the epoch's figures as this rank measured them (device-synchronised)."""
    steps = setup.train_batches.steps_per_epoch
    warmup = min(setup.config.training.warmup_steps, steps - 1) if steps > 1 else 0
    setup.events.write(EpochStarted(rank=setup.rank, epoch=epoch, steps=steps))
    setup.model.train()
    loss_sum = torch.zeros((), device=setup.device)
    images_seen = steady_images = 0
    data_wait = 0.0
    epoch_start = steady_start = synchronized_clock(setup.device)
    setup.step_reports.restart()
    setup.step_timer.restart()
    batches: Iterator[Batch] = setup.train_batches.epoch(epoch)
    for step in range(steps):
        global_step = first_global_step + step
        setup.faults.at_step(global_step)

        fetch_start = time.perf_counter()
        batch = next(batches)
        data_wait += time.perf_counter() - fetch_start
        loss, lr = train_step(setup, batch, global_step)

        loss_sum += loss.detach().float()
        setup.divergence.observe(loss, global_step)
        batch_images = batch[1].shape[0]  # one label per image
        images_seen += batch_images
        if step >= warmup:
            steady_images += batch_images
        if step + 1 == warmup:
            steady_start = synchronized_clock(setup.device)

        # step_done first: every step is counted. The epoch's last step is always reported, and
        # the run's first: where its loss began (a summary warns when it ends far above).
        due = setup.step_reports.step_done(images=batch_images)
        if due or step + 1 == steps or global_step == 0:
            setup.divergence.check(steps)
            setup.step_reports.report(
                epoch=epoch,
                step=step + 1,
                steps=steps,
                global_step=global_step + 1,
                loss=loss.item(),
                lr=lr,
            )

    epoch_end = synchronized_clock(setup.device)
    setup.step_timer.flush()  # the time to the next epoch is no step's
    return RankEpoch(
        steps=steps,
        images=images_seen,
        seconds=epoch_end - epoch_start,
        data_wait_seconds=data_wait,
        warmup_steps=warmup,
        steady_images=steady_images,
        steady_seconds=epoch_end - steady_start,
        train_loss=loss_sum.item() / steps if steps else 0.0,
    )


def report_epoch(setup: RankSetup, epoch: int, local: RankEpoch) -> None:
    """The epoch's figures, reduced across ranks first (a collective): one ``EpochEnded`` with this
    rank's and the global figures, and one line in the log."""
    reduced = reduce_epoch(local, setup.device, setup.distributed)
    setup.events.write(
        EpochEnded(
            rank=setup.rank,
            epoch=epoch,
            steps=local.steps,
            images=local.images,
            seconds=local.seconds,
            data_wait_seconds=local.data_wait_seconds,
            warmup_steps=local.warmup_steps,
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
        f"epoch {epoch + 1}/{setup.config.training.epochs}: {local.steps} steps, "
        f"{reduced.seconds:.2f} s (data {reduced.data_wait_seconds:.2f} s), "
        f"{reduced.steady_images_per_s:.0f} img/s, train loss {reduced.train_loss:.4f}",
        flush=True,
    )


# ---- evaluation and checkpoint ---------------------------------------------------------------


def evaluate_epoch(setup: RankSetup, epoch: int, test_batches: TestBatches) -> None:
    """The whole test set after ``epoch`` (collectives under DDP: every rank calls it), announced
    as a slow phase, reported as one ``Evaluation`` and one line in the log."""
    setup.events.write(PhaseStarted(rank=setup.rank, phase="evaluation"))
    setup.faults.before_evaluation(epoch)
    eval_start = synchronized_clock(setup.device)
    if setup.distributed:
        broadcast_buffers(setup.raw_model)
    # DataParallel splits test batches across its GPUs; DDP evaluates the bare module.
    dataparallel = setup.config.strategy.name == "dataparallel"
    result = evaluate(
        setup.model if dataparallel else setup.raw_model,
        test_batches,
        device=setup.device,
        precision=setup.precision,
        channels_last=setup.config.model.channels_last,
        distributed=setup.distributed,
    )
    setup.events.write(
        Evaluation(
            rank=setup.rank,
            epoch=epoch,
            accuracy=result.accuracy,
            loss=result.loss,
            samples=result.samples,
            seconds=synchronized_clock(setup.device) - eval_start,
        )
    )
    print(
        f"  test accuracy {result.accuracy:.2%} on {result.samples} images, loss {result.loss:.4f}",
        flush=True,
    )


def save_checkpoint_on_main(setup: RankSetup, run_dir: RunDir) -> None:
    """Rank 0 alone writes the checkpoint (every rank holds the same weights); the others return."""
    if setup.rank != 0:
        return
    setup.events.write(PhaseStarted(rank=setup.rank, phase="checkpoint"))
    path = run_dir.checkpoint_path
    size = save_checkpoint(setup.raw_model, path)
    setup.events.write(CheckpointSaved(rank=setup.rank, path=str(path), bytes=size))


# ---- the rank --------------------------------------------------------------------------------


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
    setup = set_up_rank(
        plan,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        events=events,
        model_factory=model_factory,
    )
    training = plan.config.training
    global_step = 0
    try:
        for epoch in range(training.epochs):
            figures = train_one_epoch(setup, epoch, global_step)
            global_step += figures.steps
            report_epoch(setup, epoch, figures)
            if setup.test_batches is not None:
                evaluate_epoch(setup, epoch, setup.test_batches)
    finally:  # global hooks: none is left behind in a process that goes on
        setup.step_timer.close()
    if training.checkpoint:
        save_checkpoint_on_main(setup, run_dir)
