"""What the run observer asks of a run on Slurm (``engine.core.runs.placement.PlacementWatch``),
answered by ``engine.core.backends.slurm.state``. Registered as ``engine.core`` is first imported,
so this module stays light: the decision's modules are imported when a run on Slurm is first
observed. Plain Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.backends.slurm.state import JobReader
    from engine.core.procs.process_identity import ProcessProbe
    from engine.core.runs.placement import PlacementVerdict, PlacementView
    from engine.core.runs.run_info import RunInfo
    from engine.core.runs.rundir import RunDir
    from engine.core.runs.summary import RunSummary

SLURM = (
    "slurm"  # the backend's name: run.json's placement.backend of its runs (and older ones' key)
)
SLURM_DIR = "slurm"  # its own records, in the run directory (RunLayout.placement_dir)
RENDEZVOUS_NAME = "rendezvous.json"  # in SLURM_DIR: where one attempt's ranks met


class SlurmWatch:
    """``jobs``: Slurm's word on a job (None: ``squeue`` / ``sacct``; a stand-in in tests)."""

    name = SLURM
    # One attempt's own file: where its ranks met (the node records and GPU samples, nodes/ and
    # gpus/, are archived with every attempt)
    attempt_files: tuple[str, ...] = (f"{SLURM_DIR}/{RENDEZVOUS_NAME}",)

    def __init__(self, jobs: JobReader | None = None) -> None:
        self.jobs = jobs

    def observe(
        self, run_dir: RunDir, info: RunInfo, now: float, probe: ProcessProbe
    ) -> PlacementVerdict:
        from engine.core.backends.slurm.state import observe_job

        return observe_job(run_dir, info, now, probe, self.jobs)

    def recorded(self, run_dir: RunDir, info: RunInfo) -> PlacementView:
        from engine.core.backends.slurm.state import ended_view, placement_view

        return placement_view(ended_view(run_dir, info))

    def summary(self, run_dir: RunDir, verdict: PlacementVerdict) -> RunSummary:
        from engine.core.backends.slurm.state import summary_of

        return summary_of(run_dir, verdict)


SLURM_WATCH = SlurmWatch()
