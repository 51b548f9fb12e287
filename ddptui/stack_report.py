"""Stack snapshots and flight-recorder dumps in words, for ``ddptui run``, ``show`` and ``stacks``."""

from __future__ import annotations

from engine.core.runs.rundir import RunDir
from engine.core.stacks.snapshot import StackSnapshot, flight_recorder_command


def diagnosis_lines(
    snapshot: StackSnapshot,
    *,
    full: bool = False,
    native: bool = True,
    fold_hint: str = "",
) -> list[str]:
    """What each rank was doing when its stack was taken, the culprit first; with ``full``, every
    rank's whole stack after it, the main thread first, its native frames folded unless
    ``native`` (``fold_hint`` says how to see them)."""
    when = f"stacks ({snapshot.reason}"
    if snapshot.path:
        when += f", {snapshot.path}"
    lines = [f"{when}):"]
    ordered = sorted(snapshot.ranks, key=lambda r: (r.rank != snapshot.culprit_rank, r.rank))
    for r in ordered:
        mark = "  <- culprit: " + snapshot.culprit_reason if r.rank == snapshot.culprit_rank else ""
        method = f" [{r.method}]" if r.method else ""
        lines.append(f"  {r.describe()}{method}{mark}")
    if snapshot.culprit is None and snapshot.culprit_reason:
        lines.append(f"  no culprit: {snapshot.culprit_reason}")
    if full:
        for r in ordered:
            lines.append("")
            pid = f"pid {r.pid}, " if r.rank >= 0 else ""
            lines.append(f"{r.who} ({pid}{r.activity}, by {r.method or 'nothing'}):")
            body = r.stack_lines(native=native, fold_hint=fold_hint) or [f"(no stack: {r.problem})"]
            lines.extend("  " + line for line in body)
    return lines


def flight_recorder_lines(run_dir: RunDir) -> list[str]:
    """Where the ranks' flight-recorder dumps are and the command that analyses them."""
    dumps = run_dir.flight_recorder_dumps()
    if not dumps:
        return []
    names = ", ".join(p.name for p in dumps)
    return [
        f"flight recorder: {run_dir.flight_recorder_dir} ({names})",
        f"  analyse: {flight_recorder_command(run_dir.flight_recorder_dir)}",
    ]
