"""Why is it slow: every rank's step split into data, forward, backward, sync, optimizer and other,
on real gloo runs with no code change (an engine run, a plain DDP script), and the slow rank and
its cause named from the split (a rank with slow data, a rank with a slow forward); the split as
the observer shows it while a run goes and once it ended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.common.statuses import RunStatus
from engine.core.runs.events import Event, StepBreakdownReported, StepProgress
from engine.core.runs.observer import observe_run
from engine.core.runs.rundir import RunDir, list_runs
from engine.core.runs.step_breakdown import (
    BottleneckKind,
    StepBreakdown,
    StepPart,
    find_bottleneck,
)
from engine.core.runs.step_curves import MAX_POINTS, StepCurveFold
from engine.core.runs.summary import RunSummary
from tests.fixtures.live_runs import ddptui, run_processes
from tests.fixtures.made_runs import make_run
from tests.fixtures.repo import REPO_ROOT

BYO = REPO_ROOT / "tests" / "fixtures" / "byo"
TUTORIAL = "tests/fixtures/tutorial_ddp.py"
# A short BYO run: 16 steps of 32 per rank, no evaluation.
SHORT_BLOBS = [
    str(BYO / "blobs.toml"), "--epochs", "1", "--batch-size", "32",
    "--set", "training.evaluate=false",
]  # fmt: skip


def finished_summary(runs_dir: Path, result: object) -> tuple[RunDir, RunSummary]:
    (run_dir,) = list_runs(runs_dir)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.COMPLETED, result
    assert run_processes(run_dir) == []
    return run_dir, summary


def assert_adds_up(split: tuple[StepBreakdown, ...], world_size: int) -> None:
    """A split for every rank whose parts add up to the rank's measured step time (its step
    reports, every step) within 10 %."""
    assert [b.rank for b in split] == list(range(world_size))
    for b in split:
        assert b.timed >= 3 and b.step_seconds is not None, b
        assert b.total == pytest.approx(b.step_seconds, rel=0.10), b
        assert min(b.parts().values()) >= 0.0 and b.forward > 0 and b.backward > 0


@pytest.fixture
def byo_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(BYO))


# ---- the split, with no code change --------------------------------------------------------


@pytest.mark.slow
def test_a_cpu_demo_run_splits_every_ranks_step_with_the_sync_apart(runs_dir: Path) -> None:
    result = ddptui(
        "run", "cpu-demo", "--epochs", "1", "--set", "training.max_steps=12",
        "--set", "training.evaluate=false", "--set", "training.checkpoint=false",
        "--runs-dir", str(runs_dir), timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir, summary = finished_summary(runs_dir, result)
    assert_adds_up(summary.step_breakdown, 2)
    assert all(b.sync is not None and b.clock == "cpu" for b in summary.step_breakdown)
    assert summary.bottleneck == find_bottleneck(summary.step_breakdown).sentence  # type: ignore[union-attr]
    # The same split in `ddptui show --json`, with the run's bottleneck sentence.
    shown = ddptui("show", run_dir.run_id, "--json", "--runs-dir", str(runs_dir))
    state = json.loads(shown.stdout)
    assert state["step_breakdown"] == [b.to_json() for b in summary.step_breakdown]
    assert state["bottleneck"] == summary.bottleneck != ""
    assert set(state["step_breakdown"][0]) >= {
        "data", "forward", "backward", "sync", "optimizer", "other"
    }  # fmt: skip
    text = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir)).stdout
    assert f"bottleneck {summary.bottleneck}" in text
    assert f"  step: {summary.bottleneck} (ddptui show {run_dir.run_id}" in result.stdout


@pytest.mark.slow
def test_a_plain_ddp_script_gets_the_same_split_with_no_ddptui_in_it(runs_dir: Path) -> None:
    # The sleep after each optimizer step makes the steps long enough to time steadily on a busy
    # machine; it is data wait by the split's own definition (before the next forward). 20 steps:
    # every one is timed, so the parts and the step reports cover the same steps whatever the
    # machine's load does to one of them (the weighting of sampled steps: test_step_timing.py).
    result = ddptui(
        "run", TUTORIAL, "--devices", "cpu:2", "--runs-dir", str(runs_dir),
        "--", "--epochs", "1", "--steps", "20", "--step-seconds", "0.02", timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    _, summary = finished_summary(runs_dir, result)
    assert_adds_up(summary.step_breakdown, 2)
    for b in summary.step_breakdown:
        assert b.sync is None  # the script's DDP module is not ours: its sync stays in backward
        assert b.data >= 0.02
    least = min(b.share(StepPart.DATA) for b in summary.step_breakdown)
    said = f"every rank waits {round(100 * least)} % of its step for data: input-bound"
    assert summary.bottleneck == said


# ---- the slow rank, named ------------------------------------------------------------------


@pytest.mark.slow
def test_a_rank_with_slow_data_is_named_input_bound(runs_dir: Path, byo_path: None) -> None:
    result = ddptui(
        "run", *SHORT_BLOBS, "--set", "data.factory=mymodels.data:slow_blobs_on_rank",
        "--set", "data.factory_args={rank = 1, seconds = 0.003}",
        "--runs-dir", str(runs_dir), timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    _, summary = finished_summary(runs_dir, result)
    found = find_bottleneck(summary.step_breakdown)
    assert found is not None and (found.kind, found.rank) == (BottleneckKind.INPUT_BOUND_RANK, 1)
    assert summary.bottleneck.startswith("rank 1: data wait ")
    assert summary.bottleneck.endswith(" on the others: input-bound")
    # rank 0 spent the wait for rank 1's gradients in its sync, not in its own data
    rank0, rank1 = summary.step_breakdown
    assert rank1.data > 0.5 * rank1.total and rank0.data < 0.2 * rank0.total
    assert rank0.sync is not None and rank0.sync > 0.5 * rank0.total


@pytest.mark.slow
def test_a_rank_with_a_slow_forward_is_named_compute_on_that_rank(
    runs_dir: Path, byo_path: None
) -> None:
    result = ddptui(
        "run", *SHORT_BLOBS, "--set", "model.factory=mymodels.nets:mlp_slow_on_rank",
        "--set", "model.factory_args={rank = 1, seconds = 0.03}",
        "--runs-dir", str(runs_dir), timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    _, summary = finished_summary(runs_dir, result)
    found = find_bottleneck(summary.step_breakdown)
    assert found is not None and (found.kind, found.rank) == (BottleneckKind.COMPUTE_RANK, 1)
    assert summary.bottleneck.startswith("rank 1's forward and backward take ")
    assert summary.bottleneck.endswith("x the others': slower device or a neighbour on its cores")
    rank0, rank1 = summary.step_breakdown
    assert rank1.forward >= 0.03 > rank0.forward


# ---- what the observer shows ---------------------------------------------------------------


def breakdown(rank: int, data: float, steps: int = 4) -> StepBreakdownReported:
    return StepBreakdownReported(
        rank=rank, steps=steps, timed=steps, data=data, forward=0.01, backward=0.02, sync=0.001,
        optimizer=0.001, other=0.0,
    )  # fmt: skip


def step(rank: int, global_step: int, loss: float) -> StepProgress:
    return StepProgress(
        rank=rank, epoch=0, step=global_step, steps=100, global_step=global_step, loss=loss,
        images_per_s=320.0, step_seconds=0.1, lr=0.1,
    )  # fmt: skip


def test_a_live_run_shows_its_recent_split_and_its_curves(tmp_path: Path) -> None:
    events: dict[str, list[Event]] = {"rank-0": [], "rank-1": []}
    for i in range(10):  # rank 1's data got slow in its last eight reports
        for rank in (0, 1):
            slow = rank == 1 and i >= 2
            events[f"rank-{rank}"] += [
                breakdown(rank, 0.5 if slow else 0.001),
                step(rank, 4 * (i + 1), loss=2.0 - 0.1 * i),
            ]
    run_dir = make_run(tmp_path / "runs", "20261205-000000-made-0001", events=events)
    state = observe_run(run_dir)
    assert not state.final
    assert [b.rank for b in state.step_breakdown] == [0, 1]
    assert state.step_breakdown[1].steps == 8 * 4  # the recent reports only
    assert state.bottleneck is not None and state.bottleneck.rank == 1
    assert state.to_json()["bottleneck"] == state.bottleneck.sentence
    assert state.curves.rank == 0
    assert [s for s, _ in state.curves.loss()] == [4 * (i + 1) for i in range(10)]
    assert state.curves.rate()[0] == "images/s"


def test_the_curves_keep_the_lowest_rank_and_a_bounded_whole_run() -> None:
    fold = StepCurveFold()
    fold.feed_all([step(1, s, loss=1.0) for s in range(1, 4)])
    assert fold.curves().rank == 1
    fold.feed_all([step(0, s, loss=float(s)) for s in range(1, 3 * MAX_POINTS)])
    curves = fold.curves()
    assert curves.rank == 0 and fold.curves() is curves  # the same object until a new point
    steps = [p.global_step for p in curves.points]
    assert len(steps) <= MAX_POINTS and steps == sorted(steps)
    assert steps[-1] == 3 * MAX_POINTS - 1  # the newest point is always kept
    assert steps[0] == 1  # and the run's start: the whole length, coarser


def test_a_stacked_bar_fills_its_width_part_by_part() -> None:
    from ddptui.widgets.step_split import PART_STYLES, stacked_bar

    split = StepBreakdown(0, 10, 10, 0.1, 0.3, 0.35, 0.2, 0.049, 0.001)
    bar = stacked_bar(split, 40)
    assert bar.plain == "█" * 40
    widths = [(span.style, span.end - span.start) for span in bar.spans]
    assert widths == [
        (PART_STYLES[StepPart.DATA], 4),
        (PART_STYLES[StepPart.FORWARD], 12),
        (PART_STYLES[StepPart.BACKWARD], 14),
        (PART_STYLES[StepPart.SYNC], 8),
        (PART_STYLES[StepPart.OPTIMIZER], 2),
    ]  # other, 0.1 % of the step, takes no cell
