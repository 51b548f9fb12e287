"""A run whose launcher died without a summary gets a ``lost`` one from the next reader that asks
to settle it, and a SIGKILL is traced to the OOM killer when the kernel says so
(engine.core.runs.observer builds it, engine.core.runs.settle writes it, engine.core.host
.oom_evidence). Hand-made run directories; the real processes are in
tests/test_orphan_proof_runs.py."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from engine.core.common.statuses import RunStatus
from engine.core.config.faults import parse_fault
from engine.core.host import oom_evidence
from engine.core.host.oom_evidence import OomBaseline
from engine.core.procs.process_identity import ProcessRef
from engine.core.runs import settle
from engine.core.runs.observer import LAUNCHER_START_GRACE_SECONDS, RunObserver, observe_run
from engine.core.runs.rundir import RunDir, RunInfo
from engine.core.runs.settle import launcher_end, settle_observed
from engine.core.runs.summary import RunSummary
from tests.fixtures.made_runs import ProcessPen, make_run, rank_events, ref_of

LOST = RunStatus.LOST

GONE = ProcessRef(pid=999_999, start_time=1.0)  # a pid with a start time no process has

KERNEL_LOG = """\
[30566.370174] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,task=python,pid=7889,uid=0
[30566.370203] Memory cgroup out of memory: Killed process 7889 (python) total-vm:276308kB
[40000.000001] Out of memory: Killed process 4242 (python) total-vm:9999kB, anon-rss:1kB
"""


@pytest.fixture
def no_kernel_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's own kernel log and OOM count must not leak into these verdicts."""
    monkeypatch.setattr(oom_evidence, "read_kernel_log", lambda: "")
    monkeypatch.setattr(oom_evidence, "cgroup_oom_kills", lambda cgroup: 0)


def settle_lost_run(
    run_dir: RunDir, *, launcher_exit: int | None = None, now: float | None = None
) -> RunSummary | None:
    """Observe ``run_dir`` and settle what it found, as a reader that asks to (``launcher_exit``:
    as the launcher's parent, which saw it end); the lost summary this wrote, or None when it
    wrote nothing."""
    had_summary = run_dir.summary_path.exists()
    state = RunObserver(
        run_dir,
        clock=time.time if now is None else (lambda: now),
        launcher_poll=None if launcher_exit is None else (lambda: launcher_exit),
    ).observe()
    state = settle_observed(state)
    if had_summary or state.status != LOST:
        return None
    return run_dir.read_summary()


# ---- the lost summary -----------------------------------------------------------------------


def test_a_run_with_nothing_alive_gets_a_lost_summary_naming_how_far_each_rank_got(
    runs_dir: Path, no_kernel_evidence: None
) -> None:
    run_dir = make_run(
        runs_dir, "r", launcher=GONE, ranks=[GONE, GONE],
        events={"rank-0": rank_events(0, 12), "rank-1": rank_events(1, 11)},
    )  # fmt: skip
    summary = settle_lost_run(run_dir, launcher_exit=-9)
    assert summary is not None
    assert summary.status == LOST
    assert summary.failure is not None and summary.failure.rank is None
    assert summary.failure.signal == "SIGKILL"
    assert summary.launcher_end == (
        "the launcher (pid 999999) was killed by SIGKILL before it could write a summary"
    )
    assert [(r.rank, r.epoch, r.step, r.steps) for r in summary.ranks] == [
        (0, 0, 12, 30),
        (1, 0, 11, 30),
    ]
    assert summary.reason.endswith(
        "rank 0 reached epoch 1 step 12/30, rank 1 reached epoch 1 step 11/30"
    )
    assert run_dir.read_summary() == summary
    assert run_dir.read_run_info().state == LOST
    # settled once: a second reader changes nothing
    assert settle_lost_run(run_dir) is None


def test_nothing_is_written_while_a_rank_is_alive_or_a_summary_exists(
    runs_dir: Path, pen: ProcessPen
) -> None:
    rank = ref_of(pen.python())
    orphaned = make_run(runs_dir, "orphaned", launcher=GONE, ranks=[rank])
    assert settle_lost_run(orphaned) is None
    assert not orphaned.summary_path.exists()
    live = make_run(runs_dir, "live", launcher=rank)
    assert settle_lost_run(live) is None
    done = make_run(runs_dir, "done", launcher=GONE)
    done.summary_path.write_text('{"schema": 1, "status": "completed"}')
    assert settle_lost_run(done) is None
    assert done.summary_path.read_text() == '{"schema": 1, "status": "completed"}'


def test_a_run_that_never_named_its_launcher_is_lost_once_the_grace_is_over(
    runs_dir: Path, no_kernel_evidence: None
) -> None:
    early = make_run(runs_dir, "early", launcher=None)  # made 5 s ago
    assert settle_lost_run(early) is None  # a reader cannot tell it from a slow start yet
    later = time.time() + LAUNCHER_START_GRACE_SECONDS
    data = settle_lost_run(early, now=later)
    assert data is not None and data.status == LOST
    assert data.launcher_end == (
        "the launcher, before it recorded itself, ended without writing a summary"
    )
    assert "rank 0 had not started training" in data.reason
    # the follower, the launcher's parent, knows at once
    seen = make_run(runs_dir, "seen", launcher=None)
    data = settle_lost_run(seen, launcher_exit=-9)
    assert data is not None and data.failure is not None and data.failure.signal == "SIGKILL"
    assert data.ranks[0].state == "stopped"


def test_show_and_runs_settle_a_lost_run(runs_dir: Path, no_kernel_evidence: None) -> None:
    run_dir = make_run(runs_dir, "r", launcher=GONE, events={"rank-0": rank_events(0, 3)})
    progress = observe_run(run_dir)
    assert progress.status == LOST and progress.unsettled == progress.summary
    assert not run_dir.summary_path.exists()  # observing alone writes nothing
    progress = settle_observed(progress)  # what ddptui show and runs ask for
    assert progress.status == LOST and progress.unsettled is None
    assert progress.summary is not None
    assert "(pid 999999) ended without writing a summary" in progress.summary.reason
    assert run_dir.read_summary() == progress.summary


BASELINE = OomBaseline(
    boot_id="this-boot", uptime=30000.0, cgroup="/sys/fs/cgroup/run", cgroup_oom_kills=3
)


def test_the_launchers_end_reads_its_exit_status_and_the_oom_evidence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    info = RunInfo(
        run_id="r", preset="p", host="h", created=0.0, state="running", world_size=1,
        devices="cpu:1", launcher=ProcessRef(4242, 1.0), oom_baseline=BASELINE,
    )  # fmt: skip
    monkeypatch.setattr(oom_evidence, "boot_id", lambda: "this-boot")
    monkeypatch.setattr(oom_evidence, "read_kernel_log", lambda: "")
    monkeypatch.setattr(oom_evidence, "cgroup_oom_kills", lambda cgroup: 3)
    assert launcher_end(info, 1).error == (
        "the launcher (pid 4242) exited with code 1 without writing a summary"
    )
    assert launcher_end(info, -15).signal == "SIGTERM"
    monkeypatch.setattr(oom_evidence, "cgroup_oom_kills", lambda cgroup: 4)
    assert launcher_end(info, -9).error.endswith(
        "; likely out of memory: the run's memory cgroup (/sys/fs/cgroup/run) counted 1 OOM "
        "kill during the run"
    )
    monkeypatch.setattr(oom_evidence, "read_kernel_log", lambda: KERNEL_LOG)
    assert launcher_end(info, None).error == (
        "the launcher (pid 4242) ended without writing a summary; killed by the kernel's "
        "out-of-memory killer (the kernel log names it)"
    )
    assert settle.launcher_end(info, -15).error.count(";") == 0  # SIGTERM is no OOM kill


# ---- OOM evidence ---------------------------------------------------------------------------


def test_the_kernel_log_names_an_oom_victim_in_either_format() -> None:
    assert oom_evidence.kernel_log_names_oom_kill(7889, KERNEL_LOG)
    assert oom_evidence.kernel_log_names_oom_kill(4242, KERNEL_LOG)
    assert not oom_evidence.kernel_log_names_oom_kill(788, KERNEL_LOG)
    assert not oom_evidence.kernel_log_names_oom_kill(42, KERNEL_LOG)
    assert not oom_evidence.kernel_log_names_oom_kill(7889, None)
    # a line logged before the run started names an earlier process with that pid
    assert not oom_evidence.kernel_log_names_oom_kill(7889, KERNEL_LOG, since=35000.0)
    assert oom_evidence.kernel_log_names_oom_kill(4242, KERNEL_LOG, since=35000.0)


def test_no_evidence_about_this_run_is_no_verdict() -> None:
    def cause(baseline: OomBaseline | None, *, kills: int, boot: str = "this-boot") -> str:
        return oom_evidence.sigkill_cause(
            5, baseline, kernel_log="", cgroup_kills_now=kills, this_boot=boot
        )

    assert cause(BASELINE, kills=3) == ""
    assert "counted 2 OOM kills" in cause(BASELINE, kills=5)
    assert cause(None, kills=99) == ""  # a run.json from before baselines were kept
    assert cause(BASELINE, kills=99, boot="another-boot") == ""  # a copied or old run
    assert cause(replace(BASELINE, cgroup_oom_kills=None), kills=99) == ""


def test_a_copied_run_is_not_called_out_of_memory_by_the_machine_counter(
    runs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from tests.fixtures.repo import REPO_ROOT
    from tests.ui.standins import LIVE_RUN, RECORDED

    vmstat = oom_evidence.Path("/proc/vmstat").read_text()
    assert "oom_kill" in vmstat  # the machine-wide counter that used to be taken for evidence
    monkeypatch.setattr(oom_evidence, "read_kernel_log", lambda: "")
    copied = runs_dir / LIVE_RUN
    shutil.copytree(REPO_ROOT / RECORDED / LIVE_RUN, copied)
    data = json.loads((copied / "run.json").read_text())
    data["oom_kills_at_start"] = 0  # what an older ddptui recorded: the machine's count
    (copied / "run.json").write_text(json.dumps(data))
    state = observe_run(RunDir(copied))
    assert state.status == LOST
    assert "out of memory" not in state.reason


def test_the_new_fault_kinds_parse() -> None:
    assert parse_fault("oom:1:3").kind == "oom"
    assert parse_fault("kill-launcher:0:5").kind == "kill-launcher"


def test_only_a_starting_running_or_orphaned_run_may_still_have_processes() -> None:
    # the observer probes for SIGSTOPped ranks and counts elapsed time only for these
    assert {s for s in RunStatus if s.live} == {
        RunStatus.QUEUED,  # its waiter waits in the machine's queue, and becomes its launcher
        RunStatus.PENDING,  # a run on Slurm whose job has not started: it may at any moment
        RunStatus.STARTING,
        RunStatus.RUNNING,
        RunStatus.ORPHANED,
    }
    assert not any(s.live for s in RunStatus if s.final)
