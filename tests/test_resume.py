"""A run stopped at step k and resumed from its checkpoint takes exactly the steps an
uninterrupted run takes: the same losses step for step and the same final weights, for ``single``
(both pipelines: the torchvision one draws its augmentation from the RNG the checkpoint holds)
and ``ddp`` on 2 gloo ranks. The stop is a crash injected at step 7, after the checkpoint of
step 6 (every 3 steps, and at epoch ends: 5 steps per epoch, so step 6 is inside epoch 2).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engine.core.config.toml_io import load_config, to_toml
from engine.core.plan.run_plan import plan_run
from engine.core.runs.checkpoint_record import read_checkpoint_record
from engine.core.runs.events import CheckpointSaved, EventWriter, read_events
from engine.core.runs.rundir import RunDir
from engine.train.checkpoint import CheckpointMismatch
from engine.train.training import train_rank
from tests.fixtures.spawning import free_port, spawn_ranks
from tests.test_training_equivalence import (
    final_weights,
    make_run_dir,
    one_thread,  # noqa: F401 (an autouse fixture: one intra-op thread, as each rank has)
    small_cnn_without_batchnorm,
    step_losses,
    train_ddp_rank,
)

COMMON: dict[str, object] = {
    "training.epochs": 2,
    "training.max_steps": 5,
    "training.evaluate": False,
    "training.checkpoint_every": "3",
    "training.seed": 5,
    "optimizer.lr": 0.05,
    "optimizer.momentum": 0.9,
    "optimizer.weight_decay": 0.0005,
    "optimizer.warmup_steps": 3,
}
STOP_AT = 7  # the crash fires as global step 7 (from 0) starts: 7 steps done, 6 checkpointed


def without_faults(run_dir: RunDir) -> None:
    """The config of the resumed attempt: the same run, the injected crash gone."""
    config = load_config(run_dir.config_path)
    run_dir.config_path.write_text(to_toml(dataclasses.replace(config, faults=())))


def train_single(run_dir: RunDir, resume_from: Path | None = None, attempt: int = 1) -> None:
    config = load_config(run_dir.config_path)
    with EventWriter(run_dir.rank_events_path(0)) as events:
        train_rank(
            run_dir,
            plan_run(config, 0),
            rank=0,
            local_rank=0,
            world_size=1,
            events=events,
            model_factory=small_cnn_without_batchnorm,
            resume_from=resume_from,
            attempt=attempt,
        )


def assert_same_weights(resumed: RunDir, whole: RunDir) -> None:
    a, b = final_weights(resumed), final_weights(whole)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["tensor", "torchvision"])
def test_a_single_run_stopped_and_resumed_ends_as_one_not_stopped(
    tmp_path: Path, pipeline: str
) -> None:
    settings = {
        **COMMON,
        "strategy.name": "single",
        "devices.spec": "cpu",
        "training.batch_size": 32,
        "data.pipeline": pipeline,
        "data.num_workers": 0,
    }
    whole = make_run_dir(tmp_path / "whole", settings)
    train_single(whole)
    stopped = make_run_dir(tmp_path / "stopped", {**settings, "faults": [f"crash:0:{STOP_AT}"]})
    with pytest.raises(RuntimeError, match=f"injected crash at step {STOP_AT}"):
        train_single(stopped)
    record = read_checkpoint_record(stopped.path)
    assert record is not None
    assert (record.epoch, record.step, record.global_step, record.attempt) == (1, 1, 6, 1)

    without_faults(stopped)
    train_single(stopped, resume_from=stopped.checkpoint_path, attempt=2)
    assert_same_weights(stopped, whole)
    # The second attempt took steps 7 to 10, each with the loss the uninterrupted run had.
    losses = step_losses(stopped.rank_events_path(0))
    assert losses == pytest.approx(step_losses(whole.rank_events_path(0)), abs=1e-6)
    saved = [
        e.global_step
        for e in read_events(stopped.rank_events_path(0))
        if isinstance(e, CheckpointSaved)
    ]
    assert saved == [3, 5, 6, 9, 10]  # attempt 1: 3, 5 (epoch end), 6; attempt 2: 9, 10
    final = read_checkpoint_record(stopped.path)
    assert final is not None and (final.global_step, final.attempt) == (10, 2)


@pytest.mark.slow
def test_a_ddp_run_stopped_and_resumed_ends_as_one_not_stopped(tmp_path: Path) -> None:
    settings = {
        **COMMON,
        "strategy.name": "ddp",
        "devices.spec": "cpu:2",
        "training.batch_size": 16,
    }
    whole = make_run_dir(tmp_path / "whole", settings)
    spawn_ranks(train_ddp_rank, (str(whole.path), free_port(), ""))
    crash = [f"crash:0:{STOP_AT}", f"crash:1:{STOP_AT}"]
    stopped = make_run_dir(tmp_path / "stopped", {**settings, "faults": crash})
    with pytest.raises(Exception, match=f"injected crash at step {STOP_AT}"):
        spawn_ranks(train_ddp_rank, (str(stopped.path), free_port(), ""))
    record = read_checkpoint_record(stopped.path)
    assert record is not None and (record.global_step, record.world_size) == (6, 2)

    without_faults(stopped)
    spawn_ranks(train_ddp_rank, (str(stopped.path), free_port(), str(stopped.checkpoint_path)))
    assert_same_weights(stopped, whole)
    for rank in (0, 1):
        losses = step_losses(stopped.rank_events_path(rank))
        assert losses == pytest.approx(step_losses(whole.rank_events_path(rank)), abs=1e-6)


def test_a_checkpoint_of_weights_only_or_another_world_is_refused(tmp_path: Path) -> None:
    settings = {
        **COMMON,
        "strategy.name": "single",
        "devices.spec": "cpu",
        "training.batch_size": 32,
    }
    run_dir = make_run_dir(tmp_path / "run", {**settings, "training.epochs": 1})
    bare = tmp_path / "bare.pt"
    torch.save(
        small_cnn_without_batchnorm(load_config(run_dir.config_path).model).state_dict(), bare
    )
    with pytest.raises(CheckpointMismatch, match="holds the model's weights only"):
        train_single(run_dir, resume_from=bare)

    train_single(run_dir)
    other = make_run_dir(tmp_path / "other", {**settings, "training.max_steps": 4})
    with pytest.raises(CheckpointMismatch, match="5 steps per epoch and this run has 4"):
        train_single(other, resume_from=run_dir.checkpoint_path)
