"""A process of a run that outlives its ranks (a script's double-forked daemon) is stopped when the
run ends, or left with the preset's say-so, and the summary names it either way (issue 21, item
9). Real script runs."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tests.fixtures.live_runs import ScriptRuns, ddptui
from tests.fixtures.waiting import wait_for


def daemon_of(ready: Path) -> int:
    assert wait_for(lambda: (ready / "daemon").exists(), 30), "no daemon started"
    return int((ready / "daemon").read_text())


@pytest.mark.slow
def test_a_daemon_outliving_a_completed_run_is_stopped_and_named(
    runs_dir: Path, script_runs: ScriptRuns, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    run_dir = script_runs.start(
        runs_dir, "--seconds", "1", "--daemon", "--daemon-seconds", "120", "--ready", str(ready)
    )
    daemon = daemon_of(ready)
    assert wait_for(lambda: run_dir.summary_path.exists(), 60), "the run never ended"
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "completed", summary
    (said,) = summary.leftovers
    assert said.startswith(f"pid {daemon} (") and said.endswith(
        "outlived the ranks: stopped (SIGTERM)"
    )
    assert not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == "zombie"
    shown = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir))
    assert f"leftover   pid {daemon} (" in shown.stdout


@pytest.mark.slow
def test_with_leftovers_leave_the_daemon_is_left_and_named(
    runs_dir: Path, script_runs: ScriptRuns, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    done = ddptui(
        "run", "tests/fixtures/user_script.py", "--devices", "cpu:2", "--runs-dir", str(runs_dir),
        "--set", "supervision.leftovers=leave", "--",
        "--seconds", "1", "--daemon", "--daemon-seconds", "120", "--ready", str(ready),
    )  # fmt: skip
    daemon = daemon_of(ready)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "outlived the ranks and was left running (supervision.leftovers = leave)" in (
            done.stdout
        )
        assert psutil.Process(daemon).is_running()
    finally:
        psutil.Process(daemon).kill()
