"""The NVML layer against a stand-in at the pynvml boundary: failures become reasons, never crashes."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from engine.core.host import gpus


class NVMLError(Exception):
    pass


def stand_in_pynvml(*, init_error: str | None = None) -> types.ModuleType:
    """Two cards: 0 is healthy and busy, 1 fails every query after its handle."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]

    def init() -> None:
        if init_error:
            raise NVMLError(init_error)

    def handle(i: int) -> int:
        return i

    def check(h: int) -> None:
        if h == 1:
            raise NVMLError("GPU is lost")

    def memory(h: int) -> types.SimpleNamespace:
        check(h)
        return types.SimpleNamespace(used=3 * 2**30, total=80 * 2**30)

    def util(h: int) -> types.SimpleNamespace:
        check(h)
        return types.SimpleNamespace(gpu=97, memory=40)

    def procs(h: int) -> list[types.SimpleNamespace]:
        return [types.SimpleNamespace(pid=4242, usedGpuMemory=2**30)]

    m.nvmlInit = init  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: "550.54"  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: b"NVIDIA A100-SXM4-80GB"  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = lambda h, kind: 61  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = lambda h: 312_000  # type: ignore[attr-defined]
    m.nvmlDeviceGetComputeRunningProcesses = procs  # type: ignore[attr-defined]
    return m


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(sys.modules, "pynvml", stand_in_pynvml())
    gpus.reset_for_tests()
    yield
    gpus.reset_for_tests()


def test_a_failing_card_is_not_available_with_its_reason_and_hides_nothing_else(nvml: None) -> None:
    inventory = gpus.sample_gpus()
    assert inventory.error is None and inventory.count == 2 and inventory.driver_version == "550.54"
    good, bad = inventory.gpus
    assert good.available and good.name == "NVIDIA A100-SXM4-80GB"
    assert (good.utilization_percent, good.memory_used_bytes, good.memory_total_bytes) == (
        97,
        3 * 2**30,
        80 * 2**30,
    )
    assert (good.temperature_c, good.power_watts) == (61, 312.0)
    assert good.processes == (gpus.GpuProcess(pid=4242, used_memory_bytes=2**30),)
    assert (
        not bad.available
        and bad.error == "NVML: GPU is lost"
        and bad.name == "NVIDIA A100-SXM4-80GB"
    )
    assert gpus.gpu_count() == 2


def test_no_driver_is_a_reason_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", stand_in_pynvml(init_error="Driver Not Loaded"))
    gpus.reset_for_tests()
    inventory = gpus.sample_gpus()
    assert inventory.count == 0 and inventory.error == "NVML: Driver Not Loaded"
    assert gpus.gpu_count() == 0
    gpus.reset_for_tests()


def test_missing_pynvml_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes the import fail
    gpus.reset_for_tests()
    assert gpus.sample_gpus().error == "pynvml is not installed (pip install nvidia-ml-py)"
    gpus.reset_for_tests()
