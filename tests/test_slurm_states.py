"""A run on Slurm's state from both sides, decided in one place (``engine.core.backends.slurm.state``
through the run observer): Slurm's word on its job (a stand-in here; the real one in
tests/slurm) and its node launchers' records. Pending with Slurm's reason, starting, running,
then completed, failed (the root cause's rank and node), killed, cancelled, timeout, node failure;
never lost while Slurm says the job is alive."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from engine.core.backends.slurm import node_loss
from engine.core.backends.slurm import state as slurm_state
from engine.core.backends.slurm.cluster import SlurmUnavailable, expand_hostlist
from engine.core.backends.slurm.jobs import JobLookup, JobState, SlurmJob, _from_sacct, _from_squeue
from engine.core.backends.slurm.records import SlurmPlacement, write_node_record
from engine.core.backends.slurm.state import settle_from_nodes
from engine.core.backends.slurm.watch import SlurmWatch
from engine.core.common.run_files import write_atomic
from engine.core.common.statuses import RunStatus, StopRequester
from engine.core.procs.process_identity import ProcessRef
from engine.core.runs.events import EventWriter, RankFailed, RankStarted
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir
from engine.core.runs.settle import settle_observed
from engine.core.runs.stop_request import StopRequest, read_stop_request
from tests.fixtures.call_counts import count_calls
from tests.fixtures.slurm_runs import JOB, node_record
from tests.fixtures.slurm_runs import slurm_run as make_slurm_run


@pytest.fixture(autouse=True)
def no_sinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Slurm here: which node of a NODE_FAIL job is down is told by its records alone."""

    def unavailable() -> None:
        raise SlurmUnavailable("no Slurm in this test")

    monkeypatch.setattr(node_loss, "read_cluster", unavailable)


def slurm_run(tmp_path: Path, *, created: float | None = None) -> RunDir:
    return make_slurm_run(tmp_path / "runs", created=created)


def job(state: JobState, **fields: object) -> SlurmJob:
    return SlurmJob(job_id=JOB, state=state, nodes=("n1", "n2"), **fields)  # type: ignore[arg-type]


def observe(run_dir: RunDir, found: JobLookup, *, settle: bool = False):  # type: ignore[no-untyped-def]
    state = RunObserver(run_dir, watch=SlurmWatch(lambda _job_id: found)).observe()
    return settle_observed(state) if settle else state  # the caller who asks writes it down


def test_pending_says_slurms_reason_and_expected_start(tmp_path: Path) -> None:
    run_dir = slurm_run(tmp_path)
    start = time.time() + 3600
    state = observe(run_dir, JobLookup(job(JobState.PENDING, reason="Resources", start_time=start)))
    assert state.status == RunStatus.PENDING
    assert state.reason.startswith("waiting for Slurm: Resources, expected to start ")
    assert state.status.active and not state.final
    shown = state.to_json()["placement"]  # ddptui show --json: the backend's own keys
    assert shown["backend"] == "slurm" and shown["job"]["reason"] == "Resources"
    assert shown["label"] == f"job {JOB}" and shown["waiting_for"] == "Resources"


def test_a_running_job_is_starting_until_its_node_launchers_record_themselves(
    tmp_path: Path,
) -> None:
    run_dir = slurm_run(tmp_path, created=time.time() - 3600)  # long past any grace
    running = JobLookup(job(JobState.RUNNING))
    assert observe(run_dir, running).status == RunStatus.STARTING  # never lost while it runs
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.RUNNING))
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.RUNNING))
    state = observe(run_dir, running)
    assert state.status == RunStatus.RUNNING and state.reason == f"job {JOB} on n1, n2"
    assert state.launcher_alive is True  # the node launchers judge silence, as a launcher does
    # Slurm cannot be asked: still not lost
    state = observe(run_dir, JobLookup(None, "`squeue --json` gave no answer within 15 s"))
    assert state.status == RunStatus.RUNNING and "cannot be asked" in state.reason


def test_completed_everywhere_is_completed_and_settled_once(tmp_path: Path) -> None:
    run_dir = slurm_run(tmp_path)
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.COMPLETED))
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.COMPLETED))
    assert settle_from_nodes(run_dir) == ""  # the batch script's last step
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.COMPLETED
    assert run_dir.read_run_info().state == RunStatus.COMPLETED
    state = observe(run_dir, JobLookup(job(JobState.RUNNING)))  # the summary stands
    assert state.status == RunStatus.COMPLETED
    assert [(r.rank, r.node) for r in state.ranks] == [(0, "n1"), (1, "n2")]


def test_a_failure_names_the_rank_its_node_and_its_traceback(tmp_path: Path) -> None:
    run_dir = slurm_run(tmp_path)
    for rank in (0, 1):
        with EventWriter(run_dir.rank_events_path(rank)) as w:
            w.write(RankStarted(rank=rank, world_size=2, pid=100 + rank, host="vm", device="cpu"))
    with EventWriter(run_dir.rank_events_path(1)) as w:
        w.write(RankFailed(rank=1, error="ValueError: bad batch", traceback="Traceback: here"))
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.KILLED))
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.FAILED))
    state = observe(run_dir, JobLookup(job(JobState.FAILED)), settle=True)
    assert state.status == RunStatus.FAILED
    summary = run_dir.read_summary()
    assert summary is not None and summary.failure is not None
    assert (summary.failure.rank, summary.failure.node) == (1, "n2")
    assert summary.failure.traceback == "Traceback: here"
    assert summary.reason == "rank 1 on n2 failed: ValueError: bad batch"


@pytest.mark.parametrize(
    ("slurm_end", "status", "reason"),
    [
        (JobState.CANCELLED, RunStatus.CANCELLED, f"job {JOB} was cancelled (scancel), not by ddptui kill"),
        (JobState.TIMEOUT, RunStatus.TIMEOUT, f"job {JOB} reached its time limit of 1 min"),
        (JobState.NODE_FAIL, RunStatus.NODE_FAILURE, f"node n2 failed: Slurm ended job {JOB} (NODE_FAIL)"),
        (JobState.PREEMPTED, RunStatus.CANCELLED, f"job {JOB} was preempted by Slurm, not by ddptui kill"),
    ],
)  # fmt: skip
def test_the_ends_only_slurm_can_tell(
    tmp_path: Path, slurm_end: JobState, status: RunStatus, reason: str
) -> None:
    run_dir = slurm_run(tmp_path)
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.KILLED))
    if slurm_end != JobState.NODE_FAIL:  # a failed node's launcher never reports
        write_node_record(run_dir.path, node_record("n2", 1, RunStatus.KILLED))
    state = observe(run_dir, JobLookup(job(slurm_end, time_limit_minutes=1)), settle=True)
    assert (state.status, state.reason) == (status, reason)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == status
    if slurm_end == JobState.NODE_FAIL:  # the root cause is the node, named as the reason says
        assert summary.failure is not None and summary.failure.who == "node n2"
        assert summary.failure.error == reason and summary.failure.rank is None
    else:
        assert summary.failure is None


def test_a_kill_request_makes_the_end_killed_with_each_node_verified_or_named(
    tmp_path: Path,
) -> None:
    run_dir = slurm_run(tmp_path)
    # the one stop-request every launcher reads; however old, it makes the end killed
    write_atomic(run_dir.layout.stop_request, '{"by": "ddptui kill", "time": 1.0, "user": "root"}')
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.KILLED))
    state = observe(run_dir, JobLookup(job(JobState.CANCELLED)))
    assert state.status == RunStatus.KILLED
    assert state.reason == (
        f"stopped by ddptui kill (job {JOB} cancelled); verified: n1; "
        "unverified: n2 (its node launcher did not report)"
    )
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.KILLED))
    state = observe(run_dir, JobLookup(job(JobState.CANCELLED)))
    assert state.reason.endswith("every node verified (n1, n2)")
    assert StopRequest(StopRequester.KILL, 1.0, "root").to_json()["user"] == "root"


def test_a_node_named_like_the_start_of_another_is_still_unverified() -> None:
    view = slurm_state.SlurmView(
        job_id=JOB,
        job=None,
        problem="",
        nodes={"gpu10": node_record("gpu10", 1, RunStatus.KILLED, clean=False)},
        kill=None,
    )
    assert slurm_state.verification(view, ("gpu1", "gpu10")) == (
        "not clean: gpu10 (1 process(es) left); unverified: gpu1 (its node launcher did not report)"
    )


def test_lost_only_when_slurm_has_no_record_and_no_node_said_how_it_ended(
    tmp_path: Path,
) -> None:
    fresh = slurm_run(tmp_path / "a")
    assert observe(fresh, JobLookup(None)).status == RunStatus.PENDING  # not listed yet
    old = slurm_run(tmp_path / "b", created=time.time() - 3600)
    state = observe(old, JobLookup(None))
    assert state.status == RunStatus.LOST and f"no record of job {JOB}" in state.reason
    ended = slurm_run(tmp_path / "c", created=time.time() - 3600)
    write_node_record(ended.path, node_record("n1", 0, RunStatus.COMPLETED))
    write_node_record(ended.path, node_record("n2", 1, RunStatus.COMPLETED))
    assert observe(ended, JobLookup(None)).status == RunStatus.COMPLETED


def test_slurms_own_words_are_read_defensively() -> None:
    assert expand_hostlist("n[1-3,07],gpu01,a[08-10]x") == (
        "n1", "n2", "n3", "n07", "gpu01", "a08x", "a09x", "a10x",
    )  # fmt: skip
    queued = _from_squeue(
        {"job_id": 7, "job_state": "PENDING", "state_reason": "Priority", "nodes": "",
         "start_time": 0, "time_limit": None}
    )  # fmt: skip
    assert (queued.state, queued.reason, queued.start_time, queued.nodes) == (
        JobState.PENDING, "Priority", None, (),
    )  # fmt: skip
    record_line = "7|CANCELLED by 0|n[1-2]|0:15|2026-12-05T02:22:21|2026-12-05T02:22:23|1"
    final = _from_sacct(record_line, "sacct -c")
    assert final is not None and final.state == JobState.CANCELLED and final.nodes == ("n1", "n2")
    assert _from_sacct("7.batch|COMPLETED|n1|0:0|x|y|z", "sacct") is None  # a step, not the job
    assert JobState.of("SOMETHING_NEW") == JobState.UNKNOWN and not JobState.UNKNOWN.alive


def test_a_step_of_an_allocation_ends_with_its_nodes_not_with_the_allocation(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    run_dir = slurm_run(tmp_path)
    info = run_dir.read_run_info()
    placed = SlurmPlacement(job_id=JOB, nodes=2, in_allocation=True).placement()
    step = replace(info, placement=placed)
    run_dir.write_run_info(step)
    allocation = JobLookup(job(JobState.RUNNING))  # the user's allocation goes on
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.COMPLETED))
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.RUNNING))
    assert observe(run_dir, allocation).status == RunStatus.RUNNING
    # the srun that started the step is gone, and n2 never said how its share ended
    run_dir.write_run_info(replace(step, launcher=ProcessRef(2**22 + 7, 1.0)))
    state = observe(run_dir, allocation)
    assert state.status == RunStatus.FAILED
    assert state.reason.startswith(f"its step of job {JOB} ended before n2 said how its share")
    # every node said it: completed, whatever the allocation does
    other = slurm_run(tmp_path / "other")
    other.write_run_info(replace(other.read_run_info(), placement=step.placement))
    write_node_record(other.path, node_record("n1", 0, RunStatus.COMPLETED))
    write_node_record(other.path, node_record("n2", 1, RunStatus.COMPLETED))
    assert observe(other, allocation).status == RunStatus.COMPLETED


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to give the directory away)")
def test_a_cancel_writes_no_word_into_another_users_run_and_still_cancels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.core.backends.slurm import stop as slurm_stop

    run_dir = slurm_run(tmp_path)
    placement = SlurmPlacement.of(run_dir.read_run_info())
    assert placement is not None
    asked: list[tuple[str, ...]] = []
    monkeypatch.setattr(slurm_stop, "run_slurm", lambda *args: asked.append(args))
    for path in [run_dir.path, *run_dir.path.rglob("*")]:  # nobody's run, stopped by root
        os.chown(path, 65534, 65534)
    assert slurm_stop.request_cancel(run_dir, placement, by=StopRequester.KILL) == ""
    assert asked == [("scancel", JOB)]
    assert not run_dir.layout.stop_request.exists()
    for path in [run_dir.path, *run_dir.path.rglob("*")]:  # root's own: the word is left
        os.chown(path, 0, 0)
    assert slurm_stop.request_cancel(run_dir, placement, by=StopRequester.KILL) == ""
    assert run_dir.layout.stop_request.exists()


def test_a_job_gone_from_the_queue_is_looked_up_in_sacct_once_per_poll_for_every_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engine.core.backends.slurm import jobs as slurm_jobs

    asked: list[str] = []
    ended = job(JobState.COMPLETED)

    def sacct(job_id: str) -> JobLookup:
        asked.append(job_id)
        return JobLookup(ended)

    monkeypatch.setattr(slurm_jobs, "final_record", sacct)
    queue = slurm_jobs.SlurmQueue()
    monkeypatch.setattr(queue, "job", lambda job_id: JobLookup(None))  # not in squeue any more
    records = slurm_jobs.FinalRecords(ttl=0.3)
    for _ in range(3):  # the follower, the observer and a screen in one poll
        assert slurm_jobs.read_job(JOB, queue, records).job == ended
    assert asked == [JOB]
    time.sleep(0.35)
    assert slurm_jobs.read_job(JOB, queue, records).job == ended
    assert asked == [JOB, JOB]


def test_the_slurm_backend_owns_a_slurm_run_and_describes_its_job_and_nodes(
    tmp_path: Path,
) -> None:
    """What `ddptui show` prints of where a Slurm run is comes from its backend's describe()."""
    from engine.core.backends.registry import LOCAL, backend_called, backend_for, backend_of

    SLURM = backend_called("slurm")

    run_dir = slurm_run(tmp_path)
    assert backend_of(run_dir) is SLURM
    state = observe(run_dir, JobLookup(job(JobState.PENDING, reason="Resources")))
    assert SLURM.describe(state) == (
        f"slurm      job {JOB} (PENDING: Resources); no node launcher yet",
    )
    write_node_record(run_dir.path, node_record("n1", 0, RunStatus.RUNNING))
    write_node_record(run_dir.path, node_record("n2", 1, RunStatus.RUNNING))
    state = observe(run_dir, JobLookup(job(JobState.RUNNING)))
    assert backend_for(state.info) is SLURM
    assert SLURM.describe(state) == (
        f"slurm      job {JOB} (RUNNING); n1 (ranks 0, running); n2 (ranks 1, running)",
    )
    assert backend_for(None) is LOCAL and LOCAL.describe(state) == ()
    # `ddptui ps` finds a Slurm run's processes in its node launchers' records
    info = run_dir.read_run_info()
    assert SLURM.locate(run_dir, info) == (
        (None, ProcessRef(200, 1.0)),
        (0, ProcessRef(100, 2.0)),
        (None, ProcessRef(201, 1.0)),
        (1, ProcessRef(101, 2.0)),
    )
    assert LOCAL.locate(run_dir, info) == ()  # run.json names none of them


def test_a_slurm_kill_looks_at_the_run_once_and_keeps_one_observer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One look at the run (``engine.core.runs.run_handle``) and one observer of it serve the
    whole kill: the stacks, the targets, the wait for the job's end and the summary. Before
    scancel, run.json is read once, and /proc is never scanned for the marker here (the handle
    scans only for a stop on this machine; a Slurm run's processes are its nodes')."""
    from engine.core.backends.slurm import state
    from engine.core.backends.slurm import stop as slurm_stop
    from engine.core.runs import run_handle

    run_dir = slurm_run(tmp_path)
    for index, node in enumerate(("n1", "n2")):
        write_node_record(run_dir.path, node_record(node, index, RunStatus.RUNNING))
    slurm_says = [JobState.RUNNING]
    monkeypatch.setattr(state, "read_job", lambda _job_id: JobLookup(job(slurm_says[-1])))
    calls: list[str] = []
    observers: list[RunObserver] = []

    class CountedObserver(RunObserver):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            observers.append(self)
            super().__init__(*args, **kwargs)

    snapshots: list[object] = []

    def snapshot(run_dir: RunDir, *, reason: str, state: object = None) -> None:
        snapshots.append(state)  # the kill's own observation, not one of its own

    cancelled: list[tuple[tuple[str, ...], tuple[int, int]]] = []

    def scancel(*args: str) -> None:
        cancelled.append((args, (calls.count("read"), calls.count("scan"))))
        for index, node in enumerate(("n1", "n2")):  # each node launcher proves its node
            write_node_record(run_dir.path, node_record(node, index, RunStatus.KILLED))
        slurm_says.append(JobState.CANCELLED)

    count_calls(monkeypatch, RunDir, "read_run_info", calls, "read")
    count_calls(monkeypatch, run_handle, "marked_processes", calls, "scan")
    monkeypatch.setattr(slurm_stop, "RunObserver", CountedObserver)
    monkeypatch.setattr(slurm_stop, "snapshot_slurm_run", snapshot)
    monkeypatch.setattr(slurm_stop, "run_slurm", scancel)
    result = slurm_stop.kill_slurm_run(run_dir, proof_wait=5.0)
    assert cancelled == [(("scancel", JOB), (1, 0))]
    assert len(observers) == 1
    assert len(snapshots) == 1 and getattr(snapshots[0], "status", None) == RunStatus.RUNNING
    assert result.ok and result.verified_nodes == ("n1", "n2") and result.summary_written
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == RunStatus.KILLED
    assert summary.reason.startswith(f"stopped by ddptui kill (job {JOB} cancelled)")
    # the word it left is the one record every launcher reads on its SIGTERM (node launchers too)
    assert read_stop_request(run_dir) == StopRequester.KILL
    assert sorted(p.name for p in run_dir.path.rglob("*.json") if "kill" in p.name) == []


def test_a_run_json_from_before_placement_still_reads_as_a_run_on_slurm(tmp_path: Path) -> None:
    """run.json kept a Slurm run's job under its own ``slurm`` key before there was one
    ``placement``: such a run is still Slurm's, observed through its watch, and written back in
    today's shape."""
    import json

    from engine.core.backends.registry import backend_called, backend_of
    from engine.core.runs.placement import Placement

    run_dir = slurm_run(tmp_path)
    data = json.loads(run_dir.run_json_path.read_text(encoding="utf-8"))
    data["slurm"] = {k: v for k, v in data.pop("placement").items() if k != "backend"}
    write_atomic(run_dir.run_json_path, json.dumps(data))
    info = run_dir.read_run_info()
    assert info.placement == Placement("slurm", data["slurm"])
    assert SlurmPlacement.of(info) == SlurmPlacement.from_json(data["slurm"])
    assert backend_of(run_dir) is backend_called("slurm")
    state = observe(run_dir, JobLookup(job(JobState.PENDING, reason="Priority")))
    assert state.status == RunStatus.PENDING and state.reason == "waiting for Slurm: Priority"
    written = info.to_json()
    assert "slurm" not in written and written["placement"]["job_id"] == JOB
