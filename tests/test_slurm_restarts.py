"""A run on Slurm going on as its next attempt, without a cluster (Slurm's word and ``sinfo`` are
stand-ins here; the real thing: tests/slurm/test_slurm_runs.py): a job Slurm requeued after a
node failure begins the next attempt from its batch script's first step, the lost node named;
a failed attempt goes on in its allocation from the script's last step; the restarts allowed are
counted across both, and Slurm is told not to requeue once they are used up; while Slurm holds
the requeued job the run is pending, restarting, never over; a node launcher stops only its own
attempt's processes."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from engine.core.backends.slurm import job_steps, node_loss, restarts
from engine.core.backends.slurm.cluster import SlurmCluster, SlurmNode
from engine.core.backends.slurm.jobs import JobLookup, JobState, SlurmJob
from engine.core.backends.slurm.node_proof import prove_node_clean
from engine.core.backends.slurm.records import (
    SlurmPlacement,
    read_node_records,
    store_address_path,
    write_node_record,
)
from engine.core.backends.slurm.restarts import begin_after_requeue, finish_attempt
from engine.core.backends.slurm.watch import SlurmWatch
from engine.core.common.run_environment import ATTEMPT_ENV, NODE_ENV
from engine.core.common.run_files import write_atomic
from engine.core.common.statuses import RunStatus
from engine.core.config.toml_io import apply_overrides, to_toml
from engine.core.runs.checkpoint_record import CheckpointRecord, write_checkpoint_record
from engine.core.runs.events import EventWriter, RankFailed
from engine.core.runs.node_files import read_node_gpus
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir
from engine.core.runs.settle import settle_observed
from engine.core.runs.summary import AttemptStart
from tests.fixtures.made_runs import ProcessPen, marker_env, rank_events
from tests.fixtures.slurm_runs import JOB, RUN_ID, no_gpus, node_record, slurm_run


@pytest.fixture(autouse=True)
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """What Slurm's commands would answer: every ``scontrol`` asked is recorded, no wait."""
    commands: list[tuple[str, ...]] = []

    def scontrol(program: str, *args: str, **_kw: object) -> None:
        commands.append((program, *args))

    monkeypatch.setattr(restarts, "run_slurm", scontrol)
    monkeypatch.setattr(restarts.time, "sleep", lambda _s: None)
    return commands


def sinfo(monkeypatch: pytest.MonkeyPatch, **nodes: SlurmNode) -> None:
    cluster = SlurmCluster(partitions=(), nodes=tuple(nodes.values()))
    monkeypatch.setattr(node_loss, "read_cluster", lambda: cluster)


def restartable_run(tmp_path: Path, max_restarts: int = 1) -> RunDir:
    """A cpu-demo run on n1 and n2 with ``max_restarts``, a checkpoint at step 10, its ranks
    past step 14: n1's launcher stopped by Slurm, n2's never said how its share ended."""
    run_dir = slurm_run(tmp_path / "runs")
    config = apply_overrides(
        run_dir.load_config(),
        {"supervision.max_restarts": max_restarts, "supervision.restart_backoff_seconds": 0.0},
    )
    write_atomic(run_dir.config_path, to_toml(config))
    for rank in (0, 1):
        with EventWriter(run_dir.rank_events_path(rank)) as w:
            for event in rank_events(rank, 14):
                w.write(event)
    run_dir.checkpoint_path.write_bytes(b"a checkpoint")
    record = CheckpointRecord(0, 10, 10, 30, 2, "small_cnn", 12, time.time())
    write_checkpoint_record(run_dir.path, record)
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.KILLED))
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.RUNNING))
    return run_dir


def requeued(restarts_count: int, state: JobState = JobState.RUNNING) -> JobLookup:
    job = SlurmJob(JOB, state, reason="BeginTime", restarts=restarts_count)
    return JobLookup(job)


def test_a_requeued_job_writes_the_lost_node_down_and_begins_the_next_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: list[tuple[str, ...]]
) -> None:
    run_dir = restartable_run(tmp_path)
    no_gpus(run_dir, "n1", time.time())
    store_address_path(run_dir.path).parent.mkdir(exist_ok=True)
    write_atomic(store_address_path(run_dir.path), '{"job_id": "4242"}')
    back = time.time() + 5  # n2's slurmd started again after the attempt's launchers started
    sinfo(monkeypatch, n1=SlurmNode("n1", state="idle"), n2=SlurmNode("n2", slurmd_started=back))
    # the job's first run for this attempt: it begins as it is
    assert begin_after_requeue(run_dir, 0, jobs=lambda _j: requeued(0)) is None
    assert not run_dir.layout.attempts_dir.exists()

    decision = begin_after_requeue(run_dir, 1, jobs=lambda _j: requeued(1))
    assert decision is not None and decision.restart and decision.from_step == 10
    earlier = RunDir(run_dir.layout.attempt(1).path)
    ended = earlier.read_summary()
    assert ended is not None and ended.status == RunStatus.NODE_FAILURE
    (record,) = ended.attempts
    at = time.strftime("%H:%M:%S", time.localtime(back))
    assert record.reason == (
        f"node n2 (its slurmd started again at {at}, after the attempt began) failed: Slurm "
        f"requeued job {JOB} (NODE_FAIL)"
    )
    assert record.failure is not None and record.failure.who == "node n2"
    assert (record.where, record.reached_step, record.step_exact) == (
        "n1, n2 (job 4242)",
        14,
        False,
    )
    assert (
        record.describe()
        == f"attempt 1 on n1, n2 (job 4242), node-failure after step 14: {record.reason}"
    )
    # the attempt's records moved below attempts/1/: its nodes, its GPU samples, where it met
    assert sorted(read_node_records(earlier.path)[0]) == ["n1", "n2"]
    assert read_node_records(run_dir.path)[0] == {} and read_node_gpus(run_dir.path) == {}
    assert sorted(read_node_gpus(earlier.path)) == ["n1"]
    assert store_address_path(earlier.path).is_file()
    assert not store_address_path(run_dir.path).exists()
    kept = SlurmPlacement.of(earlier.read_run_info())
    assert kept is not None and (kept.job_id, kept.requeues) == (JOB, 0)
    # run.json names attempt 2, a restart under the job's restart count 1
    info = run_dir.read_run_info()
    placement = SlurmPlacement.of(info)
    assert placement is not None and (info.attempt, info.state) == (2, RunStatus.STARTING)
    assert (placement.job_id, placement.requeues, placement.attempt_start) == (JOB, 1, "restart")
    assert restarts.attempt_start(info) == AttemptStart.RESTART
    # its one restart used: Slurm is told not to requeue the job again
    assert asked == [("scontrol", "update", f"JobId={JOB}", "Requeue=0")]
    assert begin_after_requeue(run_dir, 1, jobs=lambda _j: requeued(1)) is None

    # Slurm requeued it once more all the same: the run ends there, saying why
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.KILLED))
    decision = begin_after_requeue(run_dir, 2, jobs=lambda _j: requeued(2))
    assert decision is not None and not decision.restart
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.NODE_FAILURE
    assert summary.reason.endswith(
        "it failed again after 1 restart, all that --max-restarts 1 allows"
    )
    assert [(a.status, a.start) for a in summary.attempts] == [
        (RunStatus.NODE_FAILURE, AttemptStart.FIRST),
        (RunStatus.NODE_FAILURE, AttemptStart.RESTART),
    ]
    assert job_steps.main(["begin", str(run_dir.path)]) == job_steps.OVER  # the script ends


def test_while_slurm_holds_the_requeued_job_the_run_is_pending_restarting_never_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = restartable_run(tmp_path)
    sinfo(monkeypatch, n2=SlurmNode("n2", state="down+not_responding", reason="Not responding"))
    start = time.time() + 120
    held = requeued(1, JobState.PENDING)
    assert held.job is not None
    held = JobLookup(replace(held.job, start_time=start))
    state = settle_observed(RunObserver(run_dir, watch=SlurmWatch(lambda _j: held)).observe())
    assert state.status == RunStatus.PENDING and not state.final
    expected = time.strftime("%H:%M", time.localtime(start))
    assert state.reason == (
        "restarting: attempt 1 ended, node n2 (down: Not responding) failed; Slurm requeued "
        f"job {JOB}; waiting for Slurm: BeginTime, expected to start {expected}"
    )
    shown = state.to_json()["placement"]
    assert shown["requeued"] is True and shown["lost_nodes"] == ["n2"]
    assert not run_dir.summary_path.exists()  # nothing settled while Slurm will start it again


def test_a_failed_attempt_goes_on_in_its_allocation_then_ends_as_its_nodes_say(
    tmp_path: Path, asked: list[tuple[str, ...]]
) -> None:
    run_dir = restartable_run(tmp_path)
    with EventWriter(run_dir.rank_events_path(1)) as w:
        w.write(RankFailed(rank=1, error="RuntimeError: crash", traceback="", global_step=15))
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.RUNNING))
    assert finish_attempt(run_dir) is None  # n2 has not said how its share ended: a reader's
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.FAILED))
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.FAILED))
    decision = finish_attempt(run_dir)
    assert decision is not None and decision.restart and decision.from_step == 10
    ended = RunDir(run_dir.layout.attempt(1).path).read_summary()
    assert ended is not None and ended.status == RunStatus.FAILED
    (record,) = ended.attempts
    assert (record.reached_step, record.step_exact) == (15, True)
    assert record.failure is not None and record.failure.who == "rank 1 on n2"
    info = run_dir.read_run_info()
    placement = SlurmPlacement.of(info)
    assert placement is not None and (info.attempt, placement.requeues) == (2, 0)
    assert asked == [("scontrol", "update", f"JobId={JOB}", "Requeue=0")]

    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.COMPLETED))
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.COMPLETED))
    assert job_steps.main(["finish", str(run_dir.path)]) == job_steps.OVER
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.COMPLETED
    assert [(a.status, a.start) for a in summary.attempts] == [
        (RunStatus.FAILED, AttemptStart.FIRST),
        (RunStatus.COMPLETED, AttemptStart.RESTART),
    ]


def test_without_restarts_a_failure_is_the_runs_end(
    tmp_path: Path, asked: list[tuple[str, ...]]
) -> None:
    run_dir = restartable_run(tmp_path, max_restarts=0)
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.FAILED))
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.FAILED))
    assert job_steps.main(["finish", str(run_dir.path)]) == job_steps.OVER
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.FAILED
    assert "max-restarts" not in summary.reason  # no restart was asked for: nothing to say
    assert not run_dir.layout.attempts_dir.exists() and asked == []


def test_a_node_launcher_stops_only_its_own_attempts_processes(
    tmp_path: Path, pen: ProcessPen
) -> None:
    run_dir = slurm_run(tmp_path / "runs")
    env = {**marker_env(tmp_path / "runs", RUN_ID), NODE_ENV: "n1", ATTEMPT_ENV: "2"}
    later = pen.orphan(env=env)  # a process of attempt 2 on n1 (no rank is its parent)
    elsewhere = pen.orphan(env={**env, NODE_ENV: "n2"})
    proof = prove_node_clean(run_dir, "n1", {}, attempt=1)  # attempt 1's launcher, outliving
    assert later.is_running() and proof.daemons == () and proof.left == ()
    proof = prove_node_clean(run_dir, "n1", {}, attempt=2)
    assert pen.wait_until(lambda: not later.is_running() or later.status() == psutil.STATUS_ZOMBIE)
    assert len(proof.daemons) == 1 and f"pid {later.pid} " in proof.daemons[0]
    assert elsewhere.is_running()  # another node's
