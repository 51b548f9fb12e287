"""Why is it stuck? On real gloo runs: a hang is flagged within 15 s with every rank's stack and the
culprit named, a SIGSTOPped rank is named as stopped, a kill keeps the evidence it destroys, and a
hung collective fails the run at its timeout with a summary naming the rank it waited for."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine.core.common.statuses import RankActivity, RankStatus, RunStatus
from engine.core.runs.events import RankStalled, StacksTaken, StopSignalled, read_events
from engine.core.runs.observer import observe_run
from engine.core.runs.rundir import RunDir
from tests.fixtures.live_runs import ddptui, detached_run, run_processes
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.slow

STEPS = ["--max-steps", "10000", "--set", "training.report_interval=0"]


def launcher_events(run_dir: RunDir, kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in read_events(run_dir.launcher_events_path) if isinstance(e, kind)]


def last_rank_event(run_dir: RunDir, rank: int) -> float:
    return max(e.time for e in read_events(run_dir.rank_events_path(rank)))


def stacks_json(run_dir: RunDir, runs_dir: Path) -> dict:  # type: ignore[type-arg]
    result = ddptui("stacks", run_dir.run_id, "--runs-dir", str(runs_dir), "--json", timeout=90)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_a_hang_is_flagged_in_15_s_its_culprit_named_and_a_kill_keeps_the_stacks(
    runs_dir: Path, run_reaper: None
) -> None:
    run_dir = detached_run(runs_dir, *STEPS, "--fault", "hang:1:3")
    assert wait_for(lambda: launcher_events(run_dir, RankStalled), timeout=90)
    flagged = launcher_events(run_dir, RankStalled)[0]
    silent_since = last_rank_event(run_dir, flagged.rank)
    assert flagged.time - silent_since <= 15.0, "flagged later than 15 s after the last progress"

    # the launcher took every rank's stack when it flagged the stall
    assert wait_for(lambda: launcher_events(run_dir, StacksTaken), timeout=60)
    taken = launcher_events(run_dir, StacksTaken)[0]
    assert taken.reason == "stall" and taken.culprit_rank == 1
    state = observe_run(run_dir)
    assert state.diagnosis is not None
    culprit = state.diagnosis.culprit
    assert culprit is not None and culprit.frame is not None
    assert (culprit.rank, culprit.frame.where.split(":")[0], culprit.frame.function) == (
        1, "faults.py", "hang",
    )  # fmt: skip
    (rank0,) = [r for r in state.diagnosis.ranks if r.rank == 0]
    assert rank0.activity == RankActivity.WAITING, rank0.describe()

    # `ddptui stacks --json` takes a fresh snapshot of the live run
    live = stacks_json(run_dir, runs_dir)
    assert live["culprit_rank"] == 1
    assert {r["rank"]: r["state"] for r in live["ranks"]} == {0: "waiting on peers", 1: "stepping"}
    assert all(r["stack"] for r in live["ranks"])
    shown = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir))
    assert "rank 1 stuck at faults.py:" in shown.stdout and "in hang" in shown.stdout

    # a kill takes the stacks before it signals anything, and summary.json keeps them
    killed = ddptui("kill", run_dir.run_id, "--runs-dir", str(runs_dir), timeout=90)
    assert killed.returncode == 0, killed.stderr
    assert run_processes(run_dir) == []
    # the launcher stopped its ranks (one SIGTERM each, from it) and wrote the summary
    assert "its launcher stopped its ranks and wrote the summary" in killed.stdout
    (stop, *_) = launcher_events(run_dir, StopSignalled)
    assert stop.signal == "SIGTERM" and stop.ranks == (0, 1)
    assert sorted(p.name.split("-", 2)[-1] for p in run_dir.stacks_dir.glob("*.json")) == [
        "before-kill.json", "on-demand.json", "stall.json",
    ]  # fmt: skip
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.KILLED
    assert summary.diagnosis is not None and summary.diagnosis.reason == "before kill"
    assert summary.diagnosis.culprit_rank == 1
    ended = stacks_json(run_dir, runs_dir)  # an ended run: the last stored snapshot
    assert ended["reason"] == "before kill" and ended["culprit_rank"] == 1


def test_a_sigstopped_rank_is_named_as_stopped(runs_dir: Path, run_reaper: None) -> None:
    run_dir = detached_run(runs_dir, *STEPS, "--fault", "sigstop:1:3")

    def stopped() -> bool:
        return any(r.state == RankStatus.STOPPED for r in observe_run(run_dir).ranks)

    assert wait_for(stopped, timeout=90)
    (rank1,) = [r for r in observe_run(run_dir).ranks if r.rank == 1]
    assert "SIGSTOP" in rank1.reason and f"kill -CONT {rank1.pid}" in rank1.reason
    live = stacks_json(run_dir, runs_dir)
    assert live["culprit_rank"] == 1
    assert {r["rank"]: r["state"] for r in live["ranks"]}[1] == "stopped by a signal"
    killed = ddptui("kill", run_dir.run_id, "--runs-dir", str(runs_dir), timeout=90)
    assert killed.returncode == 0, killed.stderr
    assert run_processes(run_dir) == []


def test_a_hung_collective_fails_at_its_timeout_naming_the_culprit(
    runs_dir: Path, run_reaper: None
) -> None:
    began = time.monotonic()
    result = ddptui(
        "run", "cpu-demo", "--devices", "cpu:2", "--epochs", "1", *STEPS,
        "--fault", "hang-collective:1:3", "--set", "ddp.timeout_seconds=8",
        "--runs-dir", str(runs_dir), timeout=150,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert time.monotonic() - began < 120
    (path,) = runs_dir.iterdir()
    run_dir = RunDir(path)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.FAILED
    assert summary.failure is not None and summary.failure.rank == 0
    assert "Timed out" in summary.failure.error
    assert summary.diagnosis is not None and summary.diagnosis.culprit_rank == 1
    assert "rank 1 stuck at faults.py:" in summary.reason and "in hang" in summary.reason
    assert "culprit: rank 1" in result.stdout
    # the flight recorder's dump of the rank that timed out, and how to read it
    assert (run_dir.flight_recorder_dir / "rank_0").stat().st_size > 0
    shown = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir))
    assert "flight recorder:" in shown.stdout
    assert "torch.distributed.flight_recorder.fr_trace" in shown.stdout
    assert run_processes(run_dir) == []
