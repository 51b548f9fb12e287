"""What one rank trains with, made once before its first step (``set_up_rank``): device, model
wrapped for the strategy, data, optimizer, GradScaler, faults and reporters, in the order that
keeps every rank's initial weights and data the same. The loop that uses it is
``engine.train.training``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from engine.core.config.schema import ConfigError, ModelConfig, RunConfig
from engine.core.plan.run_plan import RunPlan
from engine.core.runs.events import EventWriter
from engine.core.runs.step_reporter import StepReporter
from engine.train.data import TestBatches, TrainBatches, make_train_batches
from engine.train.divergence import DivergenceWatch
from engine.train.faults import FaultInjector
from engine.train.models import prepare_model
from engine.train.rank_device import autocast, pick_device
from engine.train.step_timing import StepTimer, step_timer_for_rank

# ---- collectives ----------------------------------------------------------------------------


def set_collective_timeout(seconds: float) -> None:
    """From now on a collective that waits ``seconds`` fails this rank instead of hanging (the
    process group was made with a longer timeout for setup)."""
    c10d = dist.distributed_c10d
    setter = getattr(c10d, "set_timeout", None) or getattr(c10d, "_set_pg_timeout", None)
    if setter is not None:  # torch < 2.7 has neither: the setup timeout stays
        setter(timedelta(seconds=seconds))


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


@dataclass
class StepCounter:
    """The global step (from 0) this rank is taking, where its owner can read it after a failure:
    the step a ``RankFailed`` names (None before the first)."""

    global_step: int | None = None


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
    counter: StepCounter  # the step being taken, for whoever reports a failure

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
    attempt: int = 1,
    counter: StepCounter | None = None,
) -> RankSetup:
    """Device, model, data and optimizer of one rank, in the order that keeps every rank's
    initial weights and data the same; prints the rank's one-line description. ``attempt``: the
    run's attempt (which faults fire)."""
    config = plan.config
    training = config.training
    device = pick_device(plan, local_rank)
    faults = FaultInjector(config.faults, rank, attempt)
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
        counter=counter or StepCounter(),
    )
    print(
        f"rank {rank}/{world_size} on {device}: {config.model.label}, {config.strategy.name}, "
        f"{config.precision.mode}, {train_batches.steps_per_epoch} steps/epoch of "
        f"{training.batch_size}",
        flush=True,
    )
    return setup
