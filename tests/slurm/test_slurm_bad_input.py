"""Bad input to ``ddptui run --slurm``: one sentence, exit code 2, no run directory made and
nothing submitted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.live_runs import ddptui
from tests.slurm.cluster import SlurmTestCluster


def refused(runs_dir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    import subprocess
    import sys

    from tests.fixtures.repo import REPO_ROOT

    done = subprocess.run(
        [sys.executable, "-m", "ddptui", "run", "cpu-demo", *args, "--runs-dir", str(runs_dir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env or dict(os.environ),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptui: "), done.stderr
    assert not list(runs_dir.iterdir()), "a run directory was made"
    return lines[0].removeprefix("ddptui: ")


def test_without_slurms_commands_on_path(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    bare = {**os.environ, "PATH": "/nonexistent"}
    said = refused(runs, "--slurm", "--nodes", "2", "--devices", "cpu:1", env=bare)
    assert said.startswith("--slurm: Slurm's sbatch is not on PATH")


def test_what_the_command_line_alone_refuses(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    assert refused(runs, "--nodes", "2") == "--nodes needs --slurm"
    assert refused(runs, "--nodes", "2", "--time", "5") == "--nodes, --time need --slurm"
    assert "slurm.time is 'soon'" in refused(runs, "--slurm", "--time", "soon")
    assert "--sbatch nodes is set by ddptui itself" in refused(
        runs, "--slurm", "--sbatch", "nodes=3"
    )
    said = refused(runs, "--slurm", "--devices", "0,1")
    assert said.startswith("--devices 0,1: on Slurm each node's GPUs are Slurm's to choose")


@pytest.mark.slow
def test_what_only_the_cluster_can_refuse(slurm: SlurmTestCluster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    before = set(slurm.active_jobs())
    assert refused(runs, "--slurm", "--partition", "gpu") == (
        "--partition gpu: Slurm has no such partition (partitions: debug)"
    )
    assert refused(runs, "--slurm", "--nodes", "3", "--devices", "cpu:1") == (
        "--nodes 3: partition debug has 2 node(s) (n1, n2)"
    )
    said = refused(runs, "--slurm", "--nodes", "1", "--devices", "cpu:1", "--sbatch", "mem=99T")
    assert said.startswith("Slurm refused the job: "), said
    in_allocation = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2"}
    said = refused(runs, "--slurm", "--max-restarts", "1", env=in_allocation)
    assert said == (
        "--max-restarts 1: inside your allocation (job 77, SLURM_JOB_ID) the run is a step of "
        "it, which ddptui does not start again; submit it from outside the allocation (a batch "
        "job of its own restarts)"
    )
    assert set(slurm.active_jobs()) == before  # nothing submitted
    assert ddptui  # the shared CLI runner stays the one these tests mirror
