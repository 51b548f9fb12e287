"""Where each rank's step goes and which rank is slow and why (engine.core.runs.step_breakdown):
events folded into each rank's split, and the one rule that names the run's bottleneck."""

from __future__ import annotations

import pytest

from engine.core.runs.events import StepBreakdownReported, StepProgress, event_from_json
from engine.core.runs.step_breakdown import (
    Bottleneck,
    BottleneckKind,
    StepBreakdown,
    StepBreakdownFold,
    StepPart,
    find_bottleneck,
)


def split(
    rank: int,
    *,
    data: float = 0.01,
    forward: float = 0.03,
    backward: float = 0.05,
    sync: float | None = 0.005,
    optimizer: float = 0.004,
    other: float = 0.001,
    steps: int = 20,
) -> StepBreakdown:
    return StepBreakdown(rank, steps, steps, data, forward, backward, sync, optimizer, other)


def reported(
    rank: int, steps: int, timed: int | None = None, **parts: float | None
) -> StepBreakdownReported:
    values: dict[str, float | None] = {
        "data": 0.0,
        "forward": 0.0,
        "backward": 0.0,
        "sync": None,
        "optimizer": 0.0,
        "other": 0.0,
    }
    values.update(parts)
    timed = steps if timed is None else timed
    return StepBreakdownReported(rank=rank, steps=steps, timed=timed, **values)  # type: ignore[arg-type]


def progress(rank: int, global_step: int, step_seconds: float) -> StepProgress:
    return StepProgress(
        rank=rank,
        epoch=0,
        step=global_step,
        steps=100,
        global_step=global_step,
        loss=None,
        images_per_s=None,
        step_seconds=step_seconds,
        lr=None,
    )


def test_the_event_reads_back_as_written_with_and_without_sync() -> None:
    timed = reported(1, 4, data=0.01, forward=0.02, backward=0.03, sync=0.004, optimizer=0.001)
    untimed = reported(0, 2, data=0.5, forward=0.1)
    assert event_from_json(timed.to_json()) == timed
    assert event_from_json(untimed.to_json()) == untimed
    assert '"sync": null' in untimed.to_json()


def test_the_fold_weights_each_report_by_its_steps_over_the_whole_run_and_recently() -> None:
    fold = StepBreakdownFold()
    fold.feed_all(
        [
            reported(0, 1, data=1.0, forward=1.0, backward=1.0, sync=1.0, optimizer=1.0),
            # one step timed in three: its figures stand for all three
            reported(0, 3, 1, data=0.2, forward=0.2, backward=0.2, sync=0.0, optimizer=0.2),
            *[reported(0, 1, data=0.1, forward=0.3) for _ in range(8)],
            reported(1, 2, data=0.4, forward=0.2, backward=0.1, optimizer=0.1, other=0.2),
            # step reports: 10 steps of 0.5 s, then 30 of 0.1 s (each covers steps since the last)
            progress(1, 10, 0.5),
            progress(1, 40, 0.1),
        ]
    )
    whole = {b.rank: b for b in fold.whole_run()}
    rank0 = whole[0]
    assert (rank0.steps, rank0.timed) == (12, 10)
    assert rank0.data == pytest.approx((1.0 + 3 * 0.2 + 8 * 0.1) / 12)
    assert rank0.sync == pytest.approx(1.0 / 12)  # timed in some reports: timed for the rank
    assert rank0.step_seconds is None  # rank 0 sent no step report
    assert whole[1].sync is None and whole[1].step_seconds == pytest.approx((5 + 3) / 40)
    assert whole[1].total == pytest.approx(1.0)
    assert whole[1].share(StepPart.DATA) == pytest.approx(0.4)
    assert whole[1].share(StepPart.SYNC) == 0.0
    assert list(whole[1].parts()) == ["data", "forward", "backward", "optimizer", "other"]
    # Recently: only the last eight reports of rank 0, the early slow ones forgotten.
    recent = {b.rank: b for b in fold.recent()}
    assert recent[0].steps == 8 and recent[0].data == pytest.approx(0.1)
    assert recent[0].sync is None  # none of its recent reports timed the sync


def test_a_breakdown_reads_back_from_its_json() -> None:
    b = split(3, sync=None)
    b = StepBreakdown(**{**b.to_json(), "step_seconds": 0.2, "clock": "cuda"})
    assert StepBreakdown.from_json({**b.to_json(), "newer_key": 1}) == b
    with pytest.raises(TypeError):
        StepBreakdown.from_json({"rank": 0})


# ---- the cause, in the sentences a user reads ------------------------------------------------


def test_one_rank_waiting_for_its_data_is_named_input_bound() -> None:
    ranks = [
        split(0, data=0.0066, sync=0.04),  # the others wait for rank 3 in their gradient sync
        split(1, data=0.0066, sync=0.04),
        split(2, data=0.0066, sync=0.04),
        split(3, data=0.1224, sync=0.0, backward=0.04),
    ]
    found = find_bottleneck(ranks)
    assert found == Bottleneck(
        BottleneckKind.INPUT_BOUND_RANK,
        "rank 3: data wait 62 % of its step against 5 % on the others: input-bound",
        3,
    )


def test_every_rank_waiting_in_gradient_sync_is_communication_bound() -> None:
    ranks = [split(r, sync=0.06, backward=0.04, forward=0.035) for r in range(4)]
    ranks[2] = split(2, sync=0.07, backward=0.04, forward=0.035)  # 44 %: every rank waits 40 %
    found = find_bottleneck(ranks)
    assert found is not None and found.kind == BottleneckKind.COMMUNICATION_BOUND
    assert found.sentence == (
        "every rank waits 40 % of its step in gradient sync: communication-bound"
    )
    assert found.rank is None


def test_one_rank_computing_slower_is_named_with_how_much() -> None:
    ranks = [split(r, forward=0.03, backward=0.05, sync=0.066) for r in (0, 2, 3)]
    ranks.insert(1, split(1, forward=0.054, backward=0.09, sync=0.002))  # 1.8x the others'
    found = find_bottleneck(ranks)
    assert found == Bottleneck(
        BottleneckKind.COMPUTE_RANK,
        "rank 1's forward and backward take 1.8x the others': slower device or a neighbour on "
        "its cores",
        1,
    )


def test_without_a_timed_sync_a_slow_rank_is_judged_by_its_forward() -> None:
    """A script's backward holds its wait for the slower peers: every backward looks alike."""
    ranks = [split(0, forward=0.02, backward=0.09, sync=None), split(1, forward=0.06, sync=None)]
    found = find_bottleneck(ranks)
    assert found is not None and found.rank == 1
    assert found.sentence.startswith("rank 1's forward takes 3.0x the others'")


def test_a_slower_forward_that_is_a_small_part_of_the_step_is_not_the_cause() -> None:
    """Every rank waits 70 % of its step for data; rank 1's forward is 1.6x rank 0's, but the
    difference is 3 % of its step: noise on a busy machine, and not what slows the run."""
    ranks = [
        split(0, data=0.021, forward=0.0025, backward=0.006, sync=None, optimizer=0.0005),
        split(1, data=0.021, forward=0.004, backward=0.005, sync=None, optimizer=0.0005),
    ]
    found = find_bottleneck(ranks)
    assert found is not None and found.kind == BottleneckKind.INPUT_BOUND


def test_every_rank_waiting_for_data_and_a_balanced_run() -> None:
    waiting = [split(r, data=0.2, forward=0.1, backward=0.1, sync=None) for r in range(2)]
    found = find_bottleneck(waiting)
    assert found is not None and found.kind == BottleneckKind.INPUT_BOUND
    assert found.sentence == "every rank waits 49 % of its step for data: input-bound"
    alone = find_bottleneck([split(0, data=0.2, forward=0.1, backward=0.1, sync=None)])
    assert alone is not None and alone.sentence.startswith("rank 0 waits 49 % of its step")

    balanced = find_bottleneck([split(0), split(1)])
    assert balanced is not None and balanced.kind == BottleneckKind.BALANCED
    assert balanced.sentence == "no rank stands out: the step goes mostly to backward (50 %)"


def test_too_few_timed_steps_name_nothing() -> None:
    assert find_bottleneck([]) is None
    assert find_bottleneck([split(0, steps=2), split(1, steps=2, data=5.0)]) is None


def test_a_step_split_adds_part_by_part_and_keeps_sync_untimed_until_one_is_timed() -> None:
    from engine.core.common.step_split import StepPart, StepSplit

    blind = StepSplit(data=1.0, forward=2.0, backward=3.0, optimizer=0.5, other=0.5)
    assert blind.plus(blind).sync is None and StepPart.SYNC not in blind.parts()
    timed = StepSplit(1.0, 1.0, 1.0, 2.0, 1.0, 0.0)
    summed = blind.times(3).plus(timed)
    assert summed == StepSplit(4.0, 7.0, 10.0, 2.0, 2.5, 1.5)
    assert summed.mean_over(4) == StepSplit(1.0, 1.75, 2.5, 0.5, 0.625, 0.375)
    assert list(summed.parts()) == list(StepPart) and summed.total == 27.0
