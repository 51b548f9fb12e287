"""The launcher end to end: real processes on gloo, the run directory they leave, nothing left behind."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.backends.local.start import prepare_run, start_run
from engine.core.config.presets import load_preset
from engine.core.config.toml_io import apply_overrides, to_toml
from engine.core.runs.events import EpochEnded, Evaluation, RankStarted, StepProgress, read_events
from engine.core.runs.rundir import RunDir
from engine.train.checkpoint import model_weights
from tests.fixtures.spawning import free_port

pytestmark = pytest.mark.slow

# A quick, deterministic run: two ranks, a few steps, a small test set.
QUICK = {
    "data.train_size": "2048",
    "data.test_size": "500",
    "training.epochs": "1",
    "training.max_steps": "6",
    "training.batch_size": "32",
    "training.warmup_steps": "2",
}


def quick_config(**extra: str):  # type: ignore[no-untyped-def]
    return apply_overrides(load_preset("cpu-demo"), {**QUICK, **extra})


def assert_no_process_of(run: RunDir) -> None:
    info = run.read_run_info()
    refs = [info.launcher, *info.ranks]
    for ref in refs:
        assert ref is not None
        if psutil.pid_exists(ref.pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                assert psutil.Process(ref.pid).create_time() != ref.start_time, (
                    f"pid {ref.pid} still running"
                )


def test_cpu_demo_trains_to_90_percent_and_leaves_a_complete_run_dir(
    runs_dir: Path, no_gpu: None
) -> None:
    result = CliRunner().invoke(main, ["run", "cpu-demo", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 0, result.output
    assert "completed: cpu-demo (ddp, fp32) on cpu:2" in result.output
    (path,) = runs_dir.iterdir()
    run = RunDir(path)
    summary = run.read_summary()
    assert summary is not None and summary.status == "completed"
    assert summary.world_size == 2 and summary.global_batch == 256
    assert len(summary.epochs) == 2
    assert summary.test_accuracy > 0.90
    last = summary.epochs[-1]
    assert 0 < last.data_wait_seconds < last.seconds
    assert last.steady_images_per_s > 0 and last.warmup_steps == 5
    # run.json: final state, the launcher and both ranks with pids and start times
    info = run.read_run_info()
    assert info.state == "completed" and len(info.ranks) == 2 and info.launcher is not None
    # typed events from both ranks; rank 0's epoch figures are the summary's
    for rank in (0, 1):
        events = read_events(run.rank_events_path(rank))
        started = [e for e in events if isinstance(e, RankStarted)]
        assert started and started[0].pid == info.ranks[rank].pid and started[0].device == "cpu"
        assert any(isinstance(e, StepProgress) for e in events)
        evaluations = [e for e in events if isinstance(e, Evaluation)]
        assert [e.samples for e in evaluations] == [2000, 2000]
    rank0 = read_events(run.rank_events_path(0))
    ended = [e for e in rank0 if isinstance(e, EpochEnded)]
    assert [e.global_images for e in ended] == [e.images for e in summary.epochs]
    # rank 0's checkpoint loads without unpickling code, the model's weights in it
    loaded = torch.load(run.checkpoint_path, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in model_weights(loaded).values())
    assert loaded["position"] == {
        "epoch": 2,
        "step": 0,
        "global_step": sum(e.steps for e in ended),
        "steps_per_epoch": ended[0].steps,
    }
    for rank in (0, 1):
        log = run.rank_log_path(rank).read_text()
        # torch's flight recorder is set through the name this torch reads: no deprecation
        # warning opens the log (issue 24)
        assert "is deprecated" not in log and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in log, log
        assert f"rank {rank}/2 on cpu" in log
    assert_no_process_of(run)


def test_a_failing_rank_still_leaves_a_summary_and_no_process(runs_dir: Path, no_gpu: None) -> None:
    started = start_run(quick_config(faults=["exit:1:2"]), runs_dir)  # type: ignore[arg-type]
    assert started.wait(timeout=120) == 1
    summary = started.run_dir.read_summary()
    assert summary is not None
    assert summary.status == "failed"
    assert summary.failure.rank == 1
    assert summary.failure.exitcode == 3
    assert_no_process_of(started.run_dir)


def test_launcher_refuses_a_port_in_use_and_says_so(runs_dir: Path, no_gpu: None) -> None:
    run, _ = prepare_run(quick_config(), runs_dir)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "engine.train.launch",
                str(run.path),
                "--master-port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    assert f"--master-port {port} on 127.0.0.1 is in use" in proc.stderr
    summary = run.read_summary()
    assert summary is not None and summary.status == "failed"
    assert not run.rank_events_path(0).exists()  # no rank started


def test_the_launcher_itself_refuses_ranks_that_cannot_fit(runs_dir: Path, no_gpu: None) -> None:
    """`python -m engine.train.launch` on a node of its own runs the resource guard too: a config.toml
    asking for 999 CPU ranks is one sentence, exit 2, a failed summary and no rank started."""
    run, _ = prepare_run(quick_config(), runs_dir)
    # A batch the 999 ranks' 2 images each hold: the rule at stake is the guard's, not the plan's.
    config = apply_overrides(quick_config(), {"devices.spec": "cpu:999", "training.batch_size": 2})
    run.config_path.write_text(to_toml(config), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "engine.train.launch", str(run.path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "asks for 999 CPU ranks" in line and "devices.oversubscribe" in line
    summary = run.read_summary()
    assert summary is not None and summary.status == "failed"
    assert "999 CPU ranks" in summary.reason
    assert not run.events_dir.exists() or not list(run.events_dir.glob("rank-*"))


def final_parameters(run: RunDir) -> dict[str, torch.Tensor]:
    return model_weights(torch.load(run.checkpoint_path, weights_only=True))


def test_torchrun_and_two_node_launch_agree_with_spawn(
    runs_dir: Path, no_gpu: None, tmp_path: Path
) -> None:
    config = quick_config()
    # 1. the spawn launcher
    spawned = start_run(config, runs_dir)
    assert spawned.wait(timeout=180) == 0
    reference = final_parameters(spawned.run_dir)
    reference_acc = spawned.run_dir.read_summary().test_accuracy  # type: ignore[union-attr]

    # 2. the same worker under torchrun, from a preset file
    preset = tmp_path / "quick.toml"
    preset.write_text(to_toml(config))
    torchrun_dir = RunDir(runs_dir / "torchrun-run")
    torchrun = Path(sys.executable).with_name("torchrun")
    subprocess.run(
        [
            str(torchrun),
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            "-m",
            "engine.train.worker",
            str(torchrun_dir.path),
            "--preset",
            str(preset),
        ],
        check=True,
        timeout=180,
        capture_output=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp_path)},  # its log dir
    )
    torchrun_summary = torchrun_dir.read_summary()
    assert torchrun_summary is not None and torchrun_summary.status == "completed"
    assert torchrun_summary.test_accuracy == pytest.approx(reference_acc)
    for key, value in final_parameters(torchrun_dir).items():
        torch.testing.assert_close(value, reference[key], rtol=1e-5, atol=1e-6, msg=key)

    # 3. two launchers, one CPU rank each, as two "nodes"
    one_rank = apply_overrides(config, {"devices.spec": "cpu:1"})
    node0, _ = prepare_run(one_rank, runs_dir, run_id="node0")
    node1, _ = prepare_run(one_rank, runs_dir, run_id="node1")
    port = str(free_port())
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port]
    launchers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine.train.launch",
                str(node.path),
                "--node-rank",
                str(i),
                *common,
            ]
        )
        for i, node in enumerate((node0, node1))
    ]
    try:
        assert [p.wait(timeout=180) for p in launchers] == [0, 0]
    finally:
        for p in launchers:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert node0.read_run_info().world_size == 2
    assert node1.rank_events_path(1).exists() and not node1.rank_events_path(0).exists()
    assert node0.read_summary().test_accuracy == pytest.approx(reference_acc)  # type: ignore[union-attr]
    for key, value in final_parameters(node0).items():
        torch.testing.assert_close(value, reference[key], rtol=1e-5, atol=1e-6, msg=key)
