"""Kill and clean act only on what is provably the run's, and processes are classified by what
they are, not by their names (issue 16, findings 1 and 7). Real processes throughout."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from engine.core.backends.local.kill import kill_run
from engine.core.common.statuses import JobKind, JobState, RunStatus
from engine.core.host.gpus import GpuInventory
from engine.core.jobs.clean import plan_clean
from engine.core.jobs.process_table import scan_processes
from engine.core.procs import stopping
from engine.core.procs.stopping import KillRefused
from tests.fixtures.live_runs import ddptui
from tests.fixtures.made_runs import SLEEPER, ProcessPen, make_run, marker_env, ref_of

NO_GPU = GpuInventory(error="NVML: stand-in, no driver")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to make a user)")


@pytest.fixture(autouse=True)
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stopping, "sample_gpus", lambda: NO_GPU)


def give_to(path: Path, user: str) -> None:
    for where in [path, *path.rglob("*")]:
        shutil.chown(where, user=user)


def alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


# ---- finding 1: kill trusts nothing run.json says ------------------------------------------


def test_a_completed_run_naming_an_unrelated_process_leaves_it_alone(
    runs_dir: Path, pen: ProcessPen
) -> None:
    unrelated = pen.python()  # right pid, right start time, no marker
    run_dir = make_run(
        runs_dir, "20260101-000000-made-crafted", launcher=ref_of(unrelated),
        ranks=[ref_of(unrelated)], state=RunStatus.COMPLETED,
    )  # fmt: skip
    done = ddptui("kill", run_dir.run_id, "--grace", "1", "--runs-dir", str(runs_dir))
    assert done.returncode == 0, done.stderr
    assert "already finished (completed); nothing to stop" in done.stdout
    assert f"pid {unrelated.pid} does not carry the run marker" in done.stdout
    assert alive(unrelated)


def test_a_running_runs_unmarked_pid_is_left_alone_and_its_marked_ranks_are_stopped(
    runs_dir: Path, pen: ProcessPen
) -> None:
    marker = marker_env(runs_dir, "r-mixed")
    unrelated = pen.python()
    rank = pen.python(env=marker)
    run_dir = make_run(runs_dir, "r-mixed", launcher=ref_of(unrelated), ranks=[ref_of(rank)])
    result = kill_run(run_dir, grace=1.0)
    assert result.stop is not None and rank.pid in result.stop.stopped
    assert [t.pid for t in result.targets] == [rank.pid]
    assert alive(unrelated)


def test_a_child_without_the_marker_is_not_stopped(runs_dir: Path, pen: ProcessPen) -> None:
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], env={{}})\n"
        "while True: time.sleep(0.1)"
    )
    rank = pen.python(code, env=marker_env(runs_dir, "r-child"))
    parent = psutil.Process(rank.pid)
    assert pen.wait_until(lambda: len(parent.children()) == 1)
    (child,) = parent.children()
    pen.started.append(child)
    run_dir = make_run(runs_dir, "r-child", ranks=[ref_of(rank)])
    result = kill_run(run_dir, grace=1.0)
    assert result.stop is not None and result.stop.stopped == (rank.pid,)
    assert [pid for pid, _ in result.stop.left_alone] == [child.pid]
    assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE


@as_root
def test_another_users_run_directory_is_refused_even_naming_a_root_process(
    runs_dir: Path, pen: ProcessPen, other_user: str
) -> None:
    run_id = "20260101-000000-made-theirs"
    roots = pen.python(env={"DDPTUI_RUN_ID": run_id})  # root's, and even marked
    run_dir = make_run(runs_dir, run_id, launcher=ref_of(roots))
    give_to(run_dir.path, other_user)
    with pytest.raises(KillRefused, match=rf"belongs to user {other_user}.*--all-users"):
        kill_run(run_dir, grace=1.0)
    refused = ddptui("kill", run_id, "--grace", "1", "--runs-dir", str(runs_dir))
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert f"its run directory belongs to user {other_user}" in line
    assert "nothing was stopped" in line
    declined = ddptui(
        "kill", run_id, "--all-users", "--runs-dir", str(runs_dir), stdin="n\n"
    )  # fmt: skip
    assert declined.returncode == 1
    assert f"belongs to user {other_user}. Stop its processes as root?" in declined.stdout
    assert alive(roots)
    confirmed = ddptui(
        "kill", run_id, "--all-users", "--grace", "1", "--runs-dir", str(runs_dir), stdin="y\n"
    )  # fmt: skip
    # root's own process carries the id but not this directory: never the user's run's (#21)
    assert confirmed.returncode == 0, confirmed.stderr
    assert f"pid {roots.pid} carries run {run_id}'s id but no run directory" in confirmed.stdout
    assert alive(roots)


@as_root
def test_clean_leaves_another_users_orphaned_run_alone(
    runs_dir: Path, pen: ProcessPen, other_user: str
) -> None:
    gone = pen.python()
    gone_ref = ref_of(gone)
    gone.kill()
    gone.wait()
    rank = pen.python(env=marker_env(runs_dir, "r-orphan"))
    run_dir = make_run(runs_dir, "r-orphan", launcher=gone_ref, ranks=[ref_of(rank)])
    give_to(run_dir.path, other_user)
    assert pen.wait_until(lambda: "DDPTUI_RUN_ID" in psutil.Process(rank.pid).environ())
    table = scan_processes(gpus=NO_GPU, cpu_interval=0.0)
    job = next(j for j in table.jobs if j.run_id == "r-orphan")
    assert job.state == JobState.ORPHANED
    plan = plan_clean(table)
    assert job.key not in {j.key for j in plan.jobs}
    assert any(f"its run directory belongs to {other_user}" in why for _, why in plan.left_alone)
    assert alive(rank)


# ---- finding 7: by what it is, not by its name --------------------------------------------


def job_of(pid: int):  # type: ignore[no-untyped-def]
    table = scan_processes(gpus=NO_GPU, cpu_interval=0.0)
    return next((j for j in table.jobs if any(p.pid == pid for p in j.processes)), None)


def test_a_program_calling_itself_torchrun_is_no_agent(pen: ProcessPen) -> None:
    fake = subprocess.Popen(["bash", "-c", "exec -a torchrun sleep 600"])
    pen.popens.append(fake)
    pen.started.append(psutil.Process(fake.pid))
    assert pen.wait_until(lambda: psutil.Process(fake.pid).cmdline()[:1] == ["torchrun"])
    python_alias = subprocess.Popen(
        ["bash", "-c", f"exec -a torchrun {sys.executable} -c 'import time; time.sleep(600)'"]
    )
    pen.popens.append(python_alias)
    pen.started.append(psutil.Process(python_alias.pid))
    assert pen.wait_until(lambda: psutil.Process(python_alias.pid).cmdline()[:1] == ["torchrun"])
    assert job_of(fake.pid) is None  # today: "torchrun (no workers yet)", running
    assert job_of(python_alias.pid) is None  # a Python without torch loaded: no agent either


def test_a_stopped_rank_shows_as_stopped_with_the_hint(runs_dir: Path, pen: ProcessPen) -> None:
    marker = marker_env(runs_dir, "r-stop")
    launcher, rank = pen.python(env=marker), pen.python(env=marker)
    make_run(runs_dir, "r-stop", launcher=ref_of(launcher), ranks=[ref_of(rank)], world_size=1)
    rank.send_signal(signal.SIGSTOP)
    try:
        assert pen.wait_until(lambda: psutil.Process(rank.pid).status() == psutil.STATUS_STOPPED)
        table = scan_processes(gpus=NO_GPU, cpu_interval=0.0)
        job = next(j for j in table.jobs if j.run_id == "r-stop")
        assert job.kind == JobKind.DDPTUI and job.state == JobState.STOPPED
        assert f"kill -CONT {rank.pid}" in job.reason
        states = {p.pid: p.state for p in job.processes}
        assert states == {launcher.pid: JobState.RUNNING, rank.pid: JobState.STOPPED}
        shown = ddptui("ps", "--runs-dir", str(runs_dir))
        assert "ddptui run r-stop  [stopped]" in shown.stdout
        assert f"`kill -CONT {rank.pid}` resumes it" in shown.stdout
    finally:
        rank.send_signal(signal.SIGCONT)
