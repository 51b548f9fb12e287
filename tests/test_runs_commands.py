"""Rank states from event files (the logic `ddptui runs`, `ddptui show` and the UI share), and the
two commands themselves, on hand-made run directories."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.common.statuses import RankStatus, RunStatus
from engine.core.procs.process_identity import ProcessRef
from engine.core.runs.events import (
    EpochStarted,
    Event,
    RankExited,
    RankFailed,
    RankFinished,
    RankStalled,
    RankStarted,
    RunFinished,
    RunStarted,
    StepProgress,
    StopSignalled,
)
from engine.core.runs.observer import RunObserver, observe_run
from engine.core.runs.rank_states import RankStateTracker, Thresholds
from engine.core.runs.summarize import build_summary
from engine.core.runs.summary import Failure
from tests.fixtures.made_runs import ProcessPen, make_run, ref_of
from tests.fixtures.repo import REPO_ROOT
from tests.ui.standins import GPU_RUN, RECORDED

DONE, FAILED, STOPPED = RankStatus.DONE, RankStatus.FAILED, RankStatus.STOPPED
RUNNING, STARTING = RankStatus.RUNNING, RankStatus.STARTING
STALLED, STRAGGLER = RankStatus.STALLED, RankStatus.STRAGGLER
LOST, ORPHANED = RunStatus.LOST, RunStatus.ORPHANED

T0 = 1_000_000.0


def step(rank: int, t: float, *, step_no: int = 3, step_seconds: float = 0.1) -> StepProgress:
    return StepProgress(
        rank=rank,
        epoch=0,
        step=step_no,
        steps=10,
        global_step=step_no,
        loss=2.0 - 0.1 * step_no,
        images_per_s=1000.0,
        step_seconds=step_seconds,
        lr=0.1,
        time=t,
    )


def started(rank: int, t: float = T0) -> RankStarted:
    return RankStarted(rank=rank, world_size=2, pid=100 + rank, host="h", device="cpu", time=t)


def states_by_rank(tracker: RankStateTracker, **kwargs: object) -> dict[int, str]:
    return {s.rank: s.state for s in tracker.states(**kwargs)}  # type: ignore[arg-type]


# ---- the pure fold ---------------------------------------------------------------------------


def test_reporting_ranks_are_running_with_their_latest_figures() -> None:
    tracker = RankStateTracker(world_size=2)
    tracker.feed_all(
        [RunStarted(run_id="r", world_size=2, launcher_pid=1, devices="cpu:2", time=T0)]
    )
    tracker.feed_all([started(0), started(1), EpochStarted(rank=0, epoch=0, steps=10, time=T0 + 1)])
    tracker.feed_all([step(0, T0 + 2, step_no=4), step(1, T0 + 2, step_no=5)])
    states = tracker.states(now=T0 + 3)
    assert [s.state for s in states] == [RUNNING, RUNNING]
    assert (states[0].epoch, states[0].step, states[0].steps, states[0].pid) == (0, 4, 10, 100)
    assert states[1].loss == pytest.approx(1.5)
    assert states[0].images_per_s == 1000.0
    assert states[0].silent_seconds == pytest.approx(1.0)


def test_a_rank_with_no_event_yet_is_starting() -> None:
    tracker = RankStateTracker(world_size=2)
    tracker.feed(started(0))
    assert states_by_rank(tracker, now=T0 + 1) == {0: RUNNING, 1: STARTING}


def test_stalled_when_the_launcher_reported_it_and_the_rank_said_nothing_since() -> None:
    tracker = RankStateTracker(world_size=2, thresholds=Thresholds(stall_seconds=5))
    tracker.feed_all([started(0), started(1), step(0, T0 + 1), step(1, T0 + 1)])
    tracker.feed(RankStalled(rank=0, silent_seconds=5, time=T0 + 6))
    tracker.feed(step(1, T0 + 6))
    stalled = tracker.states(now=T0 + 7)[0]
    assert stalled.state == STALLED
    assert "reported by the launcher" in stalled.reason
    assert stalled.silent_seconds == pytest.approx(6.0)
    # the rank speaks again: the report is stale
    tracker.feed(step(0, T0 + 8))
    assert states_by_rank(tracker, now=T0 + 8.5)[0] == RUNNING


def test_silence_alone_is_left_to_the_launcher_while_it_lives() -> None:
    tracker = RankStateTracker(world_size=1, thresholds=Thresholds(stall_seconds=5))
    tracker.feed_all([started(0), step(0, T0 + 1)])
    assert states_by_rank(tracker, now=T0 + 100, launcher_alive=True) == {0: RUNNING}
    dead = tracker.states(now=T0 + 100, launcher_alive=False)[0]
    assert dead.state == STALLED
    assert "launcher is gone" in dead.reason
    assert states_by_rank(tracker, now=T0 + 3, launcher_alive=False) == {0: RUNNING}


def test_a_rank_far_behind_the_others_median_is_a_straggler() -> None:
    tracker = RankStateTracker(world_size=3, thresholds=Thresholds(straggler_factor=2.0))
    tracker.feed_all(
        [
            step(0, T0, step_seconds=0.1),
            step(1, T0, step_seconds=0.12),
            step(2, T0, step_seconds=0.5),
        ]
    )
    states = tracker.states(now=T0 + 0.5)
    assert [s.state for s in states] == [RUNNING, RUNNING, STRAGGLER]
    assert "0.500 s a step" in states[2].reason


def test_failure_root_cause_stopped_and_done() -> None:
    tracker = RankStateTracker(world_size=3)
    tracker.feed_all([started(0), started(1), started(2)])
    tracker.feed(
        RankFailed(rank=1, error="RuntimeError: boom", traceback="Traceback...", time=T0 + 2)
    )
    tracker.feed(RankExited(rank=1, pid=101, exitcode=1, signal=None, time=T0 + 2.1))
    tracker.feed(RankExited(rank=0, pid=100, exitcode=None, signal="SIGTERM", time=T0 + 2.5))
    tracker.feed(RankFinished(rank=2, time=T0 + 2.6))
    states = tracker.states(now=T0 + 3)
    assert [s.state for s in states] == [STOPPED, FAILED, DONE]
    assert states[1].error == "RuntimeError: boom"
    assert states[1].traceback == "Traceback..."


def test_a_rank_killed_by_a_signal_first_is_the_root_cause() -> None:
    tracker = RankStateTracker(world_size=2)
    tracker.feed(RankExited(rank=1, pid=101, exitcode=None, signal="SIGKILL", time=T0 + 1))
    tracker.feed(RankExited(rank=0, pid=100, exitcode=None, signal="SIGTERM", time=T0 + 2))
    states = tracker.states(now=T0 + 3)
    assert [s.state for s in states] == [STOPPED, FAILED]
    assert "SIGKILL" in states[1].reason
    # ... but in a killed run, every signal-ended rank was simply stopped
    assert states_by_rank(tracker, now=T0 + 3, run_status="killed") == {0: STOPPED, 1: STOPPED}


def test_a_rank_that_died_silently_is_the_root_cause_before_its_peers_errors(
    runs_dir: Path,
) -> None:
    """Rank 1 is SIGKILLed (the OOM killer, say); rank 0 then reports the broken connection and
    the launcher stops it. Every writer and reader names rank 1: the one rule decides it, though
    rank 0's report came before the launcher reaped rank 1."""
    launcher = [
        RunStarted(
            run_id="r-oom",
            world_size=2,
            launcher_pid=1,
            devices="cpu:2",
            stops_recorded=True,
            time=T0,
        ),
        RankExited(rank=1, pid=101, exitcode=None, signal="SIGKILL", time=T0 + 1.05),
        StopSignalled(signal="SIGTERM", ranks=(0,), pids=(100,), time=T0 + 1.1),
        RankExited(rank=0, pid=100, exitcode=1, signal=None, time=T0 + 1.5),
    ]
    peer_error = RankFailed(rank=0, error="Connection closed by peer", traceback="", time=T0 + 1.02)
    tracker = RankStateTracker(world_size=2)
    tracker.feed_all([started(0), started(1), peer_error, *launcher])
    cause = tracker.root_failure()
    assert cause is not None and (cause.rank, cause.signal) == (1, "SIGKILL")
    assert cause.error == "rank 1 exited with SIGKILL without reporting an error"
    states = tracker.states(now=T0 + 2)
    assert [s.state for s in states] == [FAILED, FAILED]  # rank 0 reported its error
    assert "exited first (SIGKILL)" in states[1].reason
    # the summary a settler or torchrun's rank 0 builds from the files, and a reader's view
    run_dir = make_run(
        runs_dir, "r-oom", events={"launcher": launcher, "rank-0": [started(0), peer_error]}
    )
    summary = build_summary(run_dir, RunStatus.FAILED)
    assert summary.failure is not None and summary.failure.rank == 1
    observed = observe_run(run_dir).failure
    assert observed is not None and observed.rank == 1


def test_a_summary_reads_each_event_file_once(
    runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.core.runs import summarize

    launcher: list[Event] = [
        RankExited(rank=1, pid=101, exitcode=None, signal="SIGKILL", time=T0 + 1.05)
    ]
    run_dir = make_run(
        runs_dir,
        "r-reads",
        events={"launcher": launcher, "rank-0": [started(0), step(0, T0 + 1)], "rank-1": []},
    )
    reads: list[Path] = []
    real_read = summarize.read_events

    def counted(path: Path, run_path: Path | None = None) -> list[Event]:
        reads.append(path)
        return real_read(path, run_path)

    monkeypatch.setattr(summarize, "read_events", counted)
    summary = build_summary(run_dir, RunStatus.FAILED)  # failed: the root cause is read too
    assert summary.failure is not None and summary.failure.rank == 1
    assert summary.global_steps == 3
    names = sorted(p.name for p in reads)
    assert names == ["launcher.jsonl", "rank-0.jsonl", "rank-1.jsonl"]


def test_a_rank_the_launcher_stopped_is_neither_root_cause_nor_failed() -> None:
    tracker = RankStateTracker(world_size=2)
    tracker.feed_all([started(0), started(1)])
    tracker.feed(RankFailed(rank=1, error="ValueError: bad", traceback="tb", time=T0 + 2))
    tracker.feed(RankExited(rank=1, pid=101, exitcode=1, signal=None, time=T0 + 2.05))
    tracker.feed(StopSignalled(signal="SIGTERM", ranks=(0,), pids=(100,), time=T0 + 2.1))
    # rank 0 handled SIGTERM and left with code 1: stopped all the same
    tracker.feed(RankExited(rank=0, pid=100, exitcode=1, signal=None, time=T0 + 2.4))
    cause = tracker.root_failure()
    assert cause is not None and (cause.rank, cause.error, cause.exitcode) == (
        1,
        "ValueError: bad",
        1,
    )
    assert states_by_rank(tracker, now=T0 + 3) == {0: STOPPED, 1: FAILED}


def test_ranks_of_an_ended_run_are_never_running() -> None:
    tracker = RankStateTracker(world_size=2)
    tracker.feed_all([started(0), step(0, T0 + 1), RunFinished(status="killed", time=T0 + 2)])
    assert states_by_rank(tracker, now=T0 + 500, launcher_alive=False) == {0: STOPPED, 1: STOPPED}


# ---- reading run directories -----------------------------------------------------------------


def test_run_watch_reads_only_what_was_appended(runs_dir: Path) -> None:
    now = time.time()
    run_dir = make_run(runs_dir, "r1", events={"rank-0": [started(0, now), step(0, now)]})
    clock = [now]
    watch = RunObserver(run_dir, clock=lambda: clock[0])
    first = watch.observe()
    assert first.ranks[0].step == 3
    with open(run_dir.rank_events_path(0), "a", encoding="utf-8") as f:
        f.write(step(0, now + 1, step_no=7).to_json() + "\n")
        f.write('{"v": 1, "type": "st')  # a writer mid-line
    clock[0] = now + 1
    assert watch.observe().ranks[0].step == 7


def test_run_states_from_the_launcher_and_the_summary(runs_dir: Path, pen: ProcessPen) -> None:
    live = pen.python()
    gone = ProcessRef(pid=live.pid, start_time=ref_of(live).start_time - 3600)  # pid reused
    alive_run = make_run(runs_dir, "alive", launcher=ref_of(live))
    orphaned = make_run(runs_dir, "orphaned", launcher=gone, ranks=[ref_of(live)])
    lost = make_run(runs_dir, "lost", launcher=gone)
    done = make_run(runs_dir, "done", launcher=gone, state="completed")
    assert observe_run(alive_run).status == RUNNING
    assert observe_run(alive_run).launcher_alive is True
    assert observe_run(orphaned).status == ORPHANED
    assert observe_run(lost).status == LOST
    assert observe_run(done).status == "completed"


def test_silent_ranks_of_an_orphaned_run_are_stalled(runs_dir: Path, pen: ProcessPen) -> None:
    live = pen.python()
    gone = ProcessRef(pid=live.pid, start_time=1.0)
    old = time.time() - 30
    run_dir = make_run(
        runs_dir,
        "hung",
        launcher=gone,
        ranks=[ref_of(live)],
        stall_seconds=10,
        events={"rank-0": [started(0, old), step(0, old)]},
    )
    progress = observe_run(run_dir)
    assert progress.status == ORPHANED
    assert progress.stalled_ranks == (0,)


def test_ranks_are_numbered_as_the_launcher_recorded_them(runs_dir: Path) -> None:
    """Node 1 of a run whose scheduler put global ranks 5 and 2 on it: nothing derives them."""
    a, b = ProcessRef(4101, 10.0), ProcessRef(4102, 11.0)
    run_dir = make_run(runs_dir, "r-node1")
    info = replace(
        run_dir.read_run_info(), node_rank=1, nnodes=2, ranks=(a, b), global_ranks=(5, 2)
    )
    run_dir.write_run_info(info)
    assert run_dir.read_run_info().ranked() == ((5, a), (2, b))
    assert [r["rank"] for r in json.loads(run_dir.run_json_path.read_text())["ranks"]] == [5, 2]
    # a run.json from before the launcher recorded them reads as those launchers numbered them
    old = json.loads(run_dir.run_json_path.read_text())
    for entry in old["ranks"]:
        del entry["rank"]
    run_dir.run_json_path.write_text(json.dumps(old))
    assert run_dir.read_run_info().ranked() == ((2, a), (3, b))
    assert "rank" not in json.dumps(run_dir.read_run_info().to_json()["ranks"])
    # as many numbers as rank processes, or run.json is corrupt
    old["ranks"][0]["rank"] = 5
    old["ranks"].append({"pid": 4103, "start_time": 12.0, "rank": 7})
    old["ranks"][1]["rank"] = 2
    run_dir.run_json_path.write_text(json.dumps(old))
    assert [r for r, _ in run_dir.read_run_info().ranked()] == [5, 2, 7]
    with pytest.raises(ValueError, match="2 global ranks for 3 rank processes"):
        replace(run_dir.read_run_info(), global_ranks=(5, 2))


# ---- the commands ----------------------------------------------------------------------------


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_runs_lists_state_devices_and_stalled_ranks(runs_dir: Path, pen: ProcessPen) -> None:
    live = pen.python()
    now = time.time()
    make_run(
        runs_dir,
        "20260101-000000-made-aaaa",
        launcher=ref_of(live),
        events={
            "rank-0": [started(0, now - 20), step(0, now - 20)],
            "rank-1": [started(1, now - 20), step(1, now - 1)],
            "launcher": [RankStalled(rank=0, silent_seconds=15, time=now - 2)],
        },
    )
    make_run(runs_dir, "20260101-000001-made-bbbb", state="completed")
    code, out, _ = cli("runs", "--runs-dir", str(runs_dir))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["RUN", "ID", "PRESET"]
    assert "running" in lines[1] and "cpu:2" in lines[1] and "stalled 0" in lines[1]
    assert "completed" in lines[2]
    code, out, _ = cli("runs", "--runs-dir", str(runs_dir), "--json")
    data = json.loads(out)
    assert [r["stalled_ranks"] for r in data] == [[0], []]


def test_runs_with_no_runs_directory_says_so(tmp_path: Path) -> None:
    code, out, _ = cli("runs", "--runs-dir", str(tmp_path / "nothing"))
    assert code == 0
    assert "No runs in" in out and "does not exist" in out


def test_show_prints_ranks_summary_and_the_failure_traceback(runs_dir: Path) -> None:
    now = time.time()
    run_dir = make_run(
        runs_dir,
        "20260101-000000-made-cccc",
        state="failed",
        events={
            "rank-0": [started(0, now), step(0, now + 1)],
            "rank-1": [
                started(1, now),
                RankFailed(
                    rank=1,
                    error="RuntimeError: injected crash",
                    traceback="Traceback (most recent call last):\n  File x\nRuntimeError: injected crash",
                    time=now + 2,
                ),
            ],
            "launcher": [
                RankExited(rank=1, pid=5, exitcode=1, signal=None, time=now + 2),
                RankExited(rank=0, pid=4, exitcode=None, signal="SIGTERM", time=now + 3),
            ],
        },
    )
    failure = Failure(
        rank=1,
        exitcode=1,
        error="RuntimeError: injected crash",
        traceback="Traceback (most recent call last):\n  File x\nRuntimeError: injected crash",
    )
    run_dir.write_summary(build_summary(run_dir, RunStatus.FAILED, failure, "rank 1 failed"))
    code, out, _ = cli("show", "20260101-000000-made-c", "--runs-dir", str(runs_dir))
    assert code == 0, out
    assert "state      failed" in out
    rank_lines = [
        line.split()
        for line in out.splitlines()
        if line.startswith("  ") and line.split()[0] in ("0", "1")
    ]
    assert rank_lines[0][2] == "stopped" and rank_lines[1][2] == "failed"
    assert "failure    rank 1 (exit code 1): RuntimeError: injected crash" in out
    assert "  Traceback (most recent call last):" in out
    code, out, _ = cli("show", "20260101-000000-made-cccc", "--runs-dir", str(runs_dir), "--json")
    data = json.loads(out)
    assert data["ranks"][1]["state"] == "failed"
    assert data["summary"]["failure"]["rank"] == 1


def test_show_refuses_an_unknown_run_in_one_sentence(runs_dir: Path) -> None:
    code, _, err = cli("show", "nosuch", "--runs-dir", str(runs_dir))
    assert code == 2
    assert err.strip() == f"ddptui: no run 'nosuch' in {runs_dir}"


def test_show_names_a_corrupt_run_json(runs_dir: Path) -> None:
    run_dir = make_run(runs_dir, "broken")
    run_dir.run_json_path.write_text("{not json", encoding="utf-8")
    code, out, err = cli("show", "broken", "--runs-dir", str(runs_dir))
    assert code == 2
    assert "run.json is corrupt" in err
    assert "state      unreadable" in out


def test_show_counts_epochs_from_1_as_the_screens_do(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    result = CliRunner().invoke(main, ["show", GPU_RUN, "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    ranks = [line.split() for line in result.stdout.splitlines() if line.startswith("     ")]
    assert [r[:4] for r in ranks[:2]] == [["0", "31010", "done", "2"], ["1", "31011", "done", "2"]]
    epochs = [
        line.split(":")[0].strip() for line in result.stdout.splitlines() if "img/s, loss" in line
    ]
    assert epochs == ["epoch 1", "epoch 2"]


def test_show_json_is_the_listing_json_of_the_run_and_then_its_details(tmp_path: Path) -> None:
    """One JSON shape of a run: ``show --json`` starts with what ``runs --json`` lists of it."""
    runs = tmp_path / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    listed = CliRunner().invoke(main, ["runs", "--runs-dir", str(runs), "--json"])
    shown = CliRunner().invoke(main, ["show", GPU_RUN, "--runs-dir", str(runs), "--json"])
    assert listed.exit_code == 0 and shown.exit_code == 0, listed.output + shown.output
    listing = next(r for r in json.loads(listed.stdout) if r["run_id"] == GPU_RUN)
    state = json.loads(shown.stdout)
    assert list(state)[: len(listing)] == list(listing)
    assert {key: state[key] for key in listing} == listing
    assert state["state"] == "completed" and state["ranks"] and state["summary"] is not None
