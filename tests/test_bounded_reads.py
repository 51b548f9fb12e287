"""Reading a run directory is bounded and writes nothing into another user's directory, and no
planted link is followed (issue 21, items 5 and 6). Real files and real `ddptui` commands; the
cross-user cases with a user made for the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.common.statuses import RunStatus
from engine.core.runs.events import EventTail, EventWriter, RankStarted, StepProgress
from engine.core.runs.rundir import RunDir
from tests.fixtures.live_runs import ddptui
from tests.fixtures.made_runs import ProcessPen, make_run, rank_events, ref_of
from tests.fixtures.repo import REPO_ROOT

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to make a user)")


def give_to(path: Path, user: str) -> None:
    for where in [path, *path.rglob("*")]:
        shutil.chown(where, user=user, group=None)


def peak_memory_of(*args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run `ddptui ARGS` and return it with its peak resident memory in bytes."""
    # VmHWM: this very program's peak (ru_maxrss would carry over its parent's, across exec)
    code = (
        "import runpy, sys\n"
        "sys.argv = ['ddptui', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('ddptui', run_name='__main__')\n"
        "finally:\n"
        "    peak = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "    print('PEAK', peak.split()[1], file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    peak = next(
        int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("PEAK")
    )
    return done, peak * 1024


# ---- item 5: every read of a run file is bounded ----------------------------------------------


def test_a_sparse_4_gib_event_file_is_named_not_loaded(runs_dir: Path, pen: ProcessPen) -> None:
    launcher = pen.python()
    run_dir = make_run(runs_dir, "20260101-000000-made-huge", launcher=ref_of(launcher),
                       events={"rank-1": rank_events(1, 3)})  # fmt: skip
    with open(run_dir.rank_events_path(0), "wb") as f:
        f.truncate(4 << 30)  # no disk used
    done, peak = peak_memory_of("runs", "--runs-dir", str(runs_dir))
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())  # the note may wrap to the terminal's width
    assert "rank-0.jsonl is 4.0 GiB, over the 1.0 GiB ddptui reads of an event file" in said
    assert peak < 400 << 20, f"ddptui runs held {peak >> 20} MiB"
    shown = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir), "--json")
    state = json.loads(shown.stdout)
    assert "not loaded" in state["problem"]
    assert [r["step"] for r in state["ranks"] if r["rank"] == 1] == [3]  # the others still read


def test_a_live_event_file_is_followed_past_the_bound_read_a_bit_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.core.runs import events

    path = tmp_path / "rank-0.jsonl"
    tail = EventTail(path)
    with EventWriter(path) as writer:
        writer.write(RankStarted(rank=0, world_size=1, pid=1, host="h", device="cpu"))
        assert len(tail.read_new()) == 1
        monkeypatch.setattr(events, "EVENTS_FILE_MAX_BYTES", path.stat().st_size + 400)
        for step in range(1, 4):  # the file grows past the bound, a step at a time
            progress = StepProgress(
                rank=0, epoch=0, step=step, steps=9, global_step=step, loss=1.0,
                images_per_s=1.0, step_seconds=0.1, lr=0.1,
            )  # fmt: skip
            writer.write(progress)
            assert [e.step for e in tail.read_new()] == [step]  # type: ignore[attr-defined]
    assert path.stat().st_size > events.EVENTS_FILE_MAX_BYTES and not tail.refused


def test_an_overlong_line_is_skipped_and_counted_never_held(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    with EventWriter(path) as writer:
        writer.write(RankStarted(rank=0, world_size=1, pid=1, host="h", device="cpu"))
    with open(path, "ab") as f:
        f.write(b"x" * (3 << 20))  # 3 MiB in one line, across several reads
    tail = EventTail(path)
    assert [e.type for e in tail.read_new()] == ["rank_started"]
    assert len(tail._partial) <= 64 << 10  # what is held of the overlong line
    with open(path, "ab") as f:
        f.write(b"\n")
    with EventWriter(path) as writer:
        writer.write(StepProgress(rank=0, epoch=0, step=1, steps=2, global_step=1, loss=1.0,
                                  images_per_s=1.0, step_seconds=0.1, lr=None))  # fmt: skip
    assert [e.type for e in tail.read_new()] == ["step"]
    assert tail.skipped == 1


def test_an_oversized_run_json_and_config_are_named_not_loaded(runs_dir: Path) -> None:
    run_dir = make_run(runs_dir, "20260101-000000-made-fat", state=RunStatus.RUNNING)
    info = json.loads(run_dir.run_json_path.read_text())
    info["padding"] = "x" * (17 << 20)
    run_dir.run_json_path.write_text(json.dumps(info))
    with open(run_dir.config_path, "a") as f:
        f.write("# " + "y" * (2 << 20) + "\n")
    done = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir))
    assert done.returncode == 2
    assert "run.json is 17 MiB, over the 16 MiB ddptui reads of such a file" in done.stderr
    assert "config.toml is 2 MiB, over the 1 MiB ddptui reads of such a file" in done.stdout


# ---- item 6: readers never write into other users' directories or follow planted links -------


@as_root
def test_root_reading_a_users_lost_run_writes_nothing_there(
    runs_dir: Path, pen: ProcessPen, other_user: str
) -> None:
    dead = pen.python("pass")
    ref = ref_of(dead)
    dead.wait()
    run_dir = make_run(runs_dir, "20260101-000000-made-lost", launcher=ref,
                       events={"rank-0": rank_events(0, 2)})  # fmt: skip
    give_to(runs_dir, other_user)
    before = sorted(p.name for p in run_dir.path.iterdir())
    run_json = run_dir.run_json_path.read_bytes()
    listed = ddptui("runs", "--runs-dir", str(runs_dir))
    shown = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir))
    assert listed.returncode == 0 and shown.returncode == 0, listed.stderr + shown.stderr
    assert "lost" in listed.stdout and "lost" in shown.stdout
    assert sorted(p.name for p in run_dir.path.iterdir()) == before
    assert run_dir.run_json_path.read_bytes() == run_json
    assert f"belongs to {other_user}: only its owner writes there" in listed.stdout


def test_a_run_json_that_is_a_symbolic_link_is_not_followed(runs_dir: Path, tmp_path: Path) -> None:
    elsewhere = make_run(tmp_path / "elsewhere", "20260101-000000-made-target",
                         state=RunStatus.COMPLETED)  # fmt: skip
    run_dir = make_run(runs_dir, "20260101-000000-made-link")
    run_dir.run_json_path.unlink()
    run_dir.run_json_path.symlink_to(elsewhere.run_json_path)
    shown = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir), "--json")
    state = json.loads(shown.stdout)
    assert state["state"] == "unreadable"
    assert f"{run_dir.run_json_path} is a symbolic link" in state["problem"]
    assert state["created"] is None and state["summary"] is None  # nothing of the target read


def test_a_run_directory_that_is_a_symbolic_link_is_no_run(runs_dir: Path, tmp_path: Path) -> None:
    target = make_run(tmp_path / "secret", "20260101-000000-made-secret")
    (runs_dir / "20260101-000000-made-alias").symlink_to(target.path)
    (runs_dir / "root-home").symlink_to("/root")
    listed = ddptui("runs", "--runs-dir", str(runs_dir), "--json")
    assert json.loads(listed.stdout) == []
    shown = ddptui("show", "20260101-000000-made-alias", "--runs-dir", str(runs_dir))
    assert shown.returncode == 2
    assert "is a symbolic link" in shown.stderr and "never followed" in shown.stderr
    assert RunDir(target.path).read_run_info().run_id == "20260101-000000-made-secret"
