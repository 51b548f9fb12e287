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

import pytest

from engine.core.host.gpus import GpuInventory, GpuSample
from engine.core.procs.process_identity import identify
from engine.core.queue.claims import Claim, ClaimState, DeviceWant, open_store
from engine.core.queue.device_state import MachineWatcher
from engine.core.queue.standing import verdict_of
from engine.core.queue.waiter import wait_turn
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
