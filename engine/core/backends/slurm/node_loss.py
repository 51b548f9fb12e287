"""Which node of a run on Slurm was lost, and how that is known, once Slurm ended the job
``NODE_FAIL`` or requeued it (a job submitted with ``--requeue``, as a run with restarts is).

Slurm's own word on the job does not name the node: its final record lists every node of the
job, a requeued job lists none. What names it, in order:

- a node of the job that Slurm counts down now (``sinfo``: down, drained, not responding), with
  Slurm's reason ("Not responding");
- a node whose slurmd started again after the attempt's node launchers started: it was lost and
  came back (a rebooted node, a slurmd restarted), which is how a requeued job finds it, since
  it runs again only once enough nodes answer;
- a node whose node launcher never said how its share ended.

Plain Python; asks ``sinfo`` once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.core.backends.slurm.cluster import SlurmCluster, SlurmUnavailable, read_cluster
from engine.core.backends.slurm.records import NodeRecord


@dataclass(frozen=True)
class LostNodes:
    """The nodes the job lost and, in a few words, how that is known ("" when only the
    silence of their node launchers tells)."""

    names: tuple[str, ...]
    how: str = ""

    def describe(self) -> str:
        """ "node n2 (down: Not responding)", "node n2 (its slurmd started again at 02:52:06,
        after the attempt began)", "nodes n1, n2"."""
        nodes = f"node{'s' if len(self.names) > 1 else ''} {', '.join(self.names)}"
        return f"{nodes} ({self.how})" if self.how else nodes


def which_failed(lost: LostNodes | None) -> str:
    """The lost nodes in words, "a node of it" when none could be named."""
    return lost.describe() if lost is not None else "a node of it"


def _down(cluster: SlurmCluster, candidates: tuple[str, ...]) -> LostNodes | None:
    down = [n for n in candidates if (node := cluster.node(n)) and node.down]
    if not down:
        return None
    node = cluster.node(down[0])
    why = f": {node.reason}" if node and node.reason else ""
    return LostNodes(tuple(down), f"{'down' if len(down) == 1 else 'all down'}{why}")


def _came_back(
    cluster: SlurmCluster, candidates: tuple[str, ...], since: float
) -> LostNodes | None:
    back = [
        (name, node.slurmd_started)
        for name in candidates
        if (node := cluster.node(name)) and node.slurmd_started and node.slurmd_started > since
    ]
    if not back:
        return None
    when = time.strftime("%H:%M:%S", time.localtime(max(started for _, started in back)))
    its = "its slurmd" if len(back) == 1 else "their slurmd"
    return LostNodes(
        tuple(name for name, _ in back), f"{its} started again at {when}, after the attempt began"
    )


def lost_nodes(
    job_nodes: tuple[str, ...],
    records: dict[str, NodeRecord],
    cluster: SlurmCluster | None = None,
) -> LostNodes | None:
    """The nodes of the job (``job_nodes``, as Slurm lists them now, and those its node
    launchers recorded: a job Slurm is ending or has requeued lists fewer, or none) that it
    lost, by the rules above; None when none can be named. ``cluster``: as ``sinfo`` says it
    now (None: asked here; Slurm not answering leaves the node launchers' silence)."""
    candidates = tuple(dict.fromkeys((*job_nodes, *sorted(records))))
    if cluster is None:
        try:
            cluster = read_cluster()
        except SlurmUnavailable:
            cluster = None
    if cluster is not None:
        found = _down(cluster, candidates)
        started = [r.started for r in records.values() if r.started]
        if found is None and started:
            found = _came_back(cluster, candidates, min(started))
        if found is not None:
            return found
    silent = tuple(n for n in candidates if n not in records or not records[n].final)
    return LostNodes(silent) if silent else None
