"""The end-to-end claim of ``ddptui diff`` on two real gloo runs: one whose data comes from a
slowed factory with no DataLoader worker, one without; the sentence names data wait and the
changed key, both runs recorded environment.json, and the report fits 80 columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.runs.recorded_environment import read_environment
from engine.core.runs.rundir import list_runs
from tests.fixtures.live_runs import ddptui, run_processes
from tests.fixtures.repo import REPO_ROOT

BLOBS = str(REPO_ROOT / "tests" / "fixtures" / "byo" / "blobs.toml")
# Reports every 50 ms, so even a fast run has steady reports after its first (its start-up).
SHORT = [
    "--epochs", "1", "--batch-size", "32", "--set", "training.evaluate=false",
    "--set", "training.report_interval=0.05",
]  # fmt: skip


@pytest.mark.slow
def test_a_slowed_data_factory_without_workers_is_named(
    runs_dir: Path, byo_path: None, run_reaper: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = ["--runs-dir", str(runs_dir)]
    fast = ddptui(
        "run", BLOBS, *SHORT, "--set", "data.num_workers=1",
        "--set", "data.factory_args={train_size = 16384}", *where, timeout=180,
    )  # fmt: skip
    assert fast.returncode == 0, fast.stdout + fast.stderr
    slow = ddptui(
        "run", BLOBS, *SHORT, "--set", "data.num_workers=0",
        "--set", "data.factory=mymodels.data:slow_blobs",
        "--set", "data.factory_args={seconds = 0.001, train_size = 2048}", *where, timeout=180,
    )  # fmt: skip
    assert slow.returncode == 0, slow.stdout + slow.stderr
    a, b = list_runs(runs_dir)
    for run in (a, b):
        assert run_processes(run) == []
        environment = read_environment(run)
        assert environment is not None and environment.torch
        assert environment.variables["OMP_NUM_THREADS"] == str(environment.threads_per_rank)
        assert environment.outside_load_cores is not None
    result = ddptui("diff", a.run_id, b.run_id, *where)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    text = " ".join(lines)
    assert " slower: its data wait rose from " in text, text
    assert "it ran with data.num_workers 0 instead of 1 and data.factory" in text, text
    # one id: against the newest completed run of its preset before it, the same comparison
    again = ddptui("diff", b.run_id, *where)
    assert again.stdout.splitlines()[:2] == lines[:2]
    monkeypatch.setenv("COLUMNS", "80")
    narrow = ddptui("diff", a.run_id, b.run_id, *where)
    assert [line for line in narrow.stdout.splitlines() if len(line) > 80] == []
