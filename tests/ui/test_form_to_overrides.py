"""The launch form as plain values (ddptui.launch_form): what a preset fills it with, the overrides
it makes of a preset, and its check here, without an app."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from ddptui.actions import EngineActions
from ddptui.launch_form import (
    QUEUE_ELSEWHERE,
    WHEN_FREE,
    LaunchForm,
    check_form,
    device_spec,
    form_for,
    form_overrides,
)
from ddptui.widgets.launch_texts import describe_form_check
from engine.core.config.devices import resolve_devices
from engine.core.config.presets import load_preset
from engine.core.config.schema import ConfigError, RunConfig, ScriptConfig
from engine.core.config.toml_io import apply_overrides
from engine.core.host.gpus import GpuInventory
from engine.core.plan.preset_check import PresetCheck, check_config
from engine.core.plan.resource_guard import ResourceCheck, check_resources
from engine.core.plan.run_plan import RunPlan
from engine.core.queue.enqueue import queue_run


def pinned(plan: RunPlan, inventory: GpuInventory | None) -> ResourceCheck:
    return check_resources(
        plan,
        inventory=inventory or GpuInventory(error="not sampled"),
        available_bytes=64 * 2**30,
        cores=16,
    )


@pytest.fixture
def demo() -> RunConfig:
    return load_preset("cpu-demo")  # ddp on cpu:2, 2 epochs, batch 128, 12000 images


def demo_form(demo: RunConfig) -> LaunchForm:
    return form_for(demo, resolve_devices("cpu:2", "ddp", 0), offered=set())


def test_a_preset_fills_the_form_with_its_own_values(demo: RunConfig) -> None:
    form = demo_form(demo)
    assert dict(form.numbers) == {
        "training.epochs": "2",
        "training.max_steps": "0",
        "training.batch_size": "128",
        "data.train_size": "12000",
    }
    assert (form.precision, form.dataset, form.cpu_ranks) == ("fp32", "synthetic", "2")
    assert form.picked_gpus == () and not form.gpus_offered


def test_a_gpu_preset_picks_its_gpus_among_those_offered(demo: RunConfig) -> None:
    gpus = resolve_devices("0,2,5", "ddp", 8)
    form = form_for(demo, gpus, offered={0, 1, 2, 3})
    assert form.picked_gpus == (0, 2) and form.gpus_offered
    assert device_spec(form) == "gpu:0,2"
    assert form_for(demo, None, offered=set()).cpu_ranks == "2"  # ddp: two CPU ranks
    single = replace(
        demo,
        strategy=replace(demo.strategy, name="single"),
        devices=replace(demo.devices, spec="auto"),
    )
    assert form_for(single, None, offered=set()).cpu_ranks == "1"


def test_the_form_as_filled_is_no_override(demo: RunConfig) -> None:
    form = demo_form(demo)
    assert form_overrides(demo, form, resolve_devices("cpu:2", "ddp", 0)) == {}
    # without a device plan to compare with, the devices are said
    assert form_overrides(demo, form, None) == {"devices.spec": "cpu:2"}


def test_only_what_differs_becomes_an_override_and_the_fields_beat_set(demo: RunConfig) -> None:
    form = replace(
        demo_form(demo),
        numbers={**demo_form(demo).numbers, "training.epochs": " 1 ", "data.train_size": "1280"},
        precision="bf16",
        cpu_ranks="3",
        set_values="optimizer.lr=0.5 training.epochs=9",
    )
    assert form_overrides(demo, form, resolve_devices("cpu:2", "ddp", 0)) == {
        "optimizer.lr": "0.5",  # as --set gives it: typed when it is applied
        "training.epochs": 1,
        "data.train_size": 1280,
        "precision.mode": "bf16",
        "devices.spec": "cpu:3",
    }


@pytest.mark.parametrize(
    ("change", "error", "said"),
    [
        ({"numbers": {"training.epochs": ""}}, ConfigError, "epochs is empty; give a number"),
        ({"numbers": {"training.epochs": "two"}}, ValueError, "invalid literal"),
        ({"cpu_ranks": ""}, ConfigError, "CPU ranks is empty; give a number"),
        ({"cpu_ranks": "0"}, ConfigError, "CPU ranks must be at least 1"),
        ({"set_values": "oops"}, ConfigError, "'oops' is not SECTION.KEY=VALUE"),
        ({"set_values": "data.root='open"}, ValueError, "No closing quotation"),
    ],
)
def test_what_cannot_be_an_override_is_said(
    demo: RunConfig, change: dict[str, object], error: type[Exception], said: str
) -> None:
    base = demo_form(demo)
    if "numbers" in change:
        change = {"numbers": {**base.numbers, **change["numbers"]}}  # type: ignore[dict-item]
    with pytest.raises(error, match=said):
        form_overrides(demo, replace(base, **change), None)  # type: ignore[arg-type]


def test_a_script_takes_its_own_arguments_not_the_engine_fields(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    config = RunConfig.for_script(ScriptConfig(path=str(script), args=("--epochs", "2")))
    form = LaunchForm(script_args="--epochs 3 --note 'two words'", cpu_ranks="2")
    assert form_overrides(config, form, None) == {
        "script.args": ["--epochs", "3", "--note", "two words"],
        "devices.spec": "cpu:2",
    }
    same = replace(form, script_args="--epochs 2")
    assert "script.args" not in form_overrides(config, same, None)


def check_of(config: RunConfig, gpu_count: int = 0) -> PresetCheck:
    return check_config(config, gpu_count, name=config.name, path=Path("x.toml"))


def test_the_check_plans_the_form_here_with_the_guard(demo: RunConfig) -> None:
    form = replace(demo_form(demo), cpu_ranks="3")
    checked = check_form(check_of(demo), form, 0, None, pinned)
    assert checked.ok and checked.problem == ""
    assert checked.plan is not None and checked.plan.devices.describe() == "cpu:3"
    assert checked.config is not None and checked.config.devices.spec == "cpu:3"
    assert checked.resources is not None and checked.resources.available_bytes == 64 * 2**30
    assert dict(checked.overrides) == {"devices.spec": "cpu:3"}
    assert not checked.gpu_preset_on_cpu


def test_the_check_says_why_not_in_one_sentence(demo: RunConfig) -> None:
    too_many = check_form(check_of(demo), replace(demo_form(demo), cpu_ranks="65"), 0, None, pinned)
    assert not too_many.ok and too_many.plan is None
    assert "asks for 65 CPU ranks, but this machine has 16 cores" in too_many.problem
    fp16 = check_form(check_of(demo), replace(demo_form(demo), precision="fp16"), 0, None, pinned)
    assert "fp16 needs CUDA" in fp16.problem
    nothing = check_form(None, LaunchForm(), 0, None, pinned)
    assert not nothing.ok and nothing.problem == "pick a preset that can be read"


def test_a_gpu_preset_with_no_gpu_picked_is_flagged(demo: RunConfig) -> None:
    gpu_preset = replace(demo, devices=replace(demo.devices, spec="all"))
    inventory = GpuInventory(error="stand-in: two GPUs")
    checked = check_form(
        check_of(gpu_preset, gpu_count=2),
        LaunchForm(numbers=demo_form(demo).numbers, gpus_offered=True, cpu_ranks="2"),
        2,
        inventory,
        pinned,
    )
    assert checked.ok, checked.problem
    assert checked.gpu_preset_on_cpu and checked.plan is not None
    assert checked.plan.devices.describe() == "cpu:2"


# ---- "when free": the run is queued (ddptui run --queue) ---------------------------------------


def queue_checker(store: Path) -> Callable[[RunConfig, RunPlan], None]:
    """The form's queue check as the app makes it: ``EngineActions.check_queue`` on ``store``."""
    return EngineActions(Path("runs"), claims_dir=store).check_queue


def test_when_free_makes_the_same_overrides_and_is_checked_for_the_queue(
    demo: RunConfig, tmp_path: Path
) -> None:
    asked: list[tuple[RunConfig, RunPlan]] = []
    form = replace(demo_form(demo), cpu_ranks="3")
    now = check_form(check_of(demo), form, 0, None, pinned)
    queued = check_form(
        check_of(demo),
        replace(form, when=WHEN_FREE),
        0,
        None,
        pinned,
        queue=lambda config, plan: asked.append((config, plan)),
    )
    assert queued.ok and queued.queued and not now.queued
    assert dict(queued.overrides) == dict(now.overrides) == {"devices.spec": "cpu:3"}
    assert queued.config == now.config
    assert [(c.devices.spec, p.devices.describe()) for c, p in asked] == [("cpu:3", "cpu:3")]
    assert "✓ runs here: cpu:3, 3 ranks" in describe_form_check(now).plain
    said = describe_form_check(queued).plain
    assert "✓ queues here, starts when free: cpu:3, 3 ranks" in said
    assert "waits in this machine's queue until its devices are free" in said


@pytest.mark.parametrize("bad", ["slots", "store"])
def test_when_free_refuses_what_ddptui_run_queue_refuses_in_the_same_sentence(
    demo: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    """The form's check and `ddptui run --queue` (``queue_run``) say the same one sentence, and
    the check makes nothing: no claim store, no run directory."""
    monkeypatch.setenv("DDPTUI_QUEUE_CPU_SLOTS", "2")
    store = tmp_path / "claims"
    ranks = "2"
    if bad == "slots":
        ranks = "3"
    else:
        (tmp_path / "elsewhere").mkdir()
        store.symlink_to(tmp_path / "elsewhere")
    form = replace(demo_form(demo), cpu_ranks=ranks, when=WHEN_FREE)
    checked = check_form(check_of(demo), form, 0, None, pinned, queue=queue_checker(store))
    assert not checked.ok
    assert checked.config is None and "\n" not in checked.problem
    with pytest.raises(ConfigError) as refused:
        queue_run(apply_overrides(demo, {"devices.spec": f"cpu:{ranks}"}), tmp_path / "runs",
                  store_path=store, gpu_count=0)  # fmt: skip
    assert checked.problem == str(refused.value)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    if bad == "slots":
        assert not store.exists(), "the check made the claim store"
        assert "asks for 3 CPU slots, but this machine's queue has 2" in checked.problem
    else:
        assert checked.problem.startswith(f"the claim store {store} is a symbolic link")


def test_when_free_is_for_this_machine_not_slurm(demo: RunConfig) -> None:
    form = replace(demo_form(demo), where="slurm", when=WHEN_FREE)

    def elsewhere(where: str, config: RunConfig) -> RunPlan:
        raise AssertionError(f"{where} was asked about a run it would not get")

    checked = check_form(check_of(demo), form, 0, None, pinned, elsewhere)
    assert not checked.ok and checked.problem == QUEUE_ELSEWHERE
