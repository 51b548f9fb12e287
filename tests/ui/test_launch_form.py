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
from tests.ui.standins import (
    EIGHT_GPUS,
    LIVE_RUN,
    RECORDED,
    StandInActions,
    screen_text,
    settle,
    standin_nvml,
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
    make_app: Callable[..., DdptuiApp],
) -> None:
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
