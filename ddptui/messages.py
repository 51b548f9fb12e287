"""Every Textual Message the UI's workers post, in one module.

Workers read the run directory and NVML in threads and end by posting one of these; widgets change
only in the handlers. High-rate messages carry a whole snapshot (not a delta), so a newer one
supersedes an older one still queued: they coalesce through ``can_replace``. Nothing is dropped
silently: the surviving message counts the ones it replaced in ``coalesced``, and the screens show
the total. What a worker read from a run directory, a command line or a log reaches the widgets
only through ``shown``: its control characters made visible.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar, cast

from textual.message import Message

from engine.core.common.visible_text import visible
from engine.core.host.gpus import GpuInventory

if TYPE_CHECKING:  # only annotations: the app starts without ddptui.watch
    from ddptui.launch_form import FormCheck
    from ddptui.watch import QueueView, RunView
    from engine.core.jobs.gpu_view import GpuView
    from engine.core.plan.preset_check import PresetCheck
    from engine.core.runs.compare.run_diff import RunDiff
    from engine.core.runs.run_listing import RunListing
    from engine.core.runs.rundir import RunDir
    from engine.core.stacks.snapshot import StackSnapshot

T = TypeVar("T")


# Frozen dataclasses already made visible, by identity (the original kept, so its id is not
# reused): a runs listing hands over the very same objects for its ended runs at every poll,
# and walking a thousand of them again each time cost a core's 0.7 %.
_SHOWN_FROZEN: dict[int, tuple[object, object]] = {}
_SHOWN_FROZEN_MAX = 20_000


def shown(value: T) -> T:
    """``value`` with every string in it made visible (``engine.core.common.visible_text``),
    through dataclasses, tuples, lists and dicts, and the very objects kept where nothing changed.
    Each message below passes what a worker read (a run directory, command lines, logs) through
    this once, so no widget ever gets a control character to draw."""
    if isinstance(value, str) and type(value) is str:  # a str enum is a word of ours
        return cast(T, visible(value))
    if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
        items = [shown(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return cast(T, type(value)(items))
    if isinstance(value, dict):
        # keys too: a node's name, say, is read from a file name and drawn as it is
        pairs = {shown(k): shown(v) for k, v in value.items()}
        unchanged = len(pairs) == len(value) and all(
            k in pairs and pairs[k] is v for k, v in value.items()
        )
        return value if unchanged else cast(T, pairs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        frozen = type(value).__dataclass_params__.frozen  # type: ignore[attr-defined]
        if frozen:
            seen = _SHOWN_FROZEN.get(id(value))
            if seen is not None and seen[0] is value:
                return cast(T, seen[1])
        changes = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = shown(old)
            if new is not old and f.init:
                changes[f.name] = new
        result = dataclasses.replace(value, **changes) if changes else value
        if frozen:
            if len(_SHOWN_FROZEN) >= _SHOWN_FROZEN_MAX:
                _SHOWN_FROZEN.clear()
            _SHOWN_FROZEN[id(value)] = (value, result)
        return result
    return value


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
        self.view = shown(view)
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
        self.runs = shown(runs)


class QueueRead(Snapshot):
    """This machine's queue: every live claim's verdict, and its owners' names."""

    def __init__(self, queue: QueueView) -> None:
        super().__init__()
        self.queue = shown(queue)


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
        self.jobs = shown(jobs)
        self.notes = shown(notes)
        self.gpu_error = shown(gpu_error)
        self.hidden = shown(hidden)  # processes with a GPU device open that NVML does not list


class GpusScanned(Snapshot):
    """Every GPU's processes, named (``engine.core.jobs.gpu_view``), for the GPUs screen."""

    def __init__(self, view: GpuView) -> None:
        super().__init__()
        self.view = shown(view)


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


class WhereChoicesRead(Message, bubble=False):
    """What the place chosen in the launch form's where-to-run offers (a scheduler's
    partitions: name, default, nodes, max time each), or why it cannot be asked."""

    def __init__(self, choices: list[tuple[str, bool, int, str]], problem: str = "") -> None:
        super().__init__()
        self.choices = choices
        self.problem = problem


class RunLaunched(Message):
    """The launcher of a run started (``engine.core.backends.local.start.start_run``), or why it did not."""

    def __init__(self, run_id: str | None, started: Any = None, error: str = "") -> None:
        super().__init__()
        self.run_id = run_id
        self.started = started
        self.error = shown(error)


class RunResumed(Message):
    """A resume (``engine.core.ops.resume``) started the run's next attempt (``started``), or did
    not (``started`` None); ``report`` says which, from where, or why not."""

    def __init__(self, run_dir: RunDir, started: Any, report: str) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.started = started
        self.report = shown(report)


class KillFinished(Message):
    """The job-scoped kill of a run ended; ``report`` says what was stopped and what is left."""

    def __init__(self, run_id: str, ok: bool, report: str) -> None:
        super().__init__()
        self.run_id = shown(run_id)
        self.ok = ok
        self.report = shown(report)


class RunsRemoved(Message):
    """Removing runs from the Runs screen ended; ``report`` says what went and what stayed."""

    def __init__(self, ok: bool, report: str) -> None:
        super().__init__()
        self.ok = ok
        self.report = shown(report)


class StopFinished(Message):
    """Stopping processes chosen on a screen ended; ``report`` says what was stopped and what is
    left."""

    def __init__(self, ok: bool, report: str) -> None:
        super().__init__()
        self.ok = ok
        self.report = shown(report)


class LatestRunFound(Message):
    """The newest run that is still going, found on disk (None: none is)."""

    def __init__(self, run_dir: RunDir | None) -> None:
        super().__init__()
        self.run_dir = run_dir


class RunsGoingAtQuit(Message):
    """Of the runs opened or launched in this UI, those still going when quit was asked."""

    def __init__(self, runs: list[RunDir]) -> None:
        super().__init__()
        self.runs = runs


class CleanFinished(Message):
    """Cleaning orphaned jobs ended."""

    def __init__(self, ok: bool, report: str) -> None:
        super().__init__()
        self.ok = ok
        self.report = shown(report)


class ResultsBuilt(Message, bubble=False):
    """A speedup table was built for the results screen (``table`` None and ``error`` set if not)."""

    def __init__(self, source: str, table: Any, error: str = "") -> None:
        super().__init__()
        self.source = source
        self.table = shown(table)
        self.error = shown(error)


class RunsCompared(Message):
    """Two runs compared (``engine.core.runs.compare``), or why they could not be (one sentence)."""

    def __init__(self, diff: RunDiff | None, problem: str = "") -> None:
        super().__init__()
        self.diff = shown(diff)
        self.problem = shown(problem)


class StacksTaken(Message):
    """A fresh stack snapshot of a run (``engine.core.backends.local.snapshot``), or why there is none."""

    def __init__(self, snapshot: StackSnapshot | None, problem: str = "") -> None:
        super().__init__()
        self.snapshot = shown(snapshot)
        self.problem = shown(problem)


class WorkerProblem(Message):
    """A background read failed; the screen shows ``error`` and keeps going."""

    def __init__(self, source: str, error: str) -> None:
        super().__init__()
        self.source = source
        self.error = shown(error)
