"""Every Textual Message the UI's workers post, in one module.

Workers read the run directory and NVML in threads and end by posting one of these; widgets change
only in the handlers. High-rate messages carry a whole snapshot (not a delta), so a newer one
supersedes an older one still queued: they coalesce through ``can_replace``. Nothing is dropped
silently: the surviving message counts the ones it replaced in ``coalesced``, and the screens show
the total.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message

from engine.core.host.gpus import GpuInventory

if TYPE_CHECKING:  # only annotations: the app starts without ddptui.watch
    from ddptui.launch_form import FormCheck
    from ddptui.watch import RunView
    from engine.core.jobs.gpu_view import GpuView
    from engine.core.plan.preset_check import PresetCheck
    from engine.core.runs.run_listing import RunListing
    from engine.core.runs.rundir import RunDir
    from engine.core.stacks.snapshot import StackSnapshot


class Snapshot(Message, bubble=False):
    """A message whose newer copy makes an older queued one stale (same ``key``)."""

    def __init__(self) -> None:
        super().__init__()
        self.coalesced = 0  # older snapshots this one replaced before it was handled

    @property
    def key(self) -> object:
        return type(self)

    def can_replace(self, message: Message) -> bool:
        # Textual asks the queued message whether the next pending one may replace it.
        if (
            isinstance(message, Snapshot)
            and type(message) is type(self)
            and message.key == self.key
        ):
            message.coalesced += self.coalesced + 1
            return True
        return False


class RunProgressed(Snapshot):
    """A run directory's state, folded from its event files (``ddptui.watch.RunReader``)."""

    def __init__(self, view: RunView, busy_polls: int = 0) -> None:
        super().__init__()
        self.view = view
        self.busy_polls = busy_polls  # polls skipped because the previous read was still going

    @property
    def key(self) -> object:
        return (type(self), self.view.run.run_id)


class GpusSampled(Snapshot):
    """One NVML sample of every GPU (``engine.core.host.gpus.sample_gpus``, which never raises)."""

    def __init__(self, inventory: GpuInventory) -> None:
        super().__init__()
        self.inventory = inventory


class RunsListed(Snapshot):
    """The runs directory's runs, newest first."""

    def __init__(self, runs: list[RunListing]) -> None:
        super().__init__()
        self.runs = runs


class ProcessesListed(Snapshot):
    """The ``ddptui ps`` view: jobs found by process discovery."""

    def __init__(
        self,
        jobs: list[Any],
        notes: tuple[str, ...] = (),
        gpu_error: str = "",
        hidden: tuple[Any, ...] = (),
    ) -> None:
        super().__init__()
        self.jobs = jobs
        self.notes = notes
        self.gpu_error = gpu_error
        self.hidden = hidden  # processes with a GPU device open that NVML does not list


class GpusScanned(Snapshot):
    """Every GPU's processes, named (``engine.core.jobs.gpu_view``), for the GPUs screen."""

    def __init__(self, view: GpuView) -> None:
        super().__init__()
        self.view = view


class PresetsChecked(Message, bubble=False):
    """Every preset with its config (or why it cannot be read) and plan (or why it cannot run)."""

    def __init__(self, checks: list[PresetCheck]) -> None:
        super().__init__()
        self.checks = checks


class FormChecked(Message, bubble=False):
    """The launch form applied to its preset and planned here (``ddptui.launch_form.check_form``)."""

    def __init__(self, checked: FormCheck, asked: int) -> None:
        super().__init__()
        self.checked = checked
        self.asked = asked  # which check of the form this is (the screen counts them)


class SlurmPartitionsRead(Message, bubble=False):
    """The partitions Slurm offers (``sinfo``), for the launch form's where-to-run, or why
    Slurm cannot be asked."""

    def __init__(self, partitions: list[tuple[str, bool, int, str]], problem: str = "") -> None:
        super().__init__()
        self.partitions = partitions  # (name, default, nodes, max time) each
        self.problem = problem


class RunLaunched(Message):
    """The launcher of a run started (``engine.core.ops.run_start.start_run``), or why it did not."""

    def __init__(self, run_id: str | None, started: Any = None, error: str = "") -> None:
        super().__init__()
        self.run_id = run_id
        self.started = started
        self.error = error


class KillFinished(Message):
    """The job-scoped kill of a run ended; ``report`` says what was stopped and what is left."""

    def __init__(self, run_id: str, ok: bool, report: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.ok = ok
        self.report = report


class RunsRemoved(Message):
    """Removing runs from the Runs screen ended; ``report`` says what went and what stayed."""

    def __init__(self, ok: bool, report: str) -> None:
        super().__init__()
        self.ok = ok
        self.report = report


class StopFinished(Message):
    """Stopping processes chosen on a screen ended; ``report`` says what was stopped and what is
    left."""

    def __init__(self, ok: bool, report: str) -> None:
        super().__init__()
        self.ok = ok
        self.report = report


class LatestRunFound(Message):
    """The newest run that is still going, found on disk (None: none is)."""

    def __init__(self, run_dir: RunDir | None) -> None:
        super().__init__()
        self.run_dir = run_dir


class CleanFinished(Message):
    """Cleaning orphaned jobs ended."""

    def __init__(self, ok: bool, report: str) -> None:
        super().__init__()
        self.ok = ok
        self.report = report


class ResultsBuilt(Message, bubble=False):
    """A speedup table was built for the results screen (``table`` None and ``error`` set if not)."""

    def __init__(self, source: str, table: Any, error: str = "") -> None:
        super().__init__()
        self.source = source
        self.table = table
        self.error = error


class StacksTaken(Message):
    """A fresh stack snapshot of a run (``engine.core.ops.run_snapshot``), or why there is none."""

    def __init__(self, snapshot: StackSnapshot | None, problem: str = "") -> None:
        super().__init__()
        self.snapshot = snapshot
        self.problem = problem


class WorkerProblem(Message):
    """A background read failed; the screen shows ``error`` and keeps going."""

    def __init__(self, source: str, error: str) -> None:
        super().__init__()
        self.source = source
        self.error = error
