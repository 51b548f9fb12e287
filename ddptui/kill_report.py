"""A ``KillResult`` said in words, in one place for both surfaces: ``ddptui kill``'s report, a
line of what was stopped and then how each part ended (``kill_report``), and the UI's one or two
sentences (``kill_sentence``). Plain text: no textual here, so the CLI may import it."""

from __future__ import annotations

from engine.core.backends.local.kill import KillResult
from engine.core.common.statuses import KillOutcome


def kill_report(result: KillResult, grace: float) -> list[str]:
    """``ddptui kill``'s report: a line of what was stopped, then how each part of it ended."""
    lines = []
    if result.outcome == KillOutcome.ALREADY_FINISHED:
        lines.append(
            f"run {result.run_id} already finished ({result.status_before}); nothing to stop."
        )
    elif result.outcome == KillOutcome.NOTHING_RUNNING:
        recorded = (
            "recorded it as killed"
            if result.summary_written
            else f"its summary was not written: {result.unwritten}"
            if result.unwritten
            else "its summary was already there"
        )
        lines.append(
            f"run {result.run_id}: no process of it is left (state was {result.status_before}); "
            f"{recorded}."
        )
    elif result.placement and not result.targets:
        lines.append(
            f"run {result.run_id}: {result.placement} {result.placement_ended} while it was "
            f"{result.status_before}, before any node launcher had started"
        )
    else:
        roles = ", ".join(f"{t.role} (pid {t.pid})" for t in result.targets)
        placed = result.placement
        where = f" ({placed}, {result.placement_ended})" if placed else ""
        lines.append(f"run {result.run_id}{where}: stopping {roles}")
        if result.status_before.final:
            lines.append(
                f"  it had already finished ({result.status_before}); these were leftovers"
            )
        stop = result.stop
        if stop is not None:
            extra = len(stop.stopped) - len(result.targets)
            if extra > 0:
                lines.append(f"  and {extra} of their child processes")
            if result.by_launcher and result.placement:
                lines.append("  each node launcher stopped its ranks and checked its node")
            elif result.by_launcher:
                lines.append("  its launcher stopped its ranks and wrote the summary")
            lines.extend(_how_stopped(result, grace))
            if stop.survivors:
                lines.append(f"  still alive after SIGKILL: {', '.join(map(str, stop.survivors))}")
            else:
                lines.append("  none left")
            lines.extend(f"  not stopped: {why}" for _, why in stop.refused)
            lines.extend(f"  {why}" for _, why in stop.left_alone)
    lines.extend(f"  {s}" for s in result.skipped)
    if result.verification:
        lines.append(f"  {result.verification}")
    lines.extend(f"  a rank's daemon: {d}" for d in result.daemons)
    if result.gpu_check:
        lines.append(f"  {result.gpu_check}")
    if result.summary_written:
        lines.append("  summary.json: killed")
    elif result.unwritten and result.outcome == KillOutcome.STOPPED:
        lines.append(f"  summary.json not written: {result.unwritten}")
    return lines


def _how_stopped(result: KillResult, grace: float) -> list[str]:
    """Which process ended on SIGTERM and which needed SIGKILL, each named (its role in the run,
    else its pid), as the launcher's events or the killer's own stop say it."""
    assert result.stop is not None
    roles = {t.pid: t.role for t in result.targets}

    def named(pids: tuple[int, ...]) -> str:
        return ", ".join(
            f"{roles[pid]} (pid {pid})" if roles.get(pid) not in (None, "marked") else f"pid {pid}"
            for pid in pids
        )

    stop = result.stop
    lines = []
    if stop.terminated:
        lines.append(f"  ended on SIGTERM: {named(stop.terminated)}")
    if stop.killed:
        given = result.grace_seconds or grace
        lines.append(f"  needed SIGKILL, {given:g} s after SIGTERM: {named(stop.killed)}")
    lines.append(f"  {stop.seconds:.1f} s in all")
    return lines


def kill_sentence(result: KillResult) -> str:
    """A ``KillResult`` in one or two sentences (the UI's notice): what was stopped and whether anything is left."""
    if result.outcome == KillOutcome.ALREADY_FINISHED:
        return f"run {result.run_id} had already finished; no process of it was left"
    if result.outcome == KillOutcome.NOTHING_RUNNING:
        return f"no process of run {result.run_id} was left; it is now recorded as killed"
    stop = result.stop
    n = len(result.targets)
    text = f"stopped run {result.run_id}: {n} process{'es' if n != 1 else ''}"
    if stop is not None:
        text += f" ({len(stop.terminated)} on SIGTERM, {len(stop.killed)} needed SIGKILL)"
        if stop.survivors:
            text += f"; STILL RUNNING: pids {', '.join(map(str, stop.survivors))}"
        else:
            text += "; none left"
    if result.verification:
        text += f"; {result.verification}"
    if result.gpu_check:
        text += f"; {result.gpu_check}"
    return text
