"""The one sentence of a comparison: how much slower (or faster) B is than A, the step part that
moved most, and the difference in config or environment that explains it, e.g. "B is 1.8x
slower: its data wait rose from 4 % to 47 % of the step; it ran with data.num_workers 2 instead
of 10". Within the runs' own step-time spread: "same config and environment; B is within noise
of A (2.1 %)". Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.core.runs.step_breakdown import StepPart

# Two runs' speeds this close are the same whatever their spreads say: a step time is measured
# no finer than this.
NOISE_FLOOR = 0.02
# Other processes keeping this many more cores busy during B than during A: named as a cause.
OUTSIDE_LOAD_CORES = 0.5
NAMED_MAX = 2  # differences named in the sentence
SAID_VALUE_MAX_CHARS = 40  # a value in the sentence (the tables show more of it)

PART_WORDS = {
    StepPart.DATA: "data wait",
    StepPart.FORWARD: "forward",
    StepPart.BACKWARD: "backward",
    StepPart.SYNC: "gradient sync",
    StepPart.OPTIMIZER: "optimizer step",
    StepPart.OTHER: "other time",
}
_THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "threads per rank")
_COMPUTE = (
    "model.", "precision.", "training.batch_size", "devices.", *_THREADS, "gpus", "cpu cores",
    "torch", "cuda", "strategy.", "ddp.", "PYTORCH_CUDA_ALLOC_CONF", "NVIDIA_TF32_OVERRIDE",
)  # fmt: skip
# The keys (prefixes) that move each part, most likely first.
RELATED: dict[StepPart, tuple[str, ...]] = {
    StepPart.DATA: ("data.", *_THREADS, "training.batch_size", "cpu cores", "devices."),
    StepPart.FORWARD: _COMPUTE,
    StepPart.BACKWARD: (*_COMPUTE, "NCCL_", "TORCH_NCCL_"),
    StepPart.SYNC: (
        "strategy.",
        "ddp.",
        "devices.",
        "NCCL_",
        "TORCH_NCCL_",
        "GLOO_SOCKET_IFNAME",
        "nccl",
        "gpus",
        "model.",
        "precision.",
    ),
    StepPart.OPTIMIZER: ("optimizer.", "model.", *_THREADS, "precision."),
    StepPart.OTHER: (),
}
# Keys that never slow a step: named last, if at all.
BYSTANDERS = ("name", "supervision.", "training.report_interval", "training.epochs")


@dataclass(frozen=True)
class Change:
    """One config key or environment fact whose value differs; "unset" where a run lacks it."""

    key: str
    a: str
    b: str

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "a": self.a, "b": self.b}

    def said(self) -> str:
        def short(value: str) -> str:
            if len(value) <= SAID_VALUE_MAX_CHARS:
                return value
            return value[: SAID_VALUE_MAX_CHARS - 3] + "..."

        return f"{self.key} {short(self.b)} instead of {short(self.a)}"


@dataclass(frozen=True)
class PartChange:
    """One part of one rank's step in both runs: seconds per step and share of the step."""

    rank: int
    part: StepPart
    a_seconds: float | None
    b_seconds: float | None
    a_share: float | None
    b_share: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "part": str(self.part),
            "a_seconds": self.a_seconds,
            "b_seconds": self.b_seconds,
            "a_share": self.a_share,
            "b_share": self.b_share,
        }


def _percent(share: float) -> str:
    return f"{round(100 * share)} %"


def _matches(key: str, prefix: str) -> bool:
    return key.startswith(prefix) if prefix.endswith((".", "_")) else key == prefix


def _rank(change: Change, related: Sequence[str]) -> tuple[int, int]:
    """Sort key of a difference as a cause: related ones first, in ``related``'s order; then the
    rest; bystanders last."""
    for i, prefix in enumerate(related):
        if _matches(change.key, prefix):
            return (0, i)
    if any(_matches(change.key, prefix) for prefix in BYSTANDERS):
        return (2, 0)
    return (1, 0)


def named_differences(changes: Sequence[Change], part: StepPart | None) -> list[Change]:
    """The differences the sentence names, most likely cause first (at most ``NAMED_MAX``)."""
    related = RELATED.get(part, ()) if part is not None else ()
    ordered = sorted(changes, key=lambda c: _rank(c, related))
    return ordered[:NAMED_MAX]


def moved_part(
    split: Sequence[PartChange], slower: float | None = None
) -> tuple[StepPart, float, float] | None:
    """The part that moved most, with its mean share of the step in A and in B: the one whose
    seconds per step (the ranks' mean) grew most where B is slower, shrank most where it is
    faster (what explains the difference), else changed most either way."""
    moves: dict[StepPart, list[PartChange]] = {}
    for p in split:
        moves.setdefault(p.part, []).append(p)
    sign = 0.0 if slower is None else (1.0 if slower >= 1 else -1.0)

    def delta(changes: list[PartChange], signed: float) -> float:
        moved = [(p.b_seconds or 0.0) - (p.a_seconds or 0.0) for p in changes]
        return (
            statistics.mean(m * signed for m in moved)
            if signed
            else statistics.mean(abs(m) for m in moved)
        )

    if not moves:
        return None
    part = max(moves, key=lambda k: delta(moves[k], sign))
    if sign and delta(moves[part], sign) <= 0:  # nothing moved the way the speed did
        part = max(moves, key=lambda k: delta(moves[k], 0.0))
    changes = moves[part]
    share_a = statistics.mean(p.a_share or 0.0 for p in changes)
    share_b = statistics.mean(p.b_share or 0.0 for p in changes)
    return part, share_a, share_b


def _how_much(slower: float) -> str:
    times = slower if slower >= 1 else 1 / slower
    figure = f"{times:.2f}" if times < 1.1 else f"{times:.1f}"
    return f"B is {figure}x {'slower' if slower >= 1 else 'faster'}"


def _part_clause(moved: tuple[StepPart, float, float] | None) -> str:
    if moved is None:
        return ""
    part, share_a, share_b = moved
    verb = "rose" if share_b > share_a else "fell" if share_b < share_a else "stayed"
    if verb == "stayed":
        return f": its {PART_WORDS[part]} stayed at {_percent(share_a)} of the step"
    return f": its {PART_WORDS[part]} {verb} from {_percent(share_a)} to {_percent(share_b)} of the step"


def _load_clause(outside_load: tuple[float | None, float | None]) -> str:
    a, b = outside_load
    if a is None or b is None or abs(b - a) < OUTSIDE_LOAD_CORES:
        return ""
    busier = "busier" if b > a else "quieter"
    return f"the host was {busier}: other processes kept {b:.1f} cores busy against {a:.1f}"


def cause_sentence(
    *,
    slower: float | None,
    noise: float,
    config: Sequence[Change],
    environment: Sequence[Change],
    environment_recorded: bool,
    split: Sequence[PartChange],
    outside_load: tuple[float | None, float | None],
    unfinished: Sequence[str] = (),
) -> str:
    """One sentence: how B compares with A and the most likely cause (see the module)."""
    changes = [*config, *environment]
    moved = moved_part(split, slower)
    named = named_differences(changes, moved[0] if moved else None)
    differences = " and ".join(c.said() for c in named)
    ran_with = f"it ran with {differences}" if named else ""
    load = _load_clause(outside_load)
    if slower is None:
        why = (
            f"{' and '.join(unfinished)} {'has' if len(unfinished) == 1 else 'have'} not ended"
            if unfinished
            else "neither has images/s or a timed step"
        )
        return f"no speeds to compare ({why})" + (f"; B ran with {differences}" if named else "")
    difference = f"{100 * abs(slower - 1):.1f} %"
    if abs(slower - 1) <= noise:
        if not changes:
            same = (
                "same config and environment"
                if environment_recorded
                else ("same config (environment not recorded)")
            )
            return f"{same}; B is within noise of A ({difference})"
        return f"B is within noise of A ({difference}), though {ran_with}"
    sentence = _how_much(slower) + _part_clause(moved)
    if ran_with:
        return f"{sentence}; {ran_with}" + (f"; {load}" if load else "")
    if load:
        return f"{sentence}; {load}"
    same = "same config and environment" if environment_recorded else "same config"
    return f"{sentence}; {same}, so look at the machine (other jobs, clocks, thermals)"
