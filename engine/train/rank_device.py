"""Where a rank computes and how: its device (``pick_device``, and the GPU behind it for NVML,
``gpu_index``), its precision (``autocast``) and a clock that waits for the device's queued work
(``synchronized_clock``), so a figure timed with it measures the work and not its queueing."""

from __future__ import annotations

import contextlib
import os
import time

import torch

from engine.core.config.schema import ConfigError
from engine.core.plan.run_plan import RunPlan


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
    """``time.perf_counter()`` once the device's queued work is done."""
    synchronize(device)
    return time.perf_counter()
