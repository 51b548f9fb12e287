"""Files dead jobs leave: torch shared-memory segments and torchelastic directories, in folders made
here (standing in for /dev/shm and /tmp), judged against real processes: a segment whose maker is
gone is offered, one whose maker lives or that a process has open is not; a torchelastic dir that
a live process refers to is not; another user's is never removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.common.statuses import LeftoverKind
from engine.core.procs.leftovers import plan_leftovers, remove_leftovers
from tests.fixtures.made_runs import ProcessPen, confine_scans


@pytest.fixture(autouse=True)
def only_our_jobs(monkeypatch: pytest.MonkeyPatch, pen: ProcessPen) -> None:
    """`clean` here sees only this test's processes: never another session's run."""
    confine_scans(monkeypatch, pen)


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    return shm, tmp


def test_dead_jobs_files_are_offered_and_live_ones_are_not(
    pen: ProcessPen, folders: tuple[Path, Path]
) -> None:
    shm, tmp = folders
    gone = shm / f"torch_{dead_pid()}_1234_0"
    gone.write_bytes(b"x" * 4096)
    holder = pen.python()  # started before its segment: it made it
    made = shm / f"torch_{holder.pid}_99_0"
    made.write_bytes(b"y")
    opened = shm / f"torch_{dead_pid()}_55_1"
    opened.write_bytes(b"z")
    keeper = pen.python(f"import time\nf = open({str(opened)!r})\nwhile True: time.sleep(0.1)")
    assert pen.wait_until(lambda: any(str(opened) == f.path for f in _open_files(keeper.pid)))
    (shm / "not-torch").write_bytes(b"")
    stale = tmp / "torchelastic_abc123"
    (stale / "none_x" / "attempt_0" / "0").mkdir(parents=True)
    (stale / "none_x" / "attempt_0" / "0" / "error.json").write_text("{}")
    live = tmp / "torchelastic_def456"
    live.mkdir()
    worker = pen.python(env={"TORCHELASTIC_ERROR_FILE": str(live / "r0" / "error.json")})
    assert pen.wait_until(lambda: _env_has(worker.pid, "TORCHELASTIC_ERROR_FILE"))

    plan = plan_leftovers(shm, tmp)
    assert {item.path for item in plan.remove} == {gone, stale}
    kinds = {item.path: item.kind for item in plan.remove}
    assert kinds[gone] == LeftoverKind.SHM_SEGMENT and kinds[stale] == LeftoverKind.ELASTIC_DIR
    alone = {item.path: item.why for item in plan.left_alone}
    assert "still running" in alone[made]
    assert "open or mapped" in alone[opened]
    assert "refers to it" in alone[live]
    assert plan.size_bytes >= 4096

    result = remove_leftovers(plan.remove)
    assert result.ok and {i.path for i in result.removed} == {gone, stale}
    assert not gone.exists() and not stale.exists()
    assert made.exists() and opened.exists() and live.exists()


def test_a_segment_opened_after_the_plan_is_kept(
    pen: ProcessPen, folders: tuple[Path, Path]
) -> None:
    shm, tmp = folders
    segment = shm / f"torch_{dead_pid()}_7_0"
    segment.write_bytes(b"x")
    plan = plan_leftovers(shm, tmp)
    assert [i.path for i in plan.remove] == [segment]
    user = pen.python(f"import time\nf = open({str(segment)!r})\nwhile True: time.sleep(0.1)")
    assert pen.wait_until(lambda: any(str(segment) == f.path for f in _open_files(user.pid)))
    result = remove_leftovers(plan.remove)
    assert [i.path for i in result.kept] == [segment] and segment.exists()


def test_another_users_files_are_left_alone(folders: tuple[Path, Path]) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a file to another user")
    shm, tmp = folders
    theirs = shm / f"torch_{dead_pid()}_3_0"
    theirs.write_bytes(b"x")
    os.chown(theirs, 65534, 65534)
    plan = plan_leftovers(shm, tmp)
    assert plan.remove == ()
    (item,) = plan.left_alone
    assert item.path == theirs and "not this user" in item.why


def test_clean_shows_then_removes_leftovers(folders: tuple[Path, Path]) -> None:
    shm, tmp = folders
    segment = shm / f"torch_{dead_pid()}_8_0"
    segment.write_bytes(b"x" * 100)
    args = ["clean", "--shm-dir", str(shm), "--tmp-dir", str(tmp)]
    shown = CliRunner().invoke(main, [*args, "--dry-run"])
    assert shown.exit_code == 0, shown.output
    assert f"remove {segment}" in shown.stdout and segment.exists()
    declined = CliRunner().invoke(main, args, input="n\n")
    assert declined.exit_code == 1 and "Nothing removed." in declined.stdout
    assert "Remove 1 left-over file(s), 100 bytes?" in declined.stdout and segment.exists()
    done = CliRunner().invoke(main, [*args, "--json"], input="y\n")
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout[done.stdout.index("{") :])
    assert data["leftovers"]["removed"] == [str(segment)]
    assert not segment.exists()


def _open_files(pid: int) -> list[object]:
    import psutil

    try:
        return list(psutil.Process(pid).open_files())
    except psutil.Error:
        return []


def _env_has(pid: int, key: str) -> bool:
    import psutil

    try:
        return key in psutil.Process(pid).environ()
    except psutil.Error:
        return False
