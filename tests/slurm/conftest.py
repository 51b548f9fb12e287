"""The two-node Slurm cluster the tests in this folder run on (``tests.slurm.cluster``): started once
for the session, on first use, and ended by its pids at the end, also when a test failed. Where it
cannot run (not root, no apt-get to install Slurm, no cgroup v1 freezer) its tests skip, saying why.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.cluster import ClusterUnavailable, SlurmTestCluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmTestCluster]:
    cluster = SlurmTestCluster()
    try:
        cluster.start()
    except ClusterUnavailable as err:
        pytest.skip(f"no test Slurm cluster here: {err}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster: SlurmTestCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmTestCluster:
    """The cluster, with SLURM_CONF in this test's environment (what sbatch and ddptui read), and
    no job of an earlier test left in its queue (but the ones a module keeps running across its
    tests, ``kept_jobs``)."""
    for name, value in slurm_cluster.env().items():
        monkeypatch.setenv(name, value)
    slurm_cluster.cancel_all(keep=slurm_cluster.kept_jobs)
    return slurm_cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With several pytest-xdist workers (``--dist loadgroup``, as scripts/test.sh runs them)
    every test of this folder goes to one worker: they share one cluster, started once."""
    for item in items:
        if item.nodeid.startswith("tests/slurm/"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
