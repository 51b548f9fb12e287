"""Computing the speedup table (``engine.core.bench.speedup_table``) from the rows as they ran:
each row's figures (medians over its repeats), the baseline, speedup and efficiency, and the
flags (global batch differs, slower with more devices, efficiency above 100 %). Plain Python.

The words under the table are ``engine.core.bench.table_notes``'s; its views are
``table_render``'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from engine.core.bench.speedup_table import RowResult, SpeedupRow, SpeedupTable, TableError
from engine.core.bench.table_notes import table_notes
from engine.core.common.statuses import RowStatus, RunStatus
from engine.core.common.step_split import StepPart
from engine.core.runs.summary import RunSummary


def build_speedup_table(
    results: Sequence[RowResult],
    *,
    title: str = "",
    baseline: str | None = None,
    header_lines: Sequence[str] = (),
) -> SpeedupTable:
    """Compute the table from the rows as they ran.

    ``baseline`` names a row label (a suite's baseline). When it is given and that row did not
    complete, no row gets a speedup and a note says why; it is never silently replaced. When it is
    not given, the first row that completed is the baseline, and a note says so.
    """
    labels = [r.label for r in results]
    if len(set(labels)) != len(labels):
        duplicate = next(label for label in labels if labels.count(label) > 1)
        raise TableError(f"two rows are labelled {duplicate!r}; row labels must be unique")
    if baseline is not None and baseline not in labels:
        raise TableError(f"baseline {baseline!r} is not one of the rows ({', '.join(labels)})")

    measured = [_measure(r) for r in results]
    base: SpeedupRow | None
    if baseline is not None:
        base = next(m for m in measured if m.label == baseline)
        # Global batches compare with the baseline's even when it did not run: its plan says it.
        batch_reference = base.global_batch
        base = base if base.ok else None
    else:
        base = next((m for m in measured if m.ok), None)
        batch_reference = base.global_batch if base else 0
    rows = [_relate(m, base, batch_reference) for m in measured]
    rows = _flag_slower_with_more_devices(rows)
    return SpeedupTable(
        title=title,
        rows=tuple(rows),
        baseline=base.label if base else None,
        notes=tuple(table_notes(rows, base, batch_reference, asked_baseline=baseline)),
        header_lines=tuple(header_lines),
    )


def _median(values: Iterable[float]) -> float:
    return float(statistics.median(values))


def _measure(result: RowResult) -> SpeedupRow:
    """A row's own figures: medians over its completed repeats. Relative figures come later."""
    shape: dict[str, Any] = {
        "label": result.label,
        "preset": result.preset,
        "strategy": result.strategy,
        "devices": result.devices,
        "device_count": result.device_count,
        "precision": result.precision,
        "global_batch": result.global_batch,
        "run_ids": tuple(s.run_id for s in result.summaries),
    }
    if result.skipped:
        return SpeedupRow(**shape, status=RowStatus.SKIPPED, reason=result.skipped)
    if not result.summaries:
        return SpeedupRow(**shape, status=RowStatus.FAILED, reason="no run finished")
    first = result.summaries[0]
    # What the run actually was beats what the plan said.
    shape.update(
        strategy=first.strategy,
        devices=first.devices,
        device_count=first.device_count,
        precision=first.precision,
        global_batch=first.global_batch,
    )
    total = len(result.summaries)
    for index, summary in enumerate(result.summaries, start=1):
        problem = ""
        if summary.status != RunStatus.COMPLETED:
            problem = failure_reason(summary)
        elif summary.table_epoch is None:
            # a failed attempt's steps never count: the one that completed the run trained none
            problem = (
                "it completed without finishing an epoch"
                if summary.attempt <= 1
                else f"its attempt {summary.attempt}, which completed it, trained no epoch"
            )
        if problem:
            which = f"run {index} of {total}: " if total > 1 else ""
            return SpeedupRow(**shape, status=RowStatus.FAILED, reason=which + problem)
    last = [s.table_epoch for s in result.summaries if s.table_epoch is not None]
    seconds = [e.steady_epoch_seconds for e in last]
    rates = [e.steady_images_per_s for e in last]
    waits = [e.data_wait_seconds / e.seconds if e.seconds > 0 else 0.0 for e in last]
    accuracies = [e.test_accuracy for e in last if e.test_accuracy is not None]
    loads = [s.outside_load_cores for s in result.summaries if s.outside_load_cores is not None]
    split = row_step_split(result.summaries)
    return SpeedupRow(
        **shape,
        status=RowStatus.OK,
        reason="",
        repeats=len(last),
        epoch_seconds=_median(seconds),
        epoch_seconds_min=min(seconds),
        epoch_seconds_max=max(seconds),
        data_wait_share=_median(waits),
        images_per_s=_median(rates),
        images_per_s_min=min(rates),
        images_per_s_max=max(rates),
        epoch_images=int(_median(e.whole_images for e in last)),
        warmup_steps=last[0].warmup_steps,
        test_accuracy=_median(accuracies) if accuracies else None,
        steady_steps=min(e.steps - e.warmup_steps for e in last),
        outside_load=max(loads) if loads else None,
        bottleneck=next((s.bottleneck for s in result.summaries if s.bottleneck), ""),
        step_data=split[StepPart.DATA],
        step_forward=split[StepPart.FORWARD],
        step_backward=split[StepPart.BACKWARD],
        step_sync=split[StepPart.SYNC],
        step_optimizer=split[StepPart.OPTIMIZER],
        step_other=split[StepPart.OTHER],
    )


def row_step_split(summaries: Sequence[RunSummary]) -> dict[StepPart, float | None]:
    """A row's ``step_*`` figures: each part's seconds per step, the mean of a run's ranks, the
    median of the runs that timed it; sync only where every rank of those runs timed it apart."""
    timed = [s.step_breakdown for s in summaries if s.step_breakdown]
    split: dict[StepPart, float | None] = dict.fromkeys(StepPart)
    for part in StepPart:
        per_run = [[b.parts().get(part) for b in ranks] for ranks in timed]
        if per_run and all(v is not None for ranks in per_run for v in ranks):
            split[part] = _median(
                statistics.mean(v for v in ranks if v is not None) for ranks in per_run
            )
    return split


def failure_reason(summary: RunSummary) -> str:
    """One line: the root cause (the first rank to fail) when known, else the launcher's reason."""
    status = summary.status
    failure = summary.failure
    if failure is not None:
        where = f"rank {failure.rank}" if failure.rank is not None else "a process"
        if failure.error:
            return f"{where}: {failure.error}"
        if failure.signal:
            return f"{where} ended by {failure.signal}"
        if failure.exitcode is not None:
            return f"{where} exited with code {failure.exitcode}"
    if summary.reason:
        return f"{status}: {summary.reason}" if status != RunStatus.FAILED else summary.reason
    return f"the run ended {status}"


def _relate(row: SpeedupRow, base: SpeedupRow | None, batch_reference: int) -> SpeedupRow:
    differs = batch_reference > 0 and row.global_batch > 0 and row.global_batch != batch_reference
    if base is None:
        return replace(row, batch_differs=differs)
    is_base = row.label == base.label
    if not row.ok or row.images_per_s is None or not base.images_per_s:
        return replace(row, baseline=is_base, batch_differs=differs)
    speedup = row.images_per_s / base.images_per_s
    device_ratio = row.device_count / base.device_count if base.device_count > 0 else 0.0
    efficiency = speedup / device_ratio if device_ratio > 0 else None
    # Beyond the spread: even the row's slowest repeat over the baseline's fastest is above 100 %.
    low = row.images_per_s_min or row.images_per_s
    high = base.images_per_s_max or base.images_per_s
    superlinear = not is_base and device_ratio > 0 and low / high / device_ratio > 1.0
    return replace(
        row,
        speedup=speedup,
        efficiency=efficiency,
        baseline=is_base,
        batch_differs=differs,
        superlinear=superlinear,
    )


def _flag_slower_with_more_devices(rows: list[SpeedupRow]) -> list[SpeedupRow]:
    done = [r for r in rows if r.ok and r.images_per_s is not None]
    flagged = []
    for row in rows:
        faster_with_fewer = [
            other
            for other in done
            if row.ok
            and other.precision == row.precision  # precision is another axis, not scaling
            and other.device_count < row.device_count
            and _clearly_faster(other, row)
        ]
        if faster_with_fewer:
            # The fewest devices that still beat it is the plainest statement of the problem.
            fewest = min(faster_with_fewer, key=lambda r: (r.device_count, -(r.images_per_s or 0)))
            row = replace(row, slower_than=fewest.label)
        flagged.append(row)
    return flagged


def _clearly_faster(a: SpeedupRow, b: SpeedupRow) -> bool:
    """``a`` beats ``b`` on images/s. With repeats on both, one median must also lie outside the
    other's range (min to max), so noise between two equal rows is not reported as a scaling
    problem, while one noisy repeat cannot hide a real gap either."""
    if a.images_per_s is None or b.images_per_s is None or a.images_per_s <= b.images_per_s:
        return False
    if a.repeats > 1 and b.repeats > 1:
        below = a.images_per_s_min is not None and b.images_per_s < a.images_per_s_min
        above = b.images_per_s_max is not None and a.images_per_s > b.images_per_s_max
        return below or above
    return True
