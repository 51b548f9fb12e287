"""Stand-ins at the machine boundaries the UI reads: pynvml (two GPUs, the second failing), the
process probe (psutil) and the clock, so snapshots show the same figures on every machine."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ddptui.watch import ProcessProbe, ProcessUsage
from engine import gpus
from engine.rundir import ProcessRef


class NVMLError(Exception):
    """Shaped like pynvml.NVMLError: str() is NVML's message."""


@dataclass
class _Memory:
    used: int
    total: int
    free: int = 0


@dataclass
class _Util:
    gpu: int
    memory: int = 0


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int  # pynvml's name


def fake_pynvml(*, gpu_count: int = 2, fail_init: str | None = None) -> types.ModuleType:
    """GPU 0 answers every query; GPU 1 names itself, then its memory query raises (a lost GPU)."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]

    def init() -> None:
        if fail_init:
            raise NVMLError(fail_init)

    def handle(index: int) -> int:
        if index >= gpu_count:
            raise NVMLError("Invalid Argument")
        return index

    def memory(h: int) -> _Memory:
        if h == 1:
            raise NVMLError("GPU is lost")
        return _Memory(used=13 * 2**30, total=40 * 2**30)

    def processes(h: int) -> list[_Proc]:
        return [_Proc(pid=31010, usedGpuMemory=12 * 2**30)] if h == 0 else []

    functions: dict[str, Any] = {
        "nvmlInit": init,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: gpu_count,
        "nvmlSystemGetDriverVersion": lambda: "550.54.15",
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetName": lambda h: "NVIDIA A100-SXM4-40GB",
        "nvmlDeviceGetUUID": lambda h: f"GPU-0000000{h}",
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetUtilizationRates": lambda h: _Util(gpu=87),
        "nvmlDeviceGetTemperature": lambda h, kind: 71,
        "nvmlDeviceGetPowerUsage": lambda h: 251_000,
        "nvmlDeviceGetComputeRunningProcesses": processes,
        "nvmlDeviceGetGraphicsRunningProcesses": lambda h: [],
    }
    for name, fn in functions.items():
        setattr(nvml, name, fn)
    return nvml


@contextmanager
def standin_nvml(**kwargs: Any) -> Iterator[types.ModuleType]:
    """Install the fake pynvml in sys.modules for the duration (engine.gpus imports it lazily)."""
    saved = sys.modules.get("pynvml")
    module = fake_pynvml(**kwargs)
    sys.modules["pynvml"] = module
    gpus.reset_for_tests()
    try:
        yield module
    finally:
        if saved is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved
        gpus.reset_for_tests()


class StandInProbe(ProcessProbe):
    """Says the given processes are alive and gives every pid fixed CPU / memory figures."""

    def __init__(
        self, alive: Iterable[int] = (), cpu: float = 97.0, rss: int = 310 * 2**20
    ) -> None:
        super().__init__()
        self.alive_pids = set(alive)
        self.cpu = cpu
        self.rss = rss

    def alive(self, ref: ProcessRef | None) -> bool:
        return ref is not None and ref.pid in self.alive_pids

    def pid_alive(self, pid: int) -> bool:
        return pid in self.alive_pids

    def usage(self, pids: Iterable[int]) -> dict[int, ProcessUsage]:
        return {pid: ProcessUsage(self.cpu, self.rss) for pid in pids if pid in self.alive_pids}
