"""Refuse, before anything starts, a plan whose ranks cannot fit on this machine.

Plain Python (the UI calls it on every change of the launch form): the machine is read through
``engine.core.host.capacity`` (usable cores, available memory: ``os``, ``psutil``, the memory
cgroup files) and NVML (``engine.core.host.gpus``), never from torch. The rules:

- CPU ranks: at most ``CPU_RANKS_PER_CORE`` per usable core, unless the config sets
  ``devices.oversubscribe = true``;
- host memory: the run's estimated peak (``engine.core.plan.memory_estimate``) must fit in what is available
  now: the kernel's available memory, or the memory cgroup's limit minus its usage where that is
  less. No override: a run that does not fit is killed by the kernel, or takes the machine down;
- GPUs: each chosen GPU must have the estimated device memory free. A GPU that other processes
  hold but that has room is a warning, not a refusal. Without NVML the GPU rules are skipped.

Every refusal is a ``ResourceError`` (a ``ConfigError``), one sentence with the figures, so every
caller that already turns a ConfigError into "exit code 2, nothing started" does so here too.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.common.config_error import ConfigError
from engine.core.common.formatting import format_bytes
from engine.core.host.capacity import available_memory_bytes, usable_cores
from engine.core.host.gpus import GpuInventory, GpuSample, sample_gpus
from engine.core.plan.memory_estimate import MemoryEstimate, estimate_memory
from engine.core.plan.run_plan import RunPlan

CPU_RANKS_PER_CORE = 4


class ResourceError(ConfigError):
    """The plan's ranks cannot fit on this machine; the message names what and the figures."""


@dataclass(frozen=True)
class ResourceCheck:
    """A plan that fits, with the figures it was judged by (bytes) and what to warn about."""

    estimate: MemoryEstimate
    available_bytes: int  # host memory available when checked
    cores: int  # usable CPU cores
    warnings: tuple[str, ...] = ()

    @property
    def host_bytes(self) -> int:
        return self.estimate.host_bytes

    @property
    def device_bytes_per_gpu(self) -> int:
        return self.estimate.device_bytes_per_gpu


# ---- the rules ---------------------------------------------------------------------------------


def _check_cpu_ranks(plan: RunPlan, cores: int) -> None:
    ranks = plan.world_size
    limit = CPU_RANKS_PER_CORE * cores
    if plan.devices.kind != "cpu" or ranks <= limit or plan.config.devices.oversubscribe:
        return
    raise ResourceError(
        f"devices.spec {plan.config.devices.spec} asks for {ranks} CPU ranks, but this machine has "
        f"{cores} core{'s' if cores != 1 else ''} (at most {limit} ranks, {CPU_RANKS_PER_CORE} "
        "per core); use fewer ranks or set devices.oversubscribe = true",
        key="devices.spec",
        reason=f"{ranks} CPU ranks, at most {limit} here",
    )


def _check_host_memory(plan: RunPlan, estimate: MemoryEstimate, available: int) -> None:
    if estimate.host_bytes <= available:
        return
    config = plan.config
    ranks = estimate.ranks
    per_rank = format_bytes(estimate.rank_host_bytes)
    remedy = "use fewer ranks, a smaller batch or fewer images"
    if estimate.workers_host_bytes:
        per_rank += f" + {format_bytes(estimate.workers_host_bytes)} of DataLoader workers"
        remedy = "use fewer ranks, a smaller batch, fewer images or fewer data.num_workers"
    raise ResourceError(
        f"the run ({plan.devices.describe()}, {config.model.label}, batch "
        f"{config.training.batch_size} per rank, {config.data.train_size} + "
        f"{config.data.test_size} images) needs an estimated {format_bytes(estimate.host_bytes)} of host "
        f"memory ({ranks} rank{'s' if ranks != 1 else ''} x {per_rank}, plus the launcher), but "
        f"{format_bytes(available)} is available here; {remedy}",
        reason=f"needs {format_bytes(estimate.host_bytes)} of memory, "
        f"{format_bytes(available)} here",
    )


def _gpu_problems(
    plan: RunPlan, estimate: MemoryEstimate, inventory: GpuInventory
) -> tuple[str, ...]:
    """Refuse a chosen GPU without room; the warnings for chosen GPUs others hold."""
    if inventory.error is not None:
        return ()  # no NVML: nothing to judge by, and plan_run has already counted the GPUs
    by_index: dict[int, GpuSample] = {gpu.index: gpu for gpu in inventory.gpus}
    needed = estimate.device_bytes_per_gpu
    warnings = []
    for index in plan.devices.gpu_indices:
        gpu = by_index.get(index)
        if gpu is None or gpu.memory_total_bytes is None or gpu.memory_used_bytes is None:
            continue  # this card did not answer; the launcher's CUDA errors will say more
        free = gpu.memory_total_bytes - gpu.memory_used_bytes
        if free < needed:
            raise ResourceError(
                f"GPU {index} has {format_bytes(free)} free of {format_bytes(gpu.memory_total_bytes)}, but each "
                f"GPU of this run needs an estimated {format_bytes(needed)} ({plan.config.model.label} at "
                f"batch {plan.config.training.batch_size}); free that GPU, pick another with "
                "--devices, or use a smaller batch",
                key="devices.spec",
                reason=f"GPU {index} has {format_bytes(free)} free, needs {format_bytes(needed)}",
            )
        if gpu.processes:
            n = len(gpu.processes)
            pids = ", ".join(str(p.pid) for p in gpu.processes[:3]) + (", …" if n > 3 else "")
            warnings.append(
                f"GPU {index} is also used by {n} other process{'es' if n != 1 else ''} (pid "
                f"{pids}); the run shares it ({format_bytes(free)} free, {format_bytes(needed)} needed)"
            )
    return tuple(warnings)


def check_resources(
    plan: RunPlan,
    *,
    inventory: GpuInventory | None = None,
    available_bytes: int | None = None,
    cores: int | None = None,
) -> ResourceCheck:
    """Judge ``plan`` against this machine; raise ResourceError when its ranks cannot fit.

    Whatever is None is read from the machine now: ``cores`` (usable cores), ``available_bytes``
    (``available_memory_bytes()``) and, for a CUDA plan only, ``inventory`` (``sample_gpus()``).
    Rules in order: CPU ranks per core, host memory, then each chosen GPU.
    """
    cores = usable_cores() if cores is None else cores
    _check_cpu_ranks(plan, cores)
    estimate = estimate_memory(plan)
    available = available_memory_bytes() if available_bytes is None else available_bytes
    _check_host_memory(plan, estimate, available)
    warnings: tuple[str, ...] = ()
    if plan.devices.kind == "cuda":
        warnings = _gpu_problems(plan, estimate, sample_gpus() if inventory is None else inventory)
    return ResourceCheck(
        estimate=estimate, available_bytes=available, cores=cores, warnings=warnings
    )
