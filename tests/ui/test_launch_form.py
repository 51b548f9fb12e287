"""The launch form's rough edges a new user hit, each pinned by a test that failed before its fix:
the preset's GPUs are picked even when the preset cannot run as it stands; a GPU preset never
becomes a CPU run without saying so; picks are said in text; Tab never stops on something
invisible; Start works from a number field; ``w`` re-attaches to the newest run going on disk."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from textual.widgets import Input, Select, SelectionList

from ddptui.app import DdptuiApp
from ddptui.screens.launch import LaunchScreen
from ddptui.screens.run import RunScreen
from ddptui.widgets.confirm import ConfirmDialog
from ddptui.widgets.launch_texts import holders_text, short_model
from engine.core.host.gpus import GpuProcess, GpuSample
from tests.fixtures.standin_nvml import EIGHT_GPUS, standin_nvml
from tests.ui.standins import (
    LIVE_RUN,
    RECORDED,
    StandInActions,
    StandInProbe,
    screen_text,
    settle,
    text_of,
)

pytestmark = pytest.mark.asyncio
SMALL = (80, 24)


@pytest.fixture
def eight(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Eight stand-in GPUs, and no CIFAR-10 on disk (so fast-ddp cannot run as it stands)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    with standin_nvml(machine=EIGHT_GPUS):
        yield


def actions(app: DdptuiApp) -> StandInActions:
    assert isinstance(app.actions, StandInActions)
    return app.actions


async def launch_screen(pilot: object, app: DdptuiApp, preset: str = "cpu-demo") -> LaunchScreen:
    await settle(
        pilot,
        lambda: (
            isinstance(app.screen, LaunchScreen)
            and app.screen.current is not None
            and app.gpu_inventory is not None
        ),
    )
    screen = app.screen
    assert isinstance(screen, LaunchScreen)
    if preset != screen.current.name:  # type: ignore[union-attr]
        screen.select_preset(preset)
        await settle(pilot)
    return screen


def picked(screen: LaunchScreen) -> list[int]:
    return sorted(screen.query_one("#gpu-picker", SelectionList).selected)


async def test_a_preset_that_cannot_run_still_has_its_gpus_picked(
    make_app: Callable[..., DdptuiApp], eight: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app, "fast-ddp")
        assert screen.current is not None and screen.current.plan is None  # CIFAR-10 missing
        assert picked(screen) == list(range(8))


async def test_switching_to_synthetic_data_keeps_a_gpu_preset_on_its_gpus(
    make_app: Callable[..., DdptuiApp], eight: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app, "fast-ddp")
        screen.query_one("#dataset", Select).value = "synthetic"
        await settle(pilot)
        assert screen.effective_plan is not None, screen.problem
        assert screen.effective_plan.devices.describe() == "gpu:0,1,2,3,4,5,6,7"


async def test_a_gpu_preset_on_the_cpu_is_said_and_confirmed(
    make_app: Callable[..., DdptuiApp], eight: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app, "fast-ddp")
        screen.query_one("#dataset", Select).value = "synthetic"
        screen.query_one("#gpu-picker", SelectionList).deselect_all()
        await settle(pilot)
        check = text_of(screen.query_one("#launch-check"))
        assert "on the CPU (cpu:2), not on GPUs as the preset says" in check
        screen.query_one("#presets").focus()
        await pilot.press("s")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("escape")
        await settle(pilot)
        assert actions(app).started == []


async def test_picks_are_said_in_text(make_app: Callable[..., DdptuiApp], eight: None) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app)
        assert "none picked" in text_of(screen.query_one("#devices-note"))
        picker = screen.query_one("#gpu-picker", SelectionList)
        picker.focus()
        await pilot.press("down", "down", "space")
        await settle(pilot)
        assert picked(screen) == [2]
        assert "picked: GPU 2" in text_of(screen.query_one("#devices-note"))
        assert screen_text(app).count("[x]") == 1


async def test_the_picker_names_who_holds_each_gpu(
    make_app: Callable[..., DdptuiApp], eight: None
) -> None:
    app = make_app()
    probe = app.probe
    assert isinstance(probe, StandInProbe)
    probe.user_names = {6100: "ana", 7200: "bo"}  # 6101 and 5100: pids NVML sees but this host not
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app)
        lines = {
            int(option.value): option.prompt.plain
            for option in (
                screen.query_one("#gpu-picker", SelectionList).get_option_at_index(i)
                for i in range(8)
            )
        }
        assert lines[0].endswith("GPU0 H100 80GB 32/80G 97% · pid 6100 ana"), lines[0]
        assert lines[1].endswith("31/80G 95% · pid 6101"), lines[1]
        assert lines[2].endswith("70/80G 88% · pid 7200 bo"), lines[2]
        assert lines[7].endswith("GPU7 H100 80GB 0/80G 0% · free"), lines[7]
        assert "GPU0 H100 80GB 32/80G 97% · pid 6100 ana" in screen_text(app)  # at 80 columns
    two = GpuSample(index=3, processes=(GpuProcess(11, 2**30), GpuProcess(12, 9 * 2**30)))
    assert holders_text(two, {12: "cy"}) == "pid 12 cy +1"  # the biggest holder first
    assert short_model("NVIDIA GeForce RTX 4090") == "RTX 4090"
    assert short_model("Tesla V100-SXM2-16GB") == "V100-SXM2"


async def test_tab_after_the_preset_list_lands_on_something_visible(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app)
        screen.query_one("#presets").focus()
        await pilot.press("tab")
        await settle(pilot)
        focused = app.focused
        assert focused is not None and focused.id == "gpu-picker"  # the stand-in NVML has GPUs


async def test_start_works_while_the_cursor_is_in_an_input(
    make_app: Callable[..., DdptuiApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddptui.screens import launch

    app = make_app()
    actions(app).start_as = None  # the stand-in refuses to start; asking is what counts
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app)
        field = screen.query_one("#epochs", Input)
        field.focus()
        await pilot.press("end", "backspace", "2")
        await settle(pilot)
        assert field.value == "2"
        await pilot.press("s")
        await settle(pilot)
        assert field.value == "2", "s was typed into the field"
        (config,) = actions(app).started
        assert config.training.epochs == 2
        # s at once after a digit, before the form's check is in: it starts once the check is
        # in, with what the form says then
        monkeypatch.setattr(launch, "CHECK_DELAY_SECONDS", 0.5)
        await pilot.press("backspace", "7", "s")
        assert len(actions(app).started) == 1
        await settle(pilot)
        assert [c.training.epochs for c in actions(app).started] == [2, 7]


async def test_w_reattaches_to_the_newest_run_going_on_disk_in_a_new_session(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        await launch_screen(pilot, app)
        await pilot.press("w")
        await settle(pilot, lambda: isinstance(app.screen, RunScreen))
        assert isinstance(app.screen, RunScreen)
        assert app.screen.run_dir.run_id == LIVE_RUN
        assert app.screen.run_dir.path == RECORDED / LIVE_RUN


SCRIPT_PRESET = (
    'description = "my own loop"\n[script]\npath = "train.py"\nargs = ["--epochs", "2"]\n'
)


@pytest.fixture
def my_presets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A presets folder with a script preset naming train.py beside it by a relative path."""
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "train.py").write_text("print('training')\n")
    (presets / "mine.toml").write_text(SCRIPT_PRESET)
    monkeypatch.setenv("DDPTUI_PRESETS", str(presets))
    return presets


async def test_a_script_preset_is_listed_with_its_arguments_in_the_form(
    make_app: Callable[..., DdptuiApp], my_presets: Path
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app, "mine")
        info = text_of(screen.query_one("#preset-info"))
        assert f"{my_presets / 'train.py'} --epochs 2" in info  # found beside the preset
        assert "started like torchrun" in info
        for field in ("#epochs", "#max-steps", "#batch", "#train-size", "#precision", "#dataset"):
            assert screen.query_one(field).disabled, field  # the script has its own
        # ... and they are not shown: a script is described as a script (#21 item 10)
        assert [row.display for row in screen.query(".engine-fields")] == [False, False, False]
        shown = screen_text(app)
        assert not [label for label in ("batch/rank", "max steps", "images") if label in shown]
        args = screen.query_one("#script-args", Input)
        assert args.display and args.value == "--epochs 2"
        check = text_of(screen.query_one("#launch-check"))
        assert check.startswith("✓ runs here: gpu:0,1, 2 ranks") and "global batch" not in check
        args.value = "--epochs 3 --note 'two words'"
        await settle(pilot)
        screen.query_one("#presets").focus()
        await pilot.press("s")
        await settle(pilot)
        (config,) = actions(app).started
        assert config.script.path == str(my_presets / "train.py")
        assert config.script.args == ("--epochs", "3", "--note", "two words")
        # and back on an engine preset, its fields are there again and the script's are not
        screen.select_preset("cpu-demo")
        await settle(pilot)
        assert not screen.query_one("#epochs").disabled
        assert all(row.display for row in screen.query(".engine-fields"))
        assert not screen.query_one("#script-args-row").display


async def test_o_adds_a_script_by_its_path_and_says_when_there_is_none(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    from ddptui.widgets.script_prompt import ScriptPrompt

    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app)
        await pilot.press("o")
        await settle(pilot)
        prompt = app.screen
        assert isinstance(prompt, ScriptPrompt)
        await pilot.press(*str(tmp_path / "nothere.py"), "enter", "enter")
        await settle(pilot)
        assert app.screen is prompt, "a script that is not there closed the dialog"
        said = text_of(prompt.query_one("#script-problem"))
        assert f"script.path = '{tmp_path / 'nothere.py'}': no such file" in said
        prompt.query_one("#script-target", Input).value = str(script)
        prompt.query_one("#script-arguments", Input).value = "--lr 0.5"
        prompt.query_one("#script-arguments", Input).focus()
        await pilot.press("enter")
        await settle(pilot)
        assert app.screen is screen
        assert screen.current is not None and screen.current.name == "train (script)"
        assert "train (script)" in screen_text(app)
        assert screen.query_one("#script-args", Input).value == "--lr 0.5"
        await pilot.press("s")
        await settle(pilot)
        (config,) = actions(app).started
        assert (config.script.path, config.script.args) == (str(script), ("--lr", "0.5"))
        assert config.devices.spec == "auto"  # as `ddptui run train.py` would: every GPU here
        assert screen.effective_plan is not None
        assert screen.effective_plan.devices.describe() == "gpu:0,1"


async def test_escape_leaves_the_script_dialog_with_nothing_added(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app)
        listed = [c.name for c in screen.listed]
        await pilot.press("o", "t", "escape")
        await settle(pilot)
        assert app.screen is screen and [c.name for c in screen.listed] == listed


async def test_the_set_field_overrides_any_key_and_a_missing_factory_is_refused(
    make_app: Callable[..., DdptuiApp],
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app)
        field = screen.query_one("#set-values", Input)
        field.value = "model.factory=nosuch.nets:build optimizer.lr=0.5"
        await settle(pilot)
        check = text_of(screen.query_one("#launch-check"))
        assert "✗ model.factory = 'nosuch.nets:build': no module 'nosuch.nets'" in check
        screen.query_one("#presets").focus()
        await pilot.press("s")
        await settle(pilot)
        assert actions(app).started == []  # refused before anything starts
        field.value = "optimizer.lr=0.5 training.seed=7"
        await settle(pilot)
        assert "overrides: optimizer.lr=0.5, training.seed=7" in text_of(
            screen.query_one("#launch-check")
        )
        await pilot.press("s")
        await settle(pilot)
        (config,) = actions(app).started
        assert (config.optimizer.lr, config.training.seed) == (0.5, 7)
        field.value = "optimizer.lr"
        await settle(pilot)
        assert "✗ 'optimizer.lr' is not SECTION.KEY=VALUE" in text_of(
            screen.query_one("#launch-check")
        )


async def test_the_form_is_checked_in_a_worker_once_per_burst_of_keys(
    make_app: Callable[..., DdptuiApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning reads /proc and cgroup files: it runs off the UI thread, and a burst of keys is
    one check (the delay is long here so the burst surely falls inside it)."""
    import threading

    from ddptui.screens import launch
    from tests.ui.conftest import pinned_resources

    threads: list[threading.Thread] = []

    def checker(plan: object, inventory: object) -> object:
        threads.append(threading.current_thread())
        return pinned_resources(plan, inventory)  # type: ignore[arg-type]

    monkeypatch.setattr(launch, "CHECK_DELAY_SECONDS", 1.0)
    app = make_app(resource_checker=checker)
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app)
        threads.clear()
        field = screen.query_one("#epochs", Input)
        field.focus()
        await pilot.press("end", "backspace", "1", "2", "3")
        await settle(pilot)
        assert field.value == "123"
        assert len(threads) == 1 and threads[0] is not threading.main_thread()
        check = text_of(screen.query_one("#launch-check"))
        assert "overrides: training.epochs=123" in check
        assert screen.effective is not None and screen.effective.training.epochs == 123


async def test_gpus_sampled_while_the_launch_screen_is_hidden_are_shown_on_its_return(
    make_app: Callable[..., DdptuiApp], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A hidden launch screen leaves its widgets alone (a late sample at the app's exit once
    found them gone); shown again, it lists the GPUs as last sampled and re-checks the presets."""
    from engine.core.host.gpus import GpuInventory

    monkeypatch.setenv("HOME", str(tmp_path))  # no CIFAR-10 there
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await launch_screen(pilot, app)
        picker = screen.query_one("#gpu-picker", SelectionList)
        assert picker.option_count == 2  # the stand-in's two GPUs
        before = next(c for c in screen.checks if c.name == "seed-dataparallel")
        assert before.short_reason == "needs 4 GPUs, 2 here"
        await pilot.press("r")
        await settle(pilot)
        four = GpuInventory(gpus=tuple(GpuSample(index=i, name="NVIDIA H100") for i in range(4)))
        app.gpu_inventory = four
        await settle(pilot)
        assert picker.option_count == 2, "a hidden screen redrew its picker"
        await pilot.press("l")
        await settle(pilot, lambda: app.screen is screen)
        assert picker.option_count == 4
        dataparallel = next(c for c in screen.checks if c.name == "seed-dataparallel")
        # it asks for 4 GPUs: they are here now, and only its data is missing
        assert dataparallel.short_reason == "CIFAR-10 is not on disk"
