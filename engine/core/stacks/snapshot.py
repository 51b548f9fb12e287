"""A stack snapshot as plain data, and where it is kept: every rank's stack at one moment, what each
rank was doing, and the culprit (``StackSnapshot``), stored as ``stacks/<time>-<why>.json`` in the
run directory; the last one goes into summary.json.

Plain data and files only, no process is touched: run-directory readers (``engine.core.runs``)
read snapshots through this module, and an import-linter contract keeps them from the capture
(``engine.core.stacks.capture``: py-spy, signals). Taking and judging a snapshot is
``engine.core.stacks.diagnosis``'s.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.core.common import strict_json
from engine.core.common.run_files import (
    PRIVATE_DIR_MODE,
    open_private,
    read_run_text,
    refuse_writing,
)
from engine.core.common.run_layout import RunLayout
from engine.core.common.statuses import RankActivity

SNAPSHOT_SUFFIX = ".json"


@dataclass(frozen=True)
class Frame:
    function: str
    filename: str
    line: int | None = None
    native: bool = False

    @property
    def where(self) -> str:
        name = Path(self.filename).name if self.filename else "?"
        return f"{name}:{self.line}" if self.line is not None else name

    def to_json(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "filename": self.filename,
            "line": self.line,
            "native": self.native,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Frame:
        return cls(
            function=str(data.get("function", "")),
            filename=str(data.get("filename", "")),
            line=data.get("line") if isinstance(data.get("line"), int) else None,
            native=bool(data.get("native", False)),
        )


@dataclass(frozen=True)
class ThreadStack:
    name: str  # "MainThread" / "Thread 0x7f..." / "Thread 1234 (idle)"
    frames: tuple[Frame, ...]  # innermost first
    main: bool = False  # the process's main thread

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "main": self.main, "frames": [f.to_json() for f in self.frames]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ThreadStack:
        return cls(
            name=str(data.get("name", "")),
            main=bool(data.get("main", False)),
            frames=tuple(Frame.from_json(f) for f in data.get("frames") or []),
        )


def ordered_threads(threads: tuple[ThreadStack, ...]) -> tuple[ThreadStack, ...]:
    """The main thread first (what a reader looks for), the others in the order they came."""
    return tuple(sorted(threads, key=lambda t: not t.main))


def thread_lines(thread: ThreadStack, *, native: bool = True, fold_hint: str = "") -> list[str]:
    """One thread as text: its name, then its frames outermost first (as a traceback reads).
    Without ``native``, each run of native frames is one line saying how many were folded
    (and ``fold_hint``: how to see them)."""
    lines = [f"{thread.name}{' (main)' if thread.main else ''}:"]
    folded = 0
    for f in reversed(thread.frames):
        if f.native and not native:
            folded += 1
            continue
        if folded:
            lines.append(_folded_line(folded, fold_hint))
            folded = 0
        where = f"{f.filename}:{f.line}" if f.line is not None else f.filename
        lines.append(f"    {f.function} ({where})")
    if folded:
        lines.append(_folded_line(folded, fold_hint))
    return lines


def _folded_line(count: int, hint: str) -> str:
    frames = "native frame" if count == 1 else "native frames"
    return f"    … {count} {frames}" + (f" ({hint})" if hint else "")


@dataclass(frozen=True)
class RankDiagnosis:
    rank: int  # -1: a process that is no run's rank (``ddptui stacks --pid``)
    pid: int | None
    activity: RankActivity
    detail: str = ""  # "in backward (all-reduce)", "in all_reduce", "waiting for its data"
    frame: Frame | None = None  # innermost frame in user or engine code
    method: str = ""  # py-spy | faulthandler | ""
    stack: str = ""  # the full stack, as text
    problem: str = ""  # why there is no stack
    last_event_time: float | None = None
    node: str = ""  # the node it runs on, in a run across nodes
    threads: tuple[ThreadStack, ...] = ()  # the stack's threads (() in older snapshots)

    @property
    def who(self) -> str:
        """ "rank 2", "rank 1 on n2" in a run across nodes, or "pid 4242" for a process that is
        no run's rank."""
        if self.rank < 0:
            return f"pid {self.pid}"
        return f"rank {self.rank} on {self.node}" if self.node else f"rank {self.rank}"

    def stack_lines(self, *, native: bool = True, fold_hint: str = "") -> list[str]:
        """The full stack as text lines, the main thread first (``thread_lines``); a snapshot
        that kept no threads: its text as it was taken."""
        if not self.threads:
            return self.stack.rstrip().splitlines()
        lines: list[str] = []
        for thread in ordered_threads(self.threads):
            lines += thread_lines(thread, native=native, fold_hint=fold_hint)
        return lines

    def describe(self) -> str:
        """One phrase: "rank 0 stuck at faults.py:42 in hang"."""
        at = f" at {self.frame.where} in {self.frame.function}" if self.frame else ""
        who = self.who
        if self.activity == RankActivity.STEPPING:
            how = f" ({self.detail})" if self.detail else ""
            return f"{who} stuck{at}{how}" if at else f"{who} busy{how}"
        if self.activity == RankActivity.WAITING:
            return f"{who} waiting {self.detail or 'on its peers'}"
        if self.activity == RankActivity.STOPPED:
            resume = f"; resume it with kill -CONT {self.pid}" if self.pid else ""
            return f"{who} stopped by a signal (SIGSTOP){resume}"
        if self.activity == RankActivity.GONE:
            return f"{who} is gone"
        if self.activity == RankActivity.FINISHED:
            return f"{who} finished (exited 0)"
        if self.activity == RankActivity.CRASHED:
            return f"{who} crashed ({self.detail})"
        if self.activity == RankActivity.FAILED:
            return f"{who} failed ({self.detail})" if self.detail else f"{who} failed"
        if self.activity == RankActivity.NOT_PROVED:
            return f"{who}: left alone ({self.problem})"
        return f"{who}: no stack ({self.problem or 'unknown'})"

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "state": self.activity,
            "detail": self.detail,
            "frame": self.frame.to_json() if self.frame else None,
            "where": f"{self.frame.where} in {self.frame.function}" if self.frame else None,
            "method": self.method,
            "stack": self.stack,
            "problem": self.problem,
            "last_event_time": self.last_event_time,
            **({"node": self.node} if self.node else {}),  # a run across nodes only
            "describe": self.describe(),
            "threads": [t.to_json() for t in self.threads],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankDiagnosis:
        frame = data.get("frame")
        return cls(
            rank=int(data["rank"]),
            pid=data.get("pid"),
            activity=RankActivity(data["state"]),
            detail=str(data.get("detail", "")),
            frame=Frame.from_json(frame) if isinstance(frame, dict) else None,
            method=str(data.get("method", "")),
            stack=str(data.get("stack", "")),
            problem=str(data.get("problem", "")),
            last_event_time=data.get("last_event_time"),
            node=str(data.get("node") or ""),
            threads=tuple(ThreadStack.from_json(t) for t in data.get("threads") or ()),
        )


@dataclass(frozen=True)
class StackSnapshot:
    time: float
    reason: str  # why it was taken: "stall", "before stop", "before kill", "on demand"
    ranks: tuple[RankDiagnosis, ...]
    culprit_rank: int | None = None
    culprit_reason: str = ""
    path: str = ""  # where it is stored ("" until saved)

    @property
    def proved(self) -> int:
        """How many of its ranks proved to be the run's (the others were left alone)."""
        return sum(r.activity != RankActivity.NOT_PROVED for r in self.ranks)

    @property
    def culprit(self) -> RankDiagnosis | None:
        return next((r for r in self.ranks if r.rank == self.culprit_rank), None)

    def summary_line(self) -> str:
        """ "rank 0 stuck at faults.py:NN in hang; rank 1 waiting in backward (all-reduce)",
        the culprit first."""
        ordered = sorted(self.ranks, key=lambda r: (r.rank != self.culprit_rank, r.rank))
        return "; ".join(r.describe() for r in ordered)

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "reason": self.reason,
            "culprit_rank": self.culprit_rank,
            "culprit_reason": self.culprit_reason,
            "summary": self.summary_line(),
            "path": self.path,
            "ranks": [r.to_json() for r in self.ranks],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackSnapshot:
        return cls(
            time=float(data["time"]),
            reason=str(data.get("reason", "")),
            ranks=tuple(RankDiagnosis.from_json(r) for r in data.get("ranks") or []),
            culprit_rank=data.get("culprit_rank"),
            culprit_reason=str(data.get("culprit_reason", "")),
            path=str(data.get("path", "")),
        )


# ---- where snapshots are kept -----------------------------------------------------------------


def stacks_dir(run_dir_path: Path) -> Path:
    return RunLayout(Path(run_dir_path)).stacks_dir


def save_snapshot(run_dir_path: Path, snapshot: StackSnapshot) -> StackSnapshot:
    """Write it as ``stacks/<time>-<reason>.json`` (private to this user); on a disk that refuses,
    or in another user's run directory (only its owner writes there), the snapshot is returned
    unsaved."""
    if refuse_writing(Path(run_dir_path)):
        return snapshot
    directory = stacks_dir(run_dir_path)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(snapshot.time))
    micro = f"{snapshot.time % 1:.6f}"[2:]
    slug = "-".join(snapshot.reason.split())
    path = directory / f"{stamp}.{micro}-{slug}{SNAPSHOT_SUFFIX}"
    saved = replace(snapshot, path=str(path))
    try:
        fd = open_private(path, "exclusive", parents=PRIVATE_DIR_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(strict_json.dumps(saved.to_json(), indent=2))
    except OSError:
        path.unlink(missing_ok=True)
        return snapshot
    return saved


def snapshot_paths(run_dir_path: Path) -> list[Path]:
    """Stored snapshots, oldest first."""
    try:
        return sorted(stacks_dir(run_dir_path).glob(f"*{SNAPSHOT_SUFFIX}"))
    except OSError:
        return []


def load_snapshot(run_dir_path: Path, path: Path) -> StackSnapshot | None:
    """A stored snapshot, read through no planted link; None when it cannot be read."""
    try:
        data = json.loads(read_run_text(run_dir_path, path))
        return StackSnapshot.from_json(data) if isinstance(data, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def latest_snapshot(run_dir_path: Path) -> StackSnapshot | None:
    """The newest stored snapshot that could be read, or None."""
    for path in reversed(snapshot_paths(run_dir_path)):
        snapshot = load_snapshot(run_dir_path, path)
        if snapshot is not None:
            return snapshot
    return None


def flight_recorder_command(directory: Path) -> str:
    """The command that merges and analyses the ranks' flight-recorder dumps in ``directory``."""
    return f"python -m torch.distributed.flight_recorder.fr_trace {directory} --prefix rank_"
