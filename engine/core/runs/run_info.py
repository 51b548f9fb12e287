"""run.json: who is (or was) running a run (``RunInfo``), and where (its ``placement``:
``engine.core.runs.placement.Placement``). Read and written through
``engine.core.runs.rundir.RunDir``. Plain Python.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from engine.core.common.run_environment import RUN_MARKER_ENV
from engine.core.common.statuses import RunStatus
from engine.core.host.oom_evidence import OomBaseline
from engine.core.procs.process_identity import ProcessRef
from engine.core.runs.placement import Placement

RUN_SCHEMA_VERSION = 1


def this_host() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class RunInfo:
    """run.json: who is (or was) running this run."""

    run_id: str
    preset: str
    host: str
    created: float
    state: RunStatus  # starting | running, then how it ended (completed | failed | killed | lost)
    world_size: int
    devices: str
    launcher: ProcessRef | None = None
    pgid: int | None = None
    ranks: tuple[ProcessRef, ...] = ()  # this node's rank processes, in the launcher's order
    node_rank: int = 0
    nnodes: int = 1
    # The launcher's boot, uptime and memory cgroup's OOM count at its start: what ties a later
    # OOM kill to this run (engine.core.host.oom_evidence).
    oom_baseline: OomBaseline | None = None
    # The global rank of each of ``ranks``, as the launcher that started them numbered them; ()
    # in a run.json written before ddptui recorded it (``ranked`` derives those).
    global_ranks: tuple[int, ...] = ()
    # A run another backend placed (``engine.core.backends``): its name and own keys. A run
    # across nodes has its node launchers record themselves and their ranks in their own
    # records, not here: ``ranks`` stays ().
    placement: Placement | None = None
    # The run's current attempt (its first is 1; a restart or ``ddptui resume`` adds one): the
    # events, stacks and summary at the top of the run directory are this attempt's, the earlier
    # ones' are below attempts/<n>/ (``engine.core.runs.attempts``).
    attempt: int = 1
    attempt_started: float = 0.0  # when a later attempt began (its launcher has 30 s to record)

    @classmethod
    def begun(
        cls,
        run_id: str,
        preset: str,
        *,
        world_size: int,
        devices: str,
        state: RunStatus = RunStatus.STARTING,
        created: float | None = None,
    ) -> RunInfo:
        """run.json as a run begins, on this host, now (or at ``created``): the one place a
        run's first run.json is made, by ``ddptui run``, a backend's submit and a launcher started
        by hand alike (each adds its own keys with ``dataclasses.replace``)."""
        when = time.time() if created is None else created
        return cls(run_id, preset, this_host(), when, state, world_size, devices)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", RunStatus(self.state))  # the word, typed where made
        object.__setattr__(self, "global_ranks", tuple(self.global_ranks))
        if self.global_ranks and len(self.global_ranks) != len(self.ranks):
            raise ValueError(
                f"{len(self.global_ranks)} global ranks for {len(self.ranks)} rank processes"
            )

    def ranked(self) -> tuple[tuple[int, ProcessRef], ...]:
        """(global rank, process) of each rank of this node: the one rank numbering every reader
        goes by. The number is the one the launcher recorded; nothing assumes a node holds a
        contiguous block of ranks (a scheduler may place global rank 0 on any node). A run.json
        from before the launcher recorded them was written by a launcher that numbered its ranks
        ``node_rank * ranks per node + local rank``, so that is what those are read as."""
        numbers = self.global_ranks or tuple(
            self.node_rank * len(self.ranks) + local for local in range(len(self.ranks))
        )
        return tuple(zip(numbers, self.ranks, strict=True))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RUN_SCHEMA_VERSION,
            "run_id": self.run_id,
            "preset": self.preset,
            "host": self.host,
            "created": self.created,
            "state": self.state,
            "world_size": self.world_size,
            "devices": self.devices,
            "launcher": self.launcher.to_json() if self.launcher else None,
            "pgid": self.pgid,
            # each rank's global number where the launcher recorded one, never a derived one
            "ranks": [
                {**ref.to_json(), **({"rank": rank} if self.global_ranks else {})}
                for rank, ref in self.ranked()
            ],
            "node_rank": self.node_rank,
            "nnodes": self.nnodes,
            "oom_baseline": self.oom_baseline.to_json() if self.oom_baseline else None,
            "marker_env": RUN_MARKER_ENV,
            **({"placement": self.placement.to_json()} if self.placement else {}),
            "attempt": self.attempt,
            **({"attempt_started": self.attempt_started} if self.attempt_started else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunInfo:
        launcher = data.get("launcher")
        ranks = data.get("ranks", [])
        numbered = bool(ranks) and all("rank" in r for r in ranks)
        return cls(
            run_id=str(data["run_id"]),
            preset=str(data.get("preset", "")),
            host=str(data.get("host", "")),
            created=float(data.get("created", 0.0)),
            state=RunStatus(data.get("state", RunStatus.STARTING)),
            world_size=int(data.get("world_size", 0)),
            devices=str(data.get("devices", "")),
            launcher=ProcessRef.from_json(launcher) if launcher else None,
            pgid=data.get("pgid"),
            ranks=tuple(ProcessRef.from_json(r) for r in ranks),
            node_rank=int(data.get("node_rank", 0)),
            nnodes=int(data.get("nnodes", 1)),
            oom_baseline=OomBaseline.from_json(data.get("oom_baseline")),
            global_ranks=tuple(int(r["rank"]) for r in ranks) if numbered else (),
            placement=Placement.in_run_json(data),
            attempt=int(data.get("attempt", 1)),
            attempt_started=float(data.get("attempt_started", 0.0)),
        )
