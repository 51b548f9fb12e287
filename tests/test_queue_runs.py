"""Queued runs end to end (issue 30): `ddptui run --queue` on CPU slots, one after the other, a
claim released with its killed launcher, a closed terminal, `ddptui kill`, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.common.statuses import RunStatus
from engine.core.config.presets import load_preset
from engine.core.config.schema import ConfigError
from engine.core.config.toml_io import apply_overrides
from engine.core.procs.process_identity import identify
from engine.core.queue.claims import Claim, DeviceWant, open_store
from engine.core.queue.enqueue import queue_run
from engine.core.runs.events import RankExited, RunFinished, RunStarted, read_events
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir
from tests.fixtures.live_runs import QUICK, ddptui
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.usefixtures("run_reaper")
FAST = [*QUICK, "--max-steps", "4"]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A claim store of the test's own, and a machine of two CPU slots for the queue."""
    path = tmp_path / "claims"
    monkeypatch.setenv("DDPTUI_CLAIMS_DIR", str(path))
    monkeypatch.setenv("DDPTUI_QUEUE_CPU_SLOTS", "2")
    return path


def queue(runs_dir: Path, *args: str) -> RunDir:
    done = ddptui(
        "run", "cpu-demo", *FAST, "--runs-dir", str(runs_dir), "--queue", "--detach", *args
    )
    assert done.returncode == 0, done.stderr
    return RunDir(runs_dir / done.stdout.strip())


def status(run_dir: RunDir) -> RunStatus:
    return RunObserver(run_dir).observe().status


def launcher_times(run_dir: RunDir) -> tuple[float, float]:
    events = read_events(run_dir.launcher_events_path)
    started = next(e.time for e in events if isinstance(e, RunStarted))
    finished = next(e.time for e in events if isinstance(e, RunFinished))
    return started, finished


def last_rank_gone(run_dir: RunDir) -> float:
    """When the run's launcher reaped its last rank (its RankExited events, one a rank)."""
    exits = [e.time for e in read_events(run_dir.launcher_events_path) if isinstance(e, RankExited)]
    assert len(exits) == run_dir.read_run_info().world_size, "every rank reaped"
    return max(exits)


def hold_slots(store: Path, pen_process: subprocess.Popen[bytes], slots: int = 2) -> Claim:
    """A claim holding ``slots`` CPU slots for a process of the test (a run's launcher)."""
    ref = identify(pen_process.pid)
    assert ref is not None
    claims = open_store(store)
    with claims.locked():
        held = Claim(
            1, "holder-run", "/nowhere/holder-run", DeviceWant("cpu", slots), ref, time.time()
        )
        claims.write(held.holding(()), new=True)
    return held


@pytest.mark.slow
def test_two_queued_runs_on_the_same_cpu_slots_run_one_after_the_other(
    runs_dir: Path, store: Path
) -> None:
    first = queue(runs_dir)
    second = queue(runs_dir)
    assert status(second) == RunStatus.QUEUED
    listed = ddptui("queue")
    assert listed.returncode == 0, listed.stderr
    assert f"2 claimed by run {first.run_id}" in listed.stdout
    assert wait_for(lambda: status(second).final, timeout=180), "the second run never ended"
    assert status(first) == status(second) == RunStatus.COMPLETED
    first_ranks_gone = last_rank_gone(first)
    second_start, _ = launcher_times(second)
    # Never overlapping: the second's launcher (which starts its ranks) began after the first's
    # last rank was gone.
    assert first_ranks_gone <= second_start, "the queued runs overlapped"
    # Within 2 s of the first ending (its last rank gone): the second's launcher has started.
    gap = second_start - first_ranks_gone
    print(f"the second started {gap:.2f} s after the first's last rank ended")
    assert gap < 2.0, f"started {gap:.2f} s after"
    # Both claims ended with their runs: the next look at the line releases the last one.
    assert "the queue is empty" in ddptui("queue").stdout
    assert open_store(store).read() == []


@pytest.mark.slow
def test_a_killed_launchers_claim_is_released_and_a_closed_terminal_loses_no_place(
    runs_dir: Path, store: Path
) -> None:
    # A queued run that got the two slots and runs long: its launcher is the waiter, in place.
    first = queue(runs_dir, "--max-steps", "100000")
    assert wait_for(lambda: status(first) == RunStatus.RUNNING, timeout=60), status(first)
    launcher = first.read_run_info().launcher
    (holding,) = open_store(store).read()
    assert launcher is not None and holding.waiter == launcher and holding.run_id == first.run_id
    # The queueing terminal: its own session, hung up and gone right after queueing.
    terminal = subprocess.run(
        ["setsid", "sh", "-c", '"$@"; kill -HUP 0', "sh", sys.executable, "-m", "ddptui", "run",
         "cpu-demo", *FAST, "--runs-dir", str(runs_dir), "--queue", "--detach"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    second = RunDir(runs_dir / terminal.stdout.strip())
    time.sleep(1.0)
    assert status(second) == RunStatus.QUEUED, terminal.stderr
    assert status(first) == RunStatus.RUNNING
    os.kill(launcher.pid, signal.SIGKILL)  # the holding run's launcher dies without a word
    assert wait_for(lambda: status(second).final, timeout=120), "the queued run never ran"
    assert status(second) == RunStatus.COMPLETED
    assert status(first) == RunStatus.LOST  # its summary says so; its claim went with it
    assert "the queue is empty" in ddptui("queue").stdout


@pytest.mark.slow
def test_ddptui_kill_removes_a_queued_run(runs_dir: Path, store: Path, pen: object) -> None:
    hold_slots(store, pen.python())  # type: ignore[attr-defined]
    run_dir = queue(runs_dir)
    waiter = run_dir.read_run_info().launcher
    assert waiter is not None and status(run_dir) == RunStatus.QUEUED
    killed = ddptui("kill", run_dir.run_id, "--runs-dir", str(runs_dir))
    assert killed.returncode == 0, killed.stderr
    assert status(run_dir) == RunStatus.KILLED
    summary = run_dir.read_summary()
    assert summary is not None and summary.reason == "stopped by ddptui kill while queued"
    assert [c.run_id for c in open_store(store).read()] == ["holder-run"]
    assert not psutil.pid_exists(waiter.pid) or psutil.Process(waiter.pid).status() == "zombie"


@pytest.mark.slow
def test_a_queue_timeout_ends_the_wait_as_failed(runs_dir: Path, store: Path, pen: object) -> None:
    hold_slots(store, pen.python())  # type: ignore[attr-defined]
    run_dir = queue(runs_dir, "--queue-timeout", "1")
    assert wait_for(lambda: status(run_dir).final, timeout=30)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.FAILED
    assert "longer than its --queue-timeout (1 s)" in summary.reason


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["--devices", "cpu:3"], "asks for 3 CPU slots, but this machine's queue has 2"),
        (["--devices", "0,2"], "asks for GPUs, but this machine has none"),
        (["--queue-store", "/etc/passwd"], "the claim store /etc/passwd is not a directory"),
    ],
)
def test_bad_input_is_one_sentence_exit_2_and_nothing_queued(
    runs_dir: Path, store: Path, args: list[str], sentence: str
) -> None:
    done = ddptui("run", "cpu-demo", *args, "--runs-dir", str(runs_dir), "--queue")
    assert done.returncode == 2
    assert sentence in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert list(runs_dir.iterdir()) == []
    assert not store.is_dir() or open_store(store).read() == []


@pytest.mark.parametrize(
    ("spec", "sentence"),
    [
        ("gpu:0,5", "devices.spec 'gpu:0,5' names GPU 5, but this machine has GPUs 0 to 1"),
        ("3", "devices.spec '3' asks for 3 GPUs, but this machine has 2"),
    ],
)
def test_a_gpu_that_does_not_exist_or_more_than_there_are_is_refused_and_nothing_queued(
    runs_dir: Path, store: Path, spec: str, sentence: str
) -> None:
    """On a machine of two GPUs (the count NVML would give), as `ddptui run --queue` asks."""
    config = apply_overrides(load_preset("cpu-demo"), {"devices.spec": spec})
    with pytest.raises(ConfigError) as refused:
        queue_run(config, runs_dir, store_path=store, gpu_count=2)
    assert str(refused.value) == sentence
    assert list(runs_dir.iterdir()) == [] and not store.exists()


def test_ddptui_queue_reads_the_line_and_makes_nothing(tmp_path: Path) -> None:
    """No store yet: nobody has queued (and none is made); an untrusted one: one sentence, 2."""
    missing = tmp_path / "claims"
    empty = CliRunner().invoke(main, ["queue", "--queue-store", str(missing)])
    assert empty.exit_code == 0 and empty.stdout == "the queue is empty\n"
    assert not missing.exists()
    (tmp_path / "elsewhere").mkdir()
    missing.symlink_to(tmp_path / "elsewhere")
    refused = CliRunner().invoke(main, ["queue", "--queue-store", str(missing), "--json"])
    assert refused.exit_code == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        f"ddptui: the claim store {missing} is a symbolic link; give another directory with "
        "--queue-store or DDPTUI_CLAIMS_DIR"
    ]
