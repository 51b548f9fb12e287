"""The backends there are, and which one a run has (``engine.core.backends``). Plain Python."""

from __future__ import annotations

from engine.core.backends.interface import Backend
from engine.core.backends.local.backend import LocalBackend
from engine.core.backends.slurm.backend import SlurmBackend
from engine.core.runs.rundir import RunDir

__all__ = ["LOCAL", "SLURM", "Backend", "backend_named", "backend_of"]

LOCAL = LocalBackend()
SLURM = SlurmBackend()


def backend_named(slurm: bool) -> Backend:
    return SLURM if slurm else LOCAL


def backend_of(run_dir: RunDir) -> Backend:
    """The backend of an existing run, from its run.json (RunDirError when it cannot be read)."""
    return SLURM if run_dir.read_run_info().slurm is not None else LOCAL
