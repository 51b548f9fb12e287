"""Finding distributed-training processes: ours by run marker and run.json, foreign ones by their
environment or command line, grouped into jobs, with their state. Real (sleeping) processes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.common.statuses import JobKind, JobState
from engine.core.host.gpus import GpuInventory, GpuProcess, GpuSample
from engine.core.jobs import grouping, process_table
from engine.core.jobs.process_table import ProcessTable, TrainingJob, scan_processes
from engine.core.procs import process_scan
from engine.core.procs.process_identity import ProcessRef
from engine.core.procs.process_scan import ProcessInfo, is_spawn_child, launcher_kind
from engine.core.runs.events import EpochStarted, EventWriter, RankStalled, RankStarted
from tests.fixtures.made_runs import ProcessPen, make_run, marker_env, ref_of

KIND_DDPTUI = JobKind.DDPTUI
KIND_ELASTIC = JobKind.ELASTIC
KIND_ENV = JobKind.ENV
KIND_SPAWN = JobKind.SPAWN
ORPHANED = JobState.ORPHANED
RUNNING = JobState.RUNNING
STALLED = JobState.STALLED
ZOMBIE = JobState.ZOMBIE

NO_GPU = GpuInventory(error="NVML: stand-in says no driver")


def scan(runs_dir: Path | None = None, gpus: GpuInventory = NO_GPU) -> ProcessTable:
    return scan_processes(gpus=gpus, cpu_interval=0.0)


def job_with(table: ProcessTable, pid: int) -> TrainingJob | None:
    return next((j for j in table.jobs if any(p.pid == pid for p in j.processes)), None)


def wait_for_env(pid: int, key: str) -> None:
    """A just-started child has its environment in place once exec is done."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if key in psutil.Process(pid).environ():
                return
        except psutil.Error:
            pass
        time.sleep(0.02)


# ---- recognising command lines -------------------------------------------------------------


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (["/venv/bin/python3", "/venv/bin/torchrun", "--nproc-per-node", "2", "t.py"], "torchrun"),
        (["torchrun", "t.py"], "torchrun"),
        (["python", "-m", "torch.distributed.run", "t.py"], "torch.distributed.run"),
        (["python", "-m", "torch.distributed.launch", "t.py"], "torch.distributed.launch"),
        (["python", "-m", "engine.train.launch", "runs/x"], "ddptui"),
        (["python", "train.py", "--torchrun"], None),
        (["vim", "torchrun.md"], None),
    ],
)
def test_launcher_command_lines(cmdline: list[str], kind: str | None) -> None:
    assert launcher_kind(cmdline) == kind


def test_spawn_children_by_command_line() -> None:
    spawn = [
        "python",
        "-c",
        "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
        "--multiprocessing-fork",
    ]
    assert is_spawn_child(spawn)
    assert not is_spawn_child(["python", "main_script.py"])


# ---- ours ------------------------------------------------------------------------------------


def test_our_run_is_one_job_with_roles_and_ranks_from_run_json(
    runs_dir: Path, pen: ProcessPen
) -> None:
    env = marker_env(runs_dir, "r-ours")
    launcher = pen.python(env=env)
    rank0, rank1 = pen.python(env=env), pen.python(env=env)
    helper = pen.python(env=env)  # marked, but not named in run.json: a rank's child, say
    make_run(runs_dir, "r-ours", launcher=ref_of(launcher), ranks=[ref_of(rank0), ref_of(rank1)])
    wait_for_env(helper.pid, "DDPTUI_RUN_ID")
    job = job_with(scan(runs_dir), rank0.pid)
    assert job is not None
    assert (job.kind, job.run_id, job.state, job.launcher_alive) == (
        KIND_DDPTUI,
        "r-ours",
        RUNNING,
        True,
    )
    by_pid = {p.pid: p for p in job.processes}
    assert set(by_pid) == {launcher.pid, rank0.pid, rank1.pid, helper.pid}
    assert by_pid[launcher.pid].role == "launcher"
    assert (by_pid[rank0.pid].role, by_pid[rank0.pid].rank) == ("rank", 0)
    assert (by_pid[rank1.pid].role, by_pid[rank1.pid].rank) == ("rank", 1)
    assert by_pid[helper.pid].role == "child"
    assert all(p.own and p.rss_bytes and p.age_seconds >= 0 for p in job.processes)


def test_our_run_is_orphaned_once_its_launcher_is_gone(runs_dir: Path, pen: ProcessPen) -> None:
    launcher = pen.python()
    rank0 = pen.python(env=marker_env(runs_dir, "r-orph"))
    make_run(runs_dir, "r-orph", launcher=ref_of(launcher), ranks=[ref_of(rank0)])
    wait_for_env(rank0.pid, "DDPTUI_RUN_ID")
    launcher.kill()
    launcher.wait()
    job = job_with(scan(runs_dir), rank0.pid)
    assert job is not None
    assert job.state == ORPHANED
    assert "from run.json) is gone" in job.reason
    assert [p.state for p in job.processes] == [ORPHANED]


def test_a_reused_launcher_pid_does_not_count_as_alive(runs_dir: Path, pen: ProcessPen) -> None:
    other = pen.python()  # lives, but is not the launcher run.json means
    rank0 = pen.python(env=marker_env(runs_dir, "r-reuse"))
    stale = ProcessRef(other.pid, ref_of(other).start_time - 600)
    make_run(runs_dir, "r-reuse", launcher=stale, ranks=[ref_of(rank0)])
    wait_for_env(rank0.pid, "DDPTUI_RUN_ID")
    table = scan(runs_dir)
    job = job_with(table, rank0.pid)
    assert job is not None and job.state == ORPHANED
    assert job_with(table, other.pid) is None


def test_a_stalled_rank_of_a_live_run(runs_dir: Path, pen: ProcessPen) -> None:
    launcher = pen.python()
    rank0 = pen.python(env=marker_env(runs_dir, "r-stall"))
    now = time.time()
    make_run(
        runs_dir,
        "r-stall",
        launcher=ref_of(launcher),
        ranks=[ref_of(rank0)],
        world_size=1,
        events={
            "rank-0": [
                RankStarted(rank=0, world_size=1, pid=rank0.pid, host="h", device="cpu", time=now)
            ],
            "launcher": [RankStalled(rank=0, silent_seconds=9, time=now + 1)],
        },
    )
    wait_for_env(rank0.pid, "DDPTUI_RUN_ID")
    job = job_with(scan(runs_dir), rank0.pid)
    assert job is not None and job.state == STALLED
    assert {p.pid: p.state for p in job.processes}[rank0.pid] == STALLED


def test_a_kept_scanner_follows_each_run_with_one_observer(
    runs_dir: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scanner the UI keeps reads each run on from where it got to: one observer per run
    across scans, not a fresh one per job per scan."""
    launcher = pen.python()
    rank0 = pen.python(env=marker_env(runs_dir, "r-follow"))
    now = time.time()
    started = RankStarted(rank=0, world_size=1, pid=rank0.pid, host="h", device="cpu", time=now)
    run_dir = make_run(
        runs_dir, "r-follow", launcher=ref_of(launcher), ranks=[ref_of(rank0)], world_size=1,
        events={"rank-0": [started], "launcher": [RankStalled(rank=0, silent_seconds=9, time=now + 1)]},
    )  # fmt: skip
    wait_for_env(rank0.pid, "DDPTUI_RUN_ID")
    made: list[object] = []
    real = process_table.RunObserver

    def counting(*args: object, **kwargs: object) -> object:
        if getattr(args[0], "path", None) == run_dir.path:  # other runs on this machine aside
            made.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(process_table, "RunObserver", counting)
    scanner = process_table.ProcessScanner()
    first = job_with(scanner.scan(gpus=NO_GPU), rank0.pid)
    assert first is not None and first.state == STALLED
    with EventWriter(run_dir.rank_events_path(0)) as events:  # the rank speaks again
        events.write(EpochStarted(rank=0, epoch=0, steps=10, time=now + 2))
    second = job_with(scanner.scan(gpus=NO_GPU), rank0.pid)
    assert second is not None and second.state == RUNNING
    scanner.scan(gpus=NO_GPU)
    # Observers of other runs going on the machine (another suite's) are not this test's to count.
    mine = [args for args in made if getattr(args[0], "path", None) == run_dir.path]
    assert len(mine) == 1


def test_a_zombie_rank_is_shown_as_a_zombie(runs_dir: Path, pen: ProcessPen) -> None:
    launcher = pen.python()
    dead = pen.python("pass")
    live = pen.python(env=marker_env(runs_dir, "r-zombie"))
    dead_ref = ref_of(dead)
    make_run(runs_dir, "r-zombie", launcher=ref_of(launcher), ranks=[dead_ref, ref_of(live)])
    assert pen.wait_until(lambda: psutil.Process(dead.pid).status() == psutil.STATUS_ZOMBIE)
    # a "python [defunct]" that NVML still lists (pytorch#1223): named, with who must reap it
    gpus = GpuInventory(
        gpus=(
            GpuSample(
                index=0, name="x", processes=(GpuProcess(pid=dead.pid, used_memory_bytes=1 << 30),)
            ),
        )
    )
    table = scan(runs_dir, gpus=gpus)
    job = job_with(table, live.pid)
    assert job is not None
    states = {p.pid: p.state for p in job.processes}
    assert states[dead.pid] == ZOMBIE
    assert states[live.pid] == RUNNING
    assert any(f"held by pid {dead.pid}, a zombie" in n for n in table.notes)


# ---- foreign ---------------------------------------------------------------------------------

# Per test process: another checkout's suite running beside this one makes the same kind of job.
JOB_X = f"job-x-{os.getpid()}"
ELASTIC = {
    "TORCHELASTIC_RUN_ID": JOB_X,
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29999",
}


def test_a_torchelastic_worker_with_a_live_python_parent_is_running(pen: ProcessPen) -> None:
    worker = pen.python(env=ELASTIC)
    wait_for_env(worker.pid, "TORCHELASTIC_RUN_ID")
    job = job_with(scan(), worker.pid)
    assert job is not None
    assert (job.kind, job.state) == (KIND_ELASTIC, RUNNING)
    assert job.label == f"torchrun job {JOB_X!r} at 127.0.0.1:29999"
    (p,) = job.processes
    assert (p.rank, p.local_rank, p.world_size, p.role) == (1, 1, 2, "rank")


def test_a_torchelastic_worker_whose_agent_is_gone_is_orphaned(pen: ProcessPen) -> None:
    worker = pen.orphan(env=ELASTIC)
    wait_for_env(worker.pid, "TORCHELASTIC_RUN_ID")
    job = job_with(scan(), worker.pid)
    assert job is not None
    assert job.state == ORPHANED
    assert "torchrun agent is gone" in job.reason


def test_rank_alone_in_the_environment_is_not_a_training_process(pen: ProcessPen) -> None:
    plain = pen.python(env={"RANK": "0"})
    orphan = pen.orphan(env={"RANK": "3"})
    wait_for_env(plain.pid, "RANK")
    table = scan()
    assert job_with(table, plain.pid) is None
    assert job_with(table, orphan.pid) is None


def test_a_hand_launched_worker_is_never_judged_orphaned_by_its_parent_alone(
    pen: ProcessPen,
) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29998"}
    worker = pen.orphan(env=env)  # its parent is init now, but a shell or srun may launch so
    wait_for_env(worker.pid, "MASTER_PORT")
    job = job_with(scan(), worker.pid)
    assert job is not None
    assert job.kind == KIND_ENV
    assert job.state == RUNNING
    assert "may or may not be its launcher" in job.reason


def test_spawn_children_that_loaded_torch_are_grouped_under_their_parent(
    pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = pen.python(argv0_note="from multiprocessing.spawn import spawn_main")
    b = pen.python(argv0_note="from multiprocessing.spawn import spawn_main")
    leaked = pen.orphan("import time\nwhile True: time.sleep(0.1)\n# spawn_main")
    not_torch = pen.python(argv0_note="from multiprocessing.spawn import spawn_main")
    torch_pids = {a.pid, b.pid, leaked.pid}
    for module in (process_scan, grouping):  # spawn children, and launchers
        monkeypatch.setattr(module, "loads_torch", lambda pid: pid in torch_pids)
    table = scan()
    job = job_with(table, a.pid)
    assert job is not None and job.kind == KIND_SPAWN and job.state == RUNNING
    assert {p.pid for p in job.processes} == {a.pid, b.pid}
    orphan_job = job_with(table, leaked.pid)
    assert orphan_job is not None and orphan_job.state == ORPHANED
    assert job_with(table, not_torch.pid) is None


def test_a_child_of_a_training_process_joins_its_job(runs_dir: Path, pen: ProcessPen) -> None:
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env={})\n"
        "while True: time.sleep(0.1)"
    )
    worker = pen.python(code, env=ELASTIC)
    parent = psutil.Process(worker.pid)
    assert pen.wait_until(lambda: len(parent.children()) == 1)
    grandchild = parent.children()[0]
    pen.started.append(grandchild)
    job = job_with(scan(), worker.pid)
    assert job is not None
    roles = {p.pid: p.role for p in job.processes}
    assert roles == {worker.pid: "rank", grandchild.pid: "worker"}


# ---- what cannot be seen, GPU memory ---------------------------------------------------------


def test_gpu_memory_per_process_and_holders_that_are_not_visible(
    pen: ProcessPen, tmp_path: Path
) -> None:
    device = tmp_path / "nvidia0"  # stands in for /dev/nvidia0: the worker holds it open
    device.write_bytes(b"")
    worker = pen.python(
        f"import time\nf = open({str(device)!r})\nwhile True: time.sleep(0.1)", env=ELASTIC
    )
    wait_for_env(worker.pid, "TORCHELASTIC_RUN_ID")
    assert pen.wait_until(
        lambda: any(str(device) in f.path for f in psutil.Process(worker.pid).open_files())
    )
    gpus = GpuInventory(
        gpus=(
            GpuSample(
                index=0,
                name="stand-in",
                memory_used_bytes=3 << 30,
                memory_total_bytes=80 << 30,
                processes=(
                    GpuProcess(pid=worker.pid, used_memory_bytes=1 << 30),
                    GpuProcess(pid=4_000_000, used_memory_bytes=2 << 30),
                ),
            ),
            GpuSample(index=1, error="NVML: GPU is lost"),
        )
    )
    table = process_table.ProcessScanner(device_glob=str(tmp_path / "nvidia*")).scan(gpus=gpus)
    job = job_with(table, worker.pid)
    assert job is not None
    (p,) = job.processes
    assert [(g.gpu_index, g.used_bytes) for g in p.gpu] == [(0, 1 << 30)]
    assert any("NVML pid 4000000" in n and "no visible process" in n for n in table.notes)
    assert any("GPU 1: not available (NVML: GPU is lost)" in n for n in table.notes)
    assert table.gpu_error is None


def test_no_nvml_is_a_note_not_a_failure() -> None:
    table = scan(gpus=NO_GPU)
    assert table.gpu_error == NO_GPU.error
    assert any("GPU memory per process is not available" in n for n in table.notes)


def test_ps_json_for_scripts(pen: ProcessPen) -> None:
    worker = pen.orphan(env=ELASTIC)
    wait_for_env(worker.pid, "TORCHELASTIC_RUN_ID")
    result = CliRunner().invoke(main, ["ps", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    jobs = [j for j in data["jobs"] if any(p["pid"] == worker.pid for p in j["processes"])]
    assert len(jobs) == 1 and jobs[0]["state"] == "orphaned"
    assert isinstance(data["notes"], list)
    result = CliRunner().invoke(main, ["ps"])
    assert result.exit_code == 0
    assert f"torchrun job {JOB_X!r} at 127.0.0.1:29999  [orphaned]" in result.stdout


def test_what_cannot_be_seen_is_said() -> None:
    def info(pid: int, uid: int, user: str) -> ProcessInfo:
        return ProcessInfo(
            pid=pid,
            ppid=1,
            name="python",
            cmdline=("python", "train.py"),
            username=user,
            uid=uid,
            create_time=1.0,
            status="sleeping",
            environ=None,
        )

    me = os.getuid()
    notes = process_table._visibility_notes(
        {1: info(1, me + 1, "alice"), 2: info(2, me + 2, "bob"), 3: info(3, me, "me")}
    )
    assert any(
        n.startswith("2 processes of other users (alice, bob): environment not readable")
        for n in notes
    )
    assert any(n.startswith("1 process (pid 3) whose environment cannot be read") for n in notes)
