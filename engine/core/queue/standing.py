"""Where the queue stands now: every live claim's verdict, read from the store and the machine
(``ddptui queue``, the Runs screen, ``ddptui run --queue``'s answer). Dead claims are dropped on
the way, as every look at the line does. Plain Python."""

from __future__ import annotations

import os
from pathlib import Path

from engine.core.queue.claims import ClaimState, ClaimStore, default_store_path, open_store
from engine.core.queue.device_state import MachineWatcher
from engine.core.queue.line import Verdict, decide


def current_line(store: ClaimStore, watcher: MachineWatcher | None = None) -> list[Verdict]:
    """Every live claim's verdict: those that hold their devices first, then the line in order.
    The GPUs are scanned only when some claim waits for one."""
    with store.locked():
        claims = store.live_claims()
    gpus = any(c.want.kind == "gpu" and c.state == ClaimState.WAITING for c in claims)
    return decide(claims, (watcher or MachineWatcher()).state(gpus=gpus))


def verdict_of(
    store: ClaimStore, run_id: str, watcher: MachineWatcher | None = None
) -> Verdict | None:
    """Where run ``run_id`` stands in line now (None when it holds no claim any more)."""
    return next((v for v in current_line(store, watcher) if v.claim.run_id == run_id), None)


def line_at(path: Path | None = None, watcher: MachineWatcher | None = None) -> list[Verdict]:
    """The line of the store at ``path`` (the default store when None), for a reader that makes
    nothing (the Runs screen): no store yet is an empty line; one that cannot be trusted is
    ClaimStoreError."""
    path = path if path is not None else default_store_path()
    if not os.path.lexists(path):
        return []
    return current_line(open_store(path, create=False), watcher)
