"""What the newest checkpoint of a run holds, for readers that cannot open it (the UI and the CLI
never load torch): ``checkpoint.json`` beside ``checkpoint.pt``.

Rank 0 writes it right after each checkpoint it saves (``engine.train.checkpoint``), from the
same figures; ``ddptui resume`` reads it to refuse a checkpoint of another model or another
world size before anything starts, and ``show`` says where a resumed attempt starts. A record
that does not match its checkpoint (a crash between the two writes) is one checkpoint behind:
the resumed rank reads the position from ``checkpoint.pt`` itself. Plain Python.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from engine.core.common.run_files import read_run_text, write_json_atomic
from engine.core.common.run_layout import RunLayout

# What checkpoint.pt holds, in its "format" key; a bare state_dict (older runs) has none.
CHECKPOINT_FORMAT = "ddptui-checkpoint/1"


@dataclass(frozen=True)
class CheckpointRecord:
    """One saved checkpoint: where training goes on from it, and what it is of."""

    epoch: int  # the epoch (from 0) of the next step
    step: int  # steps of that epoch already taken
    global_step: int  # optimizer steps taken in all
    steps_per_epoch: int
    world_size: int  # the ranks whose sampler positions and RNG states it holds
    model: str  # the model's label (ModelConfig.label)
    bytes: int
    saved_at: float  # time.time()
    attempt: int = 1  # the attempt of the run that saved it

    @property
    def where(self) -> str:
        """``step 4,800 (epoch 3, step 12 of 1,600)``: where a resumed attempt goes on."""
        return (
            f"step {self.global_step:,} (epoch {self.epoch + 1}, step {self.step:,} of "
            f"{self.steps_per_epoch:,})"
        )


def record_path(run_path: Path) -> Path:
    return RunLayout(Path(run_path)).checkpoint_record


def write_checkpoint_record(run_path: Path, record: CheckpointRecord) -> None:
    write_json_atomic(record_path(run_path), asdict(record))


def read_checkpoint_record(run_path: Path) -> CheckpointRecord | None:
    """The record of the run's newest checkpoint; None when there is none or it cannot be read
    (no checkpoint yet, a run from before records, an unsafe file)."""
    try:
        data = json.loads(read_run_text(run_path, record_path(run_path)))
    except (OSError, ValueError):
        return None
    names = {f.name for f in fields(CheckpointRecord)}
    if not isinstance(data, dict):
        return None
    try:
        return CheckpointRecord(**{k: v for k, v in data.items() if k in names})
    except TypeError:
        return None
