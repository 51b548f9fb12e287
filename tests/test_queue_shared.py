"""The queue on a shared machine (issue 30): a run waits while a foreign process holds its GPU
(the NVML stand-in, a real process holding a device file), another user sees and respects root's
claim and cannot remove it, and `ddptui queue` says why each run waits at 80 columns."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.core.common.statuses import RunStatus
from engine.core.config.presets import load_preset
from engine.core.config.toml_io import apply_overrides
from engine.core.host.gpus import GpuInventory, GpuSample
from engine.core.procs.process_identity import identify
from engine.core.queue import enqueue
from engine.core.queue.claims import Claim, ClaimState, DeviceWant, open_store
from engine.core.queue.device_state import MachineWatcher
from engine.core.queue.standing import verdict_of
from engine.core.queue.waiter import wait_turn
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir
from tests.fixtures.made_runs import ProcessPen
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for

GIB = 2**30
TWO_GPUS = GpuInventory(
    gpus=tuple(
        GpuSample(i, "NVIDIA A100", memory_used_bytes=GIB // 2, memory_total_bytes=80 * GIB)
        for i in range(2)
    ),
    driver_version="550.54",
)
HOLD_DEVICE = "import sys, time\nf = open(sys.argv[1])\nwhile True: time.sleep(0.1)"


def test_a_queued_run_waits_while_a_foreign_process_holds_its_gpu_and_starts_when_it_goes(
    tmp_path: Path, pen: ProcessPen
) -> None:
    devices = tmp_path / "dev"
    devices.mkdir()
    (devices / "nvidia1").write_text("")
    foreign = pen.python(HOLD_DEVICE.replace("sys.argv[1]", repr(str(devices / "nvidia1"))))
    store = open_store(tmp_path / "claims")
    me = identify(os.getpid())
    assert me is not None
    mine = Claim(
        1, "gpu-run", str(tmp_path / "gpu-run"), DeviceWant("gpu", 1, (1,)), me, time.time()
    )
    store.write(mine, new=True)
    watcher = MachineWatcher(str(devices / "nvidia*"), TWO_GPUS)
    reason = f"GPU 1 held by pid {foreign.pid} (root, python -c import sys, time\\x0a…)"

    def reason_now() -> str:
        verdict = verdict_of(store, "gpu-run", watcher)
        return verdict.reason if verdict is not None else ""

    assert wait_for(lambda: reason_now() == reason, 10), reason_now()
    got: list[tuple[int, ...] | None] = []
    waiting = threading.Thread(
        target=lambda: got.append(
            wait_turn(store, RunDir(tmp_path / "gpu-run"), watcher, timeout=30)
        )
    )
    waiting.start()
    time.sleep(1.5)
    assert got == [], "it started on a GPU a foreign process holds"
    foreign.kill()
    foreign.wait()
    gone = time.monotonic()
    waiting.join(timeout=30)
    assert got == [(1,)] and time.monotonic() - gone < 3.0
    (held,) = store.read()
    assert held.state == ClaimState.HOLDING and held.held == (1,)


# The waiter of a queued run on this machine's stand-ins: the eight stand-in GPUs (NVML's answer)
# and device files of the test's own (the holders' scan), then the real waiter, which becomes the
# real launcher in place when GPU 7 is free (that launcher sees the real machine: no GPU).
STANDIN_WAITER = """
import sys
from engine.core.jobs import gpu_view
from tests.fixtures.standin_nvml import EIGHT_GPUS, standin_nvml
gpu_view.DEFAULT_DEVICE_GLOB = sys.argv.pop(1)
from engine.core.queue.waiter import main
with standin_nvml(machine=EIGHT_GPUS):
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_queued_run_on_standin_gpus_waits_for_a_foreign_holder_then_its_launcher_starts(
    tmp_path: Path,
    runs_dir: Path,
    pen: ProcessPen,
    monkeypatch: pytest.MonkeyPatch,
    run_reaper: None,
) -> None:
    """End to end, as `ddptui run --devices 7 --queue` queues it: the detached waiter waits while
    a foreign process holds GPU 7's device file, and once it is gone the waiter marks its claim
    holding GPU 7 and becomes the run's launcher (same pid), which runs it (here it refuses:
    this machine has no real GPU, and says so in the summary)."""
    devices = tmp_path / "dev"
    devices.mkdir()
    for i in range(8):
        (devices / f"nvidia{i}").write_text("")
    foreign = pen.python(HOLD_DEVICE.replace("sys.argv[1]", repr(str(devices / "nvidia7"))))
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    real_command = enqueue.waiter_command

    def standin_waiter(*args: Any) -> list[str]:
        return [
            sys.executable,
            "-c",
            STANDIN_WAITER,
            str(devices / "nvidia*"),
            *real_command(*args)[3:],
        ]

    monkeypatch.setattr(enqueue, "waiter_command", standin_waiter)
    config = apply_overrides(load_preset("cpu-demo"), {"devices.spec": "gpu:7"})
    queued = enqueue.queue_run(config, runs_dir, store_path=tmp_path / "claims", gpu_count=8)
    store = open_store(tmp_path / "claims")
    waiter = queued.claim.waiter
    time.sleep(2.0)  # eight looks at the line
    (claim,) = store.read()
    assert claim.state == ClaimState.WAITING, "it started on a GPU a foreign process holds"
    assert RunObserver(queued.run_dir).observe().status == RunStatus.QUEUED
    foreign.kill()
    foreign.wait()
    gone = time.monotonic()
    assert wait_for(lambda: store.read()[0].state == ClaimState.HOLDING, 5), "it never took GPU 7"
    took = time.monotonic() - gone
    assert store.read()[0].held == (7,) and took < 2.0, f"took GPU 7 {took:.2f} s after"
    assert wait_for(lambda: queued.run_dir.summary_path.exists(), 60), "its launcher never ended"
    summary = queued.run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.FAILED
    assert "asks for GPUs, but this machine has none" in summary.reason  # the launcher's word
    assert queued.run_dir.read_run_info().launcher == waiter  # the waiter became the launcher
    queued.process.wait(10)  # type: ignore[union-attr]


@pytest.fixture
def shared(other_user: str) -> Iterator[tuple[Path, Path, str]]:
    """A claim store under /tmp and a home of ``other_user``'s, both reachable by it."""
    top = Path(tempfile.mkdtemp(prefix="ddptui-queue-", dir="/tmp"))
    top.chmod(0o755)
    home = top / "home"
    home.mkdir()
    shutil.chown(home, user=other_user)
    try:
        yield top / "claims", home, other_user
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_user(user: str, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    entry = pwd.getpwnam(user)
    env = {**os.environ, "HOME": str(home), "DDPTUI_DATA_DIR": str(home / "data"),
           "DDPTUI_CACHE_DIR": str(home / "cache"), "XDG_DATA_HOME": str(home / "data"),
           "COLUMNS": "80"}  # fmt: skip
    return subprocess.run(
        ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


# What the other user runs: one Python process (this machine's venv interpreter lies under /root,
# which only the first exec of setpriv may reach, so the user's own children could not start):
# its own claim for the same CPU slots, one look at the line, and a try at removing root's claim.
AS_THE_USER = """
import json, os, sys, time
from pathlib import Path
from engine.core.procs.process_identity import identify
from engine.core.queue.claims import Claim, DeviceWant, open_store
from engine.core.queue.waiter import take_turn
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir
store = open_store(Path(sys.argv[1]))
roots = next(c for c in store.read() if c.run_id == "roots-run")
mine = Claim(store.next_ticket(store.read()), "users-run", "/nowhere/users-run",
             DeviceWant("cpu", 2), identify(os.getpid()), time.time())
with store.locked():
    store.write(mine, new=True)
devices = take_turn(store, RunDir(Path("/nowhere/users-run")), None)
print(json.dumps({"removed": store.remove(roots), "devices": devices, "roots_uid": roots.uid}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a user: root only")
def test_another_user_sees_and_respects_roots_claim_and_cannot_remove_it(
    shared: tuple[Path, Path, str], pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_path, home, user = shared
    monkeypatch.setenv("DDPTUI_QUEUE_CPU_SLOTS", "2")
    store = open_store(store_path)
    roots_launcher = pen.python()
    ref = identify(roots_launcher.pid)
    assert ref is not None
    roots = Claim(1, "roots-run", "/root/runs/roots-run", DeviceWant("cpu", 2), ref, time.time())
    with store.locked():
        store.write(roots.holding(()), new=True)
    listed = as_user(
        user, sys.executable, "-m", "ddptui", "queue", "--queue-store", str(store_path), home=home
    )
    assert listed.returncode == 0, listed.stderr
    assert "roots-run" in listed.stdout and " root " in listed.stdout
    assert "runs on cpu:2" in listed.stdout
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80
    while_held = as_user(user, sys.executable, "-c", AS_THE_USER, str(store_path), home=home)
    assert while_held.returncode == 0, while_held.stderr
    assert json.loads(while_held.stdout) == {"removed": False, "devices": None, "roots_uid": 0}
    assert (store_path / roots.file_name).exists()
    roots_launcher.kill()
    roots_launcher.wait()
    after = as_user(user, sys.executable, "-c", AS_THE_USER, str(store_path), home=home)
    assert after.returncode == 0, after.stderr
    # root's claim ended with its launcher: it counts for nobody, though only root may remove it
    assert json.loads(after.stdout) == {"removed": False, "devices": [], "roots_uid": 0}
    assert (store_path / roots.file_name).exists()
    owners = {os.stat(store_path / n).st_uid for n in os.listdir(store_path) if n.endswith(".json")}
    assert owners == {0, pwd.getpwnam(user).pw_uid}


def test_a_store_a_normal_user_cannot_write_is_one_sentence_exit_2_and_nothing_queued(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Root may write anywhere, so as root a user made for the test queues into root's
    read-only store; any other user tries its own read-only one."""
    if os.geteuid() == 0:
        claims, home, user = request.getfixturevalue("shared")
        top = claims.parent

        def ddptui_as_user(*args: str) -> subprocess.CompletedProcess[str]:
            return as_user(user, sys.executable, "-m", "ddptui", *args, home=home)
    else:
        top, home = tmp_path, tmp_path / "home"
        home.mkdir()

        def ddptui_as_user(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "ddptui", *args], cwd=REPO_ROOT,
                                  capture_output=True, text=True, timeout=60)  # fmt: skip

    store = top / "read-only"
    store.mkdir()
    store.chmod(0o555)
    done = ddptui_as_user(
        "run", "cpu-demo", "--queue", "--queue-store", str(store), "--runs-dir", str(home / "runs")
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"ddptui: the claim store {store} is not writable by you; give another directory with "
        "--queue-store or DDPTUI_CLAIMS_DIR"
    ]
    assert os.listdir(store) == []
    assert not (home / "runs").exists() or os.listdir(home / "runs") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a user: root only")
def test_a_store_another_user_owns_is_refused_in_one_sentence_exit_2_and_nothing_queued(
    shared: tuple[Path, Path, str], runs_dir: Path
) -> None:
    """A store any user could have made and root would trust is a hole: root refuses it."""
    claims, _, user = shared
    theirs = claims.parent / "theirs"
    theirs.mkdir()
    shutil.chown(theirs, user=user)
    theirs.chmod(0o1777)
    done = subprocess.run(
        [sys.executable, "-m", "ddptui", "run", "cpu-demo", "--queue", "--queue-store",
         str(theirs), "--runs-dir", str(runs_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    uid = pwd.getpwnam(user).pw_uid
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"ddptui: the claim store {theirs} belongs to uid {uid}, neither you nor root; give "
        "another directory with --queue-store or DDPTUI_CLAIMS_DIR"
    ]
    assert os.listdir(theirs) == [] and list(runs_dir.iterdir()) == []
