"""The training loop (engine.train.training) against its promises: DDP on 2 ranks with batch b trains the
same model as one process with batch 2b, and evaluation on 2 ranks counts every test image once.

Multi-process tests start real gloo ranks with torch.multiprocessing.spawn, which joins them and
terminates the others when one fails.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from engine.core.config.schema import ConfigError, ModelConfig, RunConfig
from engine.core.config.toml_io import apply_overrides, load_config, to_toml
from engine.core.plan.run_plan import plan_run
from engine.core.runs.events import (
    CheckpointSaved,
    EpochEnded,
    Evaluation,
    EventWriter,
    StepProgress,
    read_events,
)
from engine.core.runs.rundir import RunDir
from engine.train.checkpoint import model_weights
from engine.train.data import TestBatches
from engine.train.evaluation import evaluate
from engine.train.models import SmallCNN, build_model
from engine.train.training import train_rank
from engine.train.worker import end_process
from tests.fixtures.spawning import free_port, spawn_ranks

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread in this process, as each rank has: two threads on a busy 2-core machine
    wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_run_dir(path: Path, overrides: dict[str, object]) -> RunDir:
    base: dict[str, object] = {
        "devices.spec": "cpu:2",
        "data.dataset": "synthetic",
        "data.pipeline": "tensor",
        "data.train_size": 1200,
        "data.test_size": 101,
        "training.report_interval": 0.0,
        "training.warmup_steps": 1,
    }
    config = apply_overrides(RunConfig(name="test"), {**base, **overrides})
    run_dir = RunDir(path)
    run_dir.events_dir.mkdir(parents=True)
    run_dir.logs_dir.mkdir()
    run_dir.config_path.write_text(to_toml(config), encoding="utf-8")
    return run_dir


def small_cnn_without_batchnorm(config: ModelConfig) -> nn.Module:
    return SmallCNN(batchnorm=False)


def train_in_this_process(run_dir: RunDir) -> None:
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
        )


def train_ddp_rank(local_rank: int, run_dir_path: str, port: int, resume_from: str = "") -> None:
    """One gloo rank of a DDP run of 2 (a spawn target: module level, picklable); with
    ``resume_from``, its attempt 2 going on from that checkpoint (tests/test_resume.py)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank, world_size=2
    )
    try:
        run_dir = RunDir(Path(run_dir_path))
        config = load_config(run_dir.config_path)
        with EventWriter(run_dir.rank_events_path(local_rank)) as events:
            train_rank(
                run_dir,
                plan_run(config, 0),
                rank=local_rank,
                local_rank=local_rank,
                world_size=2,
                events=events,
                model_factory=small_cnn_without_batchnorm,
                resume_from=Path(resume_from) if resume_from else None,
                attempt=2 if resume_from else 1,
            )
    finally:
        dist.destroy_process_group()
    end_process(0)  # skip seconds of interpreter shutdown; a failure raises above instead


def final_weights(run_dir: RunDir) -> dict[str, torch.Tensor]:
    return model_weights(torch.load(run_dir.checkpoint_path, weights_only=True))


def step_losses(path: Path) -> dict[int, float]:
    return {e.global_step: e.loss for e in read_events(path) if isinstance(e, StepProgress)}


@pytest.mark.slow
def test_ddp_on_two_ranks_equals_one_process_with_twice_the_batch(tmp_path: Path) -> None:
    common: dict[str, object] = {
        "training.epochs": 2,
        "training.max_steps": 5,
        "training.evaluate": False,
        "training.seed": 3,
        "optimizer.lr": 0.05,
        "optimizer.momentum": 0.9,
        "optimizer.weight_decay": 0.0005,
        "optimizer.lr_scaling": "linear",
        "optimizer.reference_batch": 32,
        "optimizer.warmup_steps": 3,
    }
    ddp = make_run_dir(
        tmp_path / "ddp",
        {**common, "strategy.name": "ddp", "devices.spec": "cpu:2", "training.batch_size": 16},
    )
    single = make_run_dir(
        tmp_path / "single",
        {**common, "strategy.name": "single", "devices.spec": "cpu", "training.batch_size": 32},
    )
    spawn_ranks(train_ddp_rank, (str(ddp.path), free_port()))
    train_in_this_process(single)

    ddp_weights = final_weights(ddp)
    single_weights = final_weights(single)
    assert ddp_weights.keys() == single_weights.keys()
    for name in single_weights:
        torch.testing.assert_close(ddp_weights[name], single_weights[name], rtol=1e-5, atol=1e-6)
    # The weights moved: the comparison is not of two untouched initialisations.
    torch.manual_seed(3)
    initial = SmallCNN(batchnorm=False).state_dict()
    assert not torch.allclose(initial["head.weight"], single_weights["head.weight"])

    # Step by step, the mean of the ranks' losses (each over b images) is the loss over 2b images.
    single_losses = step_losses(single.rank_events_path(0))
    rank_losses = [step_losses(ddp.rank_events_path(r)) for r in range(2)]
    assert sorted(single_losses) == sorted(rank_losses[0]) == list(range(1, 11))
    for step, loss in single_losses.items():
        assert (rank_losses[0][step] + rank_losses[1][step]) / 2 == pytest.approx(loss, abs=1e-5)

    # Every rank reports the same reduced epoch figures; images add up over the ranks.
    ended = [
        [e for e in read_events(ddp.rank_events_path(r)) if isinstance(e, EpochEnded)]
        for r in range(2)
    ]
    for e0, e1 in zip(*ended, strict=True):
        assert e0.global_images == e1.global_images == 2 * 5 * 16
        assert e0.global_seconds == e1.global_seconds >= max(e0.seconds, e1.seconds)
        assert e0.global_train_loss == pytest.approx((e0.train_loss + e1.train_loss) / 2)
        assert e0.global_steady_images_per_s == e1.global_steady_images_per_s > 0
    # Rank 1 takes part in each checkpoint (its phase announced); rank 0 alone saves it.
    assert not [e for e in read_events(ddp.rank_events_path(1)) if isinstance(e, CheckpointSaved)]
    assert [
        e.global_step
        for e in read_events(ddp.rank_events_path(0))
        if isinstance(e, CheckpointSaved)
    ] == [5, 10]


def _ddp_evaluate(local_rank: int, config_path: str, weights: str, out_dir: str, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank, world_size=2
    )
    try:
        config = load_config(Path(config_path))
        model = build_model(config.model)
        model.load_state_dict(model_weights(torch.load(weights, weights_only=True)))
        batches = TestBatches(
            config, batch_size=64, rank=local_rank, world_size=2, device=CPU, distributed=True
        )
        result = evaluate(model, batches, device=CPU, distributed=True)
        Path(out_dir, f"rank-{local_rank}.json").write_text(
            json.dumps([result.correct, result.loss_sum, result.samples])
        )
    finally:
        dist.destroy_process_group()
    end_process(0)


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["tensor", "torchvision"])
def test_accuracy_on_two_ranks_equals_one_process(tmp_path: Path, pipeline: str) -> None:
    """1001 test images (odd, and not a multiple of the batch of 64): nothing dropped or doubled."""
    run_dir = make_run_dir(
        tmp_path / "run",
        {
            "strategy.name": "single",
            "devices.spec": "cpu",
            "data.pipeline": pipeline,
            "data.num_workers": 0,
            "data.train_size": 2000,
            "data.test_size": 1001,
            "training.batch_size": 64,
            "training.max_steps": 15,
            "training.evaluate": False,
            "optimizer.lr": 0.05,
        },
    )
    config = load_config(run_dir.config_path)
    with EventWriter(run_dir.rank_events_path(0)) as events:  # a partly trained model with BN
        train_rank(run_dir, plan_run(config, 0), rank=0, local_rank=0, world_size=1, events=events)
    model = build_model(config.model)
    model.load_state_dict(final_weights(run_dir))
    batches = TestBatches(
        config, batch_size=64, rank=0, world_size=1, device=CPU, distributed=False
    )
    single = evaluate(model, batches, device=CPU)
    assert single.samples == 1001
    assert 0.15 < single.accuracy < 1.0  # trained somewhat: the counts mean something

    spawn_ranks(
        _ddp_evaluate,
        (str(run_dir.config_path), str(run_dir.checkpoint_path), str(tmp_path), free_port()),
    )
    per_rank = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert per_rank[0] == per_rank[1]  # all-reduced: identical on every rank
    correct, loss_sum, samples = per_rank[0]
    assert samples == 1001
    assert correct == single.correct
    assert loss_sum == pytest.approx(single.loss_sum, rel=1e-5)


def test_bf16_on_the_cpu_trains_with_finite_loss(tmp_path: Path) -> None:
    run_dir = make_run_dir(
        tmp_path / "bf16",
        {
            "strategy.name": "single",
            "devices.spec": "cpu",
            "precision.mode": "bf16",
            "data.train_size": 400,
            "training.batch_size": 32,
            "training.max_steps": 4,
        },
    )
    config = load_config(run_dir.config_path)
    with EventWriter(run_dir.rank_events_path(0)) as events:
        train_rank(run_dir, plan_run(config, 0), rank=0, local_rank=0, world_size=1, events=events)
    events_read = read_events(run_dir.rank_events_path(0))
    losses = [e.loss for e in events_read if isinstance(e, StepProgress)]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    (ended,) = [e for e in events_read if isinstance(e, EpochEnded)]
    assert math.isfinite(ended.train_loss) and ended.steps == 4
    (evaluation,) = [e for e in events_read if isinstance(e, Evaluation)]
    assert evaluation.samples == 101 and math.isfinite(evaluation.loss)


def test_a_batch_larger_than_the_epoch_is_refused(tmp_path: Path) -> None:
    run_dir = make_run_dir(
        tmp_path / "run",
        {"strategy.name": "single", "devices.spec": "cpu", "data.train_size": 100},
    )
    config = load_config(run_dir.config_path)
    with (
        EventWriter(run_dir.rank_events_path(0)) as events,
        pytest.raises(ConfigError, match="batch_size 256 is more than the 100 training images"),
    ):
        train_rank(run_dir, plan_run(config, 0), rank=0, local_rank=0, world_size=1, events=events)
