"""The UI shows what a run directory and a log hold with its control characters made visible: a
hostile run's id, summary and log neither set the terminal's title nor blank the screen (issue
21, item 4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ddptui.app import DdptuiApp
from ddptui.screens.run import RunScreen
from ddptui.screens.runs import RunsScreen
from engine.core.common.run_files import PRIVATE_FILE_MODE
from engine.core.common.statuses import RunStatus
from engine.core.runs.settle import bare_summary
from tests.fixtures.made_runs import make_run, rank_events
from tests.ui.standins import screen_text, settle

pytestmark = pytest.mark.asyncio
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\u202e"


def assert_shown_not_acted(text: str) -> None:
    for char in ("\x1b", "\x07", "\u202e"):
        assert char not in text, repr(char)
    assert "\\x1b" in text


async def test_a_hostile_runs_words_are_shown_not_acted_on(
    make_app: Callable[..., DdptuiApp], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    run_dir = make_run(runs, f"20260101-000000-{HOSTILE}", state=RunStatus.FAILED,
                       events={"rank-0": rank_events(0, 2)})  # fmt: skip
    run_dir.write_summary(bare_summary(run_dir, RunStatus.FAILED, f"why {HOSTILE}"))
    log = run_dir.rank_log_path(0)
    log.write_text(f"log {HOSTILE}\n")
    log.chmod(PRIVATE_FILE_MODE)
    app = make_app(runs)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        await pilot.press("r")
        await settle(pilot, lambda: isinstance(app.screen, RunsScreen) and bool(app.screen.runs))
        assert_shown_not_acted(screen_text(app))
        app.open_run(run_dir)
        await settle(pilot, lambda: getattr(app.screen, "view", None) is not None)
        assert isinstance(app.screen, RunScreen)
        shown = screen_text(app)
        assert_shown_not_acted(shown)
        assert "log \\x1b]0;pwned" in shown
        assert "\x1b" not in app.screen.sub_title and "\x1b" not in app.title
