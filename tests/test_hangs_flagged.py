"""A rank that hangs is flagged stalled, with itself as the culprit, within 30 s of its last word,
in every phase: before its first report (a script's fast unreported steps) and in evaluation,
where the slow-phase rule alone would wait ten minutes (issue 21, item 7). Real gloo runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.runs.events import Event, RankStalled, StacksTaken, read_events
from engine.core.runs.rundir import RunDir
from engine.core.stacks.snapshot import load_snapshot
from tests.fixtures.live_runs import QUICK, ddptui
from tests.fixtures.waiting import wait_for

TUTORIAL = "tests/fixtures/tutorial_ddp.py"
FLAGGED_WITHIN_SECONDS = 30.0


def flagged(run_dir: RunDir, rank: int) -> tuple[RankStalled, float]:
    """The stall flagged for ``rank`` and how long after the rank's last event."""
    stalls = [
        e
        for e in read_events(run_dir.launcher_events_path, run_dir.path)
        if isinstance(e, RankStalled) and e.rank == rank
    ]
    assert stalls, "never flagged"
    said: list[Event] = read_events(run_dir.rank_events_path(rank), run_dir.path)
    last = max(e.time for e in said if e.time <= stalls[0].time)
    return stalls[0], stalls[0].time - last


def stall_snapshot_culprit(run_dir: RunDir) -> int | None:
    taken = [
        e
        for e in read_events(run_dir.launcher_events_path, run_dir.path)
        if isinstance(e, StacksTaken) and e.reason == "stall"
    ]
    assert taken, "no stall snapshot"
    snapshot = load_snapshot(run_dir.path, Path(taken[0].path))
    assert snapshot is not None
    return snapshot.culprit_rank


@pytest.mark.slow
def test_a_script_rank_hanging_before_its_first_report_is_flagged_in_30_s(
    runs_dir: Path, run_reaper: None
) -> None:
    started = ddptui(
        "run", TUTORIAL, "--devices", "cpu:2", "--runs-dir", str(runs_dir), "--detach",
        "--set", "supervision.kill_stalled_after=3",
        "--", "--epochs", "5", "--steps", "20", "--hang-rank", "1", "--at-step", "3",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_dir = RunDir(runs_dir / started.stdout.strip().splitlines()[-1])
    assert wait_for(lambda: run_dir.summary_path.exists(), timeout=150), "the run never ended"
    stall, after = flagged(run_dir, 1)
    assert after <= FLAGGED_WITHIN_SECONDS, f"flagged {after:.0f} s after its last event"
    assert "hang_here" in stall.why and "rank 0 waits for it" in stall.why, stall.why
    assert stall_snapshot_culprit(run_dir) == 1
    summary = run_dir.read_summary()
    assert summary is not None and summary.failure is not None and summary.failure.rank == 1


@pytest.mark.slow
def test_a_rank_hanging_in_evaluation_is_flagged_in_30_s_and_is_the_root_cause(
    runs_dir: Path, run_reaper: None
) -> None:
    started = ddptui(
        "run", "cpu-demo", *QUICK, "--set", "training.evaluate=true",
        "--set", "data.train_size=2000", "--set", "data.test_size=1000",
        "--fault", "hang-eval:1:0", "--set", "supervision.kill_stalled_after=3",
        "--runs-dir", str(runs_dir), "--detach",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_dir = RunDir(runs_dir / started.stdout.strip().splitlines()[-1])
    assert wait_for(lambda: run_dir.summary_path.exists(), timeout=180), "the run never ended"
    stall, after = flagged(run_dir, 1)
    assert after <= FLAGGED_WITHIN_SECONDS, f"flagged {after:.0f} s after its last event"
    assert "faults.py" in stall.why and "in hang" in stall.why, stall.why
    assert stall_snapshot_culprit(run_dir) == 1
    summary = run_dir.read_summary()
    assert summary is not None and summary.failure is not None
    assert summary.failure.rank == 1, summary.reason  # never rank 0, which waited for it
