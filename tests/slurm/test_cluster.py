"""The test cluster itself: two nodes that run a job step each, and nothing of it left after stop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.slurm.cluster import SlurmTestCluster


@pytest.mark.slow
def test_two_nodes_run_one_task_each(slurm: SlurmTestCluster) -> None:
    out = slurm.run("srun", "-N2", "--ntasks-per-node=1", "sh", "-c", "echo $SLURMD_NODENAME")
    assert sorted(out.split()) == ["n1", "n2"]
    slurm.wait_nodes_idle(10)  # the step's end leaves them completing for a moment


@pytest.mark.slow
def test_a_second_cluster_starts_beside_and_stops_clean(slurm: SlurmTestCluster) -> None:
    other = SlurmTestCluster(nodes=("n1",))
    try:
        other.start()
        assert other.ports["slurmctld"] != slurm.ports["slurmctld"]
        out = other.run("srun", "-N1", "sh", "-c", "echo $SLURM_JOB_ID")
        assert int(out) >= other.first_job_id
        root, namespace = other.root, other.namespace
    finally:
        other.stop()
    assert not root.exists()
    left = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and _namespace(pid) == namespace and namespace
    ]
    assert left == []
    # the first cluster is unharmed: its nodes still run jobs (their cgroup folders are theirs)
    out = slurm.run("srun", "-N2", "--ntasks-per-node=1", "sh", "-c", "echo $SLURMD_NODENAME")
    assert sorted(out.split()) == ["n1", "n2"]


def _namespace(pid: str) -> str:
    try:
        return os.readlink(Path("/proc") / pid / "ns" / "mnt")
    except OSError:
        return ""
