"""The engine's checkpoint: everything a resumed run needs to take exactly the steps an
uninterrupted one would, in ``checkpoint.pt`` (one file, replaced atomically and durably).

``checkpoint.pt`` holds, in the layout of torchvision's classification reference::

    {"format": "ddptui-checkpoint/1",
     "model": state_dict, "optimizer": ..., "scaler": ...,
     "position": {"epoch", "step", "global_step", "steps_per_epoch"},  # the lr schedule is a
     "world_size": N, "model_label": "...",                           # function of global_step
     "rng": [per rank: torch, cuda, python, numpy]}

all loadable with ``torch.load(..., weights_only=True)``. ``model_weights`` reads the model's
``state_dict`` from it and from the bare ``state_dict`` older runs wrote. The sampler needs no
state of its own: a ``DistributedSampler``'s order is a function of (seed, epoch), so
(epoch, step) places it. Each rank's RNG states are gathered to rank 0 (a collective under DDP:
every rank takes the checkpoint together, at the same step).
"""

from __future__ import annotations

import io
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from engine.core.common.run_files import PRIVATE_FILE_MODE, write_atomic
from engine.core.runs.checkpoint_record import (
    CHECKPOINT_FORMAT,
    CheckpointRecord,
    write_checkpoint_record,
)


class CheckpointMismatch(ValueError):
    """A checkpoint this run cannot go on from (another model, another world size, no state)."""


@dataclass(frozen=True)
class TrainingPosition:
    """Where training stands: the next step is step ``step`` of ``epoch`` (both from 0)."""

    epoch: int = 0
    step: int = 0
    global_step: int = 0
    steps_per_epoch: int = 0


# ---- RNG states ------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """This process's random generators, as plain tensors and tuples (weights_only loads them)."""
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "python": random.getstate(),
        "numpy": (
            kind,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            position,
            has_gauss,
            cached,
        ),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))


def gather_rng_states(rank: int, world_size: int, distributed: bool) -> list[dict[str, Any]]:
    """Every rank's RNG states on rank 0 (in rank order); an empty list on the others."""
    mine = rng_state()
    if not distributed:
        return [mine]
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    return list(gathered) if gathered is not None else []


# ---- writing and reading ---------------------------------------------------------------------


def save_checkpoint(payload: dict[str, Any], path: Path) -> int:
    """``payload`` written atomically and durably (fsync before and after the rename), readable
    by its owner only; returns its size in bytes. A failed write (a full disk) leaves the previous
    checkpoint and no temporary file, and raises WriteFailed naming the path and the free space."""
    # Serialised in memory first: torch's writer turns a full disk into a RuntimeError that no
    # longer says which errno it was.
    data = io.BytesIO()
    torch.save(payload, data)
    write_atomic(path, data.getvalue(), PRIVATE_FILE_MODE, durable=True)
    return len(data.getbuffer())


def checkpoint_payload(
    *,
    raw_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    position: TrainingPosition,
    rng: list[dict[str, Any]],
    model_label: str,
) -> dict[str, Any]:
    return {
        "format": CHECKPOINT_FORMAT,
        "model": raw_model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "position": {
            "epoch": position.epoch,
            "step": position.step,
            "global_step": position.global_step,
            "steps_per_epoch": position.steps_per_epoch,
        },
        "world_size": len(rng),
        "model_label": model_label,
        "rng": rng,
    }


def write_checkpoint(run_path: Path, path: Path, payload: dict[str, Any], attempt: int) -> int:
    """The checkpoint, then its record for readers without torch; returns its size."""
    size = save_checkpoint(payload, path)
    position = payload["position"]
    write_checkpoint_record(
        run_path,
        CheckpointRecord(
            epoch=position["epoch"],
            step=position["step"],
            global_step=position["global_step"],
            steps_per_epoch=position["steps_per_epoch"],
            world_size=payload["world_size"],
            model=payload["model_label"],
            bytes=size,
            saved_at=time.time(),
            attempt=attempt,
        ),
    )
    return size


def load_checkpoint(path: Path) -> dict[str, Any]:
    """``checkpoint.pt`` as saved, on the CPU (``weights_only``: no code is unpickled)."""
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(loaded, dict):
        raise CheckpointMismatch(f"{path} holds no state_dict")
    return loaded


def model_weights(loaded: dict[str, Any]) -> dict[str, Any]:
    """The model's ``state_dict`` of a loaded checkpoint: this format's or a bare one (older runs)."""
    if loaded.get("format") == CHECKPOINT_FORMAT:
        return loaded["model"]
    return loaded


def resumable(loaded: dict[str, Any], path: Path) -> dict[str, Any]:
    """``loaded`` when a run can go on from it, else CheckpointMismatch saying why."""
    if loaded.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointMismatch(
            f"{path} holds the model's weights only (a run from before resumable checkpoints): "
            "there is no optimizer state or position to go on from"
        )
    return loaded


def first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def resume_from_checkpoint(
    loaded: dict[str, Any],
    path: Path,
    *,
    raw_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    rank: int,
    world_size: int,
    steps_per_epoch: int,
) -> TrainingPosition:
    """Model, optimizer, scaler and this rank's RNG states as ``loaded`` holds them; returns where
    training goes on. CheckpointMismatch (one sentence) when this run cannot go on from it: a
    checkpoint of weights only, of another model, of another world size, or of epochs of another
    length (the data or the batch changed)."""
    resumable(loaded, path)
    label = loaded.get("model_label", "?")
    if loaded["world_size"] != world_size:
        raise CheckpointMismatch(
            f"{path} was taken with {loaded['world_size']} rank(s) and this run has "
            f"{world_size}: its sampler positions and RNG states are for those"
        )
    position = TrainingPosition(**loaded["position"])
    if position.steps_per_epoch != steps_per_epoch:
        raise CheckpointMismatch(
            f"{path} was taken with {position.steps_per_epoch} steps per epoch and this run has "
            f"{steps_per_epoch}: the data or the batch size changed"
        )
    try:
        raw_model.load_state_dict(loaded["model"])
    except RuntimeError as err:
        raise CheckpointMismatch(
            f"{path} is a checkpoint of another model ({label}): {first_line(err)}"
        ) from None
    optimizer.load_state_dict(loaded["optimizer"])
    if loaded["scaler"]:  # empty where the run had no GradScaler (fp32, bf16)
        scaler.load_state_dict(loaded["scaler"])
    restore_rng_state(loaded["rng"][rank])
    return position
