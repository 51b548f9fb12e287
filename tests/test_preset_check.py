"""The one preset check (engine.core.plan.preset_check) behind `ddptui presets`, the launch
screen's list and its script entry: read as `ddptui run` reads a preset, planned here, and checked
against the machine when a resource rule is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.config.presets import PresetFile
from engine.core.config.schema import ConfigError, RunConfig, ScriptConfig
from engine.core.plan.preset_check import check_preset, check_presets, plan_user_script
from engine.core.plan.resource_guard import ResourceCheck
from engine.core.plan.run_plan import RunPlan


@pytest.fixture
def my_presets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user presets folder: a script preset naming train.py beside it, and a broken file; the
    working directory is elsewhere (no train.py there)."""
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "train.py").write_text("print('training')\n")
    (presets / "mine.toml").write_text('[script]\npath = "train.py"\n')
    (presets / "broken.toml").write_text('[training]\nbatch_size = "big"\n')
    monkeypatch.setenv("DDPTUI_PRESETS", str(presets))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return presets


def test_every_preset_is_checked_with_its_reason(my_presets: Path) -> None:
    checks = {c.name: c for c in check_presets(gpu_count=0)}
    assert {"cpu-demo", "seed-ddp", "mine", "broken"} <= set(checks)
    demo = checks["cpu-demo"]
    assert demo.runnable and demo.bundled and demo.reason == "" and not demo.broken
    assert demo.plan is not None and demo.plan.devices.describe() == "cpu:2"
    seed = checks["seed-ddp"]
    assert not seed.runnable and not seed.broken and seed.config is not None
    assert "asks for GPUs, but this machine has none" in seed.reason
    broken = checks["broken"]
    assert broken.broken and not broken.runnable and not broken.bundled
    assert str(my_presets / "broken.toml") in broken.reason
    assert "training.batch_size is 'big'" in broken.reason


def test_a_relative_script_is_the_one_beside_the_preset(my_presets: Path) -> None:
    check = check_preset(PresetFile("mine", my_presets / "mine.toml", False), gpu_count=0)
    assert check.runnable, check.reason
    assert check.config is not None
    assert check.config.script.path == str(my_presets / "train.py")


def test_a_resource_rule_that_refuses_makes_the_preset_not_runnable(my_presets: Path) -> None:
    seen: list[RunPlan] = []

    def refuse(plan: RunPlan) -> ResourceCheck:
        seen.append(plan)
        raise ConfigError(f"{plan.world_size} ranks do not fit")

    checks = {c.name: c for c in check_presets(0, refuse)}
    demo = checks["cpu-demo"]
    assert not demo.runnable and demo.reason == "2 ranks do not fit"
    assert demo.resources is None
    assert demo.devices_asked(0) is not None  # what it asks for is still known
    assert all(isinstance(p, RunPlan) for p in seen) and len(seen) >= 2


def test_a_preset_that_cannot_run_still_says_which_devices_it_asks_for(
    my_presets: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no CIFAR-10 there
    checks = {c.name: c for c in check_presets(gpu_count=4)}
    fast = checks["fast-ddp"]
    assert fast.plan is None and fast.short_reason == "CIFAR-10 is not on disk"
    assert fast.reason.startswith("CIFAR-10 is not at ")
    asked = fast.devices_asked(4)
    assert asked is not None and asked.gpu_indices == (0, 1, 2, 3)
    assert checks["broken"].devices_asked(4) is None


def test_a_users_script_is_listed_as_a_preset_is(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    check = plan_user_script(RunConfig.for_script(ScriptConfig(path=str(script))), 0)
    assert check.name == "train (script)" and check.path == script and check.runnable
    by_module = plan_user_script(RunConfig.for_script(ScriptConfig(module="json.tool")), 0)
    assert by_module.path == Path("json.tool") and by_module.runnable


def test_the_short_reason_is_the_errors_own_gist(my_presets: Path) -> None:
    """The list's few words are what the refusal said of itself (ConfigError.reason), not a
    parse of its sentence."""
    checks = {c.name: c for c in check_presets(gpu_count=2)}
    assert checks["seed-dataparallel"].short_reason == "needs 4 GPUs, 2 here"
    assert checks["seed-dataparallel"].reason.startswith("devices.spec '4' asks for 4 GPUs")
    assert check_presets(0)[0].short_reason == ""  # cpu-demo runs: nothing to say
    broken = checks["broken"]
    assert str(my_presets / "broken.toml") not in broken.short_reason  # the list names it
    assert "training.batch_size" in broken.short_reason
