"""Every rank's stack in a run on Slurm, wherever its node: ``ddptui stacks``, ``ddptui kill``
(before it cancels), the UI, and a node launcher that flags a stall.

The ranks are the ones the node launchers recorded (``nodes/<node>.json``: pid, start time, global
rank). Their stacks are asked for through Slurm: ``scancel --signal=USR2 JOB.STEP`` reaches the
node launchers, the tasks of the step, and each passes the signal to its own ranks only (a
node launcher answers it, never dies of it); every rank appends its faulthandler dump to its file
in the run directory, which every node sees. The culprit is then judged across all of them and
named with its node. Plain Python.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

from engine.core.backends.slurm.cluster import SlurmUnavailable, run_slurm
from engine.core.backends.slurm.records import NodeRecord, SlurmPlacement
from engine.core.backends.slurm.state import view_of
from engine.core.common.run_environment import STACK_DUMP_SIGNAL, faulthandler_file_name
from engine.core.common.run_files import open_private
from engine.core.runs.observer import RunObserver
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir
from engine.core.stacks.capture import ProcessStack, capture_by_signal
from engine.core.stacks.diagnosis import RankTarget, take_snapshot
from engine.core.stacks.snapshot import StackSnapshot, stacks_dir

LOCK_NAME = ".taking"
LOCK_STALE_SECONDS = 30.0  # a lock older than this was left by a taker that died


def step_of(placement: SlurmPlacement, records: dict[str, NodeRecord]) -> str:
    """``JOB.STEP`` of the node launchers' step ("" when no node launcher recorded it yet)."""
    steps = {r.step_id for r in records.values() if r.step_id}
    job = placement.job_id or next((r.job_id for r in records.values()), "")
    if not job or len(steps) != 1:
        return ""
    return f"{job}.{steps.pop()}"


def deliver_to_step(step: str) -> Callable[[], str]:
    """Send the stack-dump signal to the node launchers of ``step`` through Slurm."""

    def deliver() -> str:
        try:
            run_slurm("scancel", f"--signal={STACK_DUMP_SIGNAL.name.removeprefix('SIG')}", step)
        except SlurmUnavailable as err:
            return str(err)
        return ""

    return deliver


class SnapshotLock:
    """One stack snapshot of a run at a time: two takers would each read the other's dumps."""

    def __init__(self, run_dir: RunDir) -> None:
        self.path = stacks_dir(run_dir.path) / LOCK_NAME
        self.held = False

    def acquire(self, wait: float) -> bool:
        deadline = time.monotonic() + wait
        while True:
            try:
                os.close(open_private(self.path, "exclusive", parents=0o700))
                self.held = True
                return True
            except FileExistsError:
                with contextlib.suppress(OSError):
                    if time.time() - self.path.stat().st_mtime > LOCK_STALE_SECONDS:
                        self.path.unlink()
                        continue
            except OSError:
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def release(self) -> None:
        if self.held:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.held = False


def snapshot_slurm_run(
    run_dir: RunDir,
    *,
    reason: str,
    save: bool = True,
    wait_for_other: float = 10.0,
    state: RunState | None = None,
) -> StackSnapshot | None:
    """Every live rank's stack, the culprit named with its node; stored in the run directory.
    ``state``: the run as the caller just observed it (a kill's one observation); else it is
    observed here. None when no node launcher recorded a live rank, or another snapshot is being
    taken and did not end within ``wait_for_other`` seconds."""
    state = state or RunObserver(run_dir).observe()
    placement = SlurmPlacement.of(state.info) if state.info else None
    view = view_of(state.placement)
    if placement is None or view is None:
        return None
    records = view.nodes
    live = {n: r for n, r in records.items() if not r.final and r.ranks}
    step = step_of(placement, records)
    if not live or not step:
        return None
    reported = {r.rank: (r.last_event_time, r.error) for r in state.ranks}
    targets = [
        RankTarget(rank, ref, *reported.get(rank, (None, "")), node=record.node)
        for record in live.values()
        for rank, ref in record.ranked()
    ]
    directory = stacks_dir(run_dir.path)

    def capture(chosen: list[RankTarget]) -> dict[int, ProcessStack]:
        dumps = {
            t.rank: (t.ref.pid, directory / faulthandler_file_name(t.ref.pid, t.node))
            for t in chosen
        }
        return capture_by_signal(dumps, deliver_to_step(step))

    lock = SnapshotLock(run_dir)
    if not lock.acquire(wait_for_other):
        return None
    try:
        return take_snapshot(
            run_dir.path,
            sorted(targets, key=lambda t: t.rank),
            reason=reason,
            distributed=len(targets) > 1,
            save=save,
            capture_all=capture,
        )
    finally:
        lock.release()
