"""The event protocol and the run directory: what the engine writes is what the UI reads."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest

from engine.core.procs.process_identity import ProcessRef
from engine.core.runs.event_notices import event_notice
from engine.core.runs.events import (
    EVENT_TYPES,
    EpochEnded,
    Evaluation,
    Event,
    EventTail,
    EventWriter,
    RankExited,
    RankFailed,
    RankStalled,
    RankStarted,
    RunStarted,
    event_from_json,
    read_events,
)
from engine.core.runs.rank_states import NOTICES_KEPT, RankStateTracker
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo, find_run


def every_event_class() -> list[type[Event]]:
    """Every concrete event class, found from ``Event``'s subclasses (not from the registry, so an
    event type added but not registered is caught too)."""
    found: list[type[Event]] = []
    todo = list(Event.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("engine."):  # not a stand-in some test defined
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.type)


def sample_event(cls: type[Event]) -> Event:
    """An instance with a distinct, non-default value in every field (a swapped or dropped field
    would not read back equal)."""
    values: dict[str, Any] = {}
    for n, f in enumerate(dataclasses.fields(cls), start=1):
        hint = get_type_hints(cls)[f.name]
        optional = get_origin(hint) in (Union, types.UnionType)
        kind = next(k for k in get_args(hint) if k is not type(None)) if optional else hint
        if kind is bool:
            values[f.name] = True
        elif kind is int:
            values[f.name] = 10 + n
        elif kind is float:
            values[f.name] = n + 0.25
        elif kind is str:
            values[f.name] = f"value {n}"
        elif get_origin(kind) is dict:
            values[f.name] = {"loss": n + 0.5, "accuracy": 0.75}
        elif get_origin(kind) is tuple and get_args(kind)[0] is int:
            values[f.name] = (n, 20 + n)
        else:
            raise AssertionError(f"{cls.__name__}.{f.name}: no sample for {hint}")
    return cls(**values)


def test_every_event_type_round_trips_through_one_json_line() -> None:
    classes = every_event_class()
    assert len(classes) >= 16
    assert {c.type: c for c in classes} == EVENT_TYPES  # every event is registered, once
    for cls in classes:
        event = sample_event(cls)
        line = event.to_json()
        assert "\n" not in line
        data = json.loads(line)
        assert (data["type"], data["v"]) == (cls.type, 1)
        assert event_from_json(line) == event, cls.__name__


def test_the_log_pane_says_one_phrase_for_each_event_that_is_not_progress() -> None:
    # sample_event numbers the fields from 1, ``time`` first: rank 12, pid 13, "value 3", 3.25...
    said = {cls.type: event_notice(sample_event(cls)) for cls in every_event_class()}
    assert said["checkpoint"] == "rank 12 saved value 3"
    assert said["rank_exited"] == "rank 12 (pid 13) exited: signal value 5"
    assert said["rank_stalled"] == "launcher: rank 12 silent for 3 s: value 4"  # its why
    assert said["run_finished"] == "run value 2: value 3"
    assert said["stacks_taken"] == "stacks (value 3): value 5"
    assert said["rank_straggling"] == "launcher: rank 12 straggling (3.25 s a step, others 4.25 s)"
    assert said["node_finished"] == "node value 2: value 3: value 4"
    assert said["restart_scheduled"] == (
        "attempt 12 failed at step 14 (value 3); restart 18 of 19 in 5.25 s, from value 7"
    )
    assert said["run_started"] == "attempt 17 started (value 8), from step 19"  # a later one
    assert event_notice(RunStarted(run_id="r", world_size=2, launcher_pid=1, devices="")) == ""
    assert {t for t, phrase in said.items() if phrase} == {
        "checkpoint", "rank_exited", "rank_stalled", "run_finished", "stacks_taken",
        "rank_straggling", "node_finished", "restart_scheduled", "run_started",
    }  # fmt: skip
    # rank 0's evaluation is the run's; another rank's says nothing new, nor does a clean exit
    assert (
        event_notice(Evaluation(rank=0, epoch=1, accuracy=0.5, loss=1.0, samples=100, seconds=1.0))
        == "epoch 2: test accuracy 50.0% on 100 images"
    )
    assert event_notice(RankExited(rank=1, pid=5, exitcode=0, signal=None)) == ""
    tracker = RankStateTracker()
    for n in range(NOTICES_KEPT + 5):
        tracker.feed(RankStalled(rank=n, silent_seconds=1.0))
    assert len(tracker.notices) == NOTICES_KEPT and tracker.notices[-1].startswith(
        f"launcher: rank {NOTICES_KEPT + 4} "
    )


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


def test_one_rule_says_what_a_run_directory_is_for_listing_finding_and_locating(
    tmp_path: Path,
) -> None:
    """A real directory holding config.toml is a run for ``ddptui runs``, for ``find_run`` and
    for a process's marker alike; a link to one, or a directory with only a run.json, is none."""
    from engine.core.common.run_layout import RunLayout, is_run_dir
    from engine.core.jobs.grouping import locate_run
    from engine.core.procs.run_proof import RunMarker
    from engine.core.runs.rundir import list_runs

    runs = tmp_path / "runs"
    real = runs / "20260101-000000-made-aaaa"
    json_only = runs / "20260101-000000-made-bbbb"
    for path in (real, json_only):
        path.mkdir(parents=True)
    (real / "config.toml").write_text("")
    (json_only / "run.json").write_text("{}")
    (runs / "20260101-000000-made-cccc").symlink_to(real)
    assert [d.run_id for d in list_runs(runs)] == [real.name]
    assert [is_run_dir(p) for p in sorted(runs.iterdir())] == [True, False, False]
    assert find_run(runs, "aaaa").path == real
    for missing in ("bbbb", "cccc"):
        with pytest.raises(RunDirError):
            find_run(runs, missing)
    found, why = locate_run(RunMarker(real.name, str(real)))
    assert found is not None and found.path == real and why == ""
    found, why = locate_run(RunMarker(json_only.name, str(json_only)))
    assert found is None and "holds no run" in why
    # RunDir names its files from the one layout
    run_dir, layout = RunDir(real), RunLayout(real)
    assert (run_dir.config_path, run_dir.run_json_path) == (layout.config, layout.run_json)
    assert run_dir.rank_events_path(3) == real / "events" / "rank-3.jsonl"
    assert run_dir.launcher_log_path == real / "logs" / "launcher.log"


def test_a_runs_first_run_json_is_made_in_one_place() -> None:
    import socket
    import time

    from engine.core.common.statuses import RunStatus

    before = time.time()
    fresh = RunInfo.begun("r-1", "cpu-demo", world_size=2, devices="cpu:2")
    assert (fresh.host, fresh.state, fresh.world_size, fresh.devices) == (
        socket.gethostname(), RunStatus.STARTING, 2, "cpu:2",
    )  # fmt: skip
    assert before <= fresh.created <= time.time() and fresh.launcher is None
    kept = RunInfo.begun("r-1", "cpu-demo", world_size=2, devices="cpu:2", created=12.5,
                         state=RunStatus.RUNNING)  # fmt: skip
    assert (kept.created, kept.state) == (12.5, RunStatus.RUNNING)
