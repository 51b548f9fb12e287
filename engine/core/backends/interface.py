"""The one interface over where a run's ranks live (``engine.core.backends``): say whether a
run is its own, locate its processes, start it, take its stacks, stop it, and describe where it runs. Plain Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from engine.core.backends.local.kill import KillResult
from engine.core.backends.local.start import StartedRun
from engine.core.common.statuses import StopRequester
from engine.core.config.schema import RunConfig
from engine.core.procs.process_identity import ProcessRef
from engine.core.procs.stopping import STOP_GRACE_SECONDS
from engine.core.runs.observer import RunState
from engine.core.runs.run_handle import RunHandle
from engine.core.runs.run_info import RunInfo
from engine.core.runs.rundir import RunDir
from engine.core.stacks.snapshot import StackSnapshot

# A process a run's records name: its global rank (None: a launcher) and who it is.
RecordedProcess = tuple[int | None, ProcessRef]


class Backend(Protocol):
    name: str  # run.json's placement.backend of its runs; the registry's key

    def owns(self, info: RunInfo) -> bool:
        """Whether the run of this run.json is this backend's (where it is: ``backend_of``)."""
        ...

    def locate(self, run_dir: RunDir, info: RunInfo) -> tuple[RecordedProcess, ...]:
        """Every launcher (rank None) and rank process the run's records name, each with its
        global rank, wherever the backend keeps them; live or not is the caller's to check."""
        ...

    def start(
        self,
        config: RunConfig,
        runs_dir: Path,
        *,
        run_id: str | None = None,
        gpu_count: int | None = None,
    ) -> StartedRun:
        """Check, make the run directory and start the run; ConfigError / RunDirError (one
        sentence, nothing started) when it cannot. ``gpu_count``: the GPUs this machine has, as
        the caller already counted them (None: counted here); a backend that places the ranks
        elsewhere goes by its own."""
        ...

    def snapshot(
        self, run_dir: RunDir, *, reason: str, handle: RunHandle | None = None
    ) -> StackSnapshot | None:
        """Every live rank's stack now, judged and stored; None when none is alive. ``handle``:
        the caller's one look at the run (``engine.core.runs.run_handle``), taken instead of
        reading run.json and looking its processes up again."""
        ...

    def stop(
        self,
        run_dir: RunDir,
        grace: float = STOP_GRACE_SECONDS,
        *,
        allow_other_users: bool = False,
        by: StopRequester = StopRequester.KILL,
        handle: RunHandle | None = None,
    ) -> KillResult:
        """Stop exactly the run's processes, verified; the summary says killed. ``handle``: as
        ``snapshot``'s (made with the same ``allow_other_users``)."""
        ...

    def describe(self, state: RunState) -> tuple[str, ...]:
        """The lines ``ddptui show`` prints of where the observed run is (a label, padded to
        11 characters, then the text); none where its devices line says it all."""
        ...
