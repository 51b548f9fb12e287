"""Issue 8 on real processes: no rank outlives its launcher, and every run ends with a summary.

1. a launcher SIGKILLed while its ranks are still importing torch (before any watchdog thread
   can exist): the ranks die at once, by the parent-death signal, and the next reader writes the
   ``lost`` summary;
2. a rank SIGKILLed mid-epoch: its DataLoader workers die with it and the launcher fails the run
   naming the rank (a worker busy in ``__getitem__`` when its rank dies is in
   tests/test_rank_bootstrap.py: torch's own check would not see it for as long as it is busy);
3. the ``oom`` fault: the rank allocates until the kernel's OOM killer ends it, and the summary
   says so;
4. the ``kill-launcher`` fault under ``ddptui run``: the follower writes the ``lost`` summary
   naming SIGKILL and how far the ranks got.

Every one ends with nothing left running (conftest's reaper fails the test otherwise).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from engine.core.common.statuses import RunStatus
from engine.core.runs.observer import observe_run
from engine.core.runs.rundir import RunDir, list_runs
from engine.train.memory_fault import FAULT_CGROUP_PREFIX, own_memory_cgroup
from tests.fixtures.live_runs import QUICK, ddptui, detached_run, run_processes
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for

LOST = RunStatus.LOST

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"),
]


def gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def rank_processes(run_dir: RunDir) -> list[psutil.Process]:
    return [psutil.Process(r.pid) for r in run_dir.read_run_info().ranks]


def watchdog_spoke(run_dir: RunDir) -> bool:
    """Whether a rank's watchdog thread (not the kernel) ended it: it says so in its log."""
    return any(
        "watchdog:" in path.read_text(errors="replace")
        for path in run_dir.logs_dir.glob("rank-*.log")
    )


def test_1_ranks_die_with_a_launcher_sigkilled_while_they_import_torch(
    runs_dir: Path, run_reaper: None
) -> None:
    run_dir = detached_run(runs_dir, "--max-steps", "10000")
    info = run_dir.read_run_info()
    assert info.launcher is not None
    ranks = rank_processes(run_dir)
    os.kill(info.launcher.pid, signal.SIGKILL)
    importing = not any(run_dir.rank_event_paths())  # no rank had reported: still importing
    assert wait_for(lambda: all(gone(p) for p in ranks), timeout=3.0), "ranks outlived it"
    assert not watchdog_spoke(run_dir), "the watchdog, not the parent-death signal, ended them"
    # multiprocessing's resource tracker (marked too) exits once the last rank holding its pipe
    # is gone: a moment after them on a loaded machine
    assert wait_for(lambda: run_processes(run_dir) == [], timeout=2.0), run_processes(run_dir)
    # the next reader writes the summary the launcher could not
    listed = ddptui("runs", "--runs-dir", str(runs_dir))
    assert listed.returncode == 0, listed.stderr
    (line,) = [x for x in listed.stdout.splitlines() if x.startswith(run_dir.run_id)]
    assert line.split()[2] == LOST, line
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == LOST
    assert f"the launcher (pid {info.launcher.pid})" in summary.launcher_end
    assert [r.rank for r in summary.ranks] == [0, 1]
    if importing:
        assert "rank 0 had not started training" in summary.reason


def test_2_dataloader_workers_die_with_their_rank(runs_dir: Path, run_reaper: None) -> None:
    run_dir = detached_run(
        runs_dir, "--max-steps", "10000",
        "--set", "data.pipeline=torchvision", "--set", "data.num_workers=2",
    )  # fmt: skip
    ranks = rank_processes(run_dir)
    assert wait_for(lambda: len(ranks[1].children()) == 2, timeout=60), "no workers started"
    workers = ranks[1].children()
    ranks[1].kill()
    assert wait_for(lambda: all(gone(w) for w in workers), timeout=2.0), "workers outlived it"
    assert wait_for(lambda: run_dir.summary_path.exists(), timeout=30)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "failed"
    assert summary.failure.rank == 1 and summary.failure.signal == "SIGKILL"
    assert wait_for(lambda: run_processes(run_dir) == [], timeout=10)


CAN_CONFINE = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from engine.train.memory_fault import confine
    group = confine(1 << 30)
    print(group or "")
    """
)


def memory_fault_is_confined() -> bool:
    """Whether this machine lets the ``oom`` fault cap itself in a cgroup. Unconfined, it would
    fill all the machine's memory, which is no thing for a test suite to do."""
    out = subprocess.run(
        [sys.executable, "-c", CAN_CONFINE.format(repo=str(REPO_ROOT))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    if out:
        Path(out).rmdir()
    return bool(out)


def test_3_an_oom_rank_is_killed_by_the_kernel_and_the_summary_says_so(
    runs_dir: Path, run_reaper: None
) -> None:
    if not memory_fault_is_confined():
        pytest.skip("no writable memory cgroup here: the oom fault would fill the machine")
    result = ddptui(
        "run", "cpu-demo", *QUICK, "--max-steps", "50", "--fault", "oom:1:3",
        "--runs-dir", str(runs_dir), timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    (run_dir,) = list_runs(runs_dir)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "failed"
    failure = summary.failure
    assert failure is not None and failure.rank == 1 and failure.signal == "SIGKILL"
    assert "out-of-memory killer" in failure.error or "out of memory" in failure.error
    assert "root cause (rank 1)" in result.stdout
    assert run_processes(run_dir) == []
    cgroup = own_memory_cgroup()
    assert cgroup is None or not list(cgroup.glob(f"{FAULT_CGROUP_PREFIX}*")), "cgroup left"


def test_4_a_sigkilled_launcher_under_ddptui_run_is_summarised_as_lost(
    runs_dir: Path, run_reaper: None
) -> None:
    result = ddptui(
        "run", "cpu-demo", *QUICK, "--max-steps", "10000", "--fault", "kill-launcher:0:5",
        "--set", "training.report_interval=0", "--runs-dir", str(runs_dir), timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    (run_dir,) = list_runs(runs_dir)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == LOST
    assert summary.failure is not None and summary.failure.signal == "SIGKILL"
    assert "was killed by SIGKILL before it could write a summary" in summary.launcher_end
    reached = {r.rank: r for r in summary.ranks}
    assert reached[0].global_step is not None and reached[0].global_step >= 4
    lines = result.stdout.splitlines()
    (end,) = [i for i, line in enumerate(lines) if line.startswith("lost: cpu-demo")]
    assert lines[end + 1].startswith("  root cause (the launcher): the launcher (pid ")
    assert "rank 0 reached epoch 1 step" in result.stdout
    assert run_processes(run_dir) == []
    assert observe_run(run_dir).status == LOST
