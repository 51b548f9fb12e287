"""The rank entry (engine.train.worker): spawn_entry end to end, failures as events, fault injection, the
launcher-death watchdog and the torchrun entry. Real processes throughout."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import torch.multiprocessing as mp

from engine.core.config.presets import load_preset
from engine.core.config.schema import ConfigError, RunConfig
from engine.core.config.toml_io import apply_overrides, load_config, to_toml
from engine.core.plan.run_plan import plan_run
from engine.core.procs.process_identity import ProcessRef
from engine.core.runs.checkpoint_record import read_checkpoint_record
from engine.core.runs.events import (
    CheckpointSaved,
    EpochEnded,
    Evaluation,
    RankFailed,
    RankStarted,
    StepProgress,
    read_events,
)
from engine.core.runs.rundir import RunDir
from engine.train.checkpoint import model_weights
from engine.train.faults import FaultInjector
from engine.train.flight_recorder import dump_flight_recorder, flight_recorder_size_variable
from engine.train.models import build_model
from engine.train.worker import (
    launcher_gone,
    main,
    plan_for_world,
    spawn_entry,
    write_config_if_missing,
)
from tests.fixtures.spawning import free_port, spawn_ranks

REPO_ROOT = Path(__file__).resolve().parent.parent


def make_run_dir(path: Path, overrides: dict[str, object]) -> RunDir:
    base: dict[str, object] = {
        "strategy.name": "ddp",
        "devices.spec": "cpu:2",
        "data.dataset": "synthetic",
        "data.train_size": 600,
        "data.test_size": 101,
        "training.batch_size": 32,
        "training.max_steps": 3,
        "training.epochs": 2,
        "training.warmup_steps": 1,
    }
    config = apply_overrides(RunConfig(name="test"), {**base, **overrides})
    run_dir = RunDir(path)
    run_dir.events_dir.mkdir(parents=True)
    run_dir.logs_dir.mkdir()
    run_dir.config_path.write_text(to_toml(config), encoding="utf-8")
    return run_dir


@pytest.fixture
def rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the launcher puts in every rank's environment, for a CPU run."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("DDPTUI_THREADS_PER_RANK", "1")
    monkeypatch.setenv("DDPTUI_LAUNCHER_PID", str(os.getpid()))


def python(code: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO_ROOT, text=True, stdout=subprocess.PIPE, **kwargs
    )


def wait_gone(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (a zombie waiting for its reaper counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


# ---- spawn_entry -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("rank_env")
def test_spawn_entry_runs_ddp_ranks_end_to_end(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path / "run", {"training.report_interval": 60.0})
    spawn_ranks(spawn_entry, (str(run_dir.path), (0, 1), 2))

    events = {r: read_events(run_dir.rank_events_path(r)) for r in range(2)}
    for rank, evs in events.items():
        types = [e.type for e in evs]
        # Evaluation and checkpointing are announced as slow phases (no stall while in them).
        # Every epoch's end takes a checkpoint, every rank together; rank 0 writes it.
        saved = ["phase_started", "checkpoint"] if rank == 0 else ["phase_started"]
        epoch = [
            *("epoch_started", "step", "step_breakdown", "epoch_ended"),
            *("phase_started", "evaluation", *saved),
        ]
        first = ["epoch_started", "step", *epoch[1:]]  # the run's first step, reported too
        tail = ["rank_finished"]
        # One step report and one step split per epoch: the interval is long, the last step is
        # always reported, and the epoch's end writes what its steps' split was; and the run's
        # first step, where its loss began.
        assert types == ["rank_started", *first, *epoch, *tail]
        started = evs[0]
        assert isinstance(started, RankStarted)
        assert (started.rank, started.world_size, started.device) == (rank, 2, "cpu")
        assert started.gpu_index is None and started.pid != os.getpid()
        steps = [e for e in evs if isinstance(e, StepProgress)]
        assert [(s.step, s.steps, s.global_step) for s in steps] == [
            (1, 3, 1),
            (3, 3, 3),
            (3, 3, 6),
        ]
        log = run_dir.rank_log_path(rank).read_text()
        assert f"rank {rank}/2 on cpu" in log and "epoch 2/2" in log

    # Reduced figures and evaluations are the same on both ranks.
    def reduced(rank: int) -> list[tuple[Any, ...]]:
        return [
            (e.global_images, e.global_seconds, e.global_train_loss, e.global_steady_images_per_s)
            for e in events[rank]
            if isinstance(e, EpochEnded)
        ]

    assert reduced(0) == reduced(1)
    assert reduced(0)[0][0] == 2 * 3 * 32
    evaluations = [
        [(e.accuracy, e.loss, e.samples) for e in events[r] if isinstance(e, Evaluation)]
        for r in range(2)
    ]
    assert evaluations[0] == evaluations[1]
    assert all(samples == 101 for _, _, samples in evaluations[0])

    first_saved, saved = [e for e in events[0] if isinstance(e, CheckpointSaved)]
    assert (first_saved.global_step, saved.global_step) == (3, 6)
    assert saved.path == str(run_dir.checkpoint_path)
    assert saved.bytes == run_dir.checkpoint_path.stat().st_size
    record = read_checkpoint_record(run_dir.path)
    assert record is not None
    assert (record.epoch, record.step, record.global_step, record.world_size) == (2, 0, 6, 2)
    assert record.bytes == saved.bytes and record.model == "small_cnn"
    model = build_model(load_config(run_dir.config_path).model)
    model.load_state_dict(model_weights(torch.load(run_dir.checkpoint_path, weights_only=True)))
    assert not run_dir.summary_path.exists()  # the launcher writes it


@pytest.mark.slow
@pytest.mark.usefixtures("rank_env")
def test_injected_crash_is_reported_as_rank_failed(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path / "run", {"faults": ["crash:1:2"]})
    with pytest.raises(mp.ProcessRaisedException, match="injected crash at step 2"):
        spawn_ranks(spawn_entry, (str(run_dir.path), (0, 1), 2))
    failed = [e for e in read_events(run_dir.rank_events_path(1)) if isinstance(e, RankFailed)]
    assert len(failed) == 1
    assert failed[0].error == "RuntimeError: injected crash at step 2"
    assert "Traceback (most recent call last)" in failed[0].traceback
    assert "injected crash at step 2" in run_dir.rank_log_path(1).read_text()


@pytest.mark.slow
@pytest.mark.usefixtures("rank_env")
def test_a_refused_plan_is_a_rank_failed_event_with_the_reason(tmp_path: Path) -> None:
    run_dir = make_run_dir(
        tmp_path / "run",
        {"strategy.name": "single", "devices.spec": "cpu", "precision.mode": "fp16"},
    )
    with pytest.raises(mp.ProcessRaisedException):
        spawn_ranks(spawn_entry, (str(run_dir.path), (0,), 1), nprocs=1)
    (failed,) = read_events(run_dir.rank_events_path(0))
    assert isinstance(failed, RankFailed)
    assert failed.error.startswith("ConfigError: precision fp16 needs CUDA")


# ---- fault injection -------------------------------------------------------------------------


def test_crash_fault_raises_at_its_step_on_its_rank_only() -> None:
    FaultInjector(["crash:1:2"], rank=0).at_step(2)  # another rank's fault
    injector = FaultInjector(["crash:1:2"], rank=1)
    injector.at_step(1)
    with pytest.raises(RuntimeError, match=r"^injected crash at step 2$"):
        injector.at_step(2)


def test_slow_fault_sleeps_every_step_from_its_step_on() -> None:
    injector = FaultInjector(["slow:0:1"], rank=0)
    start = time.perf_counter()
    injector.at_step(0)
    assert time.perf_counter() - start < 0.4
    for step in (1, 2):
        start = time.perf_counter()
        injector.at_step(step)
        assert time.perf_counter() - start >= 0.5


def test_exit_fault_ends_the_process_with_code_3() -> None:
    proc = python(
        "from engine.train.faults import FaultInjector\n"
        "f = FaultInjector(['exit:0:1'], rank=0)\n"
        "f.at_step(0)\n"
        "print('step 0 done', flush=True)\n"
        "f.at_step(1)\n"
        "print('not reached')\n"
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert "step 0 done" in out and "not reached" not in out


def test_hang_fault_blocks_until_killed() -> None:
    proc = python(
        "from engine.train.faults import FaultInjector\n"
        "print('hanging', flush=True)\n"
        "FaultInjector(['hang:0:0'], rank=0).at_step(0)\n"
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "hanging"
        time.sleep(1.5)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.communicate(timeout=10)


# ---- launcher-death watchdog -----------------------------------------------------------------

RANK_WITH_WATCHDOG = """
import json, os, subprocess, sys, time
from engine.train.worker import start_launcher_watchdog
start_launcher_watchdog(interval=0.1)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(json.dumps([os.getpid(), worker.pid]), flush=True)
time.sleep(120)
"""


def test_watchdog_ends_the_rank_and_its_children_when_its_parent_dies() -> None:
    launcher = python(
        "import subprocess, sys, time\n"
        f"rank = subprocess.Popen([sys.executable, '-c', {RANK_WITH_WATCHDOG!r}])\n"
        "time.sleep(120)\n"
    )
    try:
        assert launcher.stdout is not None
        rank_pid, worker_pid = json.loads(launcher.stdout.readline())
        assert psutil.pid_exists(rank_pid) and psutil.pid_exists(worker_pid)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        assert wait_gone(rank_pid, timeout=10), "the rank outlived its parent"
        assert wait_gone(worker_pid, timeout=5), "the rank's child outlived it"
    finally:
        launcher.kill()
        launcher.communicate(timeout=10)


def test_watchdog_ends_the_rank_when_the_named_launcher_dies() -> None:
    stand_in = python("import time; time.sleep(120)")
    rank = python(RANK_WITH_WATCHDOG, env={**os.environ, "DDPTUI_LAUNCHER_PID": str(stand_in.pid)})
    try:
        assert rank.stdout is not None
        _, worker_pid = json.loads(rank.stdout.readline())
        assert rank.poll() is None
        stand_in.kill()
        stand_in.wait(timeout=10)
        assert rank.wait(timeout=10) == 1
        assert wait_gone(worker_pid, timeout=5)
    finally:
        for proc in (stand_in, rank):
            proc.kill()
            proc.communicate(timeout=10)


def test_launcher_gone_reasons() -> None:
    me = psutil.Process()
    assert launcher_gone(os.getppid(), None) is None
    assert launcher_gone(os.getppid(), ProcessRef(me.pid, me.create_time())) is None
    assert "parent process" in (launcher_gone(os.getppid() + 100_000, None) or "")
    # Same pid, another start time: a reused pid is not the launcher.
    assert "launcher" in (
        launcher_gone(os.getppid(), ProcessRef(me.pid, me.create_time() - 5)) or ""
    )


def test_redirect_output_sends_python_and_fd_output_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "rank-0.log"
    proc = python(
        "import os, sys\n"
        "from engine.train.worker import redirect_output\n"
        f"redirect_output(__import__('pathlib').Path({str(log)!r}))\n"
        "print('from print')\n"
        "print('from stderr', file=sys.stderr)\n"
        "os.write(2, b'from fd 2\\n')\n"
        "os._exit(0)\n"  # no flush at exit: lines must already be in the file
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == ""
    assert log.read_text().splitlines() == ["from print", "from stderr", "from fd 2"]


# ---- planning ---------------------------------------------------------------------------------


def test_plan_for_world_scales_batch_and_lr_over_nodes() -> None:
    config = apply_overrides(
        RunConfig(name="t"),
        {
            "devices.spec": "cpu:2",
            "training.batch_size": 64,
            "optimizer.lr": 0.1,
            "optimizer.lr_scaling": "linear",
            "optimizer.reference_batch": 128,
        },
    )
    plan = plan_run(config, 0)
    assert plan_for_world(plan, 2) is plan
    four = plan_for_world(plan, 4)  # two nodes of two ranks
    assert (four.world_size, four.global_batch, four.base_lr) == (4, 256, pytest.approx(0.2))
    single = plan_run(
        apply_overrides(config, {"strategy.name": "single", "devices.spec": "cpu"}), 0
    )
    with pytest.raises(ConfigError, match="runs one process, but 2 were started"):
        plan_for_world(single, 2)


# ---- the flight recorder --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "name"),
    [
        ("2.5.1", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
        ("2.7.1+cu126", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
        ("2.8.0", "TORCH_FR_BUFFER_SIZE"),
        ("2.14.1+cu130", "TORCH_FR_BUFFER_SIZE"),
        ("3.0.0a0", "TORCH_FR_BUFFER_SIZE"),
    ],
)
def test_the_flight_recorder_size_goes_by_the_name_its_torch_reads(version: str, name: str) -> None:
    assert flight_recorder_size_variable(version) == name


FLIGHT_RECORDER_PROBE = """
import os, pickle, sys
import torch, torch.distributed as dist
import engine.train.flight_recorder as flight_recorder
from engine.core.runs.rundir import RunDir
flight_recorder.FLIGHT_RECORDER_ENTRIES = 3
flight_recorder.enable_flight_recorder(RunDir(sys.argv[1]))
dist.init_process_group(
    "gloo", store=dist.FileStore(sys.argv[1] + "/store", 1), rank=0, world_size=1
)
for _ in range(6):
    dist.all_reduce(torch.ones(1))
print(len(pickle.loads(torch._C._distributed_c10d._dump_fr_trace())["entries"]))
dist.destroy_process_group()
"""


def test_the_flight_recorder_is_sized_by_our_setting_without_a_deprecation_warning(
    tmp_path: Path,
) -> None:
    """With this torch: the buffer keeps the 3 entries we asked for out of 6 collectives (so the
    variable set is one torch reads), and nothing on stderr says a variable is deprecated."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    env["CUDA_VISIBLE_DEVICES"] = ""
    probe = subprocess.run(
        [sys.executable, "-c", FLIGHT_RECORDER_PROBE, str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "3"
    assert "deprecated" not in probe.stderr, probe.stderr


class FullDiskStream:
    """A log on a full disk: every write fails as the kernel's ENOSPC does."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_flight_recorder_dump_on_a_full_disk_does_not_replace_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dump and its one-line note both meet the full disk: dump_flight_recorder returns None
    rather than raising, so the rank goes on to report the failure it was reporting."""

    def no_room() -> bytes:
        raise OSError(errno.ENOSPC, "No space left on device")

    c10d = torch._C._distributed_c10d
    name = "_dump_fr_trace" if hasattr(c10d, "_dump_fr_trace") else "_dump_nccl_trace"
    monkeypatch.setattr(c10d, name, no_room)
    monkeypatch.setattr(sys, "stdout", FullDiskStream())
    run_dir = RunDir(tmp_path / "run")
    assert dump_flight_recorder(run_dir, 0) is None
    assert not (run_dir.flight_recorder_dir / "rank_0").exists()


# ---- torchrun entry --------------------------------------------------------------------------


def test_write_config_if_missing(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    with pytest.raises(ConfigError, match="pass --preset"):
        write_config_if_missing(run_dir, None, [])
    write_config_if_missing(run_dir, "cpu-demo", ["training.max_steps=2", "data.test_size=11"])
    expected = apply_overrides(
        load_preset("cpu-demo"), {"training.max_steps": "2", "data.test_size": "11"}
    )
    assert load_config(run_dir.config_path, name="cpu-demo") == expected
    assert run_dir.events_dir.is_dir() and run_dir.logs_dir.is_dir()
    write_config_if_missing(run_dir, "cpu-demo", ["training.max_steps=5"])  # there already: kept
    assert load_config(run_dir.config_path).training.max_steps == 2


@pytest.mark.parametrize("item", ["oops", "=3"])
def test_worker_set_is_parsed_as_ddptui_run_parses_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    item: str,
) -> None:
    """The same sentence as `ddptui run --set` (engine.core.config.schema.parse_setting), exit 2,
    and no config.toml written."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    run = tmp_path / "run"
    assert main([str(run), "--preset", "cpu-demo", "--set", item]) == 2
    assert capsys.readouterr().err == f"error: --set {item!r} is not SECTION.KEY=VALUE\n"
    assert not RunDir(run).config_path.exists()


def test_worker_main_outside_torchrun_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert main([str(tmp_path / "run"), "--preset", "cpu-demo"]) == 2
    assert "run this module under torchrun" in capsys.readouterr().err


def torchrun(run_dir: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "engine.train.worker",
        str(run_dir),
        "--preset",
        "cpu-demo",
    ]
    for item in (
        "data.train_size=600",
        "data.test_size=101",
        "training.max_steps=2",
        "training.epochs=1",
        *sets,
    ):
        command += ["--set", item]
    # TMPDIR: torchrun's torchelastic_* log dir goes with the test's folder
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(run_dir.parent)}
    return subprocess.run(
        command, cwd=REPO_ROOT, env=env, text=True, capture_output=True, timeout=120
    )


@pytest.mark.slow
def test_torchrun_entry_writes_config_and_summary(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    result = torchrun(run_dir.path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert load_config(run_dir.config_path).data.test_size == 101
    summary = run_dir.read_summary()
    assert summary is not None
    assert summary.status == "completed"
    assert (summary.world_size, summary.global_batch) == (2, 256)
    assert summary.epochs[0].images == 2 * 2 * 128
    assert summary.test_accuracy is not None
    assert all(run_dir.rank_log_path(r).exists() for r in range(2))


@pytest.mark.slow
def test_torchrun_entry_writes_a_failed_summary(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    result = torchrun(run_dir.path, 'faults=["crash:1:1"]')
    assert result.returncode != 0
    summary = run_dir.read_summary()
    assert summary is not None and summary.status == "failed"
    assert summary.failure.rank == 1
    assert summary.failure.error == "RuntimeError: injected crash at step 1"
