"""One observer decides a run's status: ``ddptui runs``, ``ddptui show`` and the Run screen say the
same thing of the same directory, and reading a run never needs a disk that takes writes."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from ddptui.app import DdptuiApp
from ddptui.cli import main
from ddptui.screens.run import RunScreen
from engine.core.runs import rundir as rundir_module
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir
from engine.core.runs.settle import Settler
from tests.fixtures.made_runs import ProcessPen, fill_disk, make_run, rank_events, ref_of
from tests.fixtures.repo import REPO_ROOT
from tests.ui.standins import LIVE_RUN, RECORDED, settle


def cli_json(*args: str) -> Any:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.asyncio
async def test_a_sigkilled_launchers_run_reads_the_same_everywhere(
    runs_dir: Path, pen: ProcessPen
) -> None:
    launcher = pen.python()
    launcher_ref = ref_of(launcher)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    run_dir = make_run(
        runs_dir, "20260101-000000-made-kill", launcher=launcher_ref,
        events={"rank-0": rank_events(0, 7), "rank-1": rank_events(1, 6)},
    )  # fmt: skip

    app = DdptuiApp(runs_dir, gpu_poll_seconds=3600, list_poll_seconds=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        app.open_run(run_dir)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        await settle(pilot, lambda: screen.view is not None)
        assert screen.view is not None
        on_screen = screen.view.run

    listed = cli_json("runs", "--runs-dir", str(runs_dir), "--json")
    shown = cli_json("show", run_dir.run_id, "--runs-dir", str(runs_dir), "--json")
    assert on_screen.status == listed[0]["state"] == shown["state"] == "lost"
    assert on_screen.reason == listed[0]["reason"] == shown["reason"]
    assert (
        f"the launcher (pid {launcher_ref.pid}) ended without writing a summary"
        in (shown["reason"])
    )
    assert "rank 0 reached epoch 1 step 7/30, rank 1 reached epoch 1 step 6/30" in shown["reason"]
    assert [r["state"] for r in shown["ranks"]] == [r.state for r in on_screen.ranks]


# ---- a disk that takes no more writes ---------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on a disk with no byte left: a real 1 MiB tmpfs filled up when this process
    may mount one (root), else every write of a run file fails with ENOSPC as on a full disk."""
    mount = tmp_path / "full"
    mount.mkdir()
    mounted = os.geteuid() == 0 and (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    if not mounted:

        def no_space(path: Path, data: Any) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        monkeypatch.setattr(rundir_module, "write_json_atomic", no_space)
    try:
        yield mount
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> None:
    """Write until the disk refuses (a tmpfs); nothing to do for the simulated one."""
    if os.path.ismount(directory):
        fill_disk(directory)


def test_runs_and_show_work_on_a_full_disk(full_disk: Path) -> None:
    runs = full_disk / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    fill(full_disk)
    lost = runs / LIVE_RUN  # its launcher is not alive here: a reader settles it as lost
    result = CliRunner().invoke(main, ["runs", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith(LIVE_RUN))
    assert row.split()[2] == "lost", result.stdout  # RUN ID, PRESET, STATE
    assert "the disk is full" in result.stdout and "not saved" in result.stdout
    result = CliRunner().invoke(main, ["show", LIVE_RUN, "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.output
    assert "state      lost" in result.stdout
    assert "summary    lost" in result.stdout  # the summary it built, shown though not saved
    assert "the disk is full" in result.stderr
    assert not (lost / "summary.json").exists()
    assert not list(lost.glob(".*.tmp")), "a refused write leaves no temporary file"


def test_a_reader_that_cannot_write_still_observes_the_run(full_disk: Path) -> None:
    runs = full_disk / "runs"
    shutil.copytree(REPO_ROOT / RECORDED, runs)
    fill(full_disk)
    settler = Settler()  # a reader that asks to write the lost run's summary down
    state = settler.settle(RunObserver(RunDir(runs / LIVE_RUN)).observe())
    assert state.status == "lost"
    assert state.summary is not None and state.summary.status == "lost"
    assert "cannot write" in state.unsaved and "summary.json" in state.unsaved
    assert state.problem == ""
    again = settler.settle(RunObserver(RunDir(runs / LIVE_RUN)).observe())
    assert again.unsaved == state.unsaved  # asked once: a refusing disk is not asked again


def test_the_quit_check_never_writes(runs_dir: Path) -> None:
    from ddptui.watch import run_is_active
    from engine.core.procs.process_identity import ProcessProbe

    gone = make_run(runs_dir, "gone", launcher=None)
    assert not run_is_active(gone, ProcessProbe(), now=psutil.boot_time() + 1e9)
    assert not gone.summary_path.exists()


# ---- observing alone writes nothing ------------------------------------------------------------


WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def seal(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, every attempt to change anything under ``path`` (a file opened to write, one
    made, renamed, removed or changed) is recorded in the list returned and refused as a
    read-only disk refuses it: a root test cannot make a directory it cannot write, so the
    refusal is at the calls themselves."""
    root = os.path.realpath(path)
    attempts: list[str] = []

    def under(path: object) -> bool:
        try:
            return os.path.realpath(os.fspath(path)).startswith(root)  # type: ignore[arg-type]
        except TypeError:  # a file descriptor
            return False

    def refuse(what: str, path: object) -> None:
        attempts.append(f"{what} {path}")
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    real_open, real_os_open = open, os.open

    def guarded_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if any(c in mode for c in "wax+") and under(file):
            refuse(f"open({mode})", file)
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & WRITE_FLAGS and (under(path) or kwargs.get("dir_fd") is not None):
            refuse("os.open", path)
        return real_os_open(path, flags, *args, **kwargs)

    def guard(name: str) -> None:
        real = getattr(os, name)

        def guarded(path: Any, *args: Any, **kwargs: Any) -> Any:
            if under(path):
                refuse(name, path)
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, name, guarded)

    monkeypatch.setattr("builtins.open", guarded_open)
    monkeypatch.setattr("io.open", guarded_open)
    monkeypatch.setattr(os, "open", guarded_os_open)
    for name in ("replace", "rename", "unlink", "remove", "mkdir", "rmdir", "chmod", "utime"):
        guard(name)
    return attempts


def tree(path: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


def test_observing_a_lost_run_writes_nothing(
    runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The observer decides and never writes: it finds these runs lost and builds each one's
    summary (``unsettled``, for a caller that asks to settle it), on a disk that takes no write,
    through every reader that only observes (``observe_run``, a listing that settles nothing,
    the UI's quit check)."""
    from ddptui.watch import run_is_active
    from engine.core.host import oom_evidence
    from engine.core.procs.process_identity import ProcessProbe, ProcessRef
    from engine.core.runs.observer import LAUNCHER_START_GRACE_SECONDS, observe_run
    from engine.core.runs.run_listing import RunCatalog

    monkeypatch.setattr(oom_evidence, "read_kernel_log", lambda: "")
    gone = ProcessRef(pid=999_999, start_time=1.0)
    shutil.copytree(REPO_ROOT / RECORDED / LIVE_RUN, runs_dir / LIVE_RUN)
    lost = make_run(runs_dir, "20260101-000000-made-lost", launcher=gone, ranks=[gone, gone],
                    events={"rank-0": rank_events(0, 5)})  # fmt: skip
    never = make_run(runs_dir, "20260101-000001-made-none", launcher=None)
    before = tree(runs_dir)
    read_only = seal(runs_dir, monkeypatch)
    later = time.time() + LAUNCHER_START_GRACE_SECONDS
    for run_dir in (RunDir(runs_dir / LIVE_RUN), lost, never):
        state = RunObserver(run_dir, clock=lambda: later).observe()
        assert state.status == "lost", run_dir.run_id
        assert state.unsettled is not None and state.summary == state.unsettled
        assert state.unsaved == "" and state.problem == ""
        assert observe_run(run_dir, now=later).status == "lost"
        assert not run_is_active(run_dir, ProcessProbe(), now=later)
    listed = RunCatalog(runs_dir, clock=lambda: later).list()
    assert [r.status for r in listed] == ["lost"] * 3
    assert read_only == []  # not one write was even tried
    monkeypatch.undo()
    assert tree(runs_dir) == before
