"""Restarts and resumes of real runs on gloo, through the CLI as a user types it:

- ``ddptui run cpu-demo --epochs 3 --fault crash:1:60 --max-restarts 1`` completes in two
  attempts, the second from the last checkpoint (the end of epoch 1, not step 0), with the test
  accuracy of a run with no fault (within a point);
- ``ddptui kill`` then ``ddptui resume`` ends with the very weights of a run never stopped;
- ``--max-restarts 2`` with a crash that repeats stops after the second try, saying "the same
  error at the same step twice";
- a rank that hangs is found stalled, its stacks are taken, and the run restarts;
- a user's script is restarted with TORCHELASTIC_RESTART_COUNT and its resume option pointing at
  the newest checkpoint it wrote.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from engine.core.runs.checkpoint_record import read_checkpoint_record
from engine.core.runs.restart_policy import SAME_FAILURE
from engine.core.runs.rundir import RunDir
from engine.core.runs.summary import AttemptStart, RunSummary
from engine.core.stacks.snapshot import latest_snapshot
from tests.fixtures.live_runs import ddptui
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for
from tests.test_training_equivalence import final_weights

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("run_reaper")]
QUICK_BACKOFF = ("--set", "supervision.restart_backoff_seconds=0.5")


def the_run(runs_dir: Path, done: object) -> tuple[RunDir, RunSummary]:
    """The run a ``ddptui run`` made (its id on its first line) and its summary."""
    first = done.stdout.splitlines()[0]  # type: ignore[attr-defined]
    run_dir = RunDir(runs_dir / first.split()[1].rstrip(":"))
    summary = run_dir.read_summary()
    assert summary is not None
    return run_dir, summary


def test_a_crash_with_one_restart_completes_from_the_last_checkpoint(runs_dir: Path) -> None:
    common = ("run", "cpu-demo", "--epochs", "3", "--runs-dir", str(runs_dir))
    done = ddptui(*common, "--fault", "crash:1:60", "--max-restarts", "1", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir, summary = the_run(runs_dir, done)
    first, second = summary.attempts
    assert first.describe() == (
        "attempt 1 failed at step 60: rank 1: RuntimeError: injected crash at step 60"
    )
    steps_per_epoch = summary.epochs[0].steps
    assert second.start == AttemptStart.RESTART
    assert second.from_step == steps_per_epoch > 0  # the end of epoch 1's checkpoint, not step 0
    assert [(e.epoch, e.attempt) for e in summary.epochs] == [(0, 1), (1, 2), (2, 2)]
    assert "restarting: attempt 1 failed at step 60" in done.stdout
    assert f"attempt 2 resumed from step {steps_per_epoch} (restart), completed" in done.stdout
    assert (run_dir.layout.attempt(1).path / "summary.json").is_file()

    plain = ddptui(*common, timeout=600)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    _, unstopped = the_run(runs_dir, plain)
    assert summary.test_accuracy is not None and unstopped.test_accuracy is not None
    assert abs(summary.test_accuracy - unstopped.test_accuracy) <= 0.01


def test_kill_then_resume_ends_with_the_weights_of_a_run_never_stopped(runs_dir: Path) -> None:
    common = ("--epochs", "2", "--max-steps", "30", "--set", "training.checkpoint_every=10",
              "--set", "training.evaluate=false", "--runs-dir", str(runs_dir))  # fmt: skip
    # slow from step 15 on in the first attempt only, so the kill lands mid-run
    started = ddptui("run", "cpu-demo", *common, "--fault", "slow:0:15", "--detach")
    assert started.returncode == 0, started.stderr
    run_dir = RunDir(runs_dir / started.stdout.strip())

    def checkpointed() -> bool:
        record = read_checkpoint_record(run_dir.path)
        return record is not None and record.global_step >= 20

    assert wait_for(checkpointed, timeout=240), "no checkpoint of step 20"
    killed = ddptui("kill", run_dir.run_id, "--runs-dir", str(runs_dir))
    assert killed.returncode == 0, killed.stdout + killed.stderr
    record = read_checkpoint_record(run_dir.path)
    assert record is not None and 20 <= record.global_step < 60
    resumed = ddptui("resume", run_dir.run_id, "--runs-dir", str(runs_dir), timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = run_dir.read_summary()
    assert summary is not None
    first, second = summary.attempts
    assert first.status == "killed" and first.reason.startswith("stopped by ddptui kill")
    assert (second.start, second.from_step, second.status) == (
        AttemptStart.RESUME,
        record.global_step,
        "completed",
    )
    unstopped = ddptui("run", "cpu-demo", *common, timeout=600)
    assert unstopped.returncode == 0, unstopped.stdout + unstopped.stderr
    whole, _ = the_run(runs_dir, unstopped)
    a, b = final_weights(run_dir), final_weights(whole)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


def test_a_crash_that_repeats_at_the_same_step_stops_restarting(runs_dir: Path) -> None:
    done = ddptui(
        "run", "cpu-demo", "--epochs", "2", "--max-steps", "20", "--set",
        "training.evaluate=false", "--fault", "crash:1:25:every", "--max-restarts", "2",
        *QUICK_BACKOFF, "--runs-dir", str(runs_dir), timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    run_dir, summary = the_run(runs_dir, done)
    assert [a.describe() for a in summary.attempts] == [
        "attempt 1 failed at step 25: rank 1: RuntimeError: injected crash at step 25",
        "attempt 2 resumed from step 20 (restart), failed at step 25: rank 1: RuntimeError: "
        "injected crash at step 25",
    ]
    assert f"not restarting: {SAME_FAILURE}" in summary.reason
    assert f"not restarting: {SAME_FAILURE}" in done.stdout
    assert not run_dir.layout.attempt(2).path.exists()  # no third attempt began


def test_a_hung_rank_is_stopped_after_its_stacks_and_the_run_restarts(runs_dir: Path) -> None:
    done = ddptui(
        "run", "cpu-demo", "--epochs", "1", "--max-steps", "30", "--set",
        "training.evaluate=false", "--set", "training.checkpoint_every=5", "--set",
        "supervision.stall_floor_seconds=5", "--fault", "hang:1:12", "--max-restarts", "1",
        *QUICK_BACKOFF, "--runs-dir", str(runs_dir), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir, summary = the_run(runs_dir, done)
    first, second = summary.attempts
    assert first.status == "failed" and first.failure is not None and first.failure.rank == 1
    assert "stopped by supervision.max_restarts, to restart it" in first.reason
    snapshot = latest_snapshot(run_dir.layout.attempt(1).path)
    assert snapshot is not None and snapshot.culprit_rank == 1  # taken before the stop
    assert snapshot.time < second.started
    assert (second.from_step, second.status) == (10, "completed")


def test_a_script_is_restarted_pointed_at_its_newest_checkpoint(
    runs_dir: Path, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    done = ddptui(
        "run", str(REPO_ROOT / "tests" / "fixtures" / "restartable_script.py"), "--devices",
        "cpu:1", "--max-restarts", "1", "--set", "script.resume_arg=--resume", *QUICK_BACKOFF,
        "--runs-dir", str(runs_dir), "--", "--steps", "6", "--record", str(record),
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir, summary = the_run(runs_dir, done)
    checkpoints = run_dir.layout.script_checkpoints
    first = json.loads(Path(f"{record}.0").read_text())
    second = json.loads(Path(f"{record}.1").read_text())
    assert first == {"argv": ["--steps", "6", "--record", str(record)], "restarts": 0, "start": 0}
    newest = str((checkpoints / "step-3.json").resolve())  # the last its first attempt wrote
    assert second == {
        "argv": ["--steps", "6", "--record", str(record), "--resume", newest],
        "restarts": 1,
        "start": 3,
    }
    assert [a.status for a in summary.attempts] == ["failed", "completed"]
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"step-{n}.json" for n in range(1, 7)]
    assert time.time() - summary.finished < 120
