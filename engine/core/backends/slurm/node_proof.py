"""What a node launcher of a run on Slurm proves at its end (``NodeProof``, in its record): once
its ranks are gone, every other process of its attempt of the run on its node (one carrying the
run's marker: a DataLoader worker, a rank's double-forked daemon) is stopped and named, and
nothing of it is left. Two nodes may share one machine (as Slurm's test set-ups do): a process is
the node's by the node its launcher set in its environment; and the attempt's by the attempt
(``DDPTUI_ATTEMPT``), so a launcher of an earlier attempt that outlived its job never stops a
later attempt's processes.

Plain Python; run by ``engine.train.node_launch`` at its end, whatever happened.
"""

from __future__ import annotations

import contextlib

import psutil

from engine.core.backends.slurm.records import NodeProof, node_events_path
from engine.core.common.run_environment import ATTEMPT_ENV, NODE_ENV
from engine.core.procs.run_proof import RunMarker, marked_processes
from engine.core.procs.stopping import protected_pids, stop_processes
from engine.core.runs.events import StopSignalled, read_events
from engine.core.runs.rundir import RunDir

PROOF_GRACE_SECONDS = 1.0


def _of_this_attempt_here(proc: psutil.Process, node: str, attempt: int) -> bool:
    """A process of the run's attempt ``attempt`` started on this node (two nodes may share one
    machine, as Slurm's test set-ups do): its node launcher set the node and the attempt in its
    environment. A node launcher itself carries no attempt: none stops another."""
    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        return False
    here = node in (env.get(NODE_ENV), env.get("SLURMD_NODENAME"))
    return here and env.get(ATTEMPT_ENV) == str(attempt)


def _own_helpers(ranks: dict[int, psutil.Process]) -> set[int]:
    rank_pids = {p.pid for p in ranks.values()}
    try:
        return {c.pid for c in psutil.Process().children() if c.pid not in rank_pids}
    except psutil.Error:
        return set()


def prove_node_clean(
    run_dir: RunDir, node: str, ranks: dict[int, psutil.Process], attempt: int = 1
) -> NodeProof:
    """Once this node's ranks are gone: every other process of the run's ``attempt`` on this
    node (one that carries the run's marker: a DataLoader worker, a rank's double-forked daemon)
    is stopped and named, and what is left after that is the proof's ``left``."""
    # This launcher and its own helpers (multiprocessing's resource tracker, a child of it that
    # no rank started): they end with it, and are not what the proof is about.
    protected = frozenset(protected_pids() | _own_helpers(ranks))
    rank_pids = {p.pid for p in ranks.values()}
    marker = RunMarker.of_dir(run_dir.path)
    others = [
        p
        for p in marked_processes(marker, exclude=protected)
        if _of_this_attempt_here(p, node, attempt) and p.pid not in rank_pids
    ]
    daemons = []
    for p in others:
        with contextlib.suppress(psutil.Error):
            daemons.append(f"pid {p.pid} ({p.name()}, parent {p.ppid()}) outlived its rank")
    stop = stop_processes(others, PROOF_GRACE_SECONDS, run_marker=marker)
    left = [
        p.pid
        for p in marked_processes(marker, exclude=protected)
        if _of_this_attempt_here(p, node, attempt)
    ]
    killed_by_launcher = {
        pid
        for e in read_events(node_events_path(run_dir.path, node), run_dir.path)
        if isinstance(e, StopSignalled) and e.signal == "SIGKILL"
        for pid in e.pids
    }
    ranks_ended = sorted(rank_pids)
    return NodeProof(
        terminated=tuple(p for p in ranks_ended if p not in killed_by_launcher) + stop.terminated,
        killed=tuple(p for p in ranks_ended if p in killed_by_launcher) + stop.killed,
        left=tuple(sorted(left)),
        daemons=tuple(daemons),
    )
