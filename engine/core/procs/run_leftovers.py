"""What of a run is still alive once its ranks have all ended, and what becomes of it: the
launcher's last look before it writes the summary.

A script can leave processes behind that outlive its ranks: a double-forked daemon (its own
session), a helper server, a DataLoader worker its rank never joined. They carry the run's marker
(``engine.core.procs.run_proof``), so they are provably the run's; the launcher stops them (the
one way anything is stopped: SIGTERM, a grace period, SIGKILL), or leaves them running when the
preset says ``supervision.leftovers = "leave"``, and the summary names each. The launcher's own
helpers (its children: multiprocessing's resource tracker) end with it and are not leftovers.
Plain Python (psutil).
"""

from __future__ import annotations

import time

import psutil

from engine.core.procs.run_proof import RunMarker, marked_processes
from engine.core.procs.stopping import stop_processes

SETTLE_SECONDS = 2.0  # for helpers that end on their own when their rank has gone
LEFTOVER_GRACE_SECONDS = 3.0


def _command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "?"


def _outliving(marker: RunMarker, launcher: psutil.Process) -> list[psutil.Process]:
    """Marked processes that are neither the launcher nor one of its own children."""
    try:
        own = {launcher.pid, *(c.pid for c in launcher.children(recursive=True))}
    except psutil.Error:
        own = {launcher.pid}
    return [p for p in marked_processes(marker) if p.pid not in own]


def outliving_now(marker: RunMarker) -> list[psutil.Process]:
    """The run's processes alive now besides this launcher and its own children: what a restart
    must find gone before it starts the ranks again."""
    return _outliving(marker, psutil.Process())


def end_leftovers(
    marker: RunMarker, *, leave: bool, settle: float = SETTLE_SECONDS
) -> tuple[str, ...]:
    """Stop (or with ``leave``, leave) the run's processes that outlive its ranks; one sentence
    each for the summary. Called by the launcher once every rank has ended."""
    launcher = psutil.Process()
    deadline = time.monotonic() + settle
    left = _outliving(marker, launcher)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _outliving(marker, launcher)
    if not left:
        return ()
    described = {p.pid: f"pid {p.pid} ({_command(p)[:120]})" for p in left}
    if leave:
        return tuple(
            f"{what} outlived the ranks and was left running (supervision.leftovers = leave)"
            for what in described.values()
        )
    result = stop_processes(left, LEFTOVER_GRACE_SECONDS, run_marker=marker)
    said = []
    for pid, what in described.items():
        if pid in result.terminated:
            how = "stopped (SIGTERM)"
        elif pid in result.killed:
            how = "stopped (SIGKILL, after SIGTERM and a grace period)"
        elif pid in result.already_gone:
            how = "ended by itself"
        else:
            how = "could not be stopped"
        said.append(f"{what} outlived the ranks: {how}")
    return tuple(said)
