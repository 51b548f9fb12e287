"""CIFAR-10 through the real ``torchvision.datasets.CIFAR10``, from tiny files in the CIFAR-10 python
format written here (no download).

torchvision checks the md5 of each file against the real data set's; the tests swap in the md5s of
the files they wrote (class attributes, in this process and in each spawned rank), and everything
else is torchvision's own loading code.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torchvision.datasets import CIFAR10

from engine.core.config.schema import RunConfig
from engine.core.config.toml_io import apply_overrides, load_config, to_toml
from engine.core.plan.run_plan import CIFAR_DIRNAME, plan_run
from engine.core.runs.events import Evaluation, EventWriter, RankFinished, StepProgress, read_events
from engine.core.runs.rundir import RunDir
from engine.train import data
from engine.train.checkpoint import model_weights
from engine.train.training import train_rank
from engine.train.worker import spawn_entry
from tests.fixtures.spawning import spawn_ranks

IMAGES_PER_FILE = 20
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer"]
LABEL_NAMES += ["dog", "frog", "horse", "ship", "truck"]


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_cifar_files(root: Path) -> dict[str, np.ndarray]:
    """CIFAR-10 python-format pickles, 20 images each; returns the images (N, 3, 32, 32) and
    labels written per file."""
    folder = root / CIFAR_DIRNAME
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written: dict[str, np.ndarray] = {}
    for name in [*TRAIN_FILES, "test_batch"]:
        images = rng.integers(0, 256, size=(IMAGES_PER_FILE, 3, 32, 32), dtype=np.uint8)
        labels = rng.integers(0, 10, size=IMAGES_PER_FILE).tolist()
        entry = {
            "batch_label": name,
            "labels": labels,
            # One row per image: the red plane, then green, then blue, each row-major.
            "data": images.reshape(IMAGES_PER_FILE, 3072),
            "filenames": [f"{name}_{i}.png" for i in range(IMAGES_PER_FILE)],
        }
        (folder / name).write_bytes(pickle.dumps(entry))
        written[name] = images
        written[name + ".labels"] = np.array(labels)
    meta = {"label_names": LABEL_NAMES, "num_cases_per_batch": IMAGES_PER_FILE, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    return written


def accept_files(root: Path) -> dict[str, Any]:
    """The md5 lists torchvision checks, for the files under ``root``."""
    folder = root / CIFAR_DIRNAME
    return {
        "train_list": [[name, md5(folder / name)] for name in TRAIN_FILES],
        "test_list": [["test_batch", md5(folder / "test_batch")]],
        "meta": {**CIFAR10.meta, "md5": md5(folder / "batches.meta")},
    }


@pytest.fixture
def cifar_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, Any]]:
    root = tmp_path / "cifar10"
    written = write_cifar_files(root)
    for name, value in accept_files(root).items():
        monkeypatch.setattr(CIFAR10, name, value)
    return root, written


def make_config(root: Path, **overrides: object) -> RunConfig:
    base = {
        "strategy.name": "single",
        "devices.spec": "cpu",
        "data.dataset": "cifar10",
        "data.root": str(root),
        "data.num_workers": 0,
        "training.batch_size": 8,
        "training.max_steps": 3,
        "training.report_interval": 0.0,
    }
    return apply_overrides(RunConfig(name="cifar-test"), {**base, **overrides})


def make_run_dir(path: Path, config: RunConfig) -> RunDir:
    run_dir = RunDir(path)
    run_dir.events_dir.mkdir(parents=True)
    run_dir.logs_dir.mkdir()
    run_dir.config_path.write_text(to_toml(config), encoding="utf-8")
    return run_dir


def test_cifar_files_load_as_written(cifar_root: tuple[Path, dict[str, Any]]) -> None:
    root, written = cifar_root
    config = make_config(root)
    train = data.load_split(config, True)
    test = data.load_split(config, False)
    assert train.images.shape == (100, 3, 32, 32) and train.images.dtype == torch.uint8
    expected = np.concatenate([written[name] for name in TRAIN_FILES])
    assert torch.equal(train.images, torch.from_numpy(expected))
    labels = np.concatenate([written[name + ".labels"] for name in TRAIN_FILES])
    assert train.labels.tolist() == labels.tolist()
    assert torch.equal(test.images, torch.from_numpy(written["test_batch"]))
    # The PIL pipeline serves the same pixels.
    pil = data.torchvision_dataset(config, False)
    image, label = pil[3]
    torch.testing.assert_close(image, data.normalize(test.images[3]))
    assert label == test.labels[3]


@pytest.mark.parametrize("pipeline", ["tensor", "torchvision"])
def test_training_on_cifar_files(
    cifar_root: tuple[Path, dict[str, Any]], tmp_path: Path, pipeline: str
) -> None:
    root, _ = cifar_root
    config = make_config(root, **{"data.pipeline": pipeline})
    run_dir = make_run_dir(tmp_path / "run", config)
    with EventWriter(run_dir.rank_events_path(0)) as events:
        train_rank(run_dir, plan_run(config, 0), rank=0, local_rank=0, world_size=1, events=events)
    evs = read_events(run_dir.rank_events_path(0))
    assert [e.step for e in evs if isinstance(e, StepProgress)] == [1, 2, 3]
    (evaluation,) = [e for e in evs if isinstance(e, Evaluation)]
    assert evaluation.samples == IMAGES_PER_FILE
    assert model_weights(torch.load(run_dir.checkpoint_path, weights_only=True))


def _patched_rank(local_rank: int, run_dir: str, root: str) -> None:
    """A DDP rank that accepts the test's files, then runs the real rank entry."""
    for name, value in accept_files(Path(root)).items():
        setattr(CIFAR10, name, value)
    spawn_entry(local_rank, run_dir, (0, 1), 2)


@pytest.mark.slow
def test_ddp_ranks_load_cifar_after_rank_0_downloads(
    cifar_root: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """download = true under DDP: rank 0 fetches (here: finds the files complete) while rank 1
    waits at the barrier; then both train and evaluate the full test set."""
    root, _ = cifar_root
    config = make_config(
        root, **{"strategy.name": "ddp", "devices.spec": "cpu:2", "data.download": True}
    )
    run_dir = make_run_dir(tmp_path / "run", config)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    spawn_ranks(_patched_rank, (str(run_dir.path), str(root)))
    for rank in range(2):
        evs = read_events(run_dir.rank_events_path(rank))
        assert isinstance(evs[-1], RankFinished), run_dir.rank_log_path(rank).read_text()
        (evaluation,) = [e for e in evs if isinstance(e, Evaluation)]
        assert evaluation.samples == IMAGES_PER_FILE
    assert load_config(run_dir.config_path).data.download
    assert os.listdir(root) == [CIFAR_DIRNAME]  # nothing downloaded next to it
