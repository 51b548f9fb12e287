"""The NVML layer against the stand-in at the pynvml boundary (tests.fixtures.standin_nvml, the
one the UI tests use too): failures become reasons, never crashes."""

from __future__ import annotations

import sys

import pytest

from engine.core.host import gpus
from tests.fixtures.standin_nvml import standin_nvml


def test_a_failing_card_is_not_available_with_its_reason_and_hides_nothing_else() -> None:
    with standin_nvml():  # GPU 0 answers every query; GPU 1's memory query raises
        inventory = gpus.sample_gpus()
        count = gpus.gpu_count()
    assert inventory.error is None and inventory.count == 2
    assert inventory.driver_version == "550.54.15"
    good, bad = inventory.gpus
    assert good.available and good.name == "NVIDIA A100-SXM4-40GB"
    assert (good.utilization_percent, good.memory_used_bytes, good.memory_total_bytes) == (
        87,
        13 * 2**30,
        40 * 2**30,
    )
    assert (good.temperature_c, good.power_watts) == (71, 251.0)
    assert good.uuid == "GPU-00000000"
    assert good.processes == (gpus.GpuProcess(pid=31010, used_memory_bytes=12 * 2**30),)
    assert not bad.available
    assert bad.error == "NVML: GPU is lost" and bad.name == "NVIDIA A100-SXM4-40GB"
    assert count == 2


def test_no_driver_is_a_reason_not_a_crash() -> None:
    with standin_nvml(fail_init="Driver Not Loaded"):
        inventory = gpus.sample_gpus()
        count = gpus.gpu_count()
    assert inventory.count == 0 and inventory.error == "NVML: Driver Not Loaded"
    assert count == 0


def test_missing_pynvml_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes the import fail
    gpus.reset_for_tests()
    assert gpus.sample_gpus().error == "pynvml is not installed (pip install nvidia-ml-py)"
    gpus.reset_for_tests()
