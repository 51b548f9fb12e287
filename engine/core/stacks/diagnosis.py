"""Why a run is stuck, judged from its stacks: what each rank was doing, its innermost frame in user
or engine code, and which rank is the culprit; and ``take_snapshot``, which captures every rank's
stack (``engine.core.stacks.capture``), judges them and stores the ``StackSnapshot``
(``engine.core.stacks.snapshot``).

A snapshot is taken when a rank is flagged stalled, before every stop of ranks, and on demand. Per
rank it says its activity (``RankActivity``: stepping in its own code, waiting on its peers inside
a collective or in backward, stopped by a signal, failed, crashed, finished, gone). A culprit is
named only on evidence (``choose_culprit``): the rank that crashed or failed first, or the one
rank not waiting while its peers wait on it. Plain Python.
"""

from __future__ import annotations

import os
import re
import signal
import sysconfig
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from engine.core.common.run_layout import RunLayout
from engine.core.common.statuses import ProcessState, RankActivity
from engine.core.procs.process_identity import ProcessRef
from engine.core.stacks.capture import ProcessStack, capture_stack
from engine.core.stacks.snapshot import (
    Frame,
    RankDiagnosis,
    StackSnapshot,
    save_snapshot,
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
        "init_process_group",  # waiting for every rank to join
        "rendezvous",
    }
)


# A rank silent this much longer than the first error of its peers is what they failed on.
QUIET_MARGIN_SECONDS = 5.0


@dataclass(frozen=True)
class RankTarget:
    """A rank to take the stack of: its process, and when it last reported."""

    rank: int
    ref: ProcessRef
    last_event_time: float | None = None
    error: str = ""  # the error it reported, when it failed
    node: str = ""  # the node it runs on, in a run across nodes
    # why its process is not provably the run's: then it is neither signalled nor read
    refused: str = ""
    # how it ended, once it has (a wait status: negative for a signal), else None
    exitcode: int | None = None


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


def _first(candidates: list[RankDiagnosis]) -> RankDiagnosis:
    """The one of ``candidates`` that spoke last the earliest (the first to fail or go silent)."""
    return min(
        candidates,
        key=lambda r: (r.last_event_time if r.last_event_time is not None else 0.0, r.rank),
    )


def choose_culprit(ranks: tuple[RankDiagnosis, ...]) -> tuple[int | None, str]:
    """The rank the others wait for, with the reason; or None, with why there is none. Only on
    evidence: the rank that crashed first; else the one rank not waiting (stepping in its own
    code, stopped, gone) while its peers wait on it, or failed waiting for it after it had gone
    quiet; else the rank that failed first, unless every rank failed the same way (the run's
    configuration or code, not one rank). A healthy run (every rank stepping, or every rank in
    a collective at that moment), a rank that exited 0 and a rank not proved to be the run's are
    never the culprit."""
    crashed = [r for r in ranks if r.activity == RankActivity.CRASHED]
    if crashed:
        return _first(crashed).rank, "it crashed first (it exited without reporting an error)"
    failed = [r for r in ranks if r.activity == RankActivity.FAILED]
    waiting = [r for r in ranks if r.activity == RankActivity.WAITING]
    behind = [
        r
        for r in ranks
        if r.activity in (RankActivity.STEPPING, RankActivity.STOPPED, RankActivity.GONE)
    ]
    if len(behind) == 1 and (waiting or failed) and _quiet_before(behind[0], failed):
        if behind[0].activity == RankActivity.GONE:
            return behind[0].rank, "it is gone while its peers wait for it"
        return behind[0].rank, "the only rank not waiting on its peers"
    if failed:
        if len(failed) == len(ranks) > 1 and len({r.detail for r in failed}) == 1:
            return None, "every rank failed with the same error: the run's configuration or code"
        return _first(failed).rank, "it failed first"
    if waiting and behind:
        listed = ", ".join(str(r.rank) for r in behind)
        return None, f"ranks {listed} are not waiting on their peers: no single one is behind"
    if waiting:
        return None, "every rank is in a collective: none is behind the others"
    return None, "no rank waits on another"


def _quiet_before(rank: RankDiagnosis, failed: list[RankDiagnosis]) -> bool:
    """Whether ``rank`` went quiet well before any of ``failed`` failed: then their errors (a
    collective's timeout) are its doing. True when none failed."""
    if not failed:
        return True
    if rank.last_event_time is None:
        return True  # never heard from: it never got going
    first_failure = _first(failed).last_event_time
    return first_failure is not None and rank.last_event_time < first_failure - QUIET_MARGIN_SECONDS


def diagnose(
    stacks: dict[int, tuple[RankTarget, ProcessStack]], *, distributed: bool
) -> tuple[RankDiagnosis, ...]:
    found = []
    for rank in sorted(stacks):
        target, stack = stacks[rank]
        activity, detail, frame = read_activity(stack, distributed=distributed)
        if target.refused:
            activity = RankActivity.NOT_PROVED
        elif target.exitcode == 0:  # its work is done: never the one its peers wait for
            activity, detail = RankActivity.FINISHED, "exited 0"
        elif target.exitcode is not None and not target.error:
            activity, detail = RankActivity.CRASHED, f"exited with {_exit_words(target.exitcode)}"
        elif target.error and activity != RankActivity.GONE:
            # the victim, not the one it waited for
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
                node=target.node,
                threads=stack.threads,
            )
        )
    return tuple(found)


def _exit_words(code: int) -> str:
    """A wait status in words: "code 3", "SIGKILL"."""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


# ---- taking one ----------------------------------------------------------------------


def take_snapshot(
    run_dir_path: Path,
    targets: list[RankTarget],
    *,
    reason: str,
    distributed: bool,
    use_py_spy: bool = True,
    save: bool = True,
    capture_all: Callable[[list[RankTarget]], dict[int, ProcessStack]] | None = None,
) -> StackSnapshot:
    """Every target rank's stack (in parallel), what each was doing and the culprit; saved in the
    run directory unless ``save`` is False (or the disk refuses: then ``path`` stays "").
    ``capture_all`` takes every rank's stack at once instead, by rank (a run across nodes: the
    ranks answer a signal their scheduler delivers, from their backend)."""
    layout = RunLayout(Path(run_dir_path))

    def one(target: RankTarget) -> tuple[RankTarget, ProcessStack]:
        if target.refused:
            return target, ProcessStack(target.ref.pid, problem=target.refused)
        dump = layout.stack_dump(target.ref.pid, target.node)
        return target, capture_stack(target.ref, dump, use_py_spy=use_py_spy)

    if capture_all is not None:
        captured = capture_all(targets)
        taken = {t.rank: (t, captured[t.rank]) for t in targets if t.rank in captured}
    else:
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(targets)))) as pool:
            taken = {t.rank: r for t, r in zip(targets, pool.map(one, targets), strict=True)}
    ranks = diagnose(taken, distributed=distributed)
    culprit, why = choose_culprit(ranks)
    snapshot = StackSnapshot(
        time=time.time(), reason=reason, ranks=ranks, culprit_rank=culprit, culprit_reason=why
    )
    return save_snapshot(run_dir_path, snapshot) if save else snapshot
