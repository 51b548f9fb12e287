"""Two runs compared (engine.core.runs.compare): config and environment differences, figures as
ratios, the step split part by part, and the one sentence naming the biggest cause, over run
directories made by hand (tests/fixtures/diff_runs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.runs.compare import compared_run
from engine.core.runs.compare.compared_run import read_compared_run
from engine.core.runs.compare.diff_cause import Change
from engine.core.runs.compare.run_diff import diff_runs
from engine.core.runs.compare.step_spread import SAMPLES_MAX, _rank_lines, step_time_spread
from engine.core.runs.recorded_environment import environment_path
from engine.core.runs.rundir import RunDir, RunDirError
from engine.core.runs.step_breakdown import StepPart
from tests.fixtures.diff_runs import make_ended_run


def compared(a: RunDir, b: RunDir):  # type: ignore[no-untyped-def]
    return diff_runs(read_compared_run(a), read_compared_run(b))


def test_a_slower_data_pipeline_is_named_with_the_key_that_changed(tmp_path: Path) -> None:
    a = make_ended_run(tmp_path, "a", overrides={"data.num_workers": 10}, data_share=0.04)
    b = make_ended_run(
        tmp_path, "b", overrides={"data.num_workers": 2}, data_share=0.47, step_seconds=0.09
    )
    diff = compared(a, b)
    assert diff.sentence == (
        "B is 1.8x slower: its data wait rose from 4 % to 47 % of the step; it ran with "
        "data.num_workers 2 instead of 10"
    )
    assert diff.config == (Change("data.num_workers", "10", "2"),)
    assert diff.environment == ()
    figures = {f.name: f for f in diff.figures}
    assert figures["images/s"].ratio == pytest.approx(0.05 / 0.09)
    assert figures["data wait"].a == pytest.approx(4.0)
    assert figures["data wait"].b == pytest.approx(47.0)
    data = [p for p in diff.split if p.part == StepPart.DATA]
    assert [p.rank for p in data] == [0, 1]
    assert data[0].a_seconds == pytest.approx(0.002) and data[0].b_seconds == pytest.approx(0.0423)


def test_fewer_threads_are_named_for_a_slower_forward(tmp_path: Path) -> None:
    a = make_ended_run(tmp_path, "a")
    b = make_ended_run(
        tmp_path, "b", variables={"OMP_NUM_THREADS": "1"}, forward_factor=3.0, step_seconds=0.08
    )
    diff = compared(a, b)
    assert diff.environment == (Change("OMP_NUM_THREADS", "4", "1"),)
    assert diff.sentence.startswith("B is 1.6x slower: its forward rose from ")
    assert diff.sentence.endswith("; it ran with OMP_NUM_THREADS 1 instead of 4")


def test_identical_configs_within_the_runs_own_spread_are_within_noise(tmp_path: Path) -> None:
    a = make_ended_run(tmp_path, "a", spread=0.06, seed=1)
    b = make_ended_run(tmp_path, "b", spread=0.06, step_seconds=0.0515, seed=2)
    diff = compared(a, b)
    assert diff.noise == pytest.approx(0.06, rel=0.25)
    assert diff.sentence == "same config and environment; B is within noise of A (3.0 %)"
    assert diff.config == () and diff.environment == ()


def test_a_difference_over_the_spread_is_not_noise(tmp_path: Path) -> None:
    a = make_ended_run(tmp_path, "a", spread=0.01)
    b = make_ended_run(tmp_path, "b", spread=0.01, step_seconds=0.06)
    diff = compared(a, b)
    assert diff.sentence.startswith("B is 1.2x slower")
    assert diff.sentence.endswith(
        "same config and environment, so look at the machine (other jobs, clocks, thermals)"
    )


def test_a_run_from_before_environment_json_says_not_recorded(tmp_path: Path) -> None:
    a = make_ended_run(tmp_path, "a", environment=False)
    b = make_ended_run(tmp_path, "b")
    diff = compared(a, b)
    assert diff.environment_note.startswith("environment of A: not recorded")
    assert diff.sentence.startswith("same config (environment not recorded); B is within noise")


def test_the_json_form_holds_every_part(tmp_path: Path) -> None:
    a = make_ended_run(tmp_path, "a", overrides={"data.num_workers": 10})
    b = make_ended_run(tmp_path, "b", overrides={"data.num_workers": 2}, step_seconds=0.09)
    data = json.loads(json.dumps(compared(a, b).to_json()))
    assert (data["a"], data["b"]) == ("a", "b")
    assert data["config"] == [{"key": "data.num_workers", "a": "10", "b": "2"}]
    assert {f["name"] for f in data["figures"]} >= {"images/s", "epoch time", "data wait"}
    assert {p["part"] for p in data["split"]} == {p.value for p in StepPart}
    assert data["slower"] == pytest.approx(1.8)


def test_another_users_run_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = make_ended_run(tmp_path, "a")
    monkeypatch.setattr(compared_run, "run_dir_owner", lambda run_dir: "mallory")
    with pytest.raises(RunDirError, match="belongs to mallory: not compared"):
        read_compared_run(a)


def test_an_unreadable_environment_is_a_note_not_a_failure(tmp_path: Path) -> None:
    a = make_ended_run(tmp_path, "a")
    environment_path(a).write_text('{"schema": 7}')
    run = read_compared_run(a)
    assert run.environment is None
    assert "written by a newer ddptui" in run.notes[0]


def test_the_spread_is_read_from_a_bounded_sample_of_a_long_run(tmp_path: Path) -> None:
    a = make_ended_run(tmp_path, "a", reports=20_000, spread=0.1)
    lines = _rank_lines(a.path, a.rank_events_path(0)).steps.lines
    assert SAMPLES_MAX <= len(lines) < 2 * SAMPLES_MAX
    spread = step_time_spread(a.path, a.rank_event_paths().values())
    assert spread == pytest.approx(0.1, rel=0.15)


def test_a_run_that_has_not_ended_has_no_speed_to_compare(tmp_path: Path) -> None:
    a = make_ended_run(tmp_path, "a", overrides={"data.num_workers": 10})
    b = make_ended_run(tmp_path, "b", overrides={"data.num_workers": 2})
    b.summary_path.unlink()
    diff = compared(a, b)
    assert diff.slower is None
    assert diff.sentence == (
        "no speeds to compare (B has not ended); B ran with data.num_workers 2 instead of 10"
    )


def test_the_split_compared_leaves_out_each_ranks_first_report(tmp_path: Path) -> None:
    """The first report holds the DataLoader workers' start: in a short run it outweighs the
    steady steps, so a faster run would seem to wait longer for data."""
    from engine.core.runs.events import EventWriter, StepBreakdownReported

    def split_reports(run: RunDir, first_data: float, data: float) -> None:
        for rank in (0, 1):
            with EventWriter(run.rank_events_path(rank)) as events:
                for i, wait in enumerate([first_data, data, data, data]):
                    events.write(
                        StepBreakdownReported(
                            rank=rank, steps=2 if i == 0 else 20, timed=2, data=wait,
                            forward=0.01, backward=0.01, sync=0.001, optimizer=0.002, other=0.0,
                        )
                    )  # fmt: skip

    a = make_ended_run(tmp_path, "a", overrides={"data.num_workers": 1})
    b = make_ended_run(tmp_path, "b", overrides={"data.num_workers": 0}, step_seconds=0.2)
    split_reports(a, first_data=10.0, data=0.001)  # a worker's start, then prefetched batches
    split_reports(b, first_data=0.2, data=0.2)
    run_a = read_compared_run(a)
    assert [round(s.data, 6) for s in run_a.steady_split] == [0.001, 0.001]
    diff = diff_runs(run_a, read_compared_run(b))
    assert diff.sentence.startswith("B is 4.0x slower: its data wait rose from 4 % to 90 %")
    assert diff.sentence.endswith("it ran with data.num_workers 0 instead of 1")
