"""Where a later attempt of a run goes on from: the newest checkpoint its earlier attempts left.

- The engine's workload: ``checkpoint.pt`` (``engine.train.checkpoint``), described by
  ``checkpoint.json`` (``engine.core.runs.checkpoint_record``) for readers without torch.
- A user's script: the newest regular file in ``RUN_DIR/checkpoints/``, the directory every rank
  finds in ``$DDPTUI_CHECKPOINT_DIR``; newest by modification time (then by name), leaving out
  files being written (names starting with ``.``, ending in ``.tmp``, ``.part`` or ``~``), links
  and other users' files. ddptui cannot read a script's checkpoint, so its step is not known.

Plain Python: the launcher (a restart) and ``ddptui resume`` both ask here.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from engine.core.config.schema import RunConfig
from engine.core.runs.checkpoint_record import CheckpointRecord, read_checkpoint_record
from engine.core.runs.rundir import RunDir

PARTIAL_SUFFIXES = (".tmp", ".part", "~")


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint a run can go on from."""

    path: Path
    record: CheckpointRecord | None = None  # what it holds (the engine's; None for a script's)

    @property
    def global_step(self) -> int | None:
        return self.record.global_step if self.record is not None else None

    @property
    def epoch(self) -> int | None:
        return self.record.epoch if self.record is not None else None

    def describe(self) -> str:
        """``step 4,800 (epoch 3, step 12 of 1,600)``, or the script's file by name."""
        if self.record is not None:
            return self.record.where
        return f"its newest checkpoint {self.path.name}"


def _regular_file_of(path: Path, owner: int) -> os.stat_result | None:
    """``path``'s stat when it is a regular file (no link) of ``owner``, else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) and st.st_uid == owner else None


def newest_script_checkpoint(run_dir: RunDir) -> Path | None:
    """The newest file a script wrote in ``checkpoints/`` (module docstring), or None."""
    folder = run_dir.layout.script_checkpoints
    try:
        owner = os.lstat(run_dir.path).st_uid
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return None
        with os.scandir(folder) as entries:
            names = [e.name for e in entries]
    except OSError:
        return None
    found: list[tuple[int, str]] = []
    for name in names:
        if name.startswith(".") or name.endswith(PARTIAL_SUFFIXES):
            continue
        st = _regular_file_of(folder / name, owner)
        if st is not None:
            found.append((st.st_mtime_ns, name))
    return folder / max(found)[1] if found else None


def resume_point(run_dir: RunDir, config: RunConfig) -> ResumePoint | None:
    """The checkpoint the next attempt of this run goes on from; None: it begins at step 0."""
    if config.script.given:
        newest = newest_script_checkpoint(run_dir)
        return ResumePoint(newest) if newest is not None else None
    try:
        owner = os.lstat(run_dir.path).st_uid
    except OSError:
        return None
    if _regular_file_of(run_dir.checkpoint_path, owner) is None:
        return None
    return ResumePoint(run_dir.checkpoint_path, read_checkpoint_record(run_dir.path))


def checkpoint_mismatch(point: ResumePoint, config: RunConfig, world_size: int) -> str:
    """Why the engine's ranks could not go on from ``point`` under ``config``, as far as its
    record tells without torch ("" when nothing is wrong): a checkpoint of another model or of
    another number of ranks. The ranks check the checkpoint itself again as they load it."""
    record = point.record
    if record is None or config.script.given:
        return ""
    if record.model != config.model.label:
        return (
            f"{point.path} is a checkpoint of model {record.model}, and the run's config.toml "
            f"now trains {config.model.label}"
        )
    if record.world_size != world_size:
        return (
            f"{point.path} was taken with {record.world_size} rank(s) and the run now has "
            f"{world_size}: its sampler positions and RNG states are for those"
        )
    return ""
