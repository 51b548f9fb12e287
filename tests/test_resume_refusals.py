"""``ddptui resume`` refuses what cannot go on in one sentence, exit 2, with nothing started and
nothing in the run directory changed: a running run, another user's run (both ways: root
resuming a user's, a user resuming root's), a completed run, a run on Slurm that Slurm cannot
take, a run whose config.toml no longer loads, and a checkpoint of another model or another
number of ranks."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.backends.slurm.records import SlurmPlacement
from engine.core.common.statuses import RunStatus
from engine.core.config.presets import load_preset
from engine.core.config.toml_io import apply_overrides, to_toml
from engine.core.runs.checkpoint_record import CheckpointRecord, write_checkpoint_record
from engine.core.runs.rundir import RunDir
from engine.core.runs.summarize import build_summary
from tests.fixtures.made_runs import ProcessPen, make_run, marker_env, rank_events, ref_of
from tests.fixtures.repo import REPO_ROOT


def ended_run(runs_dir: Path, run_id: str, status: RunStatus, pen: ProcessPen) -> RunDir:
    """A cpu-demo run of two ranks that ended ``status``: its launcher gone, its summary written,
    its checkpoint (of epoch 1, 30 steps) there."""
    gone = pen.python()
    launcher = ref_of(gone)
    gone.send_signal(signal.SIGKILL)
    gone.wait()
    run_dir = make_run(
        runs_dir, run_id, launcher=launcher, state=status,
        events={"rank-0": rank_events(0, 30), "rank-1": rank_events(1, 30)},
    )  # fmt: skip
    config = apply_overrides(load_preset("cpu-demo"), {"training.epochs": 1})
    run_dir.config_path.write_text(to_toml(config))
    run_dir.write_summary(build_summary(run_dir, status))
    run_dir.checkpoint_path.write_bytes(b"a checkpoint")
    record = CheckpointRecord(1, 0, 30, 30, 2, "small_cnn", 12, time.time())
    write_checkpoint_record(run_dir.path, record)
    return run_dir


def tree(path: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry below ``path``: its owner and, for a file, its bytes."""
    return {
        str(p.relative_to(path)): (p.lstat().st_uid, p.read_bytes() if p.is_file() else b"")
        for p in sorted(path.rglob("*"))
    }


def refused(runs_dir: Path, run_dir: RunDir) -> str:
    """``ddptui resume`` of ``run_dir``: exit 2 with one sentence, and nothing started or
    changed; returns the sentence."""
    before = tree(runs_dir)
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    result = CliRunner().invoke(main, ["resume", run_dir.run_id, "--runs-dir", str(runs_dir)])
    assert result.exit_code == 2, result.output
    assert tree(runs_dir) == before
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ddptui: run {run_dir.run_id}")
    return lines[0]


def test_a_running_run_is_refused(runs_dir: Path, pen: ProcessPen) -> None:
    run_id = "20260101-000000-cpu-demo-live"
    launcher = pen.python(env=marker_env(runs_dir, run_id))
    run_dir = make_run(runs_dir, run_id, launcher=ref_of(launcher))
    said = refused(runs_dir, run_dir)
    assert said == (
        f"ddptui: run {run_id} is running (launcher pid {launcher.pid}): only a run that failed, "
        f"was killed, was lost or was ended by its scheduler goes on; stop it first with "
        f"`ddptui kill {run_id}`"
    )


def test_a_run_with_a_process_left_is_refused(runs_dir: Path, pen: ProcessPen) -> None:
    run_dir = ended_run(runs_dir, "20260101-000000-cpu-demo-left", RunStatus.KILLED, pen)
    daemon = pen.python(env=marker_env(runs_dir, run_dir.run_id))
    said = refused(runs_dir, run_dir)
    assert f"still has processes carrying its marker (pid {daemon.pid})" in said


def test_a_completed_run_is_refused(runs_dir: Path, pen: ProcessPen) -> None:
    run_dir = ended_run(runs_dir, "20260101-000000-cpu-demo-done", RunStatus.COMPLETED, pen)
    assert refused(runs_dir, run_dir).endswith("completed: there is nothing left of it to train")


def test_a_run_whose_config_no_longer_loads_is_refused(runs_dir: Path, pen: ProcessPen) -> None:
    run_dir = ended_run(runs_dir, "20260101-000000-cpu-demo-cfg", RunStatus.FAILED, pen)
    run_dir.config_path.write_text(run_dir.config_path.read_text() + "\n[training]\nepochz = 3\n")
    said = refused(runs_dir, run_dir)
    assert f"'s config.toml no longer loads: {run_dir.config_path}" in said


def test_a_checkpoint_of_another_model_or_world_is_refused(runs_dir: Path, pen: ProcessPen) -> None:
    run_dir = ended_run(runs_dir, "20260101-000000-cpu-demo-ckpt", RunStatus.KILLED, pen)
    record = CheckpointRecord(1, 0, 30, 30, 2, "resnet18", 12, time.time())
    write_checkpoint_record(run_dir.path, record)
    assert refused(runs_dir, run_dir) == (
        f"ddptui: run {run_dir.run_id} cannot go on from its checkpoint: "
        f"{run_dir.checkpoint_path} is a checkpoint of model resnet18, and the run's "
        "config.toml now trains small_cnn"
    )
    write_checkpoint_record(run_dir.path, replace(record, model="small_cnn", world_size=4))
    assert "was taken with 4 rank(s) and the run now has 2" in refused(runs_dir, run_dir)


def test_a_run_on_slurm_is_checked_against_slurm_first(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resumed as a new job of its own; where Slurm cannot take it, refused as ``ddptui run
    --slurm`` would be, before anything moves (the real resubmission: tests/slurm)."""
    run_dir = ended_run(runs_dir, "20260101-000000-cpu-demo-slurm", RunStatus.FAILED, pen)
    run_dir.write_run_info(
        replace(run_dir.read_run_info(), placement=SlurmPlacement(job_id="42").placement())
    )
    monkeypatch.setenv("PATH", str(runs_dir))  # no sbatch on this PATH
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    said = refused(runs_dir, run_dir)
    assert said.startswith(f"ddptui: run {run_dir.run_id} cannot start on Slurm now: --slurm: ")
    assert "sbatch" in said


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a user: root only")
def test_root_does_not_resume_another_users_run(
    runs_dir: Path, pen: ProcessPen, other_user: str
) -> None:
    run_dir = ended_run(runs_dir, "20260101-000000-cpu-demo-theirs", RunStatus.FAILED, pen)
    for path in [run_dir.path, *run_dir.path.rglob("*")]:
        shutil.chown(path, user=other_user)
    assert refused(runs_dir, run_dir) == (
        f"ddptui: run {run_dir.run_id} belongs to {other_user}: only its owner resumes it (its "
        "next attempt writes into its run directory)"
    )


@pytest.fixture
def shared_runs() -> Iterator[Path]:
    """A runs directory under /tmp another user can read."""
    top = Path(tempfile.mkdtemp(prefix="ddptui-resume-", dir="/tmp"))
    top.chmod(0o755)
    try:
        yield top / "runs"
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a user: root only")
def test_a_user_does_not_resume_roots_run(
    shared_runs: Path, pen: ProcessPen, other_user: str
) -> None:
    shared_runs.mkdir(mode=0o755)
    run_dir = ended_run(shared_runs, "20260101-000000-cpu-demo-roots", RunStatus.FAILED, pen)
    before = tree(shared_runs)
    entry = pwd.getpwnam(other_user)
    home = Path(tempfile.mkdtemp(prefix="ddptui-home-", dir="/tmp"))
    shutil.chown(home, user=other_user)
    try:
        done = subprocess.run(
            ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups",
             sys.executable, "-m", "ddptui", "resume", run_dir.run_id,
             "--runs-dir", str(shared_runs)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
            env={**os.environ, "HOME": str(home), "DDPTUI_CACHE_DIR": str(home / "cache")},
        )  # fmt: skip
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"ddptui: run {run_dir.run_id} belongs to root: only its owner resumes it (its next "
        "attempt writes into its run directory)"
    )
    assert tree(shared_runs) == before
