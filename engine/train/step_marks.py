"""The marks of one timed step and the clocks that make them: where a step's parts begin and
end, and the parts they add up to (``split_step``). ``engine.train.step_timing``'s hooks make the
marks; this module only reads time.

``HostClock`` is wall time on the host (a CPU rank); ``CudaClock`` is GPU time, a CUDA event
recorded on the current stream at each mark and read once the GPU has passed it, so a step never
waits for the device. Torch is never imported here: the CUDA clock is handed the torch module of
a process that uses CUDA.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from engine.core.common.step_split import StepSplit


class Clock(Protocol):
    """Marks points of a step and tells the seconds between them."""

    def mark(self) -> Any: ...

    def seconds(self, start: Any, end: Any) -> float: ...

    def passed(self, mark: Any) -> bool: ...

    def wait(self, mark: Any) -> None: ...

    def release(self, marks: list[Any]) -> None: ...


class HostClock:
    """Wall time on the host: what a CPU rank's steps take."""

    name = "cpu"

    def __init__(self, device: Any = None) -> None:
        self.device = device

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start

    def passed(self, mark: float) -> bool:
        return True

    def wait(self, mark: float) -> None:
        return None

    def release(self, marks: list[Any]) -> None:
        return None


class CudaClock:
    """GPU time: a CUDA event recorded at each mark on ``device``'s current stream (whichever
    thread marks: the training thread, autograd's, a collective's callback), read once the GPU
    has passed it (``passed``), so the step never waits for the device. Events are reused."""

    name = "cuda"

    def __init__(self, torch: ModuleType, device: Any) -> None:
        self.device = device
        self._event = torch.cuda.Event
        self._stream = torch.cuda.current_stream
        self._free: list[Any] = []

    def mark(self) -> Any:
        event = self._free.pop() if self._free else self._event(enable_timing=True)
        event.record(self._stream(self.device))
        return event

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0

    def passed(self, mark: Any) -> bool:
        return bool(mark.query())

    def wait(self, mark: Any) -> None:
        mark.synchronize()

    def release(self, marks: list[Any]) -> None:
        self._free.extend(marks)


@dataclass
class TimedStep:
    """The marks of one timed step, from the previous optimizer step's end to its own."""

    start: Any
    forwards: list[list[Any]] = field(default_factory=list)  # [start, end or None] each
    bucket_ready: list[Any] = field(default_factory=list)  # a gradient bucket went to sync
    bucket_synced: list[Any] = field(default_factory=list)  # its sync was done
    optimizer_start: Any = None
    end: Any = None
    module_calls: int = 0
    stands_for: int = 1  # itself and the untimed steps since the previous timed one

    def marks(self) -> list[Any]:
        inner = [m for pair in self.forwards for m in pair if m is not None]
        ends = [self.optimizer_start, self.end]
        found = [self.start, *inner, *self.bucket_ready, *self.bucket_synced, *ends]
        return [m for m in found if m is not None]


@dataclass(frozen=True)
class StepParts:
    """One step's split; ``total`` is its seconds from start to end, which the parts add up to."""

    split: StepSplit
    total: float


def split_step(step: TimedStep, clock: Clock, sync_timed: bool) -> StepParts:
    """The parts of one finished step from its marks (``other`` takes what the rest leave)."""

    def at(mark: Any) -> float:  # seconds from the step's start
        return clock.seconds(step.start, mark)

    total = max(0.0, at(step.end))
    optimizer_start = min(total, max(0.0, at(step.optimizer_start)))
    optimizer = total - optimizer_start
    forwards = [(at(s), at(e)) for s, e in step.forwards if e is not None]
    data = forward = backward = 0.0
    if forwards:
        data = max(0.0, forwards[0][0])
        forward = sum(max(0.0, e - s) for s, e in forwards)
        backward = max(0.0, optimizer_start - forwards[-1][1])
    sync: float | None = None
    if sync_timed:
        sync = 0.0
        if step.bucket_ready and step.bucket_synced:
            last_ready = max(at(m) for m in step.bucket_ready)
            last_synced = max(at(m) for m in step.bucket_synced)
            sync = min(backward, max(0.0, last_synced - last_ready))
            backward -= sync
    other = max(0.0, total - data - forward - backward - (sync or 0.0) - optimizer)
    split = StepSplit(data, forward, backward, sync, optimizer, other)
    return StepParts(split, total)
