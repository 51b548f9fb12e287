"""Where a run on Slurm lives: its job (``run.json``'s ``placement``, ``SlurmPlacement``) and what
each node launcher recorded of itself (``nodes/<node>.json``), and the paths of its own files.

A run on Slurm has one node launcher per node (``engine.train.node_launch``). Each records, in the
run directory every node sees, its node, its own process, the ranks it started with the global
number it gave each (the launcher that assigns a rank records it: nothing assumes rank 0 is on the
first node), and at its end how it ended and its proof: what it stopped and that nothing carrying
the run's marker is left on its node. Readers (the run observer, ``ddptui kill`` / ``stacks``)
go by these records, never by processes they could see on this machine.

Plain Python: typed records, read back into the objects that wrote them, every file read through
no planted link and with a size bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.backends.slurm.watch import RENDEZVOUS_NAME, SLURM, SLURM_DIR
from engine.core.common.run_files import make_dirs, write_json_atomic
from engine.core.common.run_layout import RunLayout
from engine.core.common.statuses import RunStatus
from engine.core.procs.process_identity import ProcessRef
from engine.core.runs.node_files import check_node_name, read_each_node
from engine.core.runs.run_info import Placement, RunInfo

# Slurm sends SIGKILL KillWait seconds (30 by default) after its SIGTERM: a node launcher gives
# its ranks less than that, so its proof is written before it.
NODE_STOP_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class SlurmPlacement:
    """run.json's ``placement`` of a run on Slurm (``{"backend": "slurm", ...these keys}``; a
    run.json written before ``placement`` kept them under ``slurm``): the job the run is (or is a
    step of) and what was asked of Slurm."""

    job_id: str = ""  # "" until sbatch answered
    nodes: int = 1
    partition: str = ""  # "" the cluster's default
    time_limit: str = ""  # as asked ("" the partition's)
    # A step of the user's own allocation (salloc): the run is that step, never the whole job.
    in_allocation: bool = False
    submitted: float = 0.0
    # Slurm's restart count of the job (SLURM_RESTART_COUNT) the current attempt began under:
    # a count above it says Slurm requeued the job after that attempt began (a node failure)
    requeues: int = 0
    # how the current attempt began, for its node launchers: "" (the run's first), "restart"
    # (after a failure, engine.core.backends.slurm.restarts), "resume" (ddptui resume)
    attempt_start: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "nodes": self.nodes,
            "partition": self.partition,
            "time_limit": self.time_limit,
            "in_allocation": self.in_allocation,
            "submitted": self.submitted,
            "requeues": self.requeues,
            "attempt_start": self.attempt_start,
        }

    def placement(self) -> Placement:
        """As run.json's ``placement`` keeps it."""
        return Placement(SLURM, self.to_json())

    @classmethod
    def of(cls, info: RunInfo) -> SlurmPlacement | None:
        """The run's job, when run.json places it on Slurm; None for any other run. A key that
        cannot be read reads as not given."""
        placed = info.placement
        if placed is None or placed.backend != SLURM:
            return None
        try:
            return cls.from_json(placed.keys)
        except (TypeError, ValueError):
            return cls()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SlurmPlacement:
        return cls(
            job_id=str(data.get("job_id") or ""),
            nodes=int(data.get("nodes", 1)),
            partition=str(data.get("partition") or ""),
            time_limit=str(data.get("time_limit") or ""),
            in_allocation=bool(data.get("in_allocation", False)),
            submitted=float(data.get("submitted") or 0.0),
            requeues=int(data.get("requeues") or 0),
            attempt_start=str(data.get("attempt_start") or ""),
        )


@dataclass(frozen=True)
class NodeProof:
    """What a node launcher stopped at its end and what it found left of the run on its node."""

    terminated: tuple[int, ...] = ()  # pids that ended on SIGTERM (or by themselves)
    killed: tuple[int, ...] = ()  # pids that needed SIGKILL
    left: tuple[int, ...] = ()  # pids carrying the run's marker still alive after all that
    # Processes of the run no rank was the parent of any more (a task's double-forked daemon):
    # found by the run's marker, stopped with the rest, named here.
    daemons: tuple[str, ...] = ()
    checked: float = field(default_factory=time.time)

    @property
    def clean(self) -> bool:
        return not self.left

    def to_json(self) -> dict[str, Any]:
        return {
            "terminated": list(self.terminated),
            "killed": list(self.killed),
            "left": list(self.left),
            "daemons": list(self.daemons),
            "checked": self.checked,
        }

    @classmethod
    def from_json(cls, data: Any) -> NodeProof | None:
        if not isinstance(data, dict):
            return None
        return cls(
            terminated=tuple(int(p) for p in data.get("terminated") or ()),
            killed=tuple(int(p) for p in data.get("killed") or ()),
            left=tuple(int(p) for p in data.get("left") or ()),
            daemons=tuple(str(d) for d in data.get("daemons") or ()),
            checked=float(data.get("checked") or 0.0),
        )


@dataclass(frozen=True)
class NodeRecord:
    """``nodes/<node>.json``: one node launcher, its ranks, and (at its end) how it ended."""

    node: str  # Slurm's name of the node (SLURMD_NODENAME)
    node_rank: int  # SLURM_NODEID: 0 .. nodes-1
    host: str  # the machine's own name
    job_id: str
    step_id: str = ""
    launcher: ProcessRef | None = None
    ranks: tuple[ProcessRef, ...] = ()
    global_ranks: tuple[int, ...] = ()  # the number this launcher gave each of ``ranks``
    state: RunStatus = RunStatus.STARTING  # starting, running, then how its share ended
    reason: str = ""
    started: float = field(default_factory=time.time)
    finished: float | None = None
    proof: NodeProof | None = None
    attempt: int = 1  # the run's attempt this launcher ran (run.json's when it started)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", RunStatus(self.state))
        object.__setattr__(self, "global_ranks", tuple(self.global_ranks))
        if len(self.global_ranks) != len(self.ranks):
            raise ValueError(f"{len(self.global_ranks)} global ranks for {len(self.ranks)} ranks")

    def ranked(self) -> tuple[tuple[int, ProcessRef], ...]:
        return tuple(zip(self.global_ranks, self.ranks, strict=True))

    @property
    def final(self) -> bool:
        return self.state.final

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "node_rank": self.node_rank,
            "host": self.host,
            "job_id": self.job_id,
            "step_id": self.step_id,
            "launcher": self.launcher.to_json() if self.launcher else None,
            "ranks": [{**ref.to_json(), "rank": rank} for rank, ref in self.ranked()],
            "state": str(self.state),
            "reason": self.reason,
            "started": self.started,
            "finished": self.finished,
            "proof": self.proof.to_json() if self.proof else None,
            "attempt": self.attempt,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeRecord:
        launcher = data.get("launcher")
        ranks = data.get("ranks") or []
        return cls(
            node=check_node_name(str(data["node"])),
            node_rank=int(data["node_rank"]),
            host=str(data.get("host", "")),
            job_id=str(data.get("job_id", "")),
            step_id=str(data.get("step_id", "")),
            launcher=ProcessRef.from_json(launcher) if launcher else None,
            ranks=tuple(ProcessRef.from_json(r) for r in ranks),
            global_ranks=tuple(int(r["rank"]) for r in ranks),
            state=RunStatus(data.get("state", RunStatus.STARTING)),
            reason=str(data.get("reason", "")),
            started=float(data.get("started") or 0.0),
            finished=float(data["finished"]) if data.get("finished") is not None else None,
            proof=NodeProof.from_json(data.get("proof")),
            attempt=int(data.get("attempt") or 1),
        )


# ---- where they are kept ---------------------------------------------------------------------


def node_record_path(run_path: Path, node: str) -> Path:
    return RunLayout(Path(run_path)).node_record(check_node_name(node))


def node_events_path(run_path: Path, node: str) -> Path:
    """The node launcher's own events (``engine.core.runs.events``): beside the ranks' events."""
    return RunLayout(Path(run_path)).node_events(check_node_name(node))


def node_log_path(run_path: Path, node: str) -> Path:
    return RunLayout(Path(run_path)).node_log(check_node_name(node))


def _slurm_dir(run_path: Path) -> Path:
    return RunLayout(Path(run_path)).placement_dir(SLURM_DIR)


def batch_script_path(run_path: Path) -> Path:
    return _slurm_dir(run_path) / "job.sbatch"


def job_output_path(run_path: Path) -> Path:
    """The batch job's own output (sbatch ``--output``): what srun and a node that could not
    start its launcher said."""
    return _slurm_dir(run_path) / "job.out"


def store_address_path(run_path: Path) -> Path:
    """Where node 0's launcher publishes the address and port its rank 0 serves the store on."""
    return _slurm_dir(run_path) / RENDEZVOUS_NAME


def write_node_record(run_path: Path, record: NodeRecord) -> None:
    """``record`` as ``nodes/<node>.json`` of ``run_path`` (the run directory, or the folder of
    an earlier attempt below its attempts/)."""
    path = node_record_path(run_path, record.node)
    make_dirs(path.parent)
    write_json_atomic(path, record.to_json())


def read_node_records(run_path: Path) -> tuple[dict[str, NodeRecord], tuple[str, ...]]:
    """Every node launcher's record by node, and a sentence for each that could not be read."""
    return read_each_node(run_path, RunLayout(Path(run_path)).nodes_dir, NodeRecord.from_json)


def rank_nodes(records: dict[str, NodeRecord]) -> dict[int, str]:
    """Each global rank's node, as the launchers that numbered them recorded it."""
    return {rank: r.node for r in records.values() for rank in r.global_ranks}
