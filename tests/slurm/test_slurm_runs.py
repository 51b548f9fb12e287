"""``ddptui run --slurm`` on the two-node test cluster: a preset and a plain DDP script across two
nodes, each rank on its node, the job's id recorded, the run's end decided from Slurm's side and
the node launchers' records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.runs.events import StepProgress, read_events
from engine.core.runs.placement import read_node_records
from engine.core.runs.rundir import RunDir, list_runs
from tests.fixtures.live_runs import ddptui, marked
from tests.fixtures.repo import REPO_ROOT
from tests.slurm.cluster import SlurmTestCluster

pytestmark = pytest.mark.slow

SHORT = ["--epochs", "1", "--max-steps", "10"]


def only_run(runs_dir: Path) -> RunDir:
    runs = list_runs(runs_dir)
    assert len(runs) == 1, runs
    return runs[0]


def test_a_preset_across_two_nodes_reaches_the_accuracy_of_one_machine(
    slurm: SlurmTestCluster, runs_dir: Path, tmp_path: Path
) -> None:
    done = ddptui(
        "run", "cpu-demo", "--slurm", "--nodes", "2", "--devices", "cpu:1", *SHORT,
        "--runs-dir", str(runs_dir), "--json", timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    on_slurm = json.loads(done.stdout)
    assert on_slurm["status"] == "completed" and on_slurm["world_size"] == 2
    run_dir = only_run(runs_dir)
    assert not marked(run_dir.run_id)  # nothing of it is left on the machine

    shown = json.loads(ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir), "--json").stdout)
    assert [(r["rank"], r["node"], r["state"]) for r in shown["ranks"]] == [
        (0, "n1", "done"),
        (1, "n2", "done"),
    ]
    job_id = shown["slurm"]["job_id"]
    assert int(job_id) >= slurm.first_job_id
    assert sorted(shown["slurm"]["nodes"]) == ["n1", "n2"]
    assert all(n["verified"] for n in shown["slurm"]["nodes"].values())
    records, _ = read_node_records(run_dir.path)
    assert {n: r.proof.clean for n, r in records.items() if r.proof} == {"n1": True, "n2": True}

    # the same run on one machine: two CPU ranks, the same global batch and seed
    local_runs = tmp_path / "local"
    local = ddptui(
        "run", "cpu-demo", "--devices", "cpu:2", *SHORT, "--runs-dir", str(local_runs),
        "--json", timeout=180,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    one_machine = json.loads(local.stdout)
    assert on_slurm["test_accuracy"] == pytest.approx(one_machine["test_accuracy"], abs=1e-6)
    assert on_slurm["global_batch"] == one_machine["global_batch"]


def test_a_plain_ddp_script_across_two_nodes_reports_every_ranks_progress(
    slurm: SlurmTestCluster, runs_dir: Path
) -> None:
    script = str(REPO_ROOT / "tests" / "fixtures" / "tutorial_ddp.py")
    done = ddptui(
        "run", script, "--slurm", "--nodes", "2", "--devices", "cpu:1",
        "--runs-dir", str(runs_dir), "--", "--epochs", "1", "--steps", "12", timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    assert "Slurm job" in done.stdout and "completed:" in done.stdout
    run_dir = only_run(runs_dir)
    for rank in (0, 1):
        steps = [
            e.global_step
            for e in read_events(run_dir.rank_events_path(rank))
            if isinstance(e, StepProgress)
        ]
        assert steps and steps[-1] == 12, (rank, steps)
    records, _ = read_node_records(run_dir.path)
    assert {r.node: r.global_ranks for r in records.values()} == {"n1": (0,), "n2": (1,)}
    assert {r.node: str(r.state) for r in records.values()} == {
        "n1": "completed",
        "n2": "completed",
    }
