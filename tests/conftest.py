"""Shared fixtures. Every test that starts processes ends them here, even when it fails."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers run with COLUMNS=80 and LINES=24 of their own; the commands the tests
    # start would fit their output to that. A test that wants a width sets COLUMNS itself.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


def _marked_processes(marker_prefix: str) -> list[psutil.Process]:
    """Processes whose environment carries a DDPTUI_RUN_ID / DDPTUI_TEST_ID under this test."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("DDPTUI_TEST_ID", "").startswith(marker_prefix):
            found.append(proc)
    return found


def _end(processes: list[psutil.Process], grace: float = 3.0) -> None:
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace)


@pytest.fixture(autouse=True)
def process_reaper(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Marks every process a test starts (``DDPTUI_TEST_ID`` is inherited through the environment)
    and ends the ones still alive afterwards; a test that leaves one behind fails."""
    marker = f"{os.getpid()}-{request.node.nodeid}"
    monkeypatch.setenv("DDPTUI_TEST_ID", marker)
    yield marker
    children = psutil.Process().children(recursive=True)
    leftovers = {p.pid: p for p in [*children, *_marked_processes(marker)]}
    if leftovers:
        # Give processes that are exiting on their own a moment before calling them leftovers.
        _, alive = psutil.wait_procs(list(leftovers.values()), timeout=2.0)
        if alive:
            described = ", ".join(f"{p.pid}" for p in alive)
            _end(alive)
            pytest.fail(f"test left processes running: {described}")


# Faults that make a rank stop reporting: a stall is expected of a run with one of these.
STALLING_FAULTS = ("hang", "hang-collective", "hang-setup", "hang-eval", "sigstop")


def false_stalls(runs: Path) -> list[str]:
    """Runs under ``runs`` whose launcher flagged a stall although nothing in them should stall:
    the stall rule follows the run's pace (supervision.stall_seconds = 0) and no fault stops a
    rank. A test that sets a fixed stall_seconds judges its stalls itself."""
    from engine.core.config.schema import ConfigError
    from engine.core.config.toml_io import load_config
    from engine.core.runs.events import RankStalled, read_events
    from engine.core.runs.rundir import list_runs

    found = []
    for run_dir in list_runs(runs):
        try:
            config = load_config(run_dir.config_path)
        except ConfigError:
            continue
        if config.supervision.stall_seconds > 0:
            continue
        if any(f.split(":")[0] in STALLING_FAULTS for f in config.faults):
            continue
        if "--hang-rank" in config.script.args:  # tests/fixtures/tutorial_ddp.py told to hang
            continue
        stalls = [
            e
            for path in run_dir.launcher_event_paths()  # a node launcher's too, on Slurm
            for e in read_events(path)
            if isinstance(e, RankStalled)
        ]
        if stalls:
            found.append(
                f"{run_dir.run_id}: rank {stalls[0].rank} after {stalls[0].silent_seconds} s"
            )
    return found


@pytest.fixture(autouse=True)
def no_home_writes(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests never write to the user's home: the results history, the runs listing cache and any
    XDG data go to a temporary directory (a test that wants another sets its own)."""
    data = tmp_path_factory.mktemp("data-home")
    monkeypatch.setenv("DDPTUI_DATA_DIR", str(data / "ddptui"))
    monkeypatch.setenv("DDPTUI_CACHE_DIR", str(data / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    monkeypatch.delenv("DDPTUI_RESULTS_DB", raising=False)


@pytest.fixture
def runs_dir(tmp_path: Path) -> Iterator[Path]:
    """A runs directory for the test; afterwards no run in it may have been flagged stalled
    without a reason to stall (the soak checks the same over many runs)."""
    path = tmp_path / "runs"
    path.mkdir()
    yield path
    stalls = false_stalls(path)
    assert not stalls, f"false stalls: {stalls}"


@pytest.fixture
def pen() -> Iterator[Any]:
    """Throwaway processes (fixtures.made_runs.ProcessPen), every one ended afterwards."""
    from tests.fixtures.made_runs import ProcessPen

    p = ProcessPen()
    yield p
    p.close()


@pytest.fixture
def run_reaper(runs_dir: Path) -> Iterator[None]:
    """Ends whatever any run under ``runs_dir`` left, even when the test failed half-way."""
    from engine.core.runs.rundir import list_runs
    from tests.fixtures.live_runs import run_processes

    yield
    leftovers = [p for r in list_runs(runs_dir) for p in run_processes(r)]
    for p in leftovers:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(leftovers, timeout=5)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make NVML report no GPU, whatever machine the tests run on."""
    from engine.core.host import gpus

    monkeypatch.setattr(gpus, "gpu_count", lambda: 0)


@pytest.fixture
def other_user() -> Iterator[str]:
    """A user made for this test (root only), removed afterwards."""
    import secrets
    import subprocess

    name = f"ddptui-t{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def script_runs() -> Iterator[Any]:
    """Script runs (tests/fixtures/user_script.py) started with `ddptui run --detach`, every
    process of each ended afterwards."""
    from tests.fixtures.live_runs import ScriptRuns

    runs = ScriptRuns()
    yield runs
    runs.close()


@pytest.fixture
def byo_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's package of tests/fixtures/byo on the Python path, as PYTHONPATH puts it (for
    the CLIs started here too)."""
    from tests.fixtures.repo import REPO_ROOT

    byo = REPO_ROOT / "tests" / "fixtures" / "byo"
    monkeypatch.setenv("PYTHONPATH", str(byo))
    monkeypatch.syspath_prepend(str(byo))
