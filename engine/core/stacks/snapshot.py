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
from engine.core.common.run_environment import STACKS_DIR
from engine.core.common.run_files import (
    PRIVATE_DIR_MODE,
    open_private,
    read_run_text,
    refuse_writing,
)
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


@dataclass(frozen=True)
class RankDiagnosis:
    rank: int
    pid: int | None
    activity: RankActivity
    detail: str = ""  # "in backward (all-reduce)", "in all_reduce", "waiting for its data"
    frame: Frame | None = None  # innermost frame in user or engine code
    method: str = ""  # py-spy | faulthandler | ""
    stack: str = ""  # the full stack, as text
    problem: str = ""  # why there is no stack
    last_event_time: float | None = None

    def describe(self) -> str:
        """One phrase: "rank 0 stuck at faults.py:42 in hang"."""
        at = f" at {self.frame.where} in {self.frame.function}" if self.frame else ""
        if self.activity == RankActivity.STEPPING:
            how = f" ({self.detail})" if self.detail else ""
            return f"rank {self.rank} stuck{at}{how}" if at else f"rank {self.rank} busy{how}"
        if self.activity == RankActivity.WAITING:
            return f"rank {self.rank} waiting {self.detail or 'on its peers'}"
        if self.activity == RankActivity.STOPPED:
            resume = f"; resume it with kill -CONT {self.pid}" if self.pid else ""
            return f"rank {self.rank} stopped by a signal (SIGSTOP){resume}"
        if self.activity == RankActivity.GONE:
            return f"rank {self.rank} is gone"
        if self.activity == RankActivity.FINISHED:
            return f"rank {self.rank} finished (exited 0)"
        if self.activity == RankActivity.CRASHED:
            return f"rank {self.rank} crashed ({self.detail})"
        if self.activity == RankActivity.FAILED:
            return (
                f"rank {self.rank} failed ({self.detail})"
                if self.detail
                else f"rank {self.rank} failed"
            )
        if self.activity == RankActivity.NOT_PROVED:
            return f"rank {self.rank}: left alone ({self.problem})"
        return f"rank {self.rank}: no stack ({self.problem or 'unknown'})"

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
            "describe": self.describe(),
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
    return Path(run_dir_path) / STACKS_DIR


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
