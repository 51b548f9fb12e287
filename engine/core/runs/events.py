"""The typed event protocol between the engine and everything that watches it.

Plain, frozen dataclasses of plain values. Each serialises to one JSON line
``{"v": SCHEMA_VERSION, "type": "<type>", ...fields}`` in ``events/rank-<r>.jsonl`` (rank events) or
``events/launcher.jsonl`` (launcher events), and reads back to an equal object. Readers skip a
torn last line (a writer mid-append) and count lines they cannot understand instead of failing.
Plain Python only: the UI imports this module.
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from engine.core.common import strict_json
from engine.core.common.disk_space import WriteFailed
from engine.core.common.formatting import format_bytes
from engine.core.common.run_files import (
    FILE_MODE,
    UnsafeRunFile,
    make_dirs,
    open_in_run,
    open_private,
)
from engine.core.common.step_split import StepSplit
from engine.core.common.strict_json import float_or_nan

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Event:
    type: ClassVar[str] = "event"
    time: float = field(default_factory=time.time, kw_only=True)

    def to_json(self) -> str:
        return strict_json.dumps({"v": SCHEMA_VERSION, "type": self.type, **asdict(self)})


# ---- rank events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RankStarted(Event):
    type: ClassVar[str] = "rank_started"
    rank: int
    world_size: int
    pid: int
    host: str
    device: str  # "cpu", "cuda:0" (CUDA index inside CUDA_VISIBLE_DEVICES)
    gpu_index: int | None = None  # NVML index of the card, None on CPU


@dataclass(frozen=True)
class EpochStarted(Event):
    type: ClassVar[str] = "epoch_started"
    rank: int
    epoch: int
    steps: int  # steps this epoch will run on this rank


@dataclass(frozen=True)
class StepProgress(Event):
    """Throttled: a few a second per rank at most. A rank of the user's own script knows only
    what its optimizer steps, progress bars and ``ddptui.report`` calls say: its loss, images/s
    and lr are None where they did not say, and ``steps`` 0 where no bar gave the epoch's total."""

    type: ClassVar[str] = "step"
    rank: int
    epoch: int
    step: int  # steps done in this epoch
    steps: int
    global_step: int
    loss: float | None
    images_per_s: float | None  # this rank, since the previous report
    step_seconds: float  # mean seconds per step since the previous report
    lr: float | None


@dataclass(frozen=True)
class EpochEnded(Event):
    """Per-rank figures; the ``global_*`` fields are reduced across ranks (max time, summed images)."""

    type: ClassVar[str] = "epoch_ended"
    rank: int
    epoch: int
    steps: int
    images: int
    seconds: float  # device-synchronised wall seconds of the epoch, data loading included
    data_wait_seconds: float  # of those, seconds spent waiting for the next batch
    warmup_steps: int  # steps left out of the steady-state figure
    steady_images_per_s: float  # this rank, after the warm-up steps
    train_loss: float  # mean over the epoch, this rank
    global_images: int
    global_seconds: float
    global_data_wait_seconds: float
    global_steady_images_per_s: float
    global_train_loss: float
    first_step: int = 0  # the epoch's step it began at: above 0 in an attempt resumed inside it


@dataclass(frozen=True)
class Evaluation(Event):
    """Full test set, counts all-reduced across ranks: identical on every rank."""

    type: ClassVar[str] = "evaluation"
    rank: int
    epoch: int
    accuracy: float
    loss: float
    samples: int
    seconds: float


@dataclass(frozen=True)
class CheckpointSaved(Event):
    type: ClassVar[str] = "checkpoint"
    rank: int
    path: str
    bytes: int
    global_step: int = 0  # the optimizer steps it holds (a resumed run goes on after them)


def one_line_error(err: BaseException) -> str:
    """An exception as a RankFailed's ``error``: its type and the first line of its message."""
    message = str(err).strip().splitlines()
    return f"{type(err).__name__}: {message[0]}" if message else type(err).__name__


@dataclass(frozen=True)
class RankFailed(Event):
    type: ClassVar[str] = "rank_failed"
    rank: int
    error: str
    traceback: str
    global_step: int | None = None  # optimizer steps done when it failed, where known


@dataclass(frozen=True)
class PhaseStarted(Event):
    """A rank starts one of the engine's known slow phases, during which it reports no steps:
    ``setup`` (model, data and process group), ``evaluation``, ``checkpoint``. Its next step report
    (or epoch start) ends it. Silence in a slow phase is not a stall until the longer
    ``supervision.slow_phase_seconds``."""

    type: ClassVar[str] = "phase_started"
    rank: int
    phase: str


@dataclass(frozen=True)
class MetricsReported(Event):
    """A rank of the user's script called ``ddptui.report(**metrics)`` (loss, accuracy,
    images_per_s, epoch, or anything else it chose)."""

    type: ClassVar[str] = "metrics"
    rank: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class StepBreakdownReported(Event):
    """Throttled like ``StepProgress``: where a rank's ``steps`` since its previous breakdown went,
    in mean seconds per step, from the ``timed`` ones among them, each standing for itself and the
    untimed steps before it (``engine.train.step_timing`` times one step in N with global hooks;
    ``engine.core.runs.step_breakdown`` reads them).
    ``sync`` is None where the gradient sync was not timed apart from backward (a user's script:
    its DDP module is not ours)."""

    type: ClassVar[str] = "step_breakdown"
    rank: int
    steps: int  # optimizer steps since the previous breakdown: what these figures stand for
    timed: int  # of those, the steps timed
    data: float  # end of the previous optimizer step to the first forward
    forward: float  # the outermost forward calls of modules with parameters
    backward: float  # last forward to the optimizer step, with the sync it waits for
    sync: float | None  # the gradient sync backward waited for, where timed on its own
    optimizer: float  # the optimizer step
    other: float  # the rest: between two forwards of one step, or a step with no forward seen
    clock: str = "cpu"  # "cuda": timed on the GPU with CUDA events

    @property
    def split(self) -> StepSplit:
        return StepSplit.of(self)


@dataclass(frozen=True)
class RankFinished(Event):
    type: ClassVar[str] = "rank_finished"
    rank: int


# ---- launcher events -------------------------------------------------------------------------


@dataclass(frozen=True)
class RunStarted(Event):
    type: ClassVar[str] = "run_started"
    run_id: str
    world_size: int
    launcher_pid: int
    devices: str
    # This launcher writes a StopSignalled event whenever it signals its ranks, so a rank it did
    # not name there was not stopped by it (False in older runs: readers then infer stops).
    stops_recorded: bool = False
    attempt: int = 1  # the run's how-manieth start (a restart or ``ddptui resume`` adds one)
    started_by: str = ""  # how a later attempt began: "restart" | "resume" (AttemptStart)
    # the checkpoint it goes on from: its global step and the epoch (from 0) it resumes in
    resumed_from_step: int | None = None
    resumed_from_epoch: int | None = None


@dataclass(frozen=True)
class RankExited(Event):
    type: ClassVar[str] = "rank_exited"
    rank: int
    pid: int
    exitcode: int | None  # None when ended by a signal
    signal: str | None  # "SIGKILL" ...


@dataclass(frozen=True)
class RankStalled(Event):
    """The launcher saw no event from this rank for ``silent_seconds``; ``why`` is what its stacks
    showed when a probe found it stalled before any silence rule (``engine.core.stacks.stall_probe``),
    "" when a silence rule did."""

    type: ClassVar[str] = "rank_stalled"
    rank: int
    silent_seconds: float
    why: str = ""


@dataclass(frozen=True)
class RankStraggling(Event):
    type: ClassVar[str] = "rank_straggling"
    rank: int
    step_seconds: float
    others_median_step_seconds: float


@dataclass(frozen=True)
class StopSignalled(Event):
    """The launcher signalled its ranks to stop: ``SIGTERM`` to every live rank (and its children)
    when a stop begins, ``SIGKILL`` to those left once the grace period is over. Who was stopped,
    and how, is read from these: the root cause leaves stopped ranks out, and ``ddptui kill``
    reports which needed SIGKILL."""

    type: ClassVar[str] = "stop_signalled"
    signal: str  # "SIGTERM" | "SIGKILL"
    ranks: tuple[int, ...]  # the ranks signalled
    pids: tuple[int, ...]  # every process signalled: those ranks and their children
    reason: str = ""  # why the launcher stopped them

    def __post_init__(self) -> None:  # JSON gives lists back
        object.__setattr__(self, "ranks", tuple(self.ranks))
        object.__setattr__(self, "pids", tuple(self.pids))


@dataclass(frozen=True)
class StacksTaken(Event):
    """The launcher took every rank's stack (``engine.core.stacks.diagnosis``) and stored it at ``path``."""

    type: ClassVar[str] = "stacks_taken"
    path: str
    reason: str  # stall | before stop | ...
    culprit_rank: int | None
    summary: str  # "rank 1 stuck at faults.py:NN in hang; rank 0 waiting in backward (all-reduce)"


@dataclass(frozen=True)
class RestartScheduled(Event):
    """Attempt ``attempt`` ended (``reason``, at ``global_step`` where known) and the launcher
    starts the next in ``in_seconds``, from the checkpoint of ``from_step`` (None: step 0):
    ``supervision.max_restarts`` (``engine.core.runs.restart_policy`` decided it)."""

    type: ClassVar[str] = "restart_scheduled"
    attempt: int
    reason: str
    global_step: int | None
    in_seconds: float
    from_step: int | None
    from_where: str  # the checkpoint in words ("step 0 (no checkpoint yet)" without one)
    restart: int  # this restart's number, from 1
    max_restarts: int


@dataclass(frozen=True)
class NodeFinished(Event):
    """One node launcher of a run across nodes is done with its share (``events/launcher-<node>
    .jsonl``): how its ranks ended there. The run's own end is decided from every node and from
    its scheduler (by its backend, ``engine.core.runs.placement``), so this is not a
    ``RunFinished``."""

    type: ClassVar[str] = "node_finished"
    node: str
    status: str  # completed | failed | killed
    reason: str = ""


@dataclass(frozen=True)
class RunFinished(Event):
    type: ClassVar[str] = "run_finished"
    status: str  # completed | failed | killed
    reason: str = ""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        RankStarted,
        EpochStarted,
        StepProgress,
        EpochEnded,
        Evaluation,
        CheckpointSaved,
        RankFailed,
        PhaseStarted,
        MetricsReported,
        StepBreakdownReported,
        RankFinished,
        RunStarted,
        RankExited,
        RankStalled,
        RankStraggling,
        StopSignalled,
        StacksTaken,
        RestartScheduled,
        NodeFinished,
        RunFinished,
    )
}


class UnknownEvent(ValueError):
    pass


def event_from_json(line: str) -> Event:
    """Parse one line; raises UnknownEvent for a newer schema, an unknown type or bad fields."""
    try:
        data: dict[str, Any] = json.loads(line)
    except json.JSONDecodeError as err:
        raise UnknownEvent(f"not JSON: {err}") from None
    if not isinstance(data, dict):
        raise UnknownEvent("not a JSON object")
    version = data.pop("v", None)
    if version != SCHEMA_VERSION:
        raise UnknownEvent(f"event schema {version!r}, this ddptui reads {SCHEMA_VERSION}")
    cls = EVENT_TYPES.get(data.pop("type", None))
    if cls is None:
        raise UnknownEvent("unknown event type")
    kinds = {f.name: f.type for f in fields(cls)}
    try:
        # a float written as null was a NaN or an infinity (engine.core.common.strict_json)
        return cls(
            **{
                k: float_or_nan(v) if kinds[k] == "float" else v
                for k, v in data.items()
                if k in kinds
            }
        )
    except TypeError as err:
        raise UnknownEvent(str(err)) from None


class EventWriter:
    """Appends events to one JSONL file, one ``write`` of one line each (no buffer that a full
    disk could leave half-flushed); producers never wait on readers.

    The file is made 0644 whatever the umask and never through a symbolic link. A line the disk
    refuses raises WriteFailed, whose message names the file and the free space.
    """

    def __init__(self, path: Path) -> None:
        make_dirs(path.parent)
        self.path = path
        try:
            self._fd: int | None = open_private(path, "append", FILE_MODE)
        except OSError as err:
            raise WriteFailed(path, err) from None

    def write(self, event: Event) -> None:
        if self._fd is None:
            raise WriteFailed(self.path, OSError(errno.EBADF, "the event file is closed"))
        data = (event.to_json() + "\n").encode("utf-8")
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as err:
            raise WriteFailed(self.path, err) from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# An event is a few hundred bytes; a line longer than this is no event (it is skipped and counted,
# never held). An event file over EVENTS_FILE_MAX_BYTES (a week of reports at the engine's rate
# fits many times) is named, not read: a run directory is its owner's to fill.
EVENT_LINE_MAX_BYTES = 64 << 10
EVENTS_FILE_MAX_BYTES = 1 << 30
READ_CHUNK_BYTES = 1 << 20


@dataclass
class EventTail:
    """Incremental reader of one JSONL file: each ``read_new`` returns the events appended since.

    Bounded: the file is read in chunks, a line over ``EVENT_LINE_MAX_BYTES`` is skipped (and
    counted) without being held, and a file with more than ``EVENTS_FILE_MAX_BYTES`` unread is
    not read at all (``refused`` says so). A partial last line is left for the next call; unreadable lines are
    counted in ``skipped``. Given the run directory (``run_path``), it opens the file as
    ``engine.core.common.run_files.open_in_run`` allows: never through a symbolic link, never
    another user's file; ``refused`` then says why.
    """

    path: Path
    run_path: Path | None = None
    offset: int = 0
    skipped: int = 0
    refused: str = ""
    _partial: bytes = b""
    _overlong: bool = False  # within a line too long to hold: dropped up to its newline

    def read_new(self) -> list[Event]:
        events: list[Event] = []
        try:
            with self._open() as f:
                size = os.fstat(f.fileno()).st_size
                # what is new since the last read: a live run's file that grows past the bound
                # over its life is followed on, a file made huge at once is not loaded
                if size - self.offset > EVENTS_FILE_MAX_BYTES:
                    self.refused = (
                        f"{self.path} is {format_bytes(size)}, over the "
                        f"{format_bytes(EVENTS_FILE_MAX_BYTES)} ddptui reads of an event file: "
                        "not loaded"
                    )
                    return []
                f.seek(self.offset)
                while chunk := f.read(READ_CHUNK_BYTES):
                    self.offset += len(chunk)
                    events += self._parse(chunk)
        except FileNotFoundError:
            return events
        except UnsafeRunFile as err:
            self.refused = str(err)
            return events
        self.refused = ""
        return events

    def _parse(self, chunk: bytes) -> list[Event]:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()  # empty when the chunk ended on a newline
        if self._overlong and lines:  # the rest of the overlong line ends here
            self._overlong = False
            self.skipped += 1
            lines.pop(0)
        if len(self._partial) > EVENT_LINE_MAX_BYTES:
            self._partial, self._overlong = b"", True
        events = []
        for raw in lines:
            if not raw.strip():
                continue
            if len(raw) > EVENT_LINE_MAX_BYTES:
                self.skipped += 1
                continue
            try:
                events.append(event_from_json(raw.decode("utf-8", errors="replace")))
            except UnknownEvent:
                self.skipped += 1
        return events

    def _open(self) -> BinaryIO:
        if self.run_path is None:
            return open(self.path, "rb")
        return open_in_run(self.run_path, self.path)


def read_events(path: Path, run_path: Path | None = None) -> list[Event]:
    """Every complete event in one file (opened safely when ``run_path`` is given)."""
    return EventTail(path, run_path).read_new()
