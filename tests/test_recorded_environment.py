"""environment.json: what a run's ranks ran with, recorded bounded and without secrets, read back
typed; a newer ddptui's file refused in one sentence; a run from before it was recorded has
none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.host.gpus import GpuInventory, GpuSample
from engine.core.runs.recorded_environment import (
    VALUE_MAX_CHARS,
    VARIABLES_MAX,
    RecordedEnvironment,
    environment_here,
    environment_path,
    read_environment,
    recorded_variables,
    with_outside_load,
    write_environment,
)
from engine.core.runs.rundir import RunDir, RunDirError


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "runs" / "20261206-120000-made-0001")
    run.create()
    return run


def test_only_the_listed_variables_are_kept_and_each_is_bounded() -> None:
    environ = {
        "OMP_NUM_THREADS": "4",
        "NCCL_DEBUG": "INFO",
        "TORCH_NCCL_BLOCKING_WAIT": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "x" * 1000,
        "AWS_SECRET_ACCESS_KEY": "hunter2",
        "WANDB_API_KEY": "secret",
        "HOME": "/root",
    }
    kept = recorded_variables(environ)
    assert sorted(kept) == [
        "NCCL_DEBUG",
        "OMP_NUM_THREADS",
        "PYTORCH_CUDA_ALLOC_CONF",
        "TORCH_NCCL_BLOCKING_WAIT",
    ]
    assert len(kept["PYTORCH_CUDA_ALLOC_CONF"]) == VALUE_MAX_CHARS
    assert kept["PYTORCH_CUDA_ALLOC_CONF"].endswith("...")
    many = {f"NCCL_X{i:03}": "1" for i in range(500)}
    assert len(recorded_variables(many)) == VARIABLES_MAX


def test_the_gpus_of_the_run_are_recorded_with_their_clocks() -> None:
    inventory = GpuInventory(
        gpus=(GpuSample(index=0, name="A100"), GpuSample(index=1, name="A100")),
        driver_version="550.1",
    )
    env = environment_here(
        {"CUDA_VISIBLE_DEVICES": "1"},
        inventory,
        gpu_indices=(1,),
        clocks={1: (1410, 1410)},
        threads_per_rank=8,
    )
    assert [(g.index, g.name, g.sm_clock_mhz) for g in env.gpus] == [(1, "A100", 1410)]
    assert env.facts()["gpus"] == "A100 1410/1410 MHz"
    assert env.facts()["threads per rank"] == "8"
    assert env.facts()["CUDA_VISIBLE_DEVICES"] == "1"
    assert env.gpu_driver == "550.1"


def test_written_and_read_back_the_same(run_dir: RunDir) -> None:
    env = RecordedEnvironment(
        host="h", torch="2.5.0", cuda="12.4", nccl="2.21.5", cpu_count=16, threads_per_rank=8,
        variables={"OMP_NUM_THREADS": "8"}, load_average_at_start=0.5,
    )  # fmt: skip
    write_environment(run_dir, with_outside_load(env, 1.25))
    back = read_environment(run_dir)
    assert back == RecordedEnvironment(**{**env.__dict__, "outside_load_cores": 1.25})


def test_a_run_from_before_has_none(run_dir: RunDir) -> None:
    assert read_environment(run_dir) is None


def test_a_newer_ddptuis_file_is_refused_in_one_sentence(run_dir: RunDir) -> None:
    environment_path(run_dir).write_text(json.dumps({"schema": 99, "torch": "9"}))
    with pytest.raises(RunDirError) as err:
        read_environment(run_dir)
    assert "written by a newer ddptui (schema 99, this one reads 1)" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_corrupt_or_oversized_file_is_refused(run_dir: RunDir) -> None:
    path = environment_path(run_dir)
    path.write_text("{not json")
    with pytest.raises(RunDirError, match=r"environment\.json is corrupt"):
        read_environment(run_dir)
    path.write_text(json.dumps({"schema": 1, "variables": ["x"]}))
    with pytest.raises(RunDirError, match="expected a JSON object"):
        read_environment(run_dir)
    path.write_text(json.dumps({"schema": 1, "host": "x" * (1 << 20)}))
    with pytest.raises(RunDirError, match="not loaded"):
        read_environment(run_dir)


def test_an_edited_file_is_bounded_again_on_reading(run_dir: RunDir) -> None:
    environment_path(run_dir).write_text(
        json.dumps({"schema": 1, "torch": "t" * 5000, "variables": {"SECRET": "x", "NCCL_A": "1"}})
    )
    back = read_environment(run_dir)
    assert back is not None
    assert len(back.torch) == VALUE_MAX_CHARS and back.variables == {"NCCL_A": "1"}
