"""Every operation looks at a run once: run.json read once, each process looked up once, /proc
scanned for the run marker only where the operation needs it, all before it acts, and passed down
for the rest (``engine.core.runs.run_handle``, the run observer's one look an observation, a
process scan's look). A second look after acting is by design and said so where it is counted.
``ddptui kill`` through ``kill_run`` is counted in tests/test_process_kill.py; here its CLI and
the UI's kill, ``ddptui stacks`` and the UI's stacks, ``show``, the observer, the UI's polls,
``clean``, ``rm`` and ``runs --prune``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from ddptui.actions import EngineActions
from ddptui.cli import main
from ddptui.watch import RunLister, RunReader
from engine.core.common.statuses import RunStatus
from engine.core.host.gpus import GpuInventory
from engine.core.jobs import clean
from engine.core.ops import run_removal
from engine.core.procs import stopping
from engine.core.procs.process_identity import ProcessRef
from engine.core.runs import settle
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir
from engine.core.runs.summarize import build_summary
from engine.core.stacks import diagnosis
from engine.core.stacks.capture import ProcessStack
from tests.fixtures.looks import Looks
from tests.fixtures.made_runs import (
    ProcessPen,
    confine_scans,
    make_run,
    marker_env,
    rank_events,
    ref_of,
)

GONE = ProcessRef(pid=999_999, start_time=1.0)  # a launcher no process is any more


@pytest.fixture(autouse=True)
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    none = GpuInventory(error="NVML: stand-in, no driver")
    monkeypatch.setattr(stopping, "sample_gpus", lambda: none)
    monkeypatch.setattr("engine.core.jobs.process_table.sample_gpus", lambda: none)


@pytest.fixture
def stand_in_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack capture that touches no process: these tests count looks, not stacks."""
    monkeypatch.setattr(
        diagnosis, "capture_stack", lambda ref, *_a, **_k: ProcessStack(ref.pid, problem="stand-in")
    )


def started(pen: ProcessPen, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A sleeper carrying ``env``, once its own environment shows it."""
    proc = pen.python(env=env)
    key = next(iter(env))
    assert pen.wait_until(lambda: key in psutil.Process(proc.pid).environ())
    return proc


def a_run(
    runs_dir: Path, pen: ProcessPen, run_id: str, *, launcher: bool = True
) -> tuple[RunDir, list[int]]:
    """A run of two live ranks carrying its marker, under a live launcher (or one long gone: the
    run is orphaned); its directory and the pids run.json names."""
    marker = marker_env(runs_dir, run_id)
    boss = ref_of(started(pen, marker)) if launcher else GONE
    ranks = [ref_of(started(pen, marker)) for _ in (0, 1)]
    run_dir = make_run(
        runs_dir, run_id, launcher=boss, ranks=ranks,
        events={"rank-0": rank_events(0, 3), "rank-1": rank_events(1, 3)},
    )  # fmt: skip
    return run_dir, [boss.pid, *(r.pid for r in ranks)]


def ended(runs_dir: Path, run_id: str) -> RunDir:
    run_dir = make_run(runs_dir, run_id, state=RunStatus.COMPLETED)
    run_dir.write_summary(build_summary(run_dir, RunStatus.COMPLETED, None, "it completed"))
    return run_dir


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


# ---- stacks ------------------------------------------------------------------------------------


def test_ddptui_stacks_reads_run_json_once_and_looks_up_each_process_once(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch, stand_in_stacks: None
) -> None:
    """One handle serves the command's observation, its backend and the snapshot: before the first
    stack is taken, run.json was read once, each process it names looked up once, /proc never
    scanned (a snapshot asks only the ranks run.json names). The capture's own look at each rank
    right before it acts is by design: it is the safety check before a signal."""
    _, pids = a_run(runs_dir, pen, "r-stacks")
    looks = Looks(monkeypatch)
    looks.at_first(diagnosis, "capture_stack")
    cli("stacks", "r-stacks", "--runs-dir", str(runs_dir))
    before, after = looks.before("capture_stack"), looks.now()
    assert (before.reads("r-stacks"), before.scans) == (1, 0)
    assert before.looked(pids) == dict.fromkeys(pids, 1)
    assert (after.reads("r-stacks"), after.scans) == (1, 0)  # and none after


def test_the_uis_stacks_look_once(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch, stand_in_stacks: None
) -> None:
    run_dir, pids = a_run(runs_dir, pen, "r-ui-stacks")
    looks = Looks(monkeypatch)
    looks.at_first(diagnosis, "capture_stack")
    snapshot = EngineActions(runs_dir).take_stacks(run_dir)
    assert snapshot is not None and len(snapshot.ranks) == 2
    before = looks.before("capture_stack")
    assert (before.reads("r-ui-stacks"), before.scans) == (1, 0)
    assert before.looked(pids) == dict.fromkeys(pids, 1)


# ---- kill, as the CLI and the UI start it ------------------------------------------------------


def first_signal(looks: Looks, monkeypatch: pytest.MonkeyPatch) -> None:
    """Note the counts at the first signal sent (not signal 0, a mere existence check)."""
    send = os.kill

    def noted(pid: int, sig: int) -> None:
        if sig != 0:
            looks.first.setdefault("signal", looks.now())
        send(pid, sig)

    monkeypatch.setattr(os, "kill", noted)


def test_ddptui_kill_and_the_uis_kill_look_once_before_the_first_signal(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch, stand_in_stacks: None
) -> None:
    """The handle is made once, picks the run's backend and is handed to its stop: the dispatch
    no longer reads run.json a second time. After stopping, the sweep for marked processes is
    the one second scan, by design."""
    for how in ("cli", "ui"):
        run_id = f"r-kill-{how}"
        run_dir, pids = a_run(runs_dir, pen, run_id)
        with monkeypatch.context() as patched:
            looks = Looks(patched)
            first_signal(looks, patched)
            if how == "cli":
                cli("kill", run_id, "--runs-dir", str(runs_dir), "--grace", "1")
            else:
                assert EngineActions(runs_dir).kill_run(run_dir, 1.0).ok
            before = looks.before("signal")
            assert (before.reads(run_id), before.scans) == (1, 1), how
            assert before.looked(pids) == dict.fromkeys(pids, 1), how
            assert looks.now().scans == 2, how  # the sweep after stopping
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                       for pid in pids)  # fmt: skip


# ---- show, the observer and the UI's polls -----------------------------------------------------


def test_ddptui_show_reads_run_json_once_and_looks_up_each_process_once(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An orphaned run: the launcher is looked up for the status and the ranks for whether one
    lives and which are stopped, each once (the ranks were looked up twice before)."""
    _, pids = a_run(runs_dir, pen, "r-show", launcher=False)
    looks = Looks(monkeypatch)
    out = cli("show", "r-show", "--runs-dir", str(runs_dir))
    assert "state      orphaned" in out
    seen = looks.now()
    assert (seen.reads("r-show"), seen.scans) == (1, 0)
    assert seen.looked(pids) == dict.fromkeys(pids, 1)


def test_ddptui_show_of_a_lost_run_looks_once_then_settles_it(
    runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settling is the one write, asked for after the observation: its own read of run.json (to
    record the final state there) is a look after acting, by design."""
    run_dir = make_run(runs_dir, "r-lost", launcher=GONE, ranks=[GONE, GONE])
    looks = Looks(monkeypatch)
    looks.at_first(settle, "settle_run")
    out = cli("show", "r-lost", "--runs-dir", str(runs_dir))
    assert "state      lost" in out
    before = looks.before("settle_run")
    assert (before.reads("r-lost"), before.scans) == (1, 0)
    assert before.looked([GONE.pid]) == {GONE.pid: 1}  # launcher and both ranks: one look
    assert run_dir.read_run_info().state == RunStatus.LOST


@pytest.mark.parametrize("launcher", [True, False], ids=["running", "orphaned"])
def test_one_observation_reads_run_json_once_and_looks_up_each_process_once(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch, launcher: bool
) -> None:
    run_dir, pids = a_run(runs_dir, pen, f"r-observe-{launcher}", launcher=launcher)
    observer = RunObserver(run_dir)
    for _ in range(2):  # each observation is one look
        with monkeypatch.context() as patched:
            looks = Looks(patched)
            state = observer.observe()
            assert state.status == (RunStatus.RUNNING if launcher else RunStatus.ORPHANED)
            seen = looks.now()
            assert (seen.reads(run_dir.run_id), seen.scans) == (1, 0)
            assert seen.looked(pids) == dict.fromkeys(pids, 1)


def test_the_run_screens_poll_and_the_runs_screens_listing_look_once(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll of the Run screen is one observation; a listing of the Runs screen reads an ended
    run once, ever, and observes a going one once a listing."""
    done = ended(runs_dir, "20260101-000000-made-done")
    run_dir, pids = a_run(runs_dir, pen, "20260101-000001-made-going")
    ours = (done.run_id, run_dir.run_id)
    reader, lister = RunReader(run_dir), RunLister(runs_dir)
    for listing in (1, 2):
        with monkeypatch.context() as patched:
            looks = Looks(patched)
            view = reader.poll()
            assert view is not None and view.run.status == RunStatus.RUNNING
            seen = looks.now()
            assert (seen.reads(*ours), seen.scans) == (1, 0)
            assert seen.looked(pids) == dict.fromkeys(pids, 1)
            looks = Looks(patched)
            assert [r.status for r in lister.list()] == [RunStatus.RUNNING, RunStatus.COMPLETED]
            seen = looks.now()
            assert (seen.reads(*ours), seen.scans) == (2 if listing == 1 else 1, 0)
            assert seen.looked(pids) == dict.fromkeys(pids, 1)


# ---- clean, rm and prune -----------------------------------------------------------------------


def test_ddptui_clean_takes_its_scans_look_at_each_run(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One /proc scan finds both runs; each run.json is read once (by grouping), and the live
    run's observer (for its stalled ranks) takes the scan's look, neither reading run.json nor
    looking its processes up again. Only the orphaned run's launcher, which the scan did not
    find, is looked up, once. Stopping looks each process up again right before its signal,
    and settling reads run.json after the stop: both after acting, by design."""
    confine_scans(monkeypatch, pen)
    orphaned, orphans = a_run(runs_dir, pen, "r-orphaned", launcher=False)
    _, lives = a_run(runs_dir, pen, "r-live")
    looks = Looks(monkeypatch)
    looks.at_first(clean, "stop_refs")
    nothing = runs_dir.parent / "no-leftovers"  # its files are no one else's to remove
    nothing.mkdir()
    cli("clean", "--yes", "--grace", "1", "--shm-dir", str(nothing), "--tmp-dir", str(nothing))
    before = looks.before("stop_refs")
    assert (before.reads("r-orphaned"), before.reads("r-live"), before.scans) == (1, 1, 1)
    assert before.looked([GONE.pid, *orphans, *lives]) == {GONE.pid: 1}
    assert orphaned.read_summary() is not None  # recorded killed
    assert all(psutil.Process(pid).status() != "zombie" for pid in lives)


def test_ddptui_rm_and_prune_observe_each_run_once(
    runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rm`` observes each run once and scans for live markers once before it removes, and once
    more right before removing (by design: a process may have started since). ``runs --prune``
    removes what its listing observed, without observing it again."""
    for run_id in ("20260101-000000-made-aaaa", "20260101-000001-made-bbbb"):
        ended(runs_dir, run_id)
    with monkeypatch.context() as patched:
        looks = Looks(patched)
        looks.at_first(run_removal, "_remove_tree")
        cli("rm", "aaaa", "--runs-dir", str(runs_dir), "--yes")
        before = looks.before("_remove_tree")
        assert (before.reads("20260101-000000-made-aaaa"), before.scans) == (1, 2)
    ended(runs_dir, "20260101-000002-made-cccc")
    with monkeypatch.context() as patched:
        looks = Looks(patched)
        looks.at_first(run_removal, "_remove_tree")
        cli("runs", "--prune", "--state", "completed", "--runs-dir", str(runs_dir), "--yes")
        before = looks.before("_remove_tree")
        pruned = ("20260101-000001-made-bbbb", "20260101-000002-made-cccc")
        assert (before.reads(*pruned), before.scans) == (2, 2)  # the listing's, one a run
    assert sorted(p.name for p in runs_dir.iterdir()) == []
