"""Judging a silent rank from its stacks, before any fixed rule would: the launcher's probe.

A rank may be silent for long in a slow phase (setup, evaluation, a checkpoint, before its first
report), so the silence rules of ``engine.core.runs.rank_states`` wait minutes there. When a rank
has been silent past its normal pace, the launcher probes it instead: it takes every rank's
stack twice, ``CONFIRM_SECONDS`` apart, and calls the rank stalled, and the culprit, now when both
show the same thing: its peers wait on it in a collective and it does not (``choose_culprit``),
it is at the same line of its own code, and it did next to nothing in between (CPU time and I/O
of it and its children). A rank that is working (downloading, writing a checkpoint, computing
alone, its DataLoader workers busy) uses CPU or does I/O and is never flagged by a probe; the
fixed rules still apply to it. Plain Python (psutil).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from engine.core.common.statuses import RankActivity
from engine.core.stacks.diagnosis import RankTarget, take_snapshot
from engine.core.stacks.snapshot import StackSnapshot, save_snapshot

CONFIRM_SECONDS = 4.0  # between the two snapshots of one probe
IDLE_CPU_SECONDS = 0.25  # a blocked rank and its children use less than this in CONFIRM_SECONDS
IDLE_IO_BYTES = 256 << 10  # ... and read and write less than this


@dataclass(frozen=True)
class Effort:
    """What a process and its children have done so far: CPU seconds and bytes read + written."""

    cpu_seconds: float
    io_bytes: int


def effort_of(pid: int) -> Effort | None:
    """The CPU time and I/O of ``pid`` and every descendant; None when it cannot be read."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    cpu, io = 0.0, 0
    for proc in procs:
        try:
            times = proc.cpu_times()
            cpu += times.user + times.system
            counters = proc.io_counters()
            io += counters.read_chars + counters.write_chars
        except (psutil.Error, AttributeError):
            if proc is root:
                return None
    return Effort(cpu, io)


@dataclass(frozen=True)
class StallVerdict:
    """A rank found stalled by a probe, with the snapshot that shows it (saved, culprit set)."""

    rank: int
    why: str
    snapshot: StackSnapshot


def _behind(snapshot: StackSnapshot, rank: int) -> bool:
    """Whether the snapshot names ``rank`` the one rank its peers wait on (stepping in its own
    code, not waiting for its data, or stopped by a signal)."""
    culprit = snapshot.culprit
    return (
        culprit is not None
        and culprit.rank == rank
        and culprit.activity in (RankActivity.STEPPING, RankActivity.STOPPED)
        and culprit.detail != "waiting for its data"
    )


def probe_stall(
    run_dir_path: Path,
    targets: list[RankTarget],
    rank: int,
    *,
    distributed: bool,
    confirm_seconds: float = CONFIRM_SECONDS,
    sleep: Callable[[float], object] = time.sleep,
) -> StallVerdict | None:
    """Probe the silent ``rank`` (see the module docstring): its verdict, or None when the
    evidence does not show it stalled. Only a stall's snapshot is saved. ``sleep`` waits between
    the snapshots; a true result (``threading.Event.wait`` of a cancelled probe) ends it."""
    target = next((t for t in targets if t.rank == rank), None)
    if target is None or not distributed:
        return None
    first = take_snapshot(run_dir_path, targets, reason="stall probe", distributed=True, save=False)
    before = effort_of(target.ref.pid)
    if not _behind(first, rank) or before is None:
        return None
    if sleep(confirm_seconds):
        return None
    second = take_snapshot(run_dir_path, targets, reason="stall", distributed=True, save=False)
    after = effort_of(target.ref.pid)
    if not _behind(second, rank) or after is None:
        return None
    was, now = first.culprit, second.culprit
    assert was is not None and now is not None
    if (was.frame, was.activity) != (now.frame, now.activity):
        return None  # it moved on: slow, not stuck
    cpu = after.cpu_seconds - before.cpu_seconds
    if now.activity == RankActivity.STEPPING and (
        cpu >= IDLE_CPU_SECONDS or after.io_bytes - before.io_bytes >= IDLE_IO_BYTES
    ):
        return None  # working alone while its peers wait (a download, a checkpoint)
    waiting = ", ".join(str(r.rank) for r in second.ranks if r.activity == RankActivity.WAITING)
    where = f" at {now.frame.where} in {now.frame.function}" if now.frame else ""
    why = (
        f"idle{where} for {confirm_seconds:g} s ({cpu:.2f} s of CPU) while rank"
        f"{'s' if ',' in waiting else ''} {waiting} wait{'' if ',' in waiting else 's'} for it"
    )
    if now.activity == RankActivity.STOPPED:
        why = f"stopped by a signal while rank{'s' if ',' in waiting else ''} {waiting} wait for it"
    flagged = replace(second, culprit_reason=f"stalled: {why}")
    return StallVerdict(rank, why, save_snapshot(run_dir_path, flagged))
