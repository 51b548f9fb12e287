"""A culprit is named only on evidence, and a stop the user asked for says so (issue 21, item 8).
Real script runs (no torch, so they start in a moment), stopped the ways a user stops them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ddptui.actions import EngineActions
from engine.core.runs.observer import observe_run
from engine.core.runs.rundir import RunDir, list_runs
from engine.core.stacks.snapshot import latest_snapshot
from tests.fixtures.live_runs import SCRIPT, ScriptRuns, ddptui
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for


def ended(run_dir: RunDir, timeout: float = 30) -> None:
    assert wait_for(lambda: run_dir.summary_path.exists(), timeout), "no summary.json"


@pytest.mark.slow
def test_a_healthy_run_has_no_culprit(runs_dir: Path, script_runs: ScriptRuns) -> None:
    run_dir = script_runs.start(runs_dir, "--seconds", "60")
    shown = ddptui("stacks", run_dir.run_id, "--runs-dir", str(runs_dir), "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert [r["state"] for r in data["ranks"]] == ["stepping", "stepping"]
    assert data["culprit_rank"] is None
    assert data["culprit_reason"] == "no rank waits on another"
    text = ddptui("stacks", run_dir.run_id, "--runs-dir", str(runs_dir)).stdout
    assert "culprit" not in text.replace("no culprit: no rank waits on another", "")


@pytest.mark.slow
def test_stops_the_user_asked_for_say_so_and_blame_no_rank(
    runs_dir: Path, script_runs: ScriptRuns
) -> None:
    killed = script_runs.start(runs_dir, "--seconds", "60")
    done = ddptui("kill", killed.run_id, "--grace", "2", "--runs-dir", str(runs_dir))
    assert done.returncode == 0, done.stderr
    from_ui = script_runs.start(runs_dir, "--seconds", "60")
    assert EngineActions(runs_dir).kill_run(from_ui, grace=2).ok
    for run_dir, said in ((killed, "stopped by ddptui kill"), (from_ui, "stopped from the UI")):
        ended(run_dir)
        summary = run_dir.read_summary()
        assert summary is not None and summary.status == "killed"
        assert summary.reason == said, summary.reason  # no "launcher received SIGTERM", no culprit
        assert summary.failure is None


@pytest.mark.slow
def test_ctrl_c_on_ddptui_run_says_so(runs_dir: Path) -> None:
    follower = subprocess.Popen(
        [sys.executable, "-m", "ddptui", "run", SCRIPT, "--devices", "cpu:2",
         "--runs-dir", str(runs_dir), "--", "--seconds", "60"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: any(_ranks_running(r) for r in list_runs(runs_dir)), 30)
        follower.send_signal(signal.SIGINT)  # what Ctrl-C sends the foreground process
        out, _ = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    (run_dir,) = list_runs(runs_dir)
    summary = run_dir.read_summary()
    assert summary is not None and summary.reason == "stopped with Ctrl-C", out


def _ranks_running(run_dir: RunDir) -> bool:
    return sum(r.state == "running" for r in observe_run(run_dir).ranks) == 2


@pytest.mark.slow
def test_a_crashed_rank_is_the_culprit_and_one_that_exited_0_never_is(
    runs_dir: Path, script_runs: ScriptRuns
) -> None:
    crashed = script_runs.start(runs_dir, "--seconds", "60", "--exit-rank", "1",
                                "--exit-code", "3", "--exit-after", "1")  # fmt: skip
    ended(crashed)
    summary = crashed.read_summary()
    assert summary is not None and summary.failure is not None
    assert summary.failure.rank == 1
    assert "rank 0" not in summary.reason, summary.reason  # the sleeping rank is nobody's culprit
    snapshot = latest_snapshot(crashed.path)
    assert snapshot is not None and snapshot.culprit_rank == 1, snapshot
    assert snapshot.culprit_reason.startswith("it crashed first")
    finished = script_runs.start(runs_dir, "--seconds", "60", "--exit-rank", "1",
                                 "--exit-after", "0")  # fmt: skip
    assert wait_for(lambda: observe_run(finished).ranks[1].state == "done", 30)
    data = json.loads(
        ddptui("stacks", finished.run_id, "--runs-dir", str(runs_dir), "--json").stdout
    )
    assert [r["state"] for r in data["ranks"]] == ["stepping", "finished"]
    assert data["culprit_rank"] is None
    os.kill(finished.read_run_info().ranks[0].pid, signal.SIGKILL)  # ends the run sooner
