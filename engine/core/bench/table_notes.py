"""The footer of a speedup table: what its figures mean, where rows are not comparable and why a
flagged figure cannot be trusted, one sentence each, in a fixed order. Plain Python.

``table_notes`` is called once, by ``engine.core.bench.table_compute.build_speedup_table``, with the
computed rows; every sentence is decided from their flags, never from the cells.
"""

from __future__ import annotations

from engine.core.bench.speedup_table import (
    BATCH_MARK,
    FEW_STEPS_MARK,
    LOAD_MARK,
    MIN_STEADY_STEPS,
    OUTSIDE_LOAD_CORES,
    SUPERLINEAR_MARK,
    WARN_MARK,
    SpeedupRow,
)
from engine.core.common.statuses import RowStatus


def table_notes(
    rows: list[SpeedupRow],
    base: SpeedupRow | None,
    batch_reference: int,
    *,
    asked_baseline: str | None,
) -> list[str]:
    """The footer sentences for ``rows`` with baseline ``base`` (None when no row can be one).

    ``asked_baseline`` is the label the caller named (a suite's), None when the first completed
    row was taken; when that row did not complete, the last note says so. ``batch_reference`` is
    the global batch the rows are compared with.
    """
    done = [r for r in rows if r.ok]
    notes = [
        *_what_the_figures_are(done),
        *_what_speedup_is(base, chosen=asked_baseline is None),
        *_where_steps_go(done),
        *_batch_differs(rows, batch_reference),
        *_slower_with_more_devices(rows),
        *_superlinear(rows),
        *_few_steps(rows),
        *_outside_load(rows),
        *_repeats_and_images(done),
    ]
    if any(r.test_accuracy is not None for r in done):
        notes.append("Test accuracy is on the test set after the last epoch.")
    return notes + _no_baseline(rows, base, asked_baseline)


def _names(labels: list[str]) -> str:
    return ", ".join(repr(label) for label in labels)


def _what_the_figures_are(done: list[SpeedupRow]) -> list[str]:
    if not done:
        return []
    warmups = sorted({r.warmup_steps for r in done if r.warmup_steps is not None})
    warmup = " or ".join(str(w) for w in warmups) if warmups else "the configured"
    return [
        "Figures are from each run's last epoch: epoch seconds and images/s are steady state "
        f"(the first {warmup} steps of the epoch, the warm-up, are left out), device-synchronised "
        "and with data loading included; data wait is the share of the epoch spent waiting "
        "for the next batch."
    ]


def _what_speedup_is(base: SpeedupRow | None, *, chosen: bool) -> list[str]:
    if base is None:
        return []
    how = " (the first row that completed)" if chosen else ""
    return [
        f"Speedup is a row's images/s over the baseline's, {base.label!r}{how}; efficiency "
        "is speedup divided by the row's devices over the baseline's "
        f"({base.device_count} device{'s' if base.device_count != 1 else ''})."
    ]


def _where_steps_go(done: list[SpeedupRow]) -> list[str]:
    """What the step split's letters mean, and each row's bottleneck in its own sentence."""
    split = [r for r in done if r.step_split()]
    if not split:
        return []
    why = "; ".join(f"{r.label!r}: {r.bottleneck}" for r in split if r.bottleneck)
    return [
        "Step split: the share of a step in data wait (d), forward (f), backward (b, with the "
        "gradient sync it waits for unless s shows the sync apart), optimizer (o) and other "
        "(x), the mean of the row's ranks, timed with global hooks in every rank."
        + (f" Why: {why}." if why else "")
    ]


def _batch_differs(rows: list[SpeedupRow], batch_reference: int) -> list[str]:
    differing = [r.label for r in rows if r.batch_differs]
    if not differing:
        return []
    return [
        f"{BATCH_MARK} Global batch differs from the baseline's ({batch_reference}) in "
        f"{_names(differing)}: an epoch takes fewer or more optimiser steps, so their test "
        "accuracy is not directly comparable with the baseline's unless the learning rate "
        "was scaled to match."
    ]


def _slower_with_more_devices(rows: list[SpeedupRow]) -> list[str]:
    slow = [r for r in rows if r.slower_than]
    if not slow:
        return []
    pairs = "; ".join(
        f"{r.label!r} ({r.device_count} devices) is slower than {r.slower_than!r}" for r in slow
    )
    beyond = " (beyond the spread of the repeats)" if any(r.repeats > 1 for r in slow) else ""
    return [
        f"{WARN_MARK} More devices, yet slower than a row with fewer in the same precision"
        f"{beyond}: {pairs}."
    ]


def _superlinear(rows: list[SpeedupRow]) -> list[str]:
    superlinear = [r.label for r in rows if r.superlinear]
    if not superlinear:
        return []
    return [
        f"{SUPERLINEAR_MARK} Efficiency above 100 % beyond the spread of the repeats in "
        f"{_names(superlinear)}: more than linear scaling usually means the baseline was "
        "slowed (outside load, a cold start, a throttled device), not that the row scales "
        "better than perfectly; rerun with --repeat 3 on a quiet machine."
    ]


def _few_steps(rows: list[SpeedupRow]) -> list[str]:
    few = [r for r in rows if r.few_steps]
    if not few:
        return []
    counts = ", ".join(f"{r.label!r} {r.steady_steps}" for r in few)
    return [
        f"{FEW_STEPS_MARK} Too few steady steps to trust (after the warm-up; at least "
        f"{MIN_STEADY_STEPS} are needed): {counts}; raise training.max_steps or the data set."
    ]


def _outside_load(rows: list[SpeedupRow]) -> list[str]:
    loaded = [r for r in rows if r.loaded]
    if not loaded:
        return []
    loads = ", ".join(f"{r.label!r} {r.outside_load:.2f}" for r in loaded)
    return [
        f"{LOAD_MARK} Outside load while the row ran: other processes kept this many cores "
        f"busy on average (their CPU time, from psutil; flagged above {OUTSIDE_LOAD_CORES:g}): "
        f"{loads}; its figures are likely low, and a speedup over it likely high."
    ]


def _repeats_and_images(done: list[SpeedupRow]) -> list[str]:
    notes = []
    repeats = sorted({r.repeats for r in done})
    if repeats and repeats != [1]:
        notes.append(
            f"Each figure is the median of {' or '.join(map(str, repeats))} runs; "
            "(min–max) is the spread of epoch seconds and images/s."
        )
    if len({r.epoch_images for r in done}) > 1:
        notes.append(
            "Rows processed different numbers of images per epoch (a step cap per rank, or a "
            "sampler that pads), so compare them by images/s and speedup, not by epoch seconds."
        )
    return notes


def _no_baseline(
    rows: list[SpeedupRow], base: SpeedupRow | None, asked_baseline: str | None
) -> list[str]:
    """Why no row has a speedup: the baseline asked for did not complete (it is never silently
    replaced), or no row completed at all."""
    if base is not None or not rows:
        return []
    if asked_baseline is None:
        return ["No row completed, so there is no baseline and no speedup."]
    row = next(r for r in rows if r.label == asked_baseline)
    if row.status == RowStatus.SKIPPED:
        how = f"was skipped ({row.reason})"
    else:
        how = f"failed ({row.reason})" if row.reason else "failed"
    return [f"The baseline row {asked_baseline!r} {how}, so no row has a speedup."]
