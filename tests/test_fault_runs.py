"""The process-control acceptance tests of issue 3, with real processes end to end:

1. a crash on rank 1 at step 3 of a 2-rank run ends the run non-zero within 30 s, the summary names
   rank 1 with its traceback, no process is left;
2. a hang on rank 0 is reported stalled within the configured time, and `ddptui kill` ends
   everything within the grace period plus 5 s;
3. a launcher killed with SIGKILL: the ranks exit by themselves, or `ddptui ps` shows them orphaned
   and `ddptui clean --yes` ends them; nothing is left;
4. a foreign plain-PyTorch DDP job under `torchrun` whose agent was killed: `ddptui ps` shows its
   workers orphaned, `ddptui clean --yes` ends them, and a `python` that merely has RANK in its
   environment and a live parent is left alone;
5. a run.json pointing to a pid now used by another process does not kill it;
6. bad input (unknown run id, corrupt run.json, another user's pid): one clear sentence, non-zero
   exit, nothing killed.

Every process is ended by a fixture (conftest's ``run_reaper`` and ``pen``) even when a test
fails, and conftest's ``process_reaper`` checks that.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engine.core.common.statuses import JobState, RankStatus
from engine.core.jobs.process_table import scan_processes
from engine.core.procs.process_identity import ProcessRef, ref_alive
from engine.core.runs.observer import observe_run
from engine.core.runs.rundir import RunDir, list_runs
from tests.fixtures.live_runs import QUICK, ddptui, detached_run, run_processes
from tests.fixtures.made_runs import ProcessPen, make_run, marker_env, ref_of, start_as_user
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for

ORPHANED, STALLED = JobState.ORPHANED, RankStatus.STALLED
TORCHRUN = Path(sys.executable).parent / "torchrun"
PLAIN_DDP = REPO_ROOT / "tests" / "fixtures" / "plain_ddp_sleep.py"


def first_steps_reported(run_dir: RunDir) -> bool:
    progress = observe_run(run_dir)
    return all(r.step is not None for r in progress.ranks) and len(progress.ranks) == 2


def hung_after_a_step(run_dir: RunDir) -> bool:
    rank0 = observe_run(run_dir).ranks[0]
    return rank0.state == STALLED and rank0.global_step is not None


# ---- 1. a crash -----------------------------------------------------------------------------


@pytest.mark.slow
def test_1_a_crash_on_rank_1_fails_the_run_and_names_its_traceback(
    runs_dir: Path, run_reaper: None
) -> None:
    started = time.monotonic()
    result = ddptui(
        "run", "cpu-demo", *QUICK, "--max-steps", "50", "--fault", "crash:1:3",
        "--runs-dir", str(runs_dir),
        timeout=60,
    )  # fmt: skip
    took = time.monotonic() - started
    assert result.returncode != 0, result.stdout
    (run_dir,) = list_runs(runs_dir)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "failed"
    # Bounded from the crash on: the other rank is stopped within failure_grace_seconds (5 s).
    # The whole command, start-up included, within 30 s on an idle machine; the slack is for
    # two cores shared with other tests.
    crashed = min(
        e["time"]
        for e in map(json.loads, run_dir.rank_events_path(1).read_text().splitlines())
        if e["type"] == "rank_failed"
    )
    assert summary.finished - crashed < 15, "the run took too long to end after the crash"
    assert took < 45, f"the failed run took {took:.1f} s to end"
    assert summary.failure.rank == 1
    assert "injected crash at step 3" in summary.failure.error
    assert "Traceback (most recent call last)" in summary.failure.traceback
    assert run_processes(run_dir) == []
    # `ddptui show` tells the same story
    shown = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir))
    assert shown.returncode == 0, shown.stderr
    assert "failure    rank 1" in shown.stdout
    assert "injected crash at step 3" in shown.stdout


# ---- 2. a hang ------------------------------------------------------------------------------


@pytest.mark.slow
def test_2_a_hung_rank_is_reported_stalled_and_kill_ends_everything(
    runs_dir: Path, run_reaper: None
) -> None:
    stall = 3.0
    run_dir = detached_run(
        runs_dir, "--max-steps", "10000", "--fault", "hang:0:3",
        "--set", "training.report_interval=0", "--set", f"supervision.stall_seconds={stall}",
    )  # fmt: skip
    # rank 0 hangs at step 3 (every step is reported): from its last report, stalled must show
    # within stall_seconds, plus the launcher's poll and a loaded machine's slack
    # (the launcher may also call a rank slow to start stalled: only a stall after a step counts)
    assert wait_for(lambda: hung_after_a_step(run_dir), timeout=40)
    rank0 = observe_run(run_dir).ranks[0]
    assert rank0.state == STALLED and rank0.last_event_time is not None
    reported = [
        e["time"]
        for e in map(json.loads, run_dir.launcher_events_path.read_text().splitlines())
        if e["type"] == "rank_stalled" and e["rank"] == 0 and e["time"] > rank0.last_event_time
    ]
    assert reported and min(reported) - rank0.last_event_time <= stall + 2.0
    listed = ddptui("runs", "--runs-dir", str(runs_dir))
    assert "stalled 0" in listed.stdout
    shown = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir))
    assert "stalled" in shown.stdout

    grace = 3.0
    processes = run_processes(run_dir)
    assert len(processes) >= 3  # launcher + two ranks
    started = time.monotonic()
    killed = ddptui("kill", run_dir.run_id, "--grace", str(grace), "--runs-dir", str(runs_dir))
    took = time.monotonic() - started
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "none left" in killed.stdout
    assert took <= grace + 5.0, f"kill took {took:.1f} s"
    assert not any(p.is_running() and p.status() != "zombie" for p in processes)
    assert run_processes(run_dir) == []
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "killed"


# ---- 3. a killed launcher -------------------------------------------------------------------


@pytest.mark.slow
def test_3_ranks_of_a_sigkilled_launcher_end_or_are_cleaned(
    runs_dir: Path, run_reaper: None
) -> None:
    run_dir = detached_run(runs_dir, "--max-steps", "10000")
    assert wait_for(lambda: first_steps_reported(run_dir), timeout=30)
    info = run_dir.read_run_info()
    assert info.launcher is not None
    ranks = [psutil.Process(r.pid) for r in info.ranks]
    os.kill(info.launcher.pid, signal.SIGKILL)
    assert wait_for(lambda: not ref_alive(info.launcher), timeout=5)  # type: ignore[arg-type]
    # whatever is still there right after the kill is shown as orphaned
    table = scan_processes(cpu_interval=0.0)
    for job in table.jobs:
        if job.run_id == run_dir.run_id and job.live_processes:
            assert job.state == ORPHANED, job.reason
    # the rank watchdog ends the ranks by themselves; if it does not, clean must
    if not wait_for(lambda: run_processes(run_dir) == [], timeout=15):
        ps = ddptui("ps", "--json", "--runs-dir", str(runs_dir))
        jobs = [j for j in json.loads(ps.stdout)["jobs"] if j["run_id"] == run_dir.run_id]
        assert jobs and jobs[0]["state"] == ORPHANED
        # only this run's job: another suite's processes on this machine are not ours to stop
        pids = [str(p["pid"]) for p in jobs[0]["processes"]]
        cleaned = ddptui("clean", "--yes", *pids)
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert run_processes(run_dir) == []
    assert not any(p.is_running() and p.status() != "zombie" for p in ranks)
    assert observe_run(run_dir).status in ("lost", "killed")


# ---- 4. a foreign torchrun job --------------------------------------------------------------


@pytest.fixture
def torchrun_job(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    ready = tmp_path / "ready"
    ready.mkdir()
    agent = subprocess.Popen(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(PLAIN_DDP)],
        # TMPDIR: the torchelastic_* directory a killed agent leaves goes with tmp_path
        env={
            **os.environ,
            "READY_DIR": str(ready),
            "OMP_NUM_THREADS": "1",
            "TMPDIR": str(tmp_path),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    workers: list[psutil.Process] = []
    try:
        yield agent, ready
    finally:
        for path in ready.glob("rank-*"):
            with contextlib.suppress(psutil.Error, ValueError):
                workers.append(psutil.Process(int(path.read_text())))
        for proc in [*workers]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if agent.poll() is None:
            agent.kill()
        agent.wait(timeout=10)
        psutil.wait_procs(workers, timeout=5)


@pytest.mark.slow
def test_4_workers_of_a_killed_torchrun_agent_are_orphaned_and_cleaned(
    torchrun_job: tuple[subprocess.Popen[bytes], Path], pen: ProcessPen
) -> None:
    agent, ready = torchrun_job
    assert wait_for(lambda: len(list(ready.glob("rank-*"))) == 2, timeout=40), "ranks not up"
    workers = sorted(int(p.read_text()) for p in ready.glob("rank-*"))
    bystander = pen.python(env={"RANK": "0"})  # merely has RANK, and a live parent
    listed = json.loads(ddptui("ps", "--json").stdout)
    (job,) = [j for j in listed["jobs"] if {p["pid"] for p in j["processes"]} >= set(workers)]
    assert job["kind"] == "torchelastic" and job["state"] == "running"
    assert agent.pid in {p["pid"] for p in job["processes"]}

    agent.send_signal(signal.SIGKILL)
    agent.wait(timeout=10)
    listed = json.loads(ddptui("ps", "--json").stdout)
    (job,) = [j for j in listed["jobs"] if {p["pid"] for p in j["processes"]} & set(workers)]
    assert job["state"] == "orphaned"
    assert sorted(p["pid"] for p in job["processes"]) == workers
    assert {p["state"] for p in job["processes"]} == {"orphaned"}
    assert {p["rank"] for p in job["processes"]} == {0, 1}
    assert not any(bystander.pid == p["pid"] for j in listed["jobs"] for p in j["processes"])

    cleaned = ddptui("clean", "--yes", "--grace", "3", *map(str, workers))
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in workers
    )
    assert bystander.poll() is None, "the bystander with RANK in its environment was hit"


# ---- 5. pid reuse ---------------------------------------------------------------------------


def test_5_a_run_json_naming_a_reused_pid_does_not_kill_it(runs_dir: Path, pen: ProcessPen) -> None:
    innocent = pen.python()
    ref = ref_of(innocent)
    # the run's launcher and rank had these pids once; the kernel has since given them away
    make_run(
        runs_dir,
        "20260101-000000-made-reuse",
        launcher=ProcessRef(ref.pid, ref.start_time - 3600),
        ranks=[ProcessRef(ref.pid, ref.start_time - 3599)],
    )
    result = ddptui(
        "kill", "20260101-000000-made-reuse", "--grace", "1", "--runs-dir", str(runs_dir)
    )
    assert result.returncode == 0, result.stderr
    assert "now belongs to another process" in result.stdout
    assert innocent.poll() is None
    assert abs(psutil.Process(innocent.pid).create_time() - ref.start_time) < 0.01


# ---- 6. bad input ---------------------------------------------------------------------------


def test_6_an_unknown_run_id_is_one_sentence_and_exit_2(runs_dir: Path) -> None:
    result = ddptui("kill", "nosuch", "--runs-dir", str(runs_dir))
    assert result.returncode == 2
    assert result.stderr.strip() == f"ddptui: no run 'nosuch' in {runs_dir}"
    assert result.stdout == ""


def test_6_a_corrupt_run_json_is_one_sentence_and_nothing_is_killed(
    runs_dir: Path, pen: ProcessPen
) -> None:
    rank = pen.python(env=marker_env(runs_dir, "20260101-000000-made-corrupt"))
    run_dir = make_run(runs_dir, "20260101-000000-made-corrupt", ranks=[ref_of(rank)])
    run_dir.run_json_path.write_text("{ this is not json", encoding="utf-8")
    result = ddptui("kill", "20260101-000000-made-corrupt", "--runs-dir", str(runs_dir))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "run.json is corrupt" in lines[0]
    assert rank.poll() is None


def test_6_another_users_pid_is_left_alone_unless_root_asks_for_all_users(
    runs_dir: Path, pen: ProcessPen
) -> None:
    """A process of another user than the run directory's owner is not the run's, whatever it
    carries (anyone can start a process with any environment): left alone, with the reason."""
    marker = marker_env(runs_dir, "20260101-000000-made-theirs")
    other = start_as_user(pen, "nobody", env=marker)
    mine = pen.python(env=marker)
    assert pen.wait_until(lambda: psutil.Process(other.pid).username() == "nobody")
    make_run(runs_dir, "20260101-000000-made-theirs", launcher=ref_of(other), ranks=[ref_of(mine)])
    result = ddptui(
        "kill", "20260101-000000-made-theirs", "--grace", "1", "--runs-dir", str(runs_dir)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"pid {other.pid} belongs to nobody, not to root who owns the run directory" in (
        result.stdout
    )
    assert pen.wait_until(lambda: mine.poll() is not None)
    assert other.poll() is None
    # root may, when it asks for it
    result = ddptui(
        "kill", "20260101-000000-made-theirs", "--grace", "1", "--all-users",
        "--runs-dir", str(runs_dir),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert pen.wait_until(lambda: other.poll() is not None)
