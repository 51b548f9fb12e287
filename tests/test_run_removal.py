"""Runs pile up: an ended run is read once (its summary's identity is the cache key, in a process
and across them), ``ddptui runs --state`` filters, and ``ddptui rm`` / ``runs --prune`` remove run
directories, asking first, never a run that is going."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.common.run_environment import RUN_MARKER_ENV
from engine.core.common.statuses import RunStatus
from engine.core.runs.observer import observe_run
from engine.core.runs.run_listing import RunCatalog, RunListing, listing_cache_path
from engine.core.runs.rundir import RunDir, list_runs
from engine.core.runs.settle import settle_observed
from engine.core.runs.summarize import build_summary
from tests.fixtures.made_runs import ProcessPen, make_run, marker_env, ref_of
from tests.fixtures.repo import REPO_ROOT
from tests.ui.standins import FAILED_RUN, GPU_RUN, LIVE_RUN, RECORDED

DAY = 86400.0


def cli(*args: str, input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=input)
    return result.exit_code, result.stdout, result.stderr


def ended(runs_dir: Path, run_id: str, status: RunStatus, age: float = 0.0) -> RunDir:
    """A run that ended ``status``, made ``age`` seconds ago, with its summary."""
    run_dir = make_run(runs_dir, run_id, state=status)
    if age:
        data = json.loads(run_dir.run_json_path.read_text())
        data["created"] = time.time() - age
        run_dir.run_json_path.write_text(json.dumps(data))
    run_dir.write_summary(build_summary(run_dir, status, None, f"it {status}"))
    return run_dir


def going(runs_dir: Path, run_id: str, pen: ProcessPen) -> RunDir:
    """A run whose launcher is alive and carries the run's marker."""
    launcher = pen.python(env={RUN_MARKER_ENV: run_id})
    return make_run(runs_dir, run_id, launcher=ref_of(launcher))


# ---- listing: an ended run is read once ------------------------------------------------------------


def test_an_ended_run_is_listed_as_the_observer_sees_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    for run_dir in list_runs(runs):
        observed = RunListing.of(settle_observed(observe_run(run_dir)))  # as `ddptui runs`
        assert RunListing.ended(run_dir) == observed, run_dir.run_id


def test_an_ended_run_is_read_once_and_again_only_when_its_summary_changes(
    runs_dir: Path, pen: ProcessPen
) -> None:
    first = ended(runs_dir, "20260101-000000-made-aaaa", RunStatus.COMPLETED)
    going(runs_dir, "20260101-000001-made-bbbb", pen)
    catalog = RunCatalog(runs_dir)
    listed = catalog.list()
    assert [(r.run_id[-4:], r.status) for r in listed] == [
        ("aaaa", "completed"),
        ("bbbb", "running"),
    ]
    assert catalog.reads == 2
    catalog.list()
    catalog.list()
    assert catalog.reads == 4  # the going run, at every listing; the ended one, never again
    first.write_summary(build_summary(first, RunStatus.FAILED, None, "rewritten"))
    assert catalog.list()[0].status == "failed" and catalog.reads == 6
    shutil.rmtree(first.path)
    assert [r.run_id[-4:] for r in catalog.list()] == ["bbbb"]


def test_ddptui_runs_keeps_what_it_read_for_the_next_listing(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    for i in range(3):
        ended(runs, f"20260101-00000{i}-made-000{i}", RunStatus.COMPLETED)
    code, out, _ = cli("runs", "--runs-dir", str(runs))
    assert code == 0 and out.count("completed") == 3
    cache = listing_cache_path(runs)
    assert cache.is_file() and oct(cache.stat().st_mode & 0o777) == "0o600"
    again = RunCatalog(runs, cache_file=cache)
    assert [r.status for r in again.list()] == ["completed"] * 3 and again.reads == 0
    cache.write_text("{not json")  # a broken cache costs a read, nothing more
    broken = RunCatalog(runs, cache_file=cache)
    assert len(broken.list()) == 3 and broken.reads == 3


def test_runs_state_lists_only_the_runs_in_that_state(runs_dir: Path) -> None:
    ended(runs_dir, "20260101-000000-made-aaaa", RunStatus.COMPLETED)
    ended(runs_dir, "20260101-000001-made-bbbb", RunStatus.FAILED)
    ended(runs_dir, "20260101-000002-made-cccc", RunStatus.KILLED)
    code, out, _ = cli("runs", "--runs-dir", str(runs_dir), "--state", "failed")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["20260101-000001-made-bbbb"]
    code, out, _ = cli("runs", "--runs-dir", str(runs_dir), "--state", "failed", "--state", "killed", "--json")  # fmt: skip
    assert [r["state"] for r in json.loads(out)] == ["failed", "killed"]
    code, out, _ = cli("runs", "--runs-dir", str(runs_dir), "--state", "lost")
    assert out.strip() == f"No lost runs in {runs_dir}."


# ---- ddptui rm -------------------------------------------------------------------------------------


def test_rm_asks_then_removes_ended_runs_and_never_a_going_one(
    runs_dir: Path, pen: ProcessPen
) -> None:
    done = ended(runs_dir, "20260101-000000-made-aaaa", RunStatus.FAILED)
    live = going(runs_dir, "20260101-000001-made-bbbb", pen)
    code, out, _ = cli("rm", "aaaa", "bbbb", "--runs-dir", str(runs_dir), input="n\n")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("remove 20260101-000000-made-aaaa  (failed, ")
    assert lines[1] == (
        "keep 20260101-000001-made-bbbb: it is running: stop it first (ddptui kill "
        "20260101-000001-made-bbbb)"
    )
    assert lines[2].startswith("Remove 1 run (") and lines[3] == "Nothing removed."
    assert done.path.is_dir() and live.path.is_dir()
    code, out, _ = cli("rm", "aaaa", "bbbb", "--runs-dir", str(runs_dir), "--yes")
    assert code == 1  # the going run stayed
    assert "removed 1" in out.splitlines()
    assert not done.path.exists() and live.path.is_dir()


def test_rm_refuses_an_ended_run_whose_processes_live_on(runs_dir: Path, pen: ProcessPen) -> None:
    """run.json and the summary say completed, but a process carrying its marker runs: going."""
    run_dir = ended(runs_dir, "20260101-000000-made-aaaa", RunStatus.COMPLETED)
    straggler = pen.python(env={RUN_MARKER_ENV: run_dir.run_id})
    assert pen.wait_until(lambda: _carries_marker(straggler.pid, run_dir.run_id))
    code, out, _ = cli("rm", "aaaa", "--runs-dir", str(runs_dir), "--yes")
    assert code == 1
    assert out.splitlines() == [
        f"keep {run_dir.run_id}: processes carrying its run marker are alive (pid "
        f"{straggler.pid}): stop them first (ddptui kill {run_dir.run_id})"
    ]
    assert run_dir.path.is_dir()


def test_rm_is_kept_from_a_run_only_by_its_own_processes_not_a_namesakes(
    runs_dir: Path, tmp_path: Path, pen: ProcessPen
) -> None:
    """A run of the same id in another directory is another run: its processes do not keep
    this one; a process carrying this run's marker (id and directory) does."""
    run_dir = ended(runs_dir, "20260101-000000-made-aaaa", RunStatus.COMPLETED)
    namesake = pen.python(env=marker_env(tmp_path / "elsewhere", run_dir.run_id))
    own = pen.python(env=marker_env(runs_dir, run_dir.run_id))
    for proc in (namesake, own):
        assert pen.wait_until(lambda p=proc: _carries_marker(p.pid, run_dir.run_id))
    code, out, _ = cli("rm", "aaaa", "--runs-dir", str(runs_dir), "--dry-run")
    assert code == 1 and f"(pid {own.pid})" in out and str(namesake.pid) not in out
    own.kill()
    own.wait(timeout=10)
    code, out, _ = cli("rm", "aaaa", "--runs-dir", str(runs_dir), "--yes")
    assert code == 0, out
    assert not run_dir.path.exists()


def test_removal_acts_on_the_callers_plan_and_rechecks_only_what_can_change(
    runs_dir: Path, tmp_path: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """remove_runs does not plan again (no run observed, one process scan for the plan), yet
    a run whose directory became a link or whose marker a process took since is kept."""
    from engine.core.ops import run_removal

    plain, linked, marked = (
        ended(runs_dir, f"20260101-00000{n}-made-aaa{n}", RunStatus.COMPLETED) for n in (1, 2, 3)
    )
    plan = run_removal.plan_removal([plain, linked, marked])
    assert [r.run_id for r in plan.remove] == [plain.run_id, linked.run_id, marked.run_id]
    moved = tmp_path / "moved"
    linked.path.rename(moved)
    linked.path.symlink_to(moved)
    late = pen.python(env=marker_env(runs_dir, marked.run_id))
    assert pen.wait_until(lambda: _carries_marker(late.pid, marked.run_id))
    scans = []
    real_scan = run_removal.live_run_markers

    def counted_scan() -> dict[run_removal.RunMarker, list[int]]:
        scans.append(1)
        return real_scan()

    def no_observing(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("remove_runs observed a run again")

    monkeypatch.setattr(run_removal, "live_run_markers", counted_scan)
    monkeypatch.setattr(run_removal, "observe_run", no_observing)
    result = run_removal.remove_runs(plan)
    assert result.removed == (plain.run_id,) and len(scans) == 1
    assert dict(result.failed) == {
        linked.run_id: "its run directory is a symbolic link; remove the link yourself",
        marked.run_id: f"processes carrying its run marker are alive (pid {late.pid}): stop "
        f"them first (ddptui kill {marked.run_id})",
    }
    assert not plain.path.exists() and moved.is_dir() and marked.path.is_dir()


def test_rm_dry_run_removes_nothing_and_an_unknown_run_is_bad_input(runs_dir: Path) -> None:
    run_dir = ended(runs_dir, "20260101-000000-made-aaaa", RunStatus.COMPLETED)
    code, out, _ = cli("rm", "aaaa", "--runs-dir", str(runs_dir), "--dry-run")
    assert (
        code == 0 and out.startswith("remove 20260101-000000-made-aaaa") and run_dir.path.is_dir()
    )
    code, _, err = cli("rm", "aaaa", "nosuch", "--runs-dir", str(runs_dir), "--yes")
    assert code == 2 and err.strip() == f"ddptui: no run 'nosuch' in {runs_dir}"
    assert run_dir.path.is_dir()


def test_rm_leaves_another_users_run_alone_unless_root_says_all_users(runs_dir: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a run directory to another user")
    run_dir = ended(runs_dir, "20260101-000000-made-aaaa", RunStatus.COMPLETED)
    os.chown(run_dir.path, 65534, 65534)
    code, out, _ = cli("rm", "aaaa", "--runs-dir", str(runs_dir), "--yes")
    assert code == 1
    assert out.strip() == (
        f"keep {run_dir.run_id}: it is nobody's run (as root, --all-users removes it)"
    )
    code, _, _ = cli("rm", "aaaa", "--runs-dir", str(runs_dir), "--yes", "--all-users")
    assert code == 0 and not run_dir.path.exists()


def test_rm_does_not_follow_a_planted_link(runs_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data.txt").write_text("keep me")
    run_dir = ended(runs_dir, "20260101-000000-made-aaaa", RunStatus.COMPLETED)
    (run_dir.path / "logs" / "link").symlink_to(outside)
    code, _, _ = cli("rm", "aaaa", "--runs-dir", str(runs_dir), "--yes")
    assert code == 0 and not run_dir.path.exists()
    assert (outside / "data.txt").read_text() == "keep me"


# ---- ddptui runs --prune ---------------------------------------------------------------------------


def test_prune_by_age_state_and_count_never_a_going_run(runs_dir: Path, pen: ProcessPen) -> None:
    old_ok = ended(runs_dir, "20260101-000000-made-aaaa", RunStatus.COMPLETED, age=10 * DAY)
    old_bad = ended(runs_dir, "20260101-000001-made-bbbb", RunStatus.FAILED, age=9 * DAY)
    new_bad = ended(runs_dir, "20260101-000002-made-cccc", RunStatus.FAILED, age=DAY / 2)
    new_ok = ended(runs_dir, "20260101-000003-made-dddd", RunStatus.COMPLETED)
    live = going(runs_dir, "20260101-000004-made-eeee", pen)

    def would(*options: str) -> list[str]:
        _, out, _ = cli("runs", "--runs-dir", str(runs_dir), "--prune", "--dry-run", *options)
        return [
            line.split()[1].rstrip(":")[-4:]
            for line in out.splitlines()
            if line.split()[0] in ("remove", "keep")
        ]

    assert would("--older-than", "7d") == ["aaaa", "bbbb"]
    assert would("--state", "failed") == ["bbbb", "cccc"]
    assert would("--keep", "1") == ["aaaa", "bbbb", "cccc"]  # the newest ended run stays
    assert would("--state", "failed", "--older-than", "1d") == ["bbbb"]
    assert would("--state", "running") == ["eeee"]  # named, and refused:
    code, out, _ = cli(
        "runs", "--runs-dir", str(runs_dir), "--prune", "--state", "running", "--yes"
    )
    assert code == 1 and out.startswith("keep 20260101-000004-made-eeee: it is running")
    code, out, _ = cli(
        "runs", "--runs-dir", str(runs_dir), "--prune", "--state", "failed", input="y\n"
    )
    assert code == 0 and "removed 2" in out.splitlines()
    assert [p.path.exists() for p in (old_ok, old_bad, new_bad, new_ok, live)] == [
        True, False, False, True, True,
    ]  # fmt: skip


def test_prune_needs_a_criterion_and_its_options_need_prune(runs_dir: Path) -> None:
    code, _, err = cli("runs", "--runs-dir", str(runs_dir), "--prune")
    assert code == 2
    assert err.strip() == "ddptui: say which runs --prune removes: --older-than, --state or --keep"
    code, _, err = cli("runs", "--runs-dir", str(runs_dir), "--keep", "3")
    assert code == 2 and "go with --prune" in err
    code, _, err = cli("runs", "--runs-dir", str(runs_dir), "--prune", "--older-than", "soon")
    assert code == 2 and "'soon' is not a duration such as 90s, 30m, 12h or 7d" in err


def _carries_marker(pid: int, run_id: str) -> bool:
    try:
        return f"{RUN_MARKER_ENV}={run_id}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


assert FAILED_RUN and GPU_RUN and LIVE_RUN  # the recorded runs the first test reads
