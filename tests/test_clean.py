"""`ddptui clean`: stops orphaned jobs only, after showing them; leaves running jobs, other users'
jobs (unless root asks), this process and its shell alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.common.statuses import JobKind, JobState
from engine.core.host.gpus import GpuInventory
from engine.core.jobs.clean import CleanPlan, clean_orphans, plan_clean
from engine.core.jobs.process_table import (
    ProcessTable,
    TrainingJob,
    TrainingProcess,
    scan_processes,
)
from tests.fixtures.made_runs import ProcessPen, confine_scans, make_run, marker_env, ref_of

KIND_ENV = JobKind.ENV
ORPHANED = JobState.ORPHANED
RUNNING = JobState.RUNNING

# Per test process: another checkout's suite running beside this one makes the same kind of job.
CLEAN_ME = f"clean-me-{os.getpid()}"
ELASTIC = {
    "TORCHELASTIC_RUN_ID": CLEAN_ME,
    "RANK": "0",
    "WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29997",
}


@pytest.fixture(autouse=True)
def only_our_jobs(monkeypatch: pytest.MonkeyPatch, pen: ProcessPen) -> None:
    """`clean` here sees only this test's processes: never another session's run."""
    confine_scans(monkeypatch, pen)


@pytest.fixture(autouse=True)
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.core.host import gpus

    monkeypatch.setattr(gpus, "sample_gpus", lambda: GpuInventory(error="NVML: stand-in"))
    monkeypatch.setattr(
        "engine.core.jobs.process_table.sample_gpus", lambda: GpuInventory(error="NVML: stand-in")
    )
    monkeypatch.setattr(
        "engine.core.procs.stopping.sample_gpus", lambda: GpuInventory(error="NVML: stand-in")
    )


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ready(proc: psutil.Process, key: str) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if key in proc.environ():
                return
        except psutil.Error:
            pass
        time.sleep(0.02)


def fake_job(key: str, state: str, *, user: str = "root", own: bool = True) -> TrainingJob:
    proc = TrainingProcess(
        pid=4_000_000,
        ppid=1,
        start_time=1.0,
        user=user,
        role="rank",
        rank=0,
        local_rank=0,
        world_size=1,
        state=state,
        age_seconds=1.0,
        cpu_percent=None,
        rss_bytes=None,
        gpu=(),
        command="python t.py",
        own=own,
    )
    return TrainingJob(
        key=key, kind=KIND_ENV, label=key, state=state, reason="", users=(user,), processes=(proc,)
    )


def test_the_plan_holds_own_orphaned_jobs_only() -> None:
    table = ProcessTable(
        jobs=(
            fake_job("orphan", ORPHANED),
            fake_job("running", RUNNING),
            fake_job("theirs", ORPHANED, user="alice", own=False),
        ),
        notes=(),
        gpu_error=None,
        scanned_at=0.0,
    )
    plan = plan_clean(table)
    assert [j.key for j in plan.jobs] == ["orphan"]
    assert [(j.key, "add --all-users" in why) for j, why in plan.left_alone] == [("theirs", True)]
    plan = plan_clean(table, all_users=True)  # the tests run as root
    assert [j.key for j in plan.jobs] == ["orphan", "theirs"]


def test_a_job_holding_this_process_is_never_planned() -> None:
    me = psutil.Process()
    job = fake_job("mine", ORPHANED)
    proc = replace(job.processes[0], pid=me.pid, start_time=me.create_time())
    table = ProcessTable(
        jobs=(replace(job, processes=(proc,)),),
        notes=(),
        gpu_error=None,
        scanned_at=0.0,
    )
    plan = plan_clean(table)
    assert plan.jobs == ()
    assert "this ddptui process or its parent" in plan.left_alone[0][1]


def test_clean_stops_orphans_and_leaves_live_jobs_alone(pen: ProcessPen) -> None:
    orphan = pen.orphan(env=ELASTIC)
    live = pen.python(env={**ELASTIC, "TORCHELASTIC_RUN_ID": "live-one"})
    rank_only = pen.python(env={"RANK": "0"})
    ready(orphan, "TORCHELASTIC_RUN_ID")
    ready(psutil.Process(live.pid), "TORCHELASTIC_RUN_ID")
    plan = plan_clean(scan_processes(cpu_interval=0.0))
    assert [j.label for j in plan.jobs] == [f"torchrun job {CLEAN_ME!r} at 127.0.0.1:29997"]
    (cleaned,) = clean_orphans(plan, grace=2.0)
    assert cleaned.stop.ok and cleaned.stop.stopped == (orphan.pid,)
    assert not alive(orphan.pid)
    assert alive(live.pid) and alive(rank_only.pid)


def test_clean_records_our_orphaned_run_as_killed(runs_dir: Path, pen: ProcessPen) -> None:
    launcher = pen.python()
    rank = pen.python(env=marker_env(runs_dir, "r-clean"))
    run_dir = make_run(runs_dir, "r-clean", launcher=ref_of(launcher), ranks=[ref_of(rank)])
    ready(psutil.Process(rank.pid), "DDPTUI_RUN_ID")
    launcher.kill()
    launcher.wait()
    plan = plan_clean(scan_processes(cpu_interval=0.0))
    (job,) = [j for j in plan.jobs if j.run_id == "r-clean"]
    (cleaned,) = clean_orphans(CleanPlan(jobs=(job,), left_alone=()), grace=2.0)
    assert cleaned.stop.stopped == (rank.pid,)
    assert cleaned.summary_written
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "killed"
    assert "ddptui clean" in summary.reason


def test_clean_is_refused_for_a_job_whose_pid_was_reused(pen: ProcessPen) -> None:
    innocent = pen.python()
    job = fake_job("stale", ORPHANED)
    proc = replace(job.processes[0], pid=innocent.pid, start_time=ref_of(innocent).start_time - 50)
    plan = plan_clean(
        ProcessTable(
            jobs=(replace(job, processes=(proc,)),),
            notes=(),
            gpu_error=None,
            scanned_at=0.0,
        )
    )
    (cleaned,) = clean_orphans(plan, grace=0.5)
    assert cleaned.stop.stopped == ()
    assert "now belongs to another process" in cleaned.skipped[0]
    assert alive(innocent.pid)


# ---- the command -----------------------------------------------------------------------------


def cli(
    *args: str, stdin: str | None = None, leftovers: Path | None = None
) -> tuple[int, str, str]:
    """``ddptui ARGS``; ``clean`` looks for left-over files in ``leftovers`` (an empty folder
    unless given), never in this machine's /dev/shm and /tmp."""
    with tempfile.TemporaryDirectory(prefix="ddptui-no-leftovers-") as empty:
        extra: list[str] = []
        if args[0] == "clean":
            folder = leftovers or Path(empty)
            extra = ["--shm-dir", str(folder), "--tmp-dir", str(folder)]
        result = CliRunner().invoke(main, [*args, *extra], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_dry_run_only_shows(pen: ProcessPen) -> None:
    orphan = pen.orphan(env=ELASTIC)
    ready(orphan, "TORCHELASTIC_RUN_ID")
    code, out, _ = cli("clean", "--dry-run")
    assert code == 0
    assert f"stop torchrun job {CLEAN_ME!r} at 127.0.0.1:29997" in out
    assert f"pids {orphan.pid}" in out
    assert alive(orphan.pid)


def test_declining_stops_nothing(pen: ProcessPen) -> None:
    orphan = pen.orphan(env=ELASTIC)
    ready(orphan, "TORCHELASTIC_RUN_ID")
    code, out, _ = cli("clean", stdin="n\n")
    assert code == 1
    assert "Stop 1 processes of 1 orphaned job(s)?" in out
    assert "Nothing stopped." in out
    assert alive(orphan.pid)


def test_ctrl_d_at_the_question_is_a_no(pen: ProcessPen) -> None:
    orphan = pen.orphan(env=ELASTIC)
    ready(orphan, "TORCHELASTIC_RUN_ID")
    code, out, _ = cli("clean", stdin="")  # end of input, as Ctrl-D gives
    assert code == 1
    assert "Nothing stopped." in out and "Aborted" not in out
    assert alive(orphan.pid)


def test_yes_stops_without_asking(pen: ProcessPen) -> None:
    orphan = pen.orphan(env=ELASTIC)
    ready(orphan, "TORCHELASTIC_RUN_ID")
    code, out, _ = cli("clean", "--yes", "--grace", "2")
    assert code == 0, out
    assert "1 ended on SIGTERM, 0 needed SIGKILL; none left" in out
    assert not alive(orphan.pid)


def test_nothing_to_clean(pen: ProcessPen) -> None:
    pen.python(env=ELASTIC)  # alive parent: not orphaned
    code, out, _ = cli("clean", "--yes")
    assert code == 0
    assert "No orphaned jobs to stop." in out


def test_pids_narrow_clean_to_their_jobs(pen: ProcessPen) -> None:
    """`ddptui clean PID`: only the orphaned job holding that pid is stopped."""
    named = pen.orphan(env=ELASTIC)
    other = pen.orphan(env={**ELASTIC, "TORCHELASTIC_RUN_ID": CLEAN_ME + "-other"})
    for proc in (named, other):
        ready(proc, "TORCHELASTIC_RUN_ID")
    shown_all = cli("clean", "--dry-run")[1]
    assert f"pids {named.pid}" in shown_all and f"pids {other.pid}" in shown_all
    code, out, _ = cli("clean", "--yes", "--grace", "2", str(named.pid))
    assert code == 0, out
    assert f"stop torchrun job {CLEAN_ME!r} at 127.0.0.1:29997" in out
    assert f"pids {other.pid}" not in out
    assert "1 ended on SIGTERM, 0 needed SIGKILL; none left" in out
    assert not alive(named.pid)
    assert alive(other.pid)


def test_a_pid_of_a_running_job_is_left_alone_with_the_reason(pen: ProcessPen) -> None:
    running = pen.python(env=ELASTIC)  # its parent (this test) lives: not orphaned
    ready(psutil.Process(running.pid), "TORCHELASTIC_RUN_ID")
    code, out, _ = cli("clean", "--yes", str(running.pid))
    assert code == 0, out
    assert "No orphaned jobs to stop." in out
    assert (
        f"pid {running.pid} is in torchrun job {CLEAN_ME!r} at 127.0.0.1:29997, which is "
        "running: left alone"
    ) in out
    assert alive(running.pid)


def test_a_pid_in_no_training_job_is_bad_input_and_stops_nothing(pen: ProcessPen) -> None:
    orphan = pen.orphan(env=ELASTIC)
    plain = pen.python()
    ready(orphan, "TORCHELASTIC_RUN_ID")
    code, out, err = cli("clean", "--yes", str(orphan.pid), str(plain.pid))
    assert code == 2
    assert err.strip() == (
        f"ddptui: pid {plain.pid} is in no training job ddptui can see (`ddptui ps` lists "
        "them); nothing was stopped"
    )
    assert out == ""
    assert alive(orphan.pid) and alive(plain.pid)


def test_json_plan(pen: ProcessPen) -> None:
    orphan = pen.orphan(env=ELASTIC)
    ready(orphan, "TORCHELASTIC_RUN_ID")
    code, out, _ = cli("clean", "--dry-run", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["dry_run"] and data["stop"] == [f"elastic:{CLEAN_ME}@127.0.0.1:29997"]


def test_stopping_orphans_then_declining_their_files_is_a_clean_that_worked(
    pen: ProcessPen, tmp_path: Path
) -> None:
    """Exit 0: the orphans were stopped; only the left-over files stayed, as asked."""
    orphan = pen.orphan(env=ELASTIC)
    ready(orphan, "TORCHELASTIC_RUN_ID")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    segment = tmp_path / f"torch_{gone.pid}_8_0"
    segment.write_bytes(b"x" * 100)
    code, out, _ = cli("clean", "--grace", "2", stdin="y\nn\n", leftovers=tmp_path)
    assert code == 0, out
    assert "1 ended on SIGTERM, 0 needed SIGKILL; none left" in out
    assert "Nothing removed." in out and segment.exists()
    assert not alive(orphan.pid)
