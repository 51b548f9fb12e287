"""A script run is described as a script: its script, its arguments, its steps and what it
reported, never the engine's defaults (issue 21, item 10). A real run of the tutorial's DDP loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddptui.widgets.run_summary import summary_lines
from engine.core.runs.observer import observe_run
from engine.core.runs.rundir import list_runs
from tests.fixtures.live_runs import ddptui

TUTORIAL = "tests/fixtures/tutorial_ddp.py"


@pytest.mark.slow
def test_show_and_the_end_panel_describe_a_script_run_as_a_script(runs_dir: Path) -> None:
    done = ddptui(
        "run", TUTORIAL, "--devices", "cpu:2", "--runs-dir", str(runs_dir),
        "--", "--epochs", "2", "--steps", "10", timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = list_runs(runs_dir)
    shown = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir)).stdout
    assert f"script     {TUTORIAL} --epochs 2 --steps 10" in shown
    for default in ("small_cnn", "synthetic", "epoch(s)", "batch 256", "/0 "):
        assert default not in shown, default
    assert "steps      20 optimizer steps on rank 0" in shown
    panel = " ".join(line.plain for line in summary_lines(observe_run(run_dir)))
    assert "no epoch finished" not in panel
    assert "20 optimizer steps" in panel
