"""``ddptui run --slurm`` on the two-node test cluster: a preset and a plain DDP script across two
nodes, each rank on its node, the job's id recorded, the run's end decided from Slurm's side and
the node launchers' records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.core.backends.slurm.records import (
    SlurmPlacement,
    job_output_path,
    read_node_records,
)
from engine.core.runs.checkpoint_record import CheckpointRecord, read_checkpoint_record
from engine.core.runs.events import RankStalled, StepProgress, read_events
from engine.core.runs.node_files import read_node_gpus
from engine.core.runs.recorded_environment import read_environment
from engine.core.runs.rundir import RunDir, list_runs
from tests.fixtures.live_runs import ddptui, marked
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for
from tests.slurm.cluster import SlurmTestCluster

pytestmark = pytest.mark.slow

SHORT = ["--epochs", "1", "--max-steps", "10"]
SCRIPT = str(REPO_ROOT / "tests" / "fixtures" / "tutorial_ddp.py")
NO_CHECKPOINT = CheckpointRecord(0, 0, 0, 0, 0, "", 0, 0.0)
# A script that steps for as long as it is let: 5 steps a second, little CPU.
ENDLESS = ["--", "--epochs", "1000", "--steps", "20", "--step-seconds", "0.2"]


@dataclass
class KeptRun:
    runs_dir: Path
    run_id: str
    job_id: str
    submitted: float


@pytest.fixture(scope="module", autouse=True)
def timeout_run(
    slurm_cluster: SlurmTestCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KeptRun]:
    """A run on one node with a time limit of 1 minute (Slurm's least), submitted before this
    module's other tests so that its limit runs out while they run; the last test checks its end.
    Its processes carry a marker of their own, not a test's: no test's reaper ends them."""
    runs = tmp_path_factory.mktemp("timeout-runs")
    env = {
        **os.environ,
        **slurm_cluster.env(),
        "DDPTUI_TEST_ID": f"{os.getpid()}-slurm-timeout-run",
        "PYTHONUNBUFFERED": "1",
    }
    started = subprocess.run(
        [
            sys.executable, "-m", "ddptui", "run", SCRIPT, "--slurm", "--nodes", "1",
            "--devices", "cpu:1", "--time", "1", "--sbatch", "nodelist=n1",
            "--runs-dir", str(runs), "--detach", *ENDLESS,
        ],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    run_dir = RunDir(runs / started.stdout.strip())
    placement = SlurmPlacement.of(run_dir.read_run_info())
    assert placement is not None
    kept = KeptRun(runs, run_dir.run_id, placement.job_id, time.monotonic())
    slurm_cluster.kept_jobs.add(kept.job_id)
    try:
        yield kept
    finally:
        slurm_cluster.kept_jobs.discard(kept.job_id)
        slurm_cluster.run("scancel", kept.job_id, check=False)
        wait_for(lambda: kept.job_id not in slurm_cluster.active_jobs(), timeout=30)
        wait_for(lambda: not marked(kept.run_id), timeout=15)


def show_json(run_dir: RunDir, runs_dir: Path) -> dict[str, object]:
    """What ``ddptui show RUN --json`` says of the run now."""
    said = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir), "--json")
    return json.loads(said.stdout)  # type: ignore[no-any-return]


def state_once_n2_is_lost(
    slurm: SlurmTestCluster, run_dir: RunDir, runs_dir: Path
) -> dict[str, object]:
    """Kill n2's slurmd (a node lost, as Slurm sees it) and follow ``ddptui show`` until the run
    neither starts nor runs; n2's slurmd is started again then, whatever happened. The state
    ``ddptui show`` said last."""
    slurm.kill_slurmd("n2")
    states: list[dict[str, object]] = []
    try:

        def moved_on() -> bool:
            states.append(show_json(run_dir, runs_dir))
            return states[-1]["state"] not in ("running", "starting")

        assert wait_for(moved_on, timeout=120, interval=2.0), states[-1:]
    finally:
        slurm.start_slurmd("n2")
    return states[-1]


def what_it_did(run_dir: RunDir, said: dict[str, object], slurm: SlurmTestCluster, job: str) -> str:
    """For a failed wait: the state and reason ``ddptui show`` said last, the queue, and the last
    lines of every log of the run and of what the daemons said of job ``job``, so that a CI
    failure says where it stopped."""
    lines = [f"state {said.get('state')!r}: {said.get('reason')!r}", f"nodes {slurm.node_states()}"]
    lines.append("squeue: " + slurm.run("squeue", "-h", "-o", "%i %T %r %N", check=False).strip())
    lines.append("steps: " + slurm.run("squeue", "-h", "-s", "-o", "%i %N", check=False).strip())
    for log in [job_output_path(run_dir.path), *sorted(run_dir.layout.logs_dir.glob("*.log"))]:
        tail = log.read_text(errors="replace").splitlines()[-8:] if log.is_file() else []
        lines.append(f"-- {log.name}:\n" + "\n".join(tail))
    for daemon in ("slurmctld", "slurmd-n1", "slurmd-n2"):
        said_of_job = [
            line
            for line in slurm.log(daemon).read_text(errors="replace").splitlines()
            if job in line or "n2" in line
        ]
        lines.append(f"-- {daemon}:\n" + "\n".join(said_of_job[-30:]))
    return "\n".join(lines)


def only_run(runs_dir: Path) -> RunDir:
    runs = list_runs(runs_dir)
    assert len(runs) == 1, runs
    return runs[0]


def test_a_preset_across_two_nodes_reaches_the_accuracy_of_one_machine(
    slurm: SlurmTestCluster, runs_dir: Path, tmp_path: Path
) -> None:
    done = ddptui(
        "run", "cpu-demo", "--slurm", "--nodes", "2", "--devices", "cpu:1", *SHORT,
        "--runs-dir", str(runs_dir), "--json", timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    on_slurm = json.loads(done.stdout)
    assert on_slurm["status"] == "completed" and on_slurm["world_size"] == 2
    run_dir = only_run(runs_dir)
    assert not marked(run_dir.run_id)  # nothing of it is left on the machine

    shown = json.loads(ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir), "--json").stdout)
    assert [(r["rank"], r["node"], r["state"]) for r in shown["ranks"]] == [
        (0, "n1", "done"),
        (1, "n2", "done"),
    ]
    placed = shown["placement"]  # the Slurm backend's own keys, and its label
    job_id = placed["job_id"]
    assert int(job_id) >= slurm.first_job_id and placed["label"] == f"job {job_id}"
    assert placed["backend"] == "slurm" and placed["across_nodes"] is True
    assert sorted(placed["nodes"]) == ["n1", "n2"]
    assert all(n["verified"] for n in placed["nodes"].values())
    records, _ = read_node_records(run_dir.path)
    assert {n: r.proof.clean for n, r in records.items() if r.proof} == {"n1": True, "n2": True}
    # each node launcher sampled its node's GPUs there (none on this machine: NVML says why)
    samples = read_node_gpus(run_dir.path)
    assert sorted(samples) == ["n1", "n2"]
    assert all(s.inventory.error or s.inventory.gpus for s in samples.values())

    # the same run on one machine: two CPU ranks, the same global batch and seed
    local_runs = tmp_path / "local"
    local = ddptui(
        "run", "cpu-demo", "--devices", "cpu:2", *SHORT, "--runs-dir", str(local_runs),
        "--json", timeout=180,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    one_machine = json.loads(local.stdout)
    assert on_slurm["test_accuracy"] == pytest.approx(one_machine["test_accuracy"], abs=1e-6)
    assert on_slurm["global_batch"] == one_machine["global_batch"]


def test_a_plain_ddp_script_across_two_nodes_reports_every_ranks_progress(
    slurm: SlurmTestCluster, runs_dir: Path
) -> None:
    done = ddptui(
        "run", SCRIPT, "--slurm", "--nodes", "2", "--devices", "cpu:1",
        "--runs-dir", str(runs_dir), "--", "--epochs", "1", "--steps", "12", timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    assert "Slurm job" in done.stdout and "completed:" in done.stdout
    run_dir = only_run(runs_dir)
    for rank in (0, 1):
        steps = [
            e.global_step
            for e in read_events(run_dir.rank_events_path(rank))
            if isinstance(e, StepProgress)
        ]
        assert steps and steps[-1] == 12, (rank, steps)
    records, _ = read_node_records(run_dir.path)
    assert {r.node: r.global_ranks for r in records.values()} == {"n1": (0,), "n2": (1,)}
    assert {r.node: str(r.state) for r in records.values()} == {
        "n1": "completed",
        "n2": "completed",
    }
    # node 0's launcher recorded what the ranks ran with, torch's version without importing it
    environment = read_environment(run_dir)
    assert environment is not None and environment.torch and environment.threads_per_rank
    assert environment.cuda.startswith("unknown (the launcher of a script run")
    assert environment.outside_load_cores is not None


def test_a_hang_on_the_second_node_is_flagged_named_and_killed_with_every_node_verified(
    slurm: SlurmTestCluster, runs_dir: Path
) -> None:
    started = ddptui(
        "run", "cpu-demo", "--slurm", "--nodes", "2", "--devices", "cpu:1", "--epochs", "1",
        "--max-steps", "60", "--fault", "hang:1:4", "--runs-dir", str(runs_dir), "--detach",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_dir = RunDir(runs_dir / started.stdout.strip())

    def state() -> dict[str, object]:
        shown = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir), "--json")
        return json.loads(shown.stdout)  # type: ignore[no-any-return]

    # flagged within 30 s of the rank's last progress, by the node launcher of its node
    seen: list[dict[str, object]] = []

    def stalled() -> bool:
        seen.append(state())
        return 1 in seen[-1]["stalled_ranks"]  # type: ignore[operator]

    assert wait_for(stalled, timeout=150, interval=1.0), seen[-1:]
    flagged = seen[-1]
    rank1 = next(r for r in flagged["ranks"] if r["rank"] == 1)  # type: ignore[attr-defined]
    assert rank1["node"] == "n2"
    stalls = [
        e
        for path in run_dir.launcher_event_paths()
        for e in read_events(path)
        if isinstance(e, RankStalled) and e.rank == 1
    ]
    assert stalls and stalls[0].time - rank1["last_event_time"] <= 30.0

    stacks = ddptui("stacks", run_dir.run_id, "--runs-dir", str(runs_dir), "--json")
    assert stacks.returncode == 0, stacks.stderr
    snapshot = json.loads(stacks.stdout)
    assert snapshot["culprit_rank"] == 1
    culprit = next(r for r in snapshot["ranks"] if r["rank"] == 1)
    assert culprit["node"] == "n2" and "hang" in culprit["describe"]
    assert culprit["describe"].startswith("rank 1 on n2 stuck")
    assert next(r for r in snapshot["ranks"] if r["rank"] == 0)["node"] == "n1"

    began = time.monotonic()
    killed = ddptui("kill", run_dir.run_id, "--runs-dir", str(runs_dir), "--json", timeout=60)
    took = time.monotonic() - began
    assert killed.returncode == 0, killed.stdout + killed.stderr
    result = json.loads(killed.stdout)
    assert result["verified_nodes"] == ["n1", "n2"] and result["unverified_nodes"] == []
    assert not marked(run_dir.run_id), "a process of the run is left on the machine"
    assert took <= 15.0, f"kill took {took:.1f} s"
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "killed"
    assert "every node verified (n1, n2)" in summary.reason
    # each node launcher read the one stop-request on its SIGTERM: its share says who asked
    records, _ = read_node_records(run_dir.path)
    reasons = {n: r.reason for n, r in records.items()}
    assert sorted(reasons) == ["n1", "n2"], reasons
    assert all(r.startswith("stopped by ddptui kill") for r in reasons.values()), reasons
    assert set(slurm.active_jobs()) <= slurm.kept_jobs


def test_a_job_that_cannot_start_yet_is_pending_with_slurms_reason(
    slurm: SlurmTestCluster, runs_dir: Path
) -> None:
    started = ddptui(
        "run", "cpu-demo", "--slurm", "--nodes", "2", "--devices", "cpu:1",
        "--sbatch", "begin=now+3600", "--runs-dir", str(runs_dir), "--detach",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    shown = json.loads(ddptui("show", run_id, "--runs-dir", str(runs_dir), "--json").stdout)
    assert shown["state"] == "pending"
    assert shown["reason"].startswith("waiting for Slurm: BeginTime, expected to start ")
    assert shown["placement"]["job"]["state"] == "PENDING"
    assert shown["placement"]["waiting_for"] == "BeginTime"
    listed = ddptui("runs", "--runs-dir", str(runs_dir)).stdout
    assert f"{run_id}  cpu-demo  pending" in listed
    killed = ddptui("kill", run_id, "--runs-dir", str(runs_dir))
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "cancelled while it was pending" in killed.stdout
    summary = RunDir(runs_dir / run_id).read_summary()
    assert summary is not None and summary.status == "killed"
    assert set(slurm.active_jobs()) <= slurm.kept_jobs


def test_a_node_whose_slurmd_dies_ends_the_run_as_a_node_failure_naming_it(
    slurm: SlurmTestCluster, runs_dir: Path
) -> None:
    started = ddptui(
        "run", SCRIPT, "--slurm", "--nodes", "2", "--devices", "cpu:1",
        "--runs-dir", str(runs_dir), "--detach", *ENDLESS,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_dir = RunDir(runs_dir / started.stdout.strip())
    stepping = wait_for(
        lambda: all(
            any(isinstance(e, StepProgress) for e in read_events(run_dir.rank_events_path(r)))
            for r in (0, 1)
        ),
        timeout=90,
    )
    assert stepping, "the ranks never stepped"
    last = state_once_n2_is_lost(slurm, run_dir, runs_dir)
    assert last["state"] == "node-failure", last
    assert str(last["reason"]).startswith("node n2 (down"), last["reason"]
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "node-failure"
    # the rank the dead slurmd left behind ends once its peer is gone; nothing is left
    assert wait_for(lambda: not marked(run_dir.run_id), timeout=30)


def test_a_lost_node_with_a_restart_left_requeues_the_job_and_the_run_completes(
    slurm: SlurmTestCluster, runs_dir: Path
) -> None:
    """Issue 29's done-when on Slurm: a killed slurmd and --max-restarts 1. Slurm requeues the
    job; on two nodes its next run waits for the lost one to answer again, as it would for any
    two free nodes of a larger cluster; the test brings n2's slurmd back and, once nothing of
    attempt 1 is left on n2 and n2 told slurmctld so (a crashed node leaves nothing; a killed
    slurmd leaves its job steps until they end, which Slurm's two-minute hold of a requeued job
    waits out), lets the job go at once (its owner may: ``scontrol update StartTime=now``).
    Attempt 1 steps slowly (the slow fault: 2 steps a second, attempt 1 only) so that it is
    still going when Slurm counts n2 down."""
    started = ddptui(
        "run", "cpu-demo", "--slurm", "--nodes", "2", "--devices", "cpu:1", "--epochs", "1",
        "--batch-size", "32", "--max-steps", "140", "--max-restarts", "1",
        "--fault", "slow:0:0", "--set", "training.checkpoint_every=10",
        "--runs-dir", str(runs_dir), "--detach",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_dir = RunDir(runs_dir / started.stdout.strip())
    placement = SlurmPlacement.of(run_dir.read_run_info())
    assert placement is not None
    job_id = placement.job_id
    checkpointed = wait_for(
        lambda: (read_checkpoint_record(run_dir.path) or NO_CHECKPOINT).global_step >= 10,
        timeout=120,
    )
    assert checkpointed, "attempt 1 never wrote a checkpoint"
    pending = state_once_n2_is_lost(slurm, run_dir, runs_dir)
    assert pending["state"] == "pending", pending  # never settled as over while requeued
    assert str(pending["reason"]).startswith("restarting: attempt 1 ended, node n2 (down"), pending
    assert f"Slurm requeued job {job_id}" in str(pending["reason"])
    left = wait_for(
        lambda: not marked(run_dir.run_id) and not slurm.job_processes(job_id, "n2"), timeout=60
    )
    assert left, f"attempt 1 still runs on n2: {slurm.job_processes(job_id, 'n2')}"
    # and n2 told slurmctld that the job's run there ended, before its next run may begin
    assert wait_for(lambda: slurm.job_end_told(job_id, "n2"), timeout=60), "n2 never told"
    slurm.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    states = [pending]

    def over() -> bool:
        states.append(show_json(run_dir, runs_dir))
        return states[-1]["state"] not in ("pending", "starting", "running")

    assert wait_for(over, timeout=180, interval=2.0), what_it_did(
        run_dir, states[-1], slurm, job_id
    )
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "completed", states[-1]
    first, second = summary.attempts
    assert (first.status, second.status) == ("node-failure", "completed")
    assert first.failure is not None and first.failure.who == "node n2"
    assert first.reason.startswith("node n2 (its slurmd started again at "), first.reason
    assert first.reason.endswith(f"failed: Slurm requeued job {job_id} (NODE_FAIL)")
    assert first.where == second.where == f"n1, n2 (job {job_id})"  # requeued: the same job
    assert second.start == "restart" and second.from_step is not None and second.from_step >= 10
    assert first.reached_step is not None and first.reached_step >= second.from_step
    # the earlier attempt's records below attempts/1/, the job that ran it named there
    earlier = RunDir(run_dir.layout.attempt(1).path)
    placed = SlurmPlacement.of(earlier.read_run_info())
    assert placed is not None and placed.job_id == job_id and placed.requeues == 0
    assert sorted(read_node_records(earlier.path)[0]) == ["n1", "n2"]
    placed = SlurmPlacement.of(run_dir.read_run_info())
    assert placed is not None and (placed.job_id, placed.requeues) == (job_id, 1)
    records, _ = read_node_records(run_dir.path)
    assert {n: (r.attempt, str(r.state)) for n, r in records.items()} == {
        "n1": (2, "completed"),
        "n2": (2, "completed"),
    }
    listed = ddptui("show", run_dir.run_id, "--runs-dir", str(runs_dir)).stdout
    assert f"attempt 1 on n1, n2 (job {job_id}), node-failure after step" in listed, listed
    assert f"attempt 2 resumed from step {second.from_step:,} (restart) on n1, n2" in listed
    assert wait_for(lambda: not marked(run_dir.run_id), timeout=30)


def test_a_failed_rank_restarts_in_the_allocation_and_resume_submits_the_run_again(
    slurm: SlurmTestCluster, runs_dir: Path
) -> None:
    """Rank 1 fails at step 15 in the first two attempts: restarted once in the job's own
    allocation (--max-restarts 1), it fails again and the run ends failed, saying why it did
    not go on; ``ddptui resume`` then submits it as a new job, which completes."""
    done = ddptui(
        "run", "cpu-demo", "--slurm", "--nodes", "2", "--devices", "cpu:1", "--epochs", "1",
        "--batch-size", "32", "--max-steps", "30", "--max-restarts", "1",
        "--fault", "crash:1:15:2", "--set", "training.checkpoint_every=10",
        "--runs-dir", str(runs_dir), "--json", timeout=240,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    run_dir = only_run(runs_dir)
    failed = run_dir.read_summary()
    assert failed is not None and failed.status == "failed"
    assert failed.reason.endswith(
        "it failed again after 1 restart, all that --max-restarts 1 allows"
    )
    first, second = failed.attempts
    assert (first.status, second.status, second.start) == ("failed", "failed", "restart")
    assert (first.reached_step, second.from_step, second.reached_step) == (15, 10, 15)
    assert first.failure is not None and first.failure.who == "rank 1 on n2"
    job = SlurmPlacement.of(run_dir.read_run_info())
    assert job is not None and first.where == second.where == f"n1, n2 (job {job.job_id})"

    resumed = ddptui("resume", run_dir.run_id, "--runs-dir", str(runs_dir), "--json", timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stderr.startswith(
        f"run {run_dir.run_id}: going on as attempt 3 (it failed), from step 10"
    ), resumed.stderr
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "completed"
    third = summary.attempts[-1]
    assert (len(summary.attempts), third.start, third.from_step) == (3, "resume", 10)
    # a new job: run.json names it; the earlier attempts' run.json the one before
    again = SlurmPlacement.of(run_dir.read_run_info())
    assert again is not None and again.job_id not in ("", job.job_id)
    assert again.attempt_start == "resume" and third.where == f"n1, n2 (job {again.job_id})"
    archived = SlurmPlacement.of(RunDir(run_dir.layout.attempt(2).path).read_run_info())
    assert archived is not None and archived.job_id == job.job_id
    assert wait_for(lambda: not marked(run_dir.run_id), timeout=30)


def test_a_time_limit_shorter_than_the_run_ends_it_as_timeout(
    slurm: SlurmTestCluster, timeout_run: KeptRun
) -> None:
    run_dir = RunDir(timeout_run.runs_dir / timeout_run.run_id)
    left = 180 - (time.monotonic() - timeout_run.submitted)

    def ended() -> bool:
        shown = ddptui("show", run_dir.run_id, "--runs-dir", str(timeout_run.runs_dir), "--json")
        return json.loads(shown.stdout)["state"] not in ("pending", "starting", "running")

    assert wait_for(ended, timeout=max(left, 5), interval=2.0)
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "timeout", summary
    assert summary.reason == f"job {timeout_run.job_id} reached its time limit of 1 min"
    steps = [e for e in read_events(run_dir.rank_events_path(0)) if isinstance(e, StepProgress)]
    assert steps, "it ran before its limit"
    assert wait_for(lambda: not marked(run_dir.run_id), timeout=15)


def test_inside_an_allocation_the_run_is_a_step_and_a_ranks_daemon_is_found_and_stopped(
    slurm: SlurmTestCluster, runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    granted = subprocess.run(
        ["salloc", "--no-shell", "-N2"], capture_output=True, text=True, timeout=60, check=True
    )
    allocation = granted.stderr.split("Granted job allocation")[1].split()[0]
    try:
        for name, value in {
            "SLURM_JOB_ID": allocation,
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "n[1-2]",
        }.items():
            monkeypatch.setenv(name, value)  # as salloc's shell has them
        script = str(REPO_ROOT / "tests" / "fixtures" / "daemonizing_script.py")
        started = ddptui(
            "run", script, "--slurm", "--nodes", "2", "--devices", "cpu:1",
            "--runs-dir", str(runs_dir), "--detach",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        run_dir = RunDir(runs_dir / started.stdout.strip())
        placement = SlurmPlacement.of(run_dir.read_run_info())
        assert placement is not None and placement.in_allocation
        assert placement.job_id == allocation
        # two ranks, and each one's daemon, which no rank is the parent of
        assert wait_for(lambda: len(marked(run_dir.run_id)) >= 6, timeout=60)
        killed = ddptui("kill", run_dir.run_id, "--runs-dir", str(runs_dir), "--json", timeout=60)
        assert killed.returncode == 0, killed.stdout + killed.stderr
        result = json.loads(killed.stdout)
        assert result["verified_nodes"] == ["n1", "n2"]
        assert len(result["daemons"]) == 2 and all(
            "outlived its rank" in d for d in result["daemons"]
        )
        assert not marked(run_dir.run_id)
        assert allocation in slurm.active_jobs()  # the step ended, never the allocation
    finally:
        slurm.run("scancel", allocation, check=False)
