"""A run's attempts in one run directory: the attempt that ended moves below attempts/<n>/ with
nothing lost, every reader of the top level then sees the new attempt from its start (the
observer, ``ddptui runs``' cache), summary.json keeps every attempt apart, and the speedup table
counts only the steps of the attempt that completed the run."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from engine.core.bench.result_history import RecordedRun, ResultHistory
from engine.core.bench.speedup_table import RowResult
from engine.core.bench.table_compute import build_speedup_table
from engine.core.bench.table_rows import rebaseline
from engine.core.common.statuses import RankStatus, RunStatus
from engine.core.host.machine_info import MachineInfo
from engine.core.procs.process_identity import ProcessRef
from engine.core.runs.attempts import AttemptTaken, archive_attempt
from engine.core.runs.checkpoint_record import CheckpointRecord, write_checkpoint_record
from engine.core.runs.events import (
    EpochEnded,
    EventWriter,
    RankFailed,
    RestartScheduled,
    RunStarted,
)
from engine.core.runs.observer import RunObserver
from engine.core.runs.resume_point import checkpoint_mismatch, resume_point
from engine.core.runs.run_listing import RunCatalog, listing_cache_path
from engine.core.runs.rundir import RunDir
from engine.core.runs.summarize import build_summary
from engine.core.runs.summary import AttemptStart, EpochFigures, RunSummary
from tests.fixtures.made_runs import ProcessPen, make_run, rank_events, ref_of


def epoch_ended(epoch: int, *, steps: int = 30, first_step: int = 0) -> EpochEnded:
    return EpochEnded(
        rank=0, epoch=epoch, steps=steps, images=steps * 32, seconds=3.0,
        data_wait_seconds=0.1, warmup_steps=5, steady_images_per_s=400.0, train_loss=1.0,
        global_images=steps * 64, global_seconds=3.0, global_data_wait_seconds=0.1,
        global_steady_images_per_s=800.0, global_train_loss=1.0, first_step=first_step,
    )  # fmt: skip


def write_events(run_dir: RunDir, name: str, *events: object) -> None:
    with EventWriter(run_dir.events_dir / f"{name}.jsonl") as writer:
        for e in events:
            writer.write(e)  # type: ignore[arg-type]


def tree(path: Path) -> dict[str, bytes]:
    """Every file below ``path`` with its bytes."""
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def failed_first_attempt(runs_dir: Path) -> RunDir:
    """Attempt 1 of a two-rank run: epoch 1 done, rank 1 failed at step 40 of epoch 2, its
    summary written, its stacks, logs and checkpoint there."""
    run_dir = make_run(
        runs_dir, "20260101-000000-made-att1", state=RunStatus.FAILED,
        events={
            "launcher": [RunStarted(run_id="r", world_size=2, launcher_pid=1, devices="cpu:2")],
            "rank-0": [*rank_events(0, 30), epoch_ended(0)],
            "rank-1": [*rank_events(1, 30), RankFailed(rank=1, error="E: boom", traceback="",
                                                       global_step=40)],
        },
    )  # fmt: skip
    run_dir.write_summary(build_summary(run_dir, RunStatus.FAILED))
    run_dir.stacks_dir.mkdir()
    (run_dir.stacks_dir / "pid-7.txt").write_text("a stack")
    (run_dir.logs_dir / "rank-1.log").write_text("attempt 1's output\n")
    run_dir.checkpoint_path.write_bytes(b"weights")
    record = CheckpointRecord(1, 0, 30, 30, 2, "small_cnn", 7, time.time(), attempt=1)
    write_checkpoint_record(run_dir.path, record)
    return run_dir


def test_the_attempt_that_ended_moves_below_attempts_and_nothing_of_it_is_lost(
    runs_dir: Path,
) -> None:
    run_dir = failed_first_attempt(runs_dir)
    before = tree(run_dir.path)
    archive_attempt(run_dir, 1)
    after = tree(run_dir.path)
    moved = {"events/launcher.jsonl", "events/rank-0.jsonl", "events/rank-1.jsonl",
             "stacks/pid-7.txt", "summary.json"}  # fmt: skip
    for name in moved:
        assert after[f"attempts/1/{name}"] == before[name]
        assert name not in after
    assert after["attempts/1/run.json"] == after["run.json"] == before["run.json"]  # copied
    for kept in ("config.toml", "checkpoint.pt", "checkpoint.json", "logs/rank-1.log"):
        assert after[kept] == before[kept]
    assert run_dir.events_dir.is_dir() and not any(run_dir.events_dir.iterdir())
    # a second ddptui beginning the same next attempt finds the folder made: refused, no change
    with pytest.raises(AttemptTaken, match=r"attempt 2 of run .* was begun by another ddptui"):
        archive_attempt(run_dir, 1)
    assert tree(run_dir.path) == after


def test_a_summary_keeps_every_attempt_apart_and_the_epochs_of_each(runs_dir: Path) -> None:
    run_dir = failed_first_attempt(runs_dir)
    first = run_dir.read_summary()
    assert first is not None and first.attempt == 1
    assert [a.describe() for a in first.attempts] == [
        "attempt 1 failed at step 40: rank 1: E: boom"
    ]
    archive_attempt(run_dir, 1)
    info = run_dir.read_run_info()
    run_dir.write_run_info(replace(info, attempt=2, state=RunStatus.RUNNING))
    resumed = RunStarted(
        run_id="r", world_size=2, launcher_pid=2, devices="cpu:2", attempt=2,
        started_by="restart", resumed_from_step=30, resumed_from_epoch=1,
    )  # fmt: skip
    write_events(run_dir, "launcher", resumed)
    write_events(run_dir, "rank-0", epoch_ended(1), epoch_ended(2))
    summary = build_summary(run_dir, RunStatus.COMPLETED)
    assert [(e.epoch, e.attempt) for e in summary.epochs] == [(0, 1), (1, 2), (2, 2)]
    assert [a.describe() for a in summary.attempts] == [
        "attempt 1 failed at step 40: rank 1: E: boom",
        "attempt 2 resumed from step 30 (restart), completed",
    ]
    assert summary.attempts[1].start == AttemptStart.RESTART
    assert summary.started == first.started  # the run began with its first attempt
    assert (summary.attempt, summary.table_epoch) == (2, summary.epochs[-1])
    # read back as written
    run_dir.write_summary(summary)
    assert run_dir.read_summary() == summary


def test_the_observer_reads_a_new_attempt_from_its_start_and_says_a_restart_is_due(
    runs_dir: Path, pen: ProcessPen
) -> None:
    launcher = pen.python()
    run_dir = failed_first_attempt(runs_dir)
    run_dir.summary_path.unlink()  # attempt 1 just ended; its launcher waits to restart
    run_dir.write_run_info(replace(run_dir.read_run_info(), launcher=ref_of(launcher),
                                   state=RunStatus.RUNNING))  # fmt: skip
    write_events(run_dir, "launcher", RestartScheduled(
        attempt=1, reason="rank 1 failed: E: boom", global_step=40, in_seconds=2.0, from_step=30,
        from_where="step 30 (epoch 2, step 0 of 30)", restart=1, max_restarts=1,
    ))  # fmt: skip
    observer = RunObserver(run_dir)
    waiting = observer.observe()
    assert waiting.status == RunStatus.RUNNING
    assert waiting.reason == (
        "restarting: attempt 1 failed at step 40 (rank 1 failed: E: boom); restart 1 of 1 in "
        "2 s, from step 30 (epoch 2, step 0 of 30)"
    )
    assert {r.rank: r.state for r in waiting.ranks}[1] == RankStatus.FAILED

    archive_attempt(run_dir, 1, summary=build_summary(run_dir, RunStatus.FAILED))
    run_dir.write_run_info(replace(run_dir.read_run_info(), attempt=2))
    write_events(run_dir, "rank-0", *rank_events(0, 3))
    write_events(run_dir, "rank-1", *rank_events(1, 2))
    going = observer.observe()
    assert (going.status, going.reason, going.attempt) == (RunStatus.RUNNING, "", 2)
    assert {r.rank: (r.state, r.step) for r in going.ranks} == {
        0: (RankStatus.RUNNING, 3),
        1: (RankStatus.RUNNING, 2),
    }  # attempt 2's alone: rank 1's failure of attempt 1 is not its state now
    assert [a.describe() for a in going.attempts] == [
        "attempt 1 failed at step 40: rank 1: E: boom"
    ]


def test_the_runs_cache_reads_a_resumed_run_again(runs_dir: Path) -> None:
    run_dir = failed_first_attempt(runs_dir)
    catalog = RunCatalog(runs_dir, cache_file=listing_cache_path(runs_dir))
    assert [(r.status, r.attempt) for r in catalog.list()] == [(RunStatus.FAILED, 1)]
    archive_attempt(run_dir, 1)
    run_dir.write_run_info(replace(run_dir.read_run_info(), attempt=2, state=RunStatus.STARTING,
                                   launcher=None, attempt_started=time.time()))  # fmt: skip
    again = RunCatalog(runs_dir, cache_file=listing_cache_path(runs_dir))  # a later command
    assert [(r.status, r.attempt) for r in again.list()] == [(RunStatus.STARTING, 2)]


def test_the_table_and_the_bench_history_count_only_the_attempt_that_completed_the_run(
    tmp_path: Path,
) -> None:
    def figures(epoch: int, attempt: int, rate: float, first_step: int = 0) -> EpochFigures:
        steps = 40 - first_step
        return EpochFigures(
            epoch=epoch, seconds=5.0, data_wait_seconds=0.1, images=steps * 100, steps=steps,
            warmup_steps=5, steady_images_per_s=rate, steady_epoch_seconds=4000 / rate,
            train_loss=1.0, test_accuracy=0.9, attempt=attempt, first_step=first_step,
        )  # fmt: skip

    base = RunSummary(
        run_id="r", preset="p", status=RunStatus.COMPLETED, strategy="ddp", precision="fp32",
        model="m", dataset="d", devices="cpu:2", device_count=2, world_size=2, global_batch=200,
        started=0.0,
    )  # fmt: skip
    # attempt 1 trained epoch 1 (fast), then failed in epoch 2; attempt 2 went on inside epoch 2
    restarted = replace(
        base, attempt=2,
        epochs=(figures(0, 1, 2000.0), figures(1, 2, 1000.0, first_step=10)),
    )  # fmt: skip
    assert restarted.table_epoch == restarted.epochs[1]
    row = build_speedup_table([RowResult("a", "p", "ddp", "cpu:2", 2, "fp32", 200,
                                         summaries=(restarted,))]).rows[0]  # fmt: skip
    assert row.images_per_s == 1000.0  # attempt 2's pace, not attempt 1's
    assert row.steady_steps == 30 - 5  # the steps attempt 2 took, less its warm-up
    assert row.epoch_images == 4000  # a whole epoch's images
    # the history keeps the summaries: a table rebuilt from them counts the same steps
    table = build_speedup_table([RowResult("a", "p", "ddp", "cpu:2", 2, "fp32", 200,
                                           summaries=(restarted,))], title="t")  # fmt: skip
    with ResultHistory(tmp_path / "results.sqlite3") as history:
        bench = history.record(
            title="t",
            command="ddptui bench",
            machine=MachineInfo(host="h"),
            table=table,
            runs=[RecordedRun("a", 1, "runs/r", restarted)],
        )
        rebuilt = rebaseline(history.get(bench), "a").rows[0]  # fmt: skip
    assert (rebuilt.images_per_s, rebuilt.steady_steps) == (1000.0, 25)
    nothing = replace(base, attempt=2, epochs=(figures(0, 1, 2000.0),))
    failed = build_speedup_table([RowResult("b", "p", "ddp", "cpu:2", 2, "fp32", 200,
                                            summaries=(nothing,))]).rows[0]  # fmt: skip
    assert failed.reason == "its attempt 2, which completed it, trained no epoch"


def test_an_epoch_resumed_inside_reports_a_whole_epochs_seconds(runs_dir: Path) -> None:
    run_dir = make_run(runs_dir, "20260101-000000-made-part", events={
        "rank-0": [epoch_ended(0, steps=20, first_step=10)],
    })  # fmt: skip
    (epoch,) = build_summary(run_dir, RunStatus.COMPLETED).epochs
    assert (epoch.images, epoch.whole_images) == (20 * 64, 30 * 64)
    assert epoch.steady_epoch_seconds == pytest.approx(30 * 64 / 800.0)


def test_where_a_later_attempt_goes_on_from(runs_dir: Path) -> None:
    run_dir = failed_first_attempt(runs_dir)
    config = run_dir.load_config()
    point = resume_point(run_dir, config)
    assert point is not None and (point.path, point.global_step) == (run_dir.checkpoint_path, 30)
    assert (
        checkpoint_mismatch(
            point, replace(config, model=replace(config.model, name="small_cnn")), 2
        )
        == ""
    )
    other = replace(config, model=replace(config.model, name="resnet18"))
    assert checkpoint_mismatch(point, other, 2) == (
        f"{run_dir.checkpoint_path} is a checkpoint of model small_cnn, and the run's config.toml "
        "now trains resnet18"
    )
    assert "taken with 2 rank(s) and the run now has 4" in checkpoint_mismatch(point, config, 4)
    # a script's: the newest file it wrote in checkpoints/, leaving out partial files and links
    script = replace(config, script=replace(config.script, path="train.py"))
    assert resume_point(run_dir, script) is None
    folder = run_dir.layout.script_checkpoints
    folder.mkdir()
    for i, name in enumerate(
        ["step-100.pt", "step-200.pt", ".step-300.pt.tmp", "step-300.pt.part"]
    ):
        (folder / name).write_text(name)
        os.utime(folder / name, (1000 + i, 1000 + i))
    (folder / "latest.pt").symlink_to(folder / "step-100.pt")
    newest = resume_point(run_dir, script)
    assert newest is not None and newest.path == folder / "step-200.pt"
    assert newest.describe() == "its newest checkpoint step-200.pt"


def test_run_json_and_summaries_from_before_attempts_read_as_a_first_attempt(
    runs_dir: Path,
) -> None:
    run_dir = make_run(runs_dir, "20260101-000000-made-old", launcher=ProcessRef(1, 1.0))
    data = run_dir.read_run_info().to_json()
    del data["attempt"]
    assert type(run_dir.read_run_info()).from_json(data).attempt == 1
    summary = build_summary(run_dir, RunStatus.FAILED).to_json()
    for key in ("attempt", "attempts"):
        del summary[key]
    for epoch in summary["epochs"]:
        del epoch["attempt"], epoch["first_step"]
    old = RunSummary.from_json(summary)
    assert (old.attempt, old.attempts) == (1, ())
