"""Every signal ddptui sends to a run goes to processes proved to be the run's, and a run is the run
its processes say they are (issue 21, items 1 to 3). Real processes and real run directories;
the cross-user cases with a user made for the test."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import psutil
import pytest

from engine.core.common.statuses import RunStatus
from tests.fixtures.live_runs import ScriptRuns, ddptui
from tests.fixtures.made_runs import ProcessPen, make_run, marker_env, ref_of
from tests.fixtures.waiting import wait_for

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to make a user)")


def give_to(path: Path, user: str) -> None:
    for where in [path, *path.rglob("*")]:
        shutil.chown(where, user=user)


def ps_job(run_id: str) -> dict | None:  # type: ignore[type-arg]
    listed = ddptui("ps", "--json")
    assert listed.returncode == 0, listed.stderr
    return next((j for j in json.loads(listed.stdout)["jobs"] if j["run_id"] == run_id), None)


# ---- item 1: a run is found from its processes, wherever its directory lies -------------------


@pytest.mark.slow
def test_a_script_run_in_another_runs_directory_is_running_and_orphaned_only_on_proof(
    tmp_path: Path, script_runs: ScriptRuns
) -> None:
    elsewhere = tmp_path / "other-runs"
    ready = tmp_path / "ready"
    ready.mkdir()
    run_dir = script_runs.start(
        elsewhere, "--seconds", "60", "--daemon", "--daemon-seconds", "60", "--ready", str(ready)
    )
    assert wait_for(lambda: (ready / "daemon").exists() and (ready / "rank-1").exists(), 30)
    info = run_dir.read_run_info()
    assert info.launcher is not None
    job = ps_job(run_dir.run_id)  # from the repository, whose runs directory is not that one
    assert job is not None
    assert job["state"] == "running", job["reason"]
    assert job["reason"] == f"its launcher (pid {info.launcher.pid}) is running"
    assert job["run_dir"] == str(run_dir.path)
    planned = ddptui("clean", "--dry-run")
    assert run_dir.run_id not in planned.stdout, planned.stdout
    # the launcher dies (its ranks with it): what is left is orphaned, by proof
    os.kill(info.launcher.pid, signal.SIGKILL)
    daemon = int((ready / "daemon").read_text())
    assert wait_for(lambda: not psutil.pid_exists(info.ranks[0].pid), 10)
    job = ps_job(run_dir.run_id)
    assert job is not None and [p["pid"] for p in job["processes"]] == [daemon]
    assert job["state"] == "orphaned"
    assert job["reason"] == f"its launcher (pid {info.launcher.pid}, from run.json) is gone"
    planned = ddptui("clean", "--dry-run")
    assert f"stop ddptui run {run_dir.run_id}:" in planned.stdout


# ---- item 2: a file never makes ddptui signal a process ----------------------------------------


@as_root
def test_stacks_of_a_crafted_run_never_signal_or_read_a_process_it_names(
    tmp_path: Path, pen: ProcessPen, other_user: str
) -> None:
    """A user's run.json names root's process (pid and start time are public) and plants the
    empty faulthandler file that makes ddptui send SIGUSR2, whose default action kills."""
    victim = pen.python()
    runs = tmp_path / "theirs"
    run_dir = make_run(runs, "20260101-000000-made-bait", launcher=ref_of(victim),
                       ranks=[ref_of(victim), ref_of(victim)])  # fmt: skip
    run_dir.stacks_dir.mkdir()
    (run_dir.stacks_dir / f"pid-{victim.pid}.txt").touch()
    give_to(runs, other_user)
    shown = ddptui("stacks", run_dir.run_id, "--runs-dir", str(runs), "--json")
    assert victim.poll() is None, "root's process was signalled"
    assert shown.returncode == 1, shown.stdout
    assert "none of its ranks is provably the run's" in shown.stderr
    assert f"pid {victim.pid} does not carry the run marker" in shown.stderr
    assert not list(run_dir.stacks_dir.glob("*.json")), "root wrote into the user's directory"


@as_root
def test_stacks_of_a_run_go_only_to_its_owners_marked_processes(
    runs_dir: Path, pen: ProcessPen
) -> None:
    """Root's own run whose run.json names a process of another user carrying the run's marker:
    that process is not the run's (anyone can start a process with any environment)."""
    from tests.fixtures.made_runs import start_as_user

    run_id = "20260101-000000-made-mixed"
    marker = marker_env(runs_dir, run_id)
    mine = pen.python(env=marker)
    theirs = start_as_user(pen, env=marker)
    assert pen.wait_until(lambda: psutil.Process(theirs.pid).username() == "nobody")
    run_dir = make_run(runs_dir, run_id, launcher=ref_of(mine),
                       ranks=[ref_of(mine), ref_of(theirs)])  # fmt: skip
    shown = ddptui("stacks", run_id, "--runs-dir", str(runs_dir), "--json")
    data = json.loads(shown.stdout)
    by_rank = {r["rank"]: r for r in data["ranks"]}
    assert by_rank[1]["method"] == "" and theirs.poll() is None
    assert f"pid {theirs.pid} belongs to nobody, not to root" in by_rank[1]["problem"]
    assert by_rank[0]["state"] not in ("gone", "not provably the run's"), by_rank[0]
    assert mine.poll() is None and run_dir.run_id == data["run_id"]


# ---- item 3: processes are matched to a run by the directory they carry ------------------------


@as_root
def test_kill_of_a_crafted_run_of_the_same_id_never_reaches_roots_run(
    tmp_path: Path, pen: ProcessPen, other_user: str
) -> None:
    run_id = "20260101-000000-made-twin"
    mine = tmp_path / "root-runs"
    launcher = pen.python(env={"DDPTUI_RUN_ID": run_id})  # a launcher of today: id only
    rank = pen.python(env=marker_env(mine, run_id))
    make_run(mine, run_id, launcher=ref_of(launcher), ranks=[ref_of(rank)])
    theirs = tmp_path / "user-runs"
    crafted = make_run(theirs, run_id, launcher=ref_of(launcher), ranks=[ref_of(rank)])
    give_to(theirs, other_user)
    done = ddptui("kill", run_id, "--all-users", "--yes", "--grace", "1",
                  "--runs-dir", str(theirs))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert launcher.poll() is None and rank.poll() is None
    assert f"pid {rank.pid} carries run {run_id}'s id but {mine / run_id}" in done.stdout
    assert not crafted.summary_path.exists(), "root wrote into the user's directory"


@as_root
def test_clean_all_users_never_plans_roots_live_run_from_a_crafted_directory(
    tmp_path: Path, pen: ProcessPen, other_user: str
) -> None:
    run_id = "20260101-000000-made-bait2"
    mine = tmp_path / "root-runs"
    launcher = pen.python(env={"DDPTUI_RUN_ID": run_id})
    rank = pen.python(env=marker_env(mine, run_id))
    make_run(mine, run_id, launcher=ref_of(launcher), ranks=[ref_of(rank)])
    dead = pen.python("pass")
    dead_ref = ref_of(dead)
    dead.wait()
    theirs = tmp_path / "user-runs"
    make_run(theirs, run_id, launcher=dead_ref, ranks=[ref_of(rank)], state=RunStatus.RUNNING)
    give_to(theirs, other_user)
    planned = ddptui("clean", "--dry-run", "--all-users", "--runs-dir", str(theirs))
    assert planned.returncode == 0, planned.stderr
    assert f"ddptui run {run_id}" not in planned.stdout
    job = ps_job(run_id)
    assert job is not None and job["state"] == "running"
    assert job["run_dir"] == str(mine / run_id)
