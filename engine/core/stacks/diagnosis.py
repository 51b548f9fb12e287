"""Why a run is stuck, judged from its stacks: what each rank was doing, its innermost frame in user
or engine code, and which rank is the culprit; and ``take_snapshot``, which captures every rank's
stack (``engine.core.stacks.capture``), judges them and stores the ``StackSnapshot``
(``engine.core.stacks.snapshot``).

A snapshot is taken when a rank is flagged stalled, before every stop of ranks, and on demand. Per
rank it says its activity (``RankActivity``: stepping in its own code, waiting on its peers inside
a collective or in backward, stopped by a signal, gone). The culprit is the rank that is not
waiting on its peers or, when every rank waits, the one that went silent first. Plain Python.
"""

from __future__ import annotations

import os
import re
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from engine.core.common.run_environment import faulthandler_file_name
from engine.core.common.statuses import ProcessState, RankActivity
from engine.core.procs.process_identity import ProcessRef
from engine.core.stacks.capture import ProcessStack, capture_stack
from engine.core.stacks.snapshot import (
    Frame,
    RankDiagnosis,
    StackSnapshot,
    save_snapshot,
    stacks_dir,
)

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
    # why its process is not provably the run's: then it is neither signalled nor read
    refused: str = ""


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
    if stack.process_state.ended:  # a reused pid: the rank it named is gone
        detail = "zombie" if stack.process_state == ProcessState.ZOMBIE else "gone"
        return RankActivity.GONE, detail, None
    main = stack.main_thread
    own = next((f for f in main.frames if is_own_code(f)), None) if main else None
    if stack.process_state == ProcessState.STOPPED:
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
        if target.refused:
            activity = RankActivity.NOT_PROVED
        elif (
            target.error and activity != RankActivity.GONE
        ):  # the victim, not the one it waited for
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


# ---- taking one ----------------------------------------------------------------------


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
        if target.refused:
            return target, ProcessStack(target.ref.pid, problem=target.refused)
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
