"""The event protocol and the run directory: what the engine writes is what the UI reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.procs.process_identity import ProcessRef
from engine.core.runs.events import (
    EVENT_TYPES,
    EpochEnded,
    EventTail,
    EventWriter,
    RankFailed,
    RankStarted,
    StepProgress,
    event_from_json,
    read_events,
)
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo, find_run


def test_every_event_round_trips_through_one_json_line() -> None:
    step = StepProgress(
        rank=1,
        epoch=0,
        step=5,
        steps=10,
        global_step=5,
        loss=0.5,
        images_per_s=100.0,
        step_seconds=0.1,
        lr=0.1,
    )
    line = step.to_json()
    assert "\n" not in line
    assert json.loads(line)["type"] == "step" and json.loads(line)["v"] == 1
    assert event_from_json(line) == step
    assert set(EVENT_TYPES) >= {
        "rank_started",
        "step",
        "epoch_ended",
        "evaluation",
        "rank_failed",
        "run_finished",
    }


def test_tail_returns_only_new_events_and_waits_for_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    tail = EventTail(path)
    assert tail.read_new() == []  # no file yet
    with EventWriter(path) as w:
        w.write(RankStarted(rank=0, world_size=2, pid=1, host="h", device="cpu", time=1.0))
    assert [type(e) for e in tail.read_new()] == [RankStarted]
    failed = RankFailed(rank=0, error="RuntimeError: x", traceback="tb", time=2.0).to_json()
    with open(path, "a") as f:
        f.write(failed[:10])  # a writer mid-append
    assert tail.read_new() == []
    with open(path, "a") as f:
        f.write(failed[10:] + "\n" + '{"v": 99, "type": "step"}\n' + "garbage\n")
    assert tail.read_new() == [
        RankFailed(rank=0, error="RuntimeError: x", traceback="tb", time=2.0)
    ]
    assert tail.skipped == 2  # newer schema and garbage are counted, not fatal
    assert len(read_events(path)) == 2


def test_run_json_round_trip_and_newer_version_is_refused(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r1")
    run.create()
    info = RunInfo(
        run_id="r1",
        preset="cpu-demo",
        host="h",
        created=1.0,
        state="running",
        world_size=2,
        devices="cpu:2",
        launcher=ProcessRef(10, 5.5),
        pgid=10,
        ranks=(ProcessRef(11, 6.0),),
    )
    run.write_run_info(info)
    assert run.read_run_info() == info
    data = json.loads(run.run_json_path.read_text())
    data["schema"] = 7
    run.run_json_path.write_text(json.dumps(data))
    with pytest.raises(RunDirError, match=r"written by a newer ddptui \(schema 7"):
        run.read_run_info()
    run.run_json_path.write_text("{not json")
    with pytest.raises(RunDirError, match=r"run\.json is corrupt"):
        run.read_run_info()


def test_find_run_by_prefix_and_unknown_id(tmp_path: Path) -> None:
    for name in ("20261202-a", "20261202-b", "20261203-c"):
        RunDir(tmp_path / name).create()
        (tmp_path / name / "config.toml").write_text("")
    assert find_run(tmp_path, "20261203").run_id == "20261203-c"
    with pytest.raises(RunDirError, match="matches 2 runs"):
        find_run(tmp_path, "20261202")
    with pytest.raises(RunDirError, match="no run 'zzz'"):
        find_run(tmp_path, "zzz")


def test_epoch_ended_carries_global_figures() -> None:
    fields = EpochEnded.__dataclass_fields__
    assert {
        "global_seconds",
        "global_images",
        "global_steady_images_per_s",
        "data_wait_seconds",
    } <= set(fields)
