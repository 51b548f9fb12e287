"""Stopping processes: the one SIGTERM -> grace -> SIGKILL -> verify routine, and `kill_run`, which
stops exactly one run's processes (found by pid + start time and by run marker), never a reused
pid, another user's process, this process or its parent."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from engine.core.host.gpus import GpuInventory, GpuProcess, GpuSample
from engine.core.ops.kill import kill_run
from engine.core.procs import stopping
from engine.core.procs.process_identity import ProcessRef
from engine.core.procs.stopping import KillRefused, gpu_memory_left, stop_processes
from engine.core.runs.rundir import RunDirError
from engine.core.runs.settle import killed_summary
from tests.fixtures.made_runs import STUBBORN, ProcessPen, make_run, ref_of, start_as_user

SPAWNS_A_CHILD = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.1)'])\n"
    "while True: time.sleep(0.1)"
)


@pytest.fixture(autouse=True)
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        stopping, "sample_gpus", lambda: GpuInventory(error="NVML: stand-in, no driver")
    )


def alive(pid: int, start: float | None = None) -> bool:
    try:
        p = psutil.Process(pid)
        if start is not None and abs(p.create_time() - start) > 0.01:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def children_of(pid: int, pen: ProcessPen, count: int = 1) -> list[psutil.Process]:
    parent = psutil.Process(pid)
    assert pen.wait_until(lambda: len(parent.children()) >= count)
    kids = parent.children()
    pen.started.extend(kids)
    return kids


# ---- stop_processes --------------------------------------------------------------------------


def test_sigterm_then_sigkill_after_the_grace_period(pen: ProcessPen) -> None:
    polite = pen.python()
    stubborn = pen.python(STUBBORN)
    time.sleep(0.3)  # let the stubborn one install its handler
    started = time.monotonic()
    result = stop_processes([psutil.Process(polite.pid), psutil.Process(stubborn.pid)], grace=1.0)
    took = time.monotonic() - started
    assert result.terminated == (polite.pid,)
    assert result.killed == (stubborn.pid,)
    assert result.survivors == () and result.ok
    assert 1.0 <= took < 4.0
    assert not alive(polite.pid) and not alive(stubborn.pid)


def test_descendants_are_stopped_too(pen: ProcessPen) -> None:
    parent = pen.python(SPAWNS_A_CHILD)
    (child,) = children_of(parent.pid, pen)
    result = stop_processes([psutil.Process(parent.pid)], grace=2.0)
    assert set(result.stopped) == {parent.pid, child.pid}
    assert not alive(child.pid)


def test_never_this_process_nor_its_parent() -> None:
    me, parent = psutil.Process(), psutil.Process().parent()
    assert parent is not None
    result = stop_processes([me, parent], grace=0.1, include_descendants=False)
    assert [pid for pid, _ in result.refused] == sorted([me.pid, parent.pid])
    assert "this ddptui process or one of its parents" in result.refused[0][1]
    assert result.stopped == ()


def test_another_users_process_is_refused_unless_allowed(pen: ProcessPen) -> None:
    other = start_as_user(pen)
    proc = psutil.Process(other.pid)
    assert pen.wait_until(lambda: proc.username() == "nobody")
    result = stop_processes([proc], grace=0.5)
    assert result.refused and "belongs to user nobody" in result.refused[0][1]
    assert alive(other.pid)
    allowed = stop_processes([proc], grace=2.0, allow_other_users=True)  # we are root here
    assert allowed.stopped == (other.pid,)


# ---- kill_run --------------------------------------------------------------------------------


def test_kill_run_stops_launcher_ranks_marked_processes_and_their_children(
    runs_dir: Path, pen: ProcessPen
) -> None:
    marker = {"DDPTUI_RUN_ID": "r-kill"}
    launcher = pen.python(env=marker)
    rank0 = pen.python(SPAWNS_A_CHILD, env=marker)
    rank1 = pen.python(STUBBORN, env=marker)  # named in run.json; ignores SIGTERM
    stray = pen.python(env=marker)  # carries the marker; run.json does not name it
    bystander = pen.python()  # an unrelated process of the same user
    (worker,) = children_of(rank0.pid, pen)
    run_dir = make_run(
        runs_dir, "r-kill", launcher=ref_of(launcher), ranks=[ref_of(rank0), ref_of(rank1)]
    )
    time.sleep(0.3)
    started = time.monotonic()
    result = kill_run(run_dir, grace=1.0)
    assert time.monotonic() - started < 1.0 + 5.0
    assert result.outcome == "stopped" and result.ok
    assert {t.role for t in result.targets} == {"launcher", "rank 0", "rank 1", "marked"}
    assert result.stop is not None
    assert set(result.stop.stopped) == {launcher.pid, rank0.pid, rank1.pid, stray.pid, worker.pid}
    assert rank1.pid in result.stop.killed
    assert alive(bystander.pid)
    for pid in (launcher.pid, rank0.pid, rank1.pid, stray.pid, worker.pid):
        assert not alive(pid)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "killed"
    assert "ddptui kill" in summary.reason
    assert run_dir.read_run_info().state == "killed"
    assert result.summary_written
    assert result.gpu_check.startswith("GPU memory not checked")


def test_kill_run_keeps_the_launchers_own_killed_summary(runs_dir: Path, pen: ProcessPen) -> None:
    launcher = pen.python()
    run_dir = make_run(runs_dir, "r-own", launcher=ref_of(launcher))
    run_dir.write_summary(killed_summary(run_dir, "the launcher received SIGTERM"))
    run_dir.write_run_info(run_dir.read_run_info())
    result = kill_run(run_dir, grace=1.0)
    assert not result.summary_written
    assert json.loads(run_dir.summary_path.read_text())["reason"] == (
        "the launcher received SIGTERM"
    )


def test_a_finished_run_is_left_alone(runs_dir: Path, pen: ProcessPen) -> None:
    bystander = pen.python()
    # the run finished long ago; its launcher's pid now names a newer process
    stale = ProcessRef(bystander.pid, ref_of(bystander).start_time - 100)
    run_dir = make_run(runs_dir, "r-done", launcher=stale, state="completed")
    result = kill_run(run_dir, grace=1.0)
    assert result.outcome == "already-finished"
    assert result.status_before == "completed"
    assert alive(bystander.pid)
    assert not run_dir.summary_path.exists()


def test_a_reused_pid_in_run_json_is_never_signalled(runs_dir: Path, pen: ProcessPen) -> None:
    innocent = pen.python()
    start = ref_of(innocent).start_time
    run_dir = make_run(
        runs_dir,
        "r-reused",
        launcher=ProcessRef(innocent.pid, start - 3600),
        ranks=[ProcessRef(innocent.pid, start + 5)],
    )
    result = kill_run(run_dir, grace=1.0)
    assert alive(innocent.pid, start)
    assert result.outcome == "nothing-running"
    assert any("now belongs to another process" in s for s in result.skipped)
    assert json.loads(run_dir.summary_path.read_text())["status"] == "killed"


def test_another_users_process_in_run_json_refuses_the_whole_kill(
    runs_dir: Path, pen: ProcessPen
) -> None:
    mine = pen.python(env={"DDPTUI_RUN_ID": "r-other"})
    other = start_as_user(pen, env={"DDPTUI_RUN_ID": "r-other"})
    assert pen.wait_until(lambda: psutil.Process(other.pid).username() == "nobody")
    run_dir = make_run(runs_dir, "r-other", launcher=ref_of(other), ranks=[ref_of(mine)])
    with pytest.raises(KillRefused, match=r"belongs to user nobody.*nothing was stopped"):
        kill_run(run_dir, grace=1.0)
    assert alive(other.pid) and alive(mine.pid)
    assert not run_dir.summary_path.exists()
    result = kill_run(run_dir, grace=2.0, allow_other_users=True)
    assert result.ok and not alive(other.pid) and not alive(mine.pid)


def test_a_run_json_naming_this_process_is_left_alone(runs_dir: Path) -> None:
    me = psutil.Process()
    run_dir = make_run(runs_dir, "r-me", launcher=ProcessRef(me.pid, me.create_time()))
    result = kill_run(run_dir, grace=0.1)
    assert result.outcome == "nothing-running"
    assert any(f"pid {me.pid} does not carry the run marker" in s for s in result.skipped)


def test_a_marked_ancestor_is_still_refused() -> None:
    me = psutil.Process()
    why = stopping.refusal(me, allow_other_users=True, protected=stopping.protected_pids())
    assert why is not None and "this ddptui process or one of its parents" in why


def test_a_corrupt_run_json_stops_nothing(runs_dir: Path, pen: ProcessPen) -> None:
    rank = pen.python(env={"DDPTUI_RUN_ID": "r-corrupt"})
    run_dir = make_run(runs_dir, "r-corrupt", ranks=[ref_of(rank)])
    run_dir.run_json_path.write_text('{"schema": 1, "run_id": ', encoding="utf-8")
    with pytest.raises(RunDirError, match=r"run\.json is corrupt"):
        kill_run(run_dir, grace=0.1)
    assert alive(rank.pid)


# ---- the GPU check ---------------------------------------------------------------------------


def test_gpu_memory_check_waits_for_the_driver_then_names_holders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    holding = GpuInventory(
        gpus=(
            GpuSample(
                index=1, name="x", processes=(GpuProcess(pid=4242, used_memory_bytes=512 << 20),)
            ),
        )
    )
    released = GpuInventory(gpus=(GpuSample(index=1, name="x"),))
    samples = iter([holding, holding, released])
    monkeypatch.setattr(stopping, "sample_gpus", lambda: next(samples))
    assert gpu_memory_left([4242], wait=5.0).startswith("GPU memory released")
    monkeypatch.setattr(stopping, "sample_gpus", lambda: holding)
    assert gpu_memory_left([4242], wait=0.3) == (
        "GPU memory still held: pid 4242 on GPU 1 (512 MiB)"
    )
    assert gpu_memory_left([7], wait=0).startswith("GPU memory released")


def test_protected_pids_hold_this_process_and_its_ancestors() -> None:
    pids = stopping.protected_pids()
    assert os.getpid() in pids and os.getppid() in pids
