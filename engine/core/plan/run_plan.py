"""Decide, before anything starts, whether a config can run on this machine, and how.

Plain Python. ``plan_run`` resolves the device set, the world size, the global batch, the backend
and the learning rate, and refuses (ConfigError, one sentence with the reason) any combination that
cannot run here: fp16 or dataparallel without CUDA, a batch DataParallel cannot split evenly, a
batch larger than a rank's share of the training images, a missing CIFAR-10 directory, more GPUs
than the machine has.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.core.common.config_error import ConfigError
from engine.core.config.devices import DevicePlan, resolve_devices
from engine.core.config.schema import RunConfig
from engine.core.config.user_code import check_user_code

CIFAR_DIRNAME = "cifar-10-batches-py"
CIFAR_TRAIN_IMAGES = 50_000


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig
    devices: DevicePlan
    world_size: int  # processes (ranks)
    global_batch: int  # images per optimiser step across all ranks
    backend: str | None  # "nccl" | "gloo" for ddp, None otherwise
    base_lr: float  # after linear scaling, before warm-up

    @property
    def device_count(self) -> int:
        return self.devices.device_count


def dataset_root(config: RunConfig) -> Path:
    return Path(os.path.expanduser(config.data.root))


def check_dataset(config: RunConfig) -> None:
    """CIFAR-10 must be on disk unless the preset asks to download it (or brings its own data)."""
    if config.data.dataset != "cifar10" or config.data.download or config.data.factory:
        return
    root = dataset_root(config)
    if not (root / CIFAR_DIRNAME / "batches.meta").exists():
        raise ConfigError(
            f"CIFAR-10 is not at {root / CIFAR_DIRNAME}; put the python version of the data set "
            "there, set data.root to where it is, allow data.download = true where the internet is "
            "reachable, or use --data synthetic",
            key="data.root",
            reason="CIFAR-10 is not on disk",
        )


def train_images(config: RunConfig) -> int | None:
    """How many training images the data set has; None for data of the user's own (a factory's,
    or a script's), whose size is known only once it runs."""
    if config.script.given or config.data.factory:
        return None
    return CIFAR_TRAIN_IMAGES if config.data.dataset == "cifar10" else config.data.train_size


def check_batch_fits(config: RunConfig, replicas: int) -> None:
    """Each replica's share of the training images (a DistributedSampler's, full batches only)
    must hold one batch, or an epoch has no step: refused here, before any rank starts."""
    images = train_images(config)
    batch = config.training.batch_size
    if images is None:
        return
    share = images // replicas
    if batch > share:
        each = f"each of the {replicas} ranks gets" if replicas > 1 else "the run has"
        raise ConfigError(
            f"training.batch_size {batch} is more than the {share} training images {each} per "
            f"epoch ({images} in all), so an epoch would have no full batch; use a batch of at "
            f"most {share} or more data",
            key="training.batch_size",
            reason=f"batch {batch} is more than the {share} images a rank gets",
        )


def plan_run(config: RunConfig, gpu_count: int) -> RunPlan:
    """Resolve and check ``config`` for a machine with ``gpu_count`` GPUs (as NVML counts them)."""
    check_user_code(config)
    strategy = config.strategy.name
    devices = resolve_devices(config.devices.spec, strategy, gpu_count)
    precision = config.precision.mode
    if strategy == "dataparallel" and devices.kind != "cuda":
        raise ConfigError(
            "strategy dataparallel needs CUDA GPUs (nn.DataParallel splits batches across GPUs), "
            "and this run would use the CPU; use ddp for several CPU ranks",
            key="strategy.name",
            reason="strategy dataparallel needs CUDA",
        )
    if precision == "fp16" and devices.kind != "cuda":
        raise ConfigError(
            "precision fp16 needs CUDA (autocast + GradScaler), and this run would use the CPU; "
            "use bf16 or fp32 on the CPU",
            key="precision.mode",
            reason="precision fp16 needs CUDA",
        )
    if strategy == "single" and devices.device_count != 1:
        raise ConfigError(
            f"strategy single uses one device, but the device set {devices.describe()} has "
            f"{devices.device_count}; use ddp or dataparallel for several",
            key="devices.spec",
            reason=f"strategy single uses one device, not {devices.device_count}",
        )
    batch = config.training.batch_size
    if strategy == "dataparallel":
        n = devices.device_count
        if batch % n:
            raise ConfigError(
                f"training.batch_size {batch} does not divide by the {n} GPUs of dataparallel; "
                f"use a multiple of {n}",
                key="training.batch_size",
                reason=f"batch {batch} does not divide by {n} GPUs",
            )
        world_size, global_batch = 1, batch
    elif strategy == "ddp":
        world_size = devices.device_count
        global_batch = batch * world_size
    else:
        world_size, global_batch = 1, batch
    backend = None
    if strategy == "ddp":
        backend = config.ddp.backend
        if backend == "auto":
            backend = "nccl" if devices.kind == "cuda" else "gloo"
        if backend == "nccl" and devices.kind != "cuda":
            raise ConfigError(
                "ddp.backend nccl needs CUDA GPUs; use gloo (or auto) on the CPU",
                key="ddp.backend",
                reason="ddp.backend nccl needs CUDA",
            )
        if config.ddp.sync_batchnorm and devices.kind != "cuda":
            raise ConfigError(
                "ddp.sync_batchnorm needs CUDA: torch's SyncBatchNorm only runs on GPU modules; "
                "set ddp.sync_batchnorm = false for CPU ranks",
                key="ddp.sync_batchnorm",
                reason="ddp.sync_batchnorm needs CUDA",
            )
    check_dataset(config)
    check_batch_fits(config, world_size if strategy == "ddp" else 1)
    lr = config.optimizer.lr
    if config.optimizer.lr_scaling == "linear":
        lr = lr * global_batch / config.optimizer.reference_batch
    return RunPlan(
        config=config,
        devices=devices,
        world_size=world_size,
        global_batch=global_batch,
        backend=backend,
        base_lr=lr,
    )


def lr_at_step(plan: RunPlan, global_step: int) -> float:
    """Learning rate for an optimiser step: linear warm-up to ``base_lr`` when scaling is linear."""
    warmup = plan.config.optimizer.warmup_steps
    if plan.config.optimizer.lr_scaling == "linear" and warmup > 0 and global_step < warmup:
        return plan.base_lr * (global_step + 1) / warmup
    return plan.base_lr
