"""Backends: where a run's ranks live. A backend starts, locates, signals and stops a run's
launchers; everything else (the run directory, the observer, stacks, the summary) is the same for
both, as torchelastic's ``PContext`` has one interface over its two ways of starting workers.

- ``local``: this machine. ``start_run`` starts the launcher in its own session, which spawns the
  ranks; ``kill_run`` asks that launcher to stop them; stacks are taken with py-spy or the
  faulthandler signal, here.
- ``slurm``: ``sbatch`` (or ``srun`` inside an allocation) starts one node launcher per node;
  Slurm owns the allocation; ddptui owns the watching, the stacks (the signal delivered through
  Slurm) and the proof that nothing of the run is left on any node.

``backend_of(run_dir)`` picks a run's backend from its run.json. Plain Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from engine.core.common.statuses import StopRequester
from engine.core.config.schema import RunConfig
from engine.core.ops.kill import KillResult, kill_run
from engine.core.ops.run_snapshot import snapshot_run
from engine.core.ops.run_start import StartedRun, start_run
from engine.core.ops.slurm_stacks import snapshot_slurm_run
from engine.core.ops.slurm_stop import kill_slurm_run
from engine.core.ops.slurm_submit import submit_run
from engine.core.runs.rundir import RunDir
from engine.core.stacks.snapshot import StackSnapshot


class Backend(Protocol):
    name: str

    def start(self, config: RunConfig, runs_dir: Path, *, run_id: str | None = None) -> StartedRun:
        """Check, make the run directory and start the run; ConfigError / RunDirError (one
        sentence, nothing started) when it cannot."""
        ...

    def snapshot(self, run_dir: RunDir, *, reason: str) -> StackSnapshot | None:
        """Every live rank's stack now, judged and stored; None when none is alive."""
        ...

    def stop(
        self,
        run_dir: RunDir,
        grace: float = 10.0,
        *,
        allow_other_users: bool = False,
        by: StopRequester = StopRequester.KILL,
    ) -> KillResult:
        """Stop exactly the run's processes, verified; the summary says killed."""
        ...


class LocalBackend:
    name = "local"

    def start(self, config: RunConfig, runs_dir: Path, *, run_id: str | None = None) -> StartedRun:
        return start_run(config, runs_dir, run_id=run_id)

    def snapshot(self, run_dir: RunDir, *, reason: str) -> StackSnapshot | None:
        return snapshot_run(run_dir, reason=reason)

    def stop(
        self,
        run_dir: RunDir,
        grace: float = 10.0,
        *,
        allow_other_users: bool = False,
        by: StopRequester = StopRequester.KILL,
    ) -> KillResult:
        return kill_run(run_dir, grace, allow_other_users=allow_other_users, by=by)


class SlurmBackend:
    name = "slurm"

    def start(self, config: RunConfig, runs_dir: Path, *, run_id: str | None = None) -> StartedRun:
        run_dir, plan, handle = submit_run(config, runs_dir, run_id=run_id)
        return StartedRun(run_dir=run_dir, plan=plan, process=handle)

    def snapshot(self, run_dir: RunDir, *, reason: str) -> StackSnapshot | None:
        return snapshot_slurm_run(run_dir, reason=reason)

    def stop(
        self,
        run_dir: RunDir,
        grace: float = 10.0,  # Slurm's KillWait governs; the node launchers' own grace is shorter
        *,
        allow_other_users: bool = False,
        by: StopRequester = StopRequester.KILL,
    ) -> KillResult:
        return kill_slurm_run(run_dir, allow_other_users=allow_other_users, reason=by.sentence)


LOCAL = LocalBackend()
SLURM = SlurmBackend()


def backend_named(slurm: bool) -> Backend:
    return SLURM if slurm else LOCAL


def backend_of(run_dir: RunDir) -> Backend:
    """The backend of an existing run, from its run.json (RunDirError when it cannot be read)."""
    return SLURM if run_dir.read_run_info().slurm is not None else LOCAL
