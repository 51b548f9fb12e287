"""Why a run is stuck: every rank's stack, what each rank was doing, and which rank is the culprit.

A ``StackSnapshot`` is taken (``take_snapshot``) when a rank is flagged stalled, before every stop of
ranks, and on demand. Per rank it says its activity (``RankActivity``: stepping in its own code,
waiting on its peers inside a collective or in backward, stopped by a signal, gone), the innermost
frame in user or engine code, and the full stack with the method that produced it. The culprit is
the rank that is not waiting on its peers or, when every rank waits, the one that went silent
first. Snapshots are stored in the run directory (``stacks/<time>-<why>.json``); the last one goes
into summary.json. Plain Python.
"""

from __future__ import annotations

import json
import os
import re
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.core.common import strict_json
from engine.core.common.run_environment import STACKS_DIR, faulthandler_file_name
from engine.core.common.run_files import PRIVATE_DIR_MODE, open_private, read_run_text
from engine.core.common.statuses import RankActivity
from engine.core.procs.process_identity import ProcessRef
from engine.core.stacks.capture import Frame, ProcessStack, capture_stack

SNAPSHOT_SUFFIX = ".json"
_ENGINE_DIR = Path(__file__).resolve().parents[2]  # engine/
_LIBRARY_DIRS = tuple(
    str(Path(p).resolve())
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
    if p
)
_NATIVE_WAIT = re.compile(r"c10d::|gloo::|nccl", re.IGNORECASE)
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "monitored_barrier",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "gather",
        "scatter",
        "send",
        "recv",
        "wait",
        "_store_based_barrier",
    }
)


@dataclass(frozen=True)
class RankTarget:
    """A rank to take the stack of: its process, and when it last reported."""

    rank: int
    ref: ProcessRef
    last_event_time: float | None = None
    error: str = ""  # the error it reported, when it failed


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
        if self.activity == RankActivity.FAILED:
            return (
                f"rank {self.rank} failed ({self.detail})"
                if self.detail
                else f"rank {self.rank} failed"
            )
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


# ---- reading a stack -------------------------------------------------------------------------


def is_own_code(frame: Frame) -> bool:
    """A frame in the engine or in the user's code: not the standard library, not an installed
    package (torch included), not native."""
    if frame.native or not frame.filename or frame.filename.startswith("<"):
        return False
    path = os.path.realpath(frame.filename)
    if path.startswith(str(_ENGINE_DIR) + os.sep):
        return True
    return not any(path.startswith(d + os.sep) for d in _LIBRARY_DIRS) and (
        "site-packages" not in path
    )


def _in_torch(frame: Frame, part: str) -> bool:
    return f"torch{os.sep}{part}" in frame.filename or f"torch/{part}" in frame.filename


def read_activity(
    stack: ProcessStack, *, distributed: bool
) -> tuple[RankActivity, str, Frame | None]:
    """(activity, detail, innermost own frame) from one rank's stack."""
    if stack.process_state in ("gone", "zombie"):
        return RankActivity.GONE, stack.process_state, None
    main = stack.main_thread
    own = next((f for f in main.frames if is_own_code(f)), None) if main else None
    if stack.process_state == "stopped":
        return RankActivity.STOPPED, "SIGSTOP", own
    if main is None:
        return RankActivity.UNKNOWN, "", None
    for frame in main.frames:  # innermost first: the Python frames say what it waits in
        if frame.native:
            continue
        name = frame.function.split(".")[-1]  # py-spy qualifies methods with their class
        if _in_torch(frame, "distributed") and name in COLLECTIVES:
            return RankActivity.WAITING, f"in {name}", own
        if distributed and _in_torch(frame, f"nn{os.sep}parallel") and name.startswith("_"):
            what = "buffer broadcast" if "buffer" in name or "broadcast" in name else "sync"
            return RankActivity.WAITING, f"in DDP's forward ({what})", own
        if (
            distributed
            and name in ("_engine_run_backward", "backward")
            and (_in_torch(frame, "autograd") or _in_torch(frame, "_tensor.py"))
        ):
            return RankActivity.WAITING, "in backward (all-reduce)", own
        if _in_torch(frame, f"utils{os.sep}data"):
            return RankActivity.STEPPING, "waiting for its data", own
    if distributed and any(f.native and _NATIVE_WAIT.search(f.function) for f in main.frames):
        return RankActivity.WAITING, "in a collective (native wait)", own
    return RankActivity.STEPPING, "", own


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def choose_culprit(ranks: tuple[RankDiagnosis, ...]) -> tuple[int | None, str]:
    """The rank the others wait for, with the reason."""
    if not ranks:
        return None, ""
    own = [r for r in ranks if r.activity in (RankActivity.STEPPING, RankActivity.STOPPED)]
    if len(own) == 1:
        return own[0].rank, "the only rank not waiting on its peers"

    def silent_first(candidates: list[RankDiagnosis]) -> RankDiagnosis:
        return min(
            candidates,
            key=lambda r: (r.last_event_time if r.last_event_time is not None else 0.0, r.rank),
        )

    if own:
        first = silent_first(own)
        return first.rank, "not waiting on its peers, and the first of those to go silent"
    gone = [r for r in ranks if r.activity == RankActivity.GONE]
    if gone and len(gone) < len(ranks):
        first = silent_first(gone)
        return first.rank, "it is gone while its peers wait for it"
    first = silent_first(list(ranks))
    return first.rank, "every rank waits; it went silent first"


def diagnose(
    stacks: dict[int, tuple[RankTarget, ProcessStack]], *, distributed: bool
) -> tuple[RankDiagnosis, ...]:
    found = []
    for rank in sorted(stacks):
        target, stack = stacks[rank]
        activity, detail, frame = read_activity(stack, distributed=distributed)
        if target.error and activity != RankActivity.GONE:  # the victim, not the one it waited for
            activity, detail = RankActivity.FAILED, _shorten(target.error, 100)
        found.append(
            RankDiagnosis(
                rank=rank,
                pid=stack.pid,
                activity=activity,
                detail=detail,
                frame=frame,
                method=stack.method,
                stack=stack.text,
                problem=stack.problem,
                last_event_time=target.last_event_time,
            )
        )
    return tuple(found)


# ---- taking and storing ----------------------------------------------------------------------


def stacks_dir(run_dir_path: Path) -> Path:
    return Path(run_dir_path) / STACKS_DIR


def take_snapshot(
    run_dir_path: Path,
    targets: list[RankTarget],
    *,
    reason: str,
    distributed: bool,
    use_py_spy: bool = True,
    save: bool = True,
) -> StackSnapshot:
    """Every target rank's stack (in parallel), what each was doing and the culprit; saved in the
    run directory unless ``save`` is False (or the disk refuses: then ``path`` stays "")."""
    directory = stacks_dir(run_dir_path)

    def one(target: RankTarget) -> tuple[RankTarget, ProcessStack]:
        dump = directory / faulthandler_file_name(target.ref.pid)
        return target, capture_stack(target.ref, dump, use_py_spy=use_py_spy)

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(targets)))) as pool:
        taken = {t.rank: result for t, result in zip(targets, pool.map(one, targets), strict=True)}
    ranks = diagnose(taken, distributed=distributed)
    culprit, why = choose_culprit(ranks)
    snapshot = StackSnapshot(
        time=time.time(), reason=reason, ranks=ranks, culprit_rank=culprit, culprit_reason=why
    )
    return save_snapshot(run_dir_path, snapshot) if save else snapshot


def save_snapshot(run_dir_path: Path, snapshot: StackSnapshot) -> StackSnapshot:
    """Write it as ``stacks/<time>-<reason>.json`` (private to this user); on a disk that refuses,
    the snapshot is returned unsaved."""
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
