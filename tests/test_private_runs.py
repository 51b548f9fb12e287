"""Private by default and loopback only (issue 16, findings 2 and 6): run directories are never
group- or world-writable whatever the umask, logs and checkpoints are their owner's alone, readers
follow no planted link and read no one else's file, and a single-node run listens on loopback
only. Real runs and real files."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from ddptui.watch import RunReader
from engine.core.common.run_files import open_private, write_atomic
from engine.core.runs.events import EventWriter
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir, list_runs
from tests.fixtures.live_runs import QUICK, ddptui, detached_run, run_processes
from tests.fixtures.made_runs import make_run, rank_events
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for

WILDCARDS = ("0.0.0.0", "::", "")


def modes(root: Path) -> dict[Path, int]:
    return {p: stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


@pytest.mark.slow
def test_with_umask_000_nothing_is_group_or_world_writable(tmp_path: Path) -> None:
    runs = tmp_path / "made-by-the-run" / "runs"
    command = [
        sys.executable, "-m", "ddptui", "run", "cpu-demo", *QUICK, "--max-steps", "6",
        "--runs-dir", str(runs),
    ]  # fmt: skip
    done = subprocess.run(
        ["sh", "-c", 'umask 000; exec "$@"', "sh", *command],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = list_runs(runs)
    assert run_dir.checkpoint_path.exists() and run_dir.rank_log_path(1).exists()
    found = modes(tmp_path / "made-by-the-run")
    writable = {str(p): oct(m) for p, m in found.items() if m & 0o022}
    assert writable == {}, "group- or world-writable"
    private = [run_dir.logs_dir, *run_dir.logs_dir.iterdir(), run_dir.checkpoint_path]
    readable = {str(p): oct(found[p]) for p in private if found[p] & 0o077}
    assert readable == {}, "logs and checkpoints readable by others"


def test_the_log_pane_follows_no_planted_link(runs_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret-hash:19000:0:99999:7:::\n")
    run_dir = make_run(runs_dir, "r-link", events={"rank-0": rank_events(0, 3)})
    run_dir.rank_log_path(0).symlink_to(secret)
    view = RunReader(run_dir).poll(log_rank=0)
    assert view is not None
    shown = "\n".join(view.log_lines)
    assert "secret-hash" not in shown
    assert f"{run_dir.rank_log_path(0)} is a symbolic link ({secret}): not followed" in shown


def test_a_linked_logs_directory_is_not_followed_either(runs_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rank-0.log").write_text("not this run's\n")
    run_dir = make_run(runs_dir, "r-dirlink")
    shutil.rmtree(run_dir.logs_dir)
    run_dir.logs_dir.symlink_to(elsewhere)
    view = RunReader(run_dir).poll(log_rank=0)
    assert view is not None
    assert "not this run's" not in "\n".join(view.log_lines)
    assert "is a symbolic link" in view.log_lines[0]


def test_a_linked_event_file_is_skipped_and_named(runs_dir: Path, tmp_path: Path) -> None:
    planted = tmp_path / "planted.jsonl"
    with EventWriter(planted) as writer:
        for event in rank_events(1, 29):
            writer.write(event)
    run_dir = make_run(runs_dir, "r-events", events={"rank-0": rank_events(0, 3)})
    run_dir.rank_events_path(1).symlink_to(planted)
    state = RunObserver(run_dir).observe()
    steps = {r.rank: r.step for r in state.ranks}
    assert steps == {0: 3, 1: None}  # the planted events (step 29) were not read
    assert f"{run_dir.rank_events_path(1)} is a symbolic link" in state.problem


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_file_of_another_user_is_skipped_and_named(runs_dir: Path) -> None:
    run_dir = make_run(
        runs_dir, "r-owner", events={"rank-0": rank_events(0, 3), "rank-1": rank_events(1, 4)}
    )
    shutil.chown(run_dir.rank_events_path(1), user="nobody")
    shutil.chown(run_dir.rank_log_path(0).parent, user="root")
    run_dir.rank_log_path(0).write_text("mine\n")
    shutil.chown(run_dir.rank_log_path(0), user="nobody")
    state = RunObserver(run_dir).observe()
    assert {r.rank: r.step for r in state.ranks} == {0: 3, 1: None}
    assert "rank-1.jsonl belongs to nobody, not to root who owns the run directory" in (
        state.problem
    )
    view = RunReader(run_dir).poll(log_rank=0)
    assert view is not None and "belongs to nobody" in view.log_lines[0]


# ---- loopback only --------------------------------------------------------------------------


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    return [
        (c.pid, c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections("inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    ]


def family(run_dir: RunDir) -> set[int]:
    pids = set()
    for p in run_processes(run_dir):
        pids.add(p.pid)
        try:
            pids.update(c.pid for c in p.children(recursive=True))
        except psutil.Error:
            continue
    return pids


@pytest.mark.slow
def test_a_single_node_run_listens_on_loopback_only(runs_dir: Path, run_reaper: None) -> None:
    run_dir = detached_run(runs_dir, "--max-steps", "100000", "--epochs", "50")
    assert wait_for(lambda: len(run_dir.rank_event_paths()) == 2, timeout=60)
    assert wait_for(lambda: listening(family(run_dir)), timeout=30), "gloo listens on nothing?"
    sockets = listening(family(run_dir))
    beyond = [s for s in sockets if s[1] in WILDCARDS or not s[1].startswith(("127.", "::1"))]
    assert beyond == [], f"listening beyond loopback: {sockets}"
    assert run_dir.rendezvous_path.exists()
    assert stat.S_IMODE(run_dir.rendezvous_path.stat().st_mode) == 0o600
    for p in run_processes(run_dir):
        p.kill()


@pytest.mark.slow
def test_your_own_script_listens_on_loopback_only(runs_dir: Path, run_reaper: None) -> None:
    """The script calls init_process_group() with env://, which under torch alone makes its rank 0
    serve a TCP store on every interface; under ddptui it meets at the run's file store."""
    started = ddptui(
        "run", "tests/fixtures/tutorial_ddp.py", "--devices", "cpu:2", "--runs-dir",
        str(runs_dir), "--detach", "--", "--epochs", "50", "--steps", "100",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_dir = RunDir(runs_dir / started.stdout.strip().splitlines()[-1])
    assert wait_for(lambda: len(run_dir.rank_event_paths()) == 2, timeout=60)
    assert wait_for(lambda: len(listening(family(run_dir))) >= 2, timeout=60), "no gloo sockets?"
    sockets = listening(family(run_dir))
    beyond = [s for s in sockets if s[1] in WILDCARDS or not s[1].startswith(("127.", "::1"))]
    assert beyond == [], f"listening beyond loopback: {sockets}"
    (master_port,) = {
        int(p.environ()["MASTER_PORT"])
        for p in run_processes(run_dir)
        if "MASTER_PORT" in p.environ()
    }  # set, as torchrun does
    assert [s for s in sockets if s[2] == master_port] == [], "a TCP store on MASTER_PORT"
    for p in run_processes(run_dir):
        p.kill()


def test_a_multi_node_store_listens_on_the_given_address_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engine.train.rendezvous import rendezvous_store
    from tests.fixtures.spawning import free_port

    port = free_port()
    monkeypatch.setenv("DDPTUI_RENDEZVOUS", f"tcp://127.0.0.1:{port}")
    store = rendezvous_store(0, 1, timedelta(seconds=10))
    assert store is not None
    store.set("k", "v")
    mine = [s for s in listening({os.getpid()}) if s[2] == port]
    assert mine == [(os.getpid(), "127.0.0.1", port)]
    del store


# ---- the one private-file primitive (engine.core.common.run_files) ------------------------------


def test_open_private_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep")
    planted = tmp_path / "run" / "logs" / "rank-0.log"
    planted.parent.mkdir(parents=True)
    planted.symlink_to(target)
    with pytest.raises(OSError):
        open_private(planted, "append")
    assert target.read_text() == "keep"


def test_open_private_makes_its_parents_and_the_file_private(tmp_path: Path) -> None:
    path = tmp_path / "run" / "stacks" / "pid-1.txt"
    old = os.umask(0)
    try:
        os.close(open_private(path, "exclusive", parents=0o700))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    with pytest.raises(FileExistsError):
        open_private(path, "exclusive")


def test_write_atomic_takes_bytes_and_text_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    write_atomic(tmp_path / "checkpoint.pt", b"\x00\x01", 0o600)
    write_atomic(tmp_path / "config.toml", "a = 1\n")
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"\x00\x01"
    assert (tmp_path / "config.toml").read_text() == "a = 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "config.toml"]
