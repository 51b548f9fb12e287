"""The readers behind the screens, without the app: what a run directory says, told honestly."""

from __future__ import annotations

import shutil
from pathlib import Path

from ddptui.messages import RunProgressed
from ddptui.watch import RunReader, list_run_listings
from engine.core.runs.rundir import RunDir
from tests.fixtures.repo import REPO_ROOT
from tests.ui.standins import FAILED_RUN, GPU_RUN, LIVE_PIDS, LIVE_RUN, NOW, RECORDED, StandInProbe

RUNS = REPO_ROOT / RECORDED


def reader(run_id: str, probe: StandInProbe | None = None) -> RunReader:
    return RunReader(RunDir(RUNS / run_id), clock=lambda: NOW, probe=probe or StandInProbe())


def test_a_live_run_shows_each_rank_state_and_an_eta() -> None:
    view = reader(LIVE_RUN, StandInProbe(alive=LIVE_PIDS)).poll()
    assert view is not None
    assert view.run.status == "running"
    assert [(r.rank, r.state) for r in view.run.ranks] == [
        (0, "running"),
        (1, "straggler"),
        (2, "stalled"),
        (3, "running"),
    ]
    assert view.run.ranks[2].last_event_time == NOW - 75
    assert view.run.eta is not None and view.run.eta > 0
    assert view.run.elapsed == 95.0
    assert view.run.ranks[0].usage is not None and view.run.ranks[0].usage.cpu_percent == 97.0


def copy_of_recorded(tmp_path: Path) -> Path:
    """The recorded runs in a scratch directory: a reader settles a lost run by writing into it."""
    runs = tmp_path / "runs"
    shutil.copytree(RUNS, runs)
    return runs


def test_a_run_whose_launcher_is_gone_is_settled_as_lost_with_a_summary(tmp_path: Path) -> None:
    runs = copy_of_recorded(tmp_path)
    run_dir = RunDir(runs / LIVE_RUN)
    view = RunReader(run_dir, clock=lambda: NOW, probe=StandInProbe(alive=())).poll()
    assert view is not None
    assert view.run.status == "lost"
    assert "(pid 424242) ended without writing a summary" in view.run.reason
    assert "rank 0 reached epoch 2 step 20/24" in view.run.reason
    assert not any(r.state in ("running", "straggler") for r in view.run.ranks)
    assert view.run.eta is None
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "lost"
    assert summary.failure is not None and summary.failure.rank is None
    assert [r.rank for r in summary.ranks] == [0, 1, 2, 3]
    assert run_dir.read_run_info().state == "lost"


def test_orphaned_ranks_are_said_so() -> None:
    view = reader(LIVE_RUN, StandInProbe(alive=LIVE_PIDS[1:])).poll()
    assert view is not None
    assert view.run.status == "orphaned"
    assert "still alive" in view.run.reason


def test_a_failed_run_names_its_root_cause() -> None:
    view = reader(FAILED_RUN).poll()
    assert view is not None
    assert view.run.status == "failed"
    assert view.run.failure is not None and view.run.failure.rank == 1
    assert "InjectedFault" in view.run.failure.error
    assert view.run.failure.traceback.rstrip().endswith("at step 12")
    assert view.log_rank == 1  # the log shown is the failing rank's
    assert [r.state for r in view.run.ranks] == ["stopped", "failed"]


def test_a_completed_gpu_run() -> None:
    view = reader(GPU_RUN).poll()
    assert view is not None
    assert view.run.status == "completed"
    assert view.run.gpu_indices == (0, 1)
    assert [r.device for r in view.run.ranks] == ["cuda:0", "cuda:1"]
    assert view.run.accuracy == 0.53
    assert view.run.failure is None


def test_reading_is_incremental(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(RUNS, runs)
    r = RunReader(RunDir(runs / LIVE_RUN), clock=lambda: NOW, probe=StandInProbe(LIVE_PIDS))
    first = r.poll()
    assert first is not None
    with open(runs / LIVE_RUN / "events" / "rank-0.jsonl", "a", encoding="utf-8") as f:
        f.write('{"v": 1, "type": "step", "rank": 0, "epoch": 1, "step": 24, "steps": 24, ')
    second = r.poll()  # a torn line is left for later, not misread
    assert second is not None and second.run.events_read == first.run.events_read
    with open(runs / LIVE_RUN / "events" / "rank-0.jsonl", "a", encoding="utf-8") as f:
        f.write(
            '"global_step": 48, "loss": 0.5, "images_per_s": 400.0, "step_seconds": 0.3, '
            f'"lr": 0.05, "time": {NOW}}}\n'
        )
    third = r.poll()
    assert third is not None and third.run.events_read == first.run.events_read + 1
    assert third.run.ranks[0].step == 24


def test_the_runs_list_is_newest_first_with_honest_statuses() -> None:
    listings = list_run_listings(RUNS, clock=lambda: NOW, probe=StandInProbe(LIVE_PIDS))
    assert [(r.run_id, r.status) for r in listings] == [
        (LIVE_RUN, "running"),
        (FAILED_RUN, "failed"),
        (GPU_RUN, "completed"),
    ]


def test_the_runs_list_settles_a_lost_run(tmp_path: Path) -> None:
    runs = copy_of_recorded(tmp_path)
    gone = list_run_listings(runs, clock=lambda: NOW, probe=StandInProbe())
    assert gone[0].status == "lost"
    assert "ended without writing a summary" in gone[0].detail
    assert (runs / LIVE_RUN / "summary.json").exists()


def test_a_newer_snapshot_replaces_a_queued_one_and_counts_it() -> None:
    view = reader(GPU_RUN).poll()
    assert view is not None
    older, newer = RunProgressed(view), RunProgressed(view)
    older.coalesced = 2
    assert older.can_replace(newer)
    assert newer.coalesced == 3
    other = reader(FAILED_RUN).poll()
    assert other is not None
    assert not RunProgressed(view).can_replace(RunProgressed(other))  # another run: kept
