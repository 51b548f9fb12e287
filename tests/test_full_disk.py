"""A full disk is a clear failure, and a full or read-only runs directory still reads (issue 16,
finding 3): real runs on a small tmpfs (root only; elsewhere these are skipped)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir, list_runs
from tests.fixtures.live_runs import ddptui, run_processes
from tests.fixtures.made_runs import fill_disk, strict_json_load
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for
from tests.ui.standins import LIVE_RUN, RECORDED

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 3 MiB tmpfs: room for a run's start, and quickly filled."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_run_that_fills_the_disk_fails_with_one_sentence_and_a_summary(
    small_disk: Path,
) -> None:
    runs = small_disk / "runs"
    command = [
        sys.executable, "-m", "ddptui", "run", "cpu-demo", "--devices", "cpu:2",
        "--epochs", "50", "--set", "training.evaluate=false",
        "--runs-dir", str(runs),
    ]  # fmt: skip
    follower = subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert wait_for(lambda: len(list_runs(runs)) == 1, timeout=60)
        (run_dir,) = list_runs(runs)
        assert wait_for(lambda: len(run_dir.rank_event_paths()) == 2, timeout=90)
        fill_disk(small_disk)
        out, err = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
        for made in list_runs(runs):
            for p in run_processes(made):
                p.kill()
    assert follower.returncode == 1, out + err
    assert "Traceback" not in out + err
    cause = next(line for line in out.splitlines() if "root cause" in line)
    assert f"cannot write {run_dir.path}/" in cause
    assert "the disk is full (No space left on device; " in cause
    assert "free on the file system holding it)" in cause
    summary = strict_json_load(run_dir.summary_path.read_text())
    assert isinstance(summary, dict) and summary["status"] == "failed"
    assert "the disk is full" in summary["reason"]
    assert run_dir.read_run_info().state == "failed"
    hidden = [p.name for p in run_dir.path.rglob(".*")]
    assert hidden == [], f"temporary or reserve files left: {hidden}"
    assert run_processes(run_dir) == []
    for args in (["runs"], ["show", run_dir.run_id], ["runs", "--json"]):
        read = ddptui(*args, "--runs-dir", str(runs))
        assert read.returncode == 0, read.stderr
        assert "failed" in read.stdout


def test_a_run_on_a_full_disk_does_not_start_and_says_why(small_disk: Path) -> None:
    runs = small_disk / "runs"
    runs.mkdir()
    fill_disk(small_disk)
    done = ddptui("run", "cpu-demo", "--runs-dir", str(runs))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("ddptui: the run could not start: cannot write ")
    assert "the disk is full (No space left on device; 0 bytes free" in line
    assert list(runs.iterdir()) == []


def test_every_reader_works_on_a_read_only_runs_directory(small_disk: Path) -> None:
    from ddptui.watch import RunLister, RunReader

    runs = small_disk / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    lost = runs / LIVE_RUN  # its launcher is not alive here: readers find it lost
    listed = ddptui("runs", "--runs-dir", str(runs))
    assert listed.returncode == 0, listed.stderr
    assert "Read-only file system" in listed.stdout and "not saved" in listed.stdout
    shown = ddptui("show", LIVE_RUN, "--runs-dir", str(runs))
    assert shown.returncode == 0, shown.stderr
    assert "summary    lost" in shown.stdout
    view = RunReader(RunDir(lost)).poll()
    assert view is not None and view.run.status == "lost" and "not saved" in view.run.unsaved
    assert {r.run_id for r in RunLister(runs).list()} == {p.name for p in runs.iterdir()}
    state = RunObserver(RunDir(lost)).observe()
    assert state.problem == "" and not (lost / "summary.json").exists()
