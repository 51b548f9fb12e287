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

from engine.core.backends.local import kill
from engine.core.backends.local.kill import kill_run
from engine.core.config.schema import RunConfig, SupervisionConfig
from engine.core.config.toml_io import to_toml
from engine.core.host.gpus import GpuInventory, GpuProcess, GpuSample
from engine.core.jobs.process_table import scan_processes
from engine.core.procs import stopping
from engine.core.procs.process_identity import ProcessRef
from engine.core.procs.stopping import gpu_memory_left, stop_processes
from engine.core.runs.rundir import RunDir, RunDirError
from engine.core.runs.settle import killed_summary
from tests.fixtures.made_runs import (
    STUBBORN,
    ProcessPen,
    make_run,
    marker_env,
    ref_of,
    start_as_user,
)

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
    marker = marker_env(runs_dir, "r-kill")
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


def test_another_users_process_carrying_the_marker_is_left_alone_unless_all_users(
    runs_dir: Path, pen: ProcessPen
) -> None:
    """Anyone can start a process carrying any environment: one of another user than the run
    directory's owner is not the run's (it is never signalled, and cannot block the kill)."""
    mine = pen.python(env=marker_env(runs_dir, "r-other"))
    other = start_as_user(pen, env=marker_env(runs_dir, "r-other"))
    assert pen.wait_until(lambda: psutil.Process(other.pid).username() == "nobody")
    run_dir = make_run(runs_dir, "r-other", launcher=ref_of(other), ranks=[ref_of(mine)])
    result = kill_run(run_dir, grace=1.0)
    assert alive(other.pid) and not alive(mine.pid)
    assert f"pid {other.pid} belongs to nobody, not to root who owns the run directory" in (
        " ".join(result.skipped)
    )
    mine = pen.python(env=marker_env(runs_dir, "r-other"))
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
    rank = pen.python(env=marker_env(runs_dir, "r-corrupt"))
    run_dir = make_run(runs_dir, "r-corrupt", ranks=[ref_of(rank)])
    run_dir.run_json_path.write_text('{"schema": 1, "run_id": ', encoding="utf-8")
    with pytest.raises(RunDirError, match=r"run\.json is corrupt"):
        kill_run(run_dir, grace=0.1)
    assert alive(rank.pid)


# ---- one stop authority: a live launcher stops its own ranks -------------------------------

# A rank that notes every SIGTERM it gets in TERM_FILE: POLITE leaves a moment after the first,
# STUBBORN_RANK stays until SIGKILL. Two lines in a file: it was signalled twice.
RANK_CODE = (
    "import os, signal, sys, time\n"
    "def on_term(*_):\n"
    "    with open(os.environ['TERM_FILE'], 'a') as f:\n"
    "        f.write('TERM\\n')\n"
    "    if os.environ.get('POLITE'):\n"
    "        signal.setitimer(signal.ITIMER_REAL, 0.3)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "signal.signal(signal.SIGALRM, lambda *_: sys.exit(0))\n"
    "while True: time.sleep(0.05)\n"
)
# A launcher as engine.train.launch behaves on SIGTERM, in a few lines: it starts two ranks (global
# ranks 3 and 1 of the run), records them in run.json, and when asked to stop it SIGTERMs them,
# gives them its grace period, SIGKILLs the rest, says so in StopSignalled events and writes a
# killed summary.
FAKE_LAUNCHER = f"""
import dataclasses, os, signal, subprocess, sys, time
from pathlib import Path
import psutil
from engine.core.config.toml_io import load_config
from engine.core.procs.process_identity import ref_of
from engine.core.runs.events import EventWriter, StopSignalled
from engine.core.runs.rundir import RunDir
from engine.core.runs.settle import killed_summary
run_dir = RunDir(Path(os.environ["FAKE_RUN_DIR"]))
asked = []
signal.signal(signal.SIGTERM, lambda *_: asked.append(True))
ranks = {{}}
for rank, polite in ((3, "1"), (1, "")):
    env = {{**os.environ, "TERM_FILE": str(run_dir.path / f"term-{{rank}}"), "POLITE": polite}}
    ranks[rank] = subprocess.Popen([sys.executable, "-c", {RANK_CODE!r}], env=env)
info = dataclasses.replace(
    run_dir.read_run_info(),
    launcher=ref_of(psutil.Process()),
    ranks=tuple(ref_of(psutil.Process(p.pid)) for p in ranks.values()),
    global_ranks=tuple(ranks),
)
run_dir.write_run_info(info)
while not asked:
    time.sleep(0.05)
events = EventWriter(run_dir.launcher_events_path)
def stop(sig):
    live = {{r: p for r, p in ranks.items() if p.poll() is None}}
    for p in live.values():
        p.send_signal(sig)
    pids = tuple(p.pid for p in live.values())
    events.write(StopSignalled(signal=sig.name, ranks=tuple(live), pids=pids))
stop(signal.SIGTERM)
deadline = time.monotonic() + load_config(run_dir.config_path).supervision.failure_grace_seconds
while time.monotonic() < deadline and any(p.poll() is None for p in ranks.values()):
    time.sleep(0.05)
if any(p.poll() is None for p in ranks.values()):
    stop(signal.SIGKILL)
for p in ranks.values():
    p.wait()
run_dir.write_summary(killed_summary(run_dir, "the launcher received SIGTERM"))
"""


def launched_run(runs_dir: Path, pen: ProcessPen, run_id: str, code: str = FAKE_LAUNCHER) -> RunDir:
    """A run whose launcher (``code``) is alive and has recorded its two ranks."""
    run_dir = make_run(runs_dir, run_id)
    config = RunConfig(name="made", supervision=SupervisionConfig(failure_grace_seconds=1.0))
    run_dir.config_path.write_text(to_toml(config), encoding="utf-8")
    launcher = pen.python(
        code, env={**marker_env(runs_dir, run_id), "FAKE_RUN_DIR": str(run_dir.path)}
    )
    assert pen.wait_until(lambda: len(run_dir.read_run_info().ranks) == 2)
    pen.started.extend(psutil.Process(launcher.pid).children())
    return run_dir


def terms(run_dir: Path, rank: int) -> int:
    path = run_dir / f"term-{rank}"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_live_launcher_stops_its_own_ranks_and_writes_the_summary(
    runs_dir: Path, pen: ProcessPen
) -> None:
    run_dir = launched_run(runs_dir, pen, "r-launcher-stops")
    info = run_dir.read_run_info()
    assert info.launcher is not None
    polite, stubborn = (ref.pid for _, ref in info.ranked())
    result = kill_run(run_dir, grace=4.0, check_gpu=False)
    assert result.by_launcher and result.ok
    assert not result.summary_written  # the launcher wrote it
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "killed"
    assert summary.reason == "the launcher received SIGTERM"
    # every rank was signalled once, by its launcher; none by the killer
    assert (terms(run_dir.path, 3), terms(run_dir.path, 1)) == (1, 1)
    assert result.stop is not None
    assert result.stop.killed == (stubborn,)  # as the launcher's StopSignalled events say
    assert set(result.stop.terminated) == {info.launcher.pid, polite}
    assert result.grace_seconds == 1.0  # the launcher's, not the killer's 4 s
    assert {t.role for t in result.targets} == {"launcher", "rank 3", "rank 1"}
    assert not any(alive(pid) for pid in (info.launcher.pid, polite, stubborn))


def test_with_the_launcher_gone_the_killer_stops_the_ranks_and_settles(
    runs_dir: Path, pen: ProcessPen
) -> None:
    gone = pen.python("pass")
    gone_ref = ref_of(gone)
    gone.wait()
    marker = marker_env(runs_dir, "r-gone")
    ranks = [
        pen.python(
            RANK_CODE, env={**marker, "TERM_FILE": str(runs_dir / f"term-{r}"), "POLITE": "1"}
        )
        for r in (0, 1)
    ]
    run_dir = make_run(runs_dir, "r-gone", launcher=gone_ref, ranks=[ref_of(r) for r in ranks])
    time.sleep(0.3)  # let the ranks install their handlers
    result = kill_run(run_dir, grace=2.0, check_gpu=False)
    assert not result.by_launcher and result.summary_written and result.ok
    assert result.stop is not None and set(result.stop.terminated) == {r.pid for r in ranks}
    assert result.grace_seconds == 2.0
    assert (terms(runs_dir, 0), terms(runs_dir, 1)) == (1, 1)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "killed"
    assert "stopped by ddptui kill" in summary.reason


def test_a_launcher_that_does_not_finish_in_time_is_stopped_with_its_ranks(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kill, "LAUNCHER_STOP_MARGIN_SECONDS", 0.5)
    deaf = FAKE_LAUNCHER.replace("lambda *_: asked.append(True)", "signal.SIG_IGN")
    run_dir = launched_run(runs_dir, pen, "r-deaf-launcher", deaf)
    info = run_dir.read_run_info()
    assert info.launcher is not None
    result = kill_run(run_dir, grace=1.0, check_gpu=False)
    assert not result.by_launcher and result.summary_written
    assert result.stop is not None and info.launcher.pid in result.stop.killed
    assert (
        "stopped by ddptui kill" in (run_dir.read_summary() or killed_summary(run_dir, "")).reason
    )
    assert not any(alive(ref.pid) for ref in [info.launcher, *info.ranks])


def test_readers_take_each_ranks_number_from_run_json(runs_dir: Path, pen: ProcessPen) -> None:
    run_dir = launched_run(runs_dir, pen, "r-numbered")
    numbered = {ref.pid: rank for rank, ref in run_dir.read_run_info().ranked()}
    found, _ = kill.run_targets(run_dir)
    assert {p.pid: role for p, role in found if role != "launcher"} == {
        pid: f"rank {rank}" for pid, rank in numbered.items()
    }
    job = next(j for j in scan_processes(cpu_interval=0.0).jobs if j.run_id == "r-numbered")
    assert {p.pid: p.rank for p in job.processes if p.pid in numbered} == numbered


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


def test_a_kill_reads_run_json_once_and_scans_for_the_marker_once_before_acting(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One look at the run (engine.core.runs.run_handle) serves the ownership, the targets and the
    stacks: before the first signal, run.json is read once and /proc scanned for the marker once.
    After stopping, the sweep for marked processes that slipped through is the one second scan."""
    from engine.core.runs import run_handle

    marker = marker_env(runs_dir, "r-once")
    ranks = [pen.python(env=marker) for _ in (0, 1)]
    run_dir = make_run(runs_dir, "r-once", ranks=[ref_of(r) for r in ranks])
    calls: list[str] = []
    before_signal: list[tuple[int, int]] = []
    read_info, scan, send = RunDir.read_run_info, kill.marked_processes, os.kill

    def counted_read(self: RunDir):  # type: ignore[no-untyped-def]
        calls.append("read")
        return read_info(self)

    def counted_scan(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append("scan")
        return scan(*args, **kwargs)

    def first_signal(pid: int, sig: int) -> None:
        if sig != 0 and not before_signal:
            before_signal.append((calls.count("read"), calls.count("scan")))
        send(pid, sig)

    monkeypatch.setattr(RunDir, "read_run_info", counted_read)
    monkeypatch.setattr(run_handle, "marked_processes", counted_scan)
    monkeypatch.setattr(kill, "marked_processes", counted_scan)
    monkeypatch.setattr(os, "kill", first_signal)
    result = kill_run(run_dir, grace=1.0, check_gpu=False)
    assert result.ok and result.stop is not None
    assert set(result.stop.stopped) == {r.pid for r in ranks}
    assert before_signal == [(1, 1)]
    assert calls.count("scan") == 2  # and the sweep after stopping
