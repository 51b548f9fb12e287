"""engine.train.rank_bootstrap on real processes: a bound process dies with its parent, and one whose
parent is already gone when it binds exits at once. (That it loads only the standard library is
checked in tests/test_import_hygiene.py.)

The end-to-end cases (a launcher SIGKILLed while its ranks import torch, a SIGKILLed rank with
DataLoader workers) are in tests/test_orphan_proof_runs.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)

# The process under test: binds (or not), says so, then waits to be ended.
CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    from engine.train.rank_bootstrap import bind_to_parent
    time.sleep({delay})
    armed = bind_to_parent() if {bind} else False
    print("bound" if armed else "unbound", flush=True)
    time.sleep(60)
    """
)

# Its parent, standing in for a launcher: starts the child with its own pid as
# DDPTUI_LAUNCHER_PID, prints the child's pid, then waits (or exits at once).
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = {{**os.environ, "DDPTUI_LAUNCHER_PID": str(os.getpid())}}
    child = subprocess.Popen([sys.executable, "-c", {child!r}], env=env)
    print(child.pid, flush=True)
    if not {exit_at_once}:
        time.sleep(60)
    """
)


def start_pair(
    *, bind: bool, delay: float = 0.0, exit_at_once: bool = False
) -> tuple[subprocess.Popen[str], psutil.Process]:
    child = CHILD.format(repo=str(REPO_ROOT), delay=delay, bind=bind)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(child=child, exit_at_once=exit_at_once)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    return parent, psutil.Process(pid)


def gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def end(*procs: psutil.Process | subprocess.Popen[str]) -> None:
    """End the child before the parent: an orphaned child holds the parent's pipes open."""
    for p in procs:
        if isinstance(p, subprocess.Popen):
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=10)
        elif not gone(p):
            p.kill()
            psutil.wait_procs([p], timeout=5)


@pytest.mark.parametrize("bind", [True, False], ids=["bound", "unbound-control"])
def test_a_bound_process_dies_the_moment_its_parent_is_sigkilled(bind: bool) -> None:
    """Bound, the child goes with its parent; the unbound control is reparented and lives on,
    which is what binding prevents."""
    parent, child = start_pair(bind=bind)
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == ("bound" if bind else "unbound")
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=5)
        assert wait_for(lambda: gone(child), timeout=2.0 if bind else 1.0) == bind
        if not bind:
            assert child.ppid() != parent.pid  # an orphan, reparented
    finally:
        end(child, parent)


def test_a_process_whose_parent_ended_before_it_bound_exits_at_once() -> None:
    # The parent exits right after starting the child; the child binds 0.5 s later, so the death
    # signal can no longer fire: the re-check after arming must end it.
    parent, child = start_pair(bind=True, delay=0.5, exit_at_once=True)
    try:
        out, err = parent.communicate(timeout=10)
        assert wait_for(lambda: gone(child), timeout=5.0), "the orphan kept running"
        assert "bound" not in out
        assert "ddptui rank bootstrap:" in err and "exiting" in err
    finally:
        end(child, parent)


def test_spawned_ranks_bind_before_torch_is_imported() -> None:
    """The launcher module arms the bootstrap at its top when a spawned rank re-imports it as
    __mp_main__, before any other import; under torchrun, engine.train.worker does the same."""
    for module in ("engine/train/launch.py", "engine/train/worker.py"):
        text = Path(REPO_ROOT, module).read_text(encoding="utf-8")
        bind_at = min(
            text.index(call) for call in ("bootstrap_rank()", "bind_to_parent()") if call in text
        )
        first_import = text.index("\nimport ")
        assert bind_at < first_import, f"{module} imports before it binds"


# A rank whose DataLoader worker is busy in __getitem__ (30 s) when the rank is SIGKILLed. torch's
# own check on the parent runs only between batches, so an unbound worker lives on.
BUSY_LOADER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from torch.utils.data import DataLoader, Dataset
    from engine.train.data import _loader_options
    from engine.core.config.schema import RunConfig, DataConfig
    import torch

    class Busy(Dataset):
        def __len__(self):
            return 10
        def __getitem__(self, i):
            print(os.getpid(), flush=True)
            time.sleep(30)
            return i

    options = _loader_options(RunConfig(data=DataConfig(num_workers=1)), torch.device("cpu"))
    if not {bind}:
        options["worker_init_fn"] = None
    next(iter(DataLoader(Busy(), **options)))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("bind", [True, False], ids=["engine-loader", "unbound-control"])
def test_a_busy_dataloader_worker_dies_with_its_rank(bind: bool) -> None:
    rank = subprocess.Popen(
        [sys.executable, "-c", BUSY_LOADER.format(repo=str(REPO_ROOT), bind=bind)],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker: psutil.Process | None = None
    try:
        assert rank.stdout is not None
        worker = psutil.Process(int(rank.stdout.readline()))
        rank.kill()
        rank.wait(timeout=10)
        died = wait_for(lambda: gone(worker), timeout=2.0)  # type: ignore[arg-type]
        assert died == bind
    finally:
        if worker is not None:
            end(worker)
        end(rank)
