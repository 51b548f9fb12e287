"""The thin NVML layer: which GPUs this machine has and how busy they are.

Plain Python (pynvml, never CUDA): the UI samples it in a thread, and the CLI uses it to validate a
device set before anything starts. Every NVML failure becomes "not available" plus the reason,
for the whole machine (no driver) or for one GPU (that card's query failed); it never raises.
Indices are NVML's, which equal CUDA's once ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class GpuProcess:
    pid: int  # as NVML reports it: a host pid when this process runs in a container
    used_memory_bytes: int | None


@dataclass(frozen=True)
class GpuSample:
    """One card at one moment. ``error`` is set (and figures are None) when the card failed."""

    index: int
    name: str = ""
    uuid: str = ""
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_percent: int | None = None
    temperature_c: int | None = None
    power_watts: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None
    minor_number: int | None = None  # N of /dev/nvidiaN; None when NVML did not say

    @property
    def device_minor(self) -> int:
        """The N of the /dev/nvidiaN file of this card (its index when NVML did not say)."""
        return self.minor_number if self.minor_number is not None else self.index

    @property
    def available(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class GpuInventory:
    """All cards, or why NVML could not be used at all (``error``)."""

    gpus: tuple[GpuSample, ...] = ()
    driver_version: str = ""
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.gpus)

    def index_of_minor(self, minor: int) -> int | None:
        """The NVML index of the card whose device file is /dev/nvidia<minor>, if NVML lists it."""
        return next((g.index for g in self.gpus if g.device_minor == minor), None)

    def listed_pids(self) -> set[int]:
        """Every pid NVML lists as using some GPU."""
        return {p.pid for g in self.gpus for p in g.processes}


_lock = threading.Lock()
_initialised = False


def _nvml() -> Any:
    """Import and initialise pynvml once per process; raises on any failure."""
    global _initialised
    import pynvml

    with _lock:
        if not _initialised:
            pynvml.nvmlInit()
            _initialised = True
    return pynvml


def _reason(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    if isinstance(err, ImportError):
        return "pynvml is not installed (pip install nvidia-ml-py)"
    return f"NVML: {text}"


def _try(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except Exception:
        return None


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _sample_one(nvml: Any, index: int) -> GpuSample:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = _decode(nvml.nvmlDeviceGetName(handle))
    except Exception as err:  # one bad card must not hide the others
        return GpuSample(index=index, error=_reason(err))
    try:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        util = nvml.nvmlDeviceGetUtilizationRates(handle)
    except Exception as err:
        return GpuSample(index=index, name=name, error=_reason(err))
    power_mw = _try(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    processes: list[GpuProcess] = []
    for getter_name in (
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ):
        getter = getattr(nvml, getter_name, None)
        for p in (_try(partial(getter, handle)) if getter else None) or ():
            used = getattr(p, "usedGpuMemory", None)
            processes.append(GpuProcess(pid=int(p.pid), used_memory_bytes=used))
    return GpuSample(
        index=index,
        name=name,
        uuid=_decode(_try(lambda: nvml.nvmlDeviceGetUUID(handle)) or ""),
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
        utilization_percent=int(util.gpu),
        temperature_c=_try(
            lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        ),
        power_watts=power_mw / 1000.0 if power_mw is not None else None,
        processes=tuple(processes),
        minor_number=_try(lambda: int(nvml.nvmlDeviceGetMinorNumber(handle))),
    )


def sample_gpus() -> GpuInventory:
    """Sample every GPU now. Never raises: failures are in ``error`` fields."""
    try:
        nvml = _nvml()
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as err:
        return GpuInventory(error=_reason(err))
    driver = _decode(_try(nvml.nvmlSystemGetDriverVersion) or "")
    return GpuInventory(
        gpus=tuple(_sample_one(nvml, i) for i in range(count)), driver_version=driver
    )


def sm_clocks(indices: tuple[int, ...]) -> dict[int, tuple[int | None, int | None]]:
    """(SM clock now, its maximum) in MHz of each card of ``indices`` NVML can say, for a run's
    record of what it ran on; {} without NVML. Never raises."""
    try:
        nvml = _nvml()
    except Exception:
        return {}
    clocks: dict[int, tuple[int | None, int | None]] = {}
    for index in indices:
        handle = _try(partial(nvml.nvmlDeviceGetHandleByIndex, index))
        if handle is None:
            continue
        now = _try(partial(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM))
        most = _try(partial(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM))
        clocks[index] = (None if now is None else int(now), None if most is None else int(most))
    return clocks


def gpu_count() -> int:
    """GPUs NVML can see (0 without a driver)."""
    return sample_gpus().count


def reset_for_tests() -> None:
    """Forget the initialised NVML so a test's stand-in module is picked up."""
    global _initialised
    with _lock:
        _initialised = False
