"""Each step of a rank, split into data wait, forward, backward, sync, optimizer and other, with no
change to the model: torch's global hooks, the same for the engine's loop and a user's script.

- optimizer step pre and post hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook``
  / ``..._post_hook``) mark where a step's optimizer part begins and ends; one post hook to the
  next is one step;
- module forward pre and post hooks (``torch.nn.modules.module.register_module_forward_pre_hook``
  / ``register_module_forward_hook``) mark the outermost forward calls of modules with
  parameters (a loss module or a transform has none), on the thread that steps the optimizer
  (DataParallel's replica threads are not the step's);
- where the engine owns the DDP module, a communication hook (the default all-reduce, timed)
  marks when the last gradient bucket was ready and when its sync was done: the sync backward
  waits for, apart from backward's own work.

The module hooks cost every module call a few microseconds, so they are in place only for the
steps being timed: every one of the first ``ALL_TIMED_FIRST``, then one step in N, N chosen so
that timing costs ``COST_SHARE`` of the steps (``bench/step_timing_overhead.py`` measures it).
Each timed step stands for itself and the untimed steps before it; their parts are written as
``StepBreakdownReported`` events, at most one per ``training.report_interval`` seconds
(``engine.core.runs.step_breakdown`` reads them).

On a GPU the marks are CUDA events, resolved a few steps later once the GPU has passed them:
never a synchronize in the step (the marks, the clocks and a step's parts from its marks:
``engine.train.step_marks``). The hooks never change what the model or the optimizer
compute, and a hook that fails turns the timing off instead of failing the step.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from engine.core.common.step_split import StepSplit
from engine.core.runs.events import EventWriter, StepBreakdownReported
from engine.train.step_marks import Clock, CudaClock, HostClock, StepParts, TimedStep, split_step

# What a module call costs with the global hooks in place, and what one timed step's own
# bookkeeping costs: an estimate on the high side of a timed step of a real loop, measured
# against its untimed steps (bench/step_timing_overhead.py: 120-250 us for 7 module calls).
HOOKED_CALL_SECONDS = 20e-6
TIMED_STEP_SECONDS = 100e-6
# The share of the steps' time the timing may cost on average.
COST_SHARE = 0.002
ALL_TIMED_FIRST = 20  # a short run still gets its split from every one of its first steps
MAX_GAP = 64  # at least one step in this many is timed
PENDING_KEPT = 16  # CUDA-timed steps waiting for the GPU; more are dropped, not waited for


@dataclass
class _Window:
    """The steps split since the last report: each timed step's parts counted for the steps it
    stands for (itself and the untimed ones before it), so the means are of every step."""

    steps: int = 0
    timed: int = 0
    seconds: StepSplit = field(default_factory=StepSplit)

    def add(self, parts: StepParts, steps: int, timed: int = 1) -> None:
        self.steps += steps
        self.timed += timed
        self.seconds = self.seconds.plus(parts.split.times(steps))

    def event(self, rank: int, clock: str) -> StepBreakdownReported:
        mean = self.seconds.mean_over(self.steps)
        return StepBreakdownReported(
            rank=rank, steps=self.steps, timed=self.timed, clock=clock, **mean.fields()
        )


def _never() -> bool:
    return False


def next_gap(module_calls: int, step_seconds: float, steps_timed: int, rng: random.Random) -> int:
    """Steps until the next timed one: 1 for the first ``ALL_TIMED_FIRST``, then as many as keep
    the hooks' cost (``module_calls`` hooked calls and the step's own marks) to ``COST_SHARE`` of
    the steps' time; drawn around that mean, so a pattern in the loop is not always missed."""
    if steps_timed < ALL_TIMED_FIRST:
        return 1
    cost = module_calls * HOOKED_CALL_SECONDS + TIMED_STEP_SECONDS
    mean = min(MAX_GAP, max(1, math.ceil(cost / (COST_SHARE * max(step_seconds, 1e-9)))))
    return rng.randint(1, 2 * mean - 1)


class StepTimer:
    """Times one rank's steps through torch's global hooks; ``install`` puts the optimizer hooks
    in place (the module hooks come and go with the timed steps), ``close`` takes every hook out.

    ``restart`` starts the next step now (an epoch's start: the time between epochs is in no
    step); ``flush`` writes what was timed since the last report (waiting for the GPU, at an
    epoch's end or the script's). ``make_clock(device)`` makes the clock at the first step, for
    the device of the optimizer's parameters (None: not known yet): the GPU's for a CUDA device.
    """

    def __init__(
        self,
        events: EventWriter,
        rank: int,
        interval: float,
        *,
        make_clock: Callable[[Any], Clock] | None = None,
    ) -> None:
        self.events = events
        self.rank = rank
        self.interval = interval
        self._make_clock: Callable[[Any], Clock] = make_clock or HostClock
        self.clock: Clock | None = None
        self.clock_name = "cpu"
        self.sync_timed = False  # a communication hook times the gradient sync
        self._module_module: ModuleType | None = None
        # torch.compiler.is_compiling: True while TorchDynamo traces a module's call, hooks
        # included; a hook must then do nothing it cannot trace, or it breaks the user's graph.
        self._compiling: Callable[[], bool] = _never
        self._handles: list[Any] = []
        self._module_handles: list[Any] = []
        self._thread: int | None = None  # the thread that steps the optimizer
        self._depth = 0  # module calls open on that thread
        self._outer: Any = None  # the outermost module call open, when it is timed
        self._step: TimedStep | None = None  # being timed now
        self._pending: deque[TimedStep] = deque()  # finished, waiting for the GPU
        self._window = _Window()
        self._countdown = 1  # optimizer steps until the next timed step begins
        self._started = False  # a step has begun (the first optimizer step, or a restart)
        self._untimed = 0  # steps done since the last timed one ended
        self._last_parts: StepParts | None = None  # the latest timed step's
        self._gap = 1
        self.timed = 0  # steps split so far
        self._last_report = time.monotonic()
        self._rng = random.Random(rank)
        self.failed = ""  # why timing stopped, when a hook failed
        self._lock = threading.Lock()  # the comm hook's callbacks run on the backend's threads

    # -- hooks in and out ----------------------------------------------------------------------

    def install(self, optimizer_module: ModuleType, module_module: ModuleType) -> None:
        """Register the optimizer step hooks (``torch.optim.optimizer``) and the module hooks
        (``torch.nn.modules.module``), which are taken out between timed steps unless a model
        was compiled."""
        self._module_module = module_module
        compiler = getattr(sys.modules.get("torch"), "compiler", None)
        self._compiling = getattr(compiler, "is_compiling", _never)
        self._handles = [
            optimizer_module.register_optimizer_step_pre_hook(self._optimizer_started),
            optimizer_module.register_optimizer_step_post_hook(self._optimizer_done),
        ]
        if hasattr(os, "register_at_fork"):  # a DataLoader worker forked mid-step times nothing
            os.register_at_fork(after_in_child=self._forget)
        # in place from the first forward on: a model compiled then sees the hooks it will
        # keep (``_dynamo_compiled``) and is compiled once
        self._hook_modules()

    def close(self) -> None:
        """Write what was split and take every hook out. Never waits for the GPU: a rank may be
        closing because a collective failed (``flush`` first, on the way out of a good run)."""
        with contextlib.suppress(Exception):
            self._resolve(wait=False)
            self._maybe_report(force=True)
        self._forget()

    def _forget(self) -> None:
        for handle in [*self._handles, *self._module_handles]:
            handle.remove()
        self._handles, self._module_handles = [], []
        self._step = None
        self._pending.clear()

    def _hook_modules(self) -> None:
        if self._module_handles or self._module_module is None:
            return
        self._depth = 0
        self._module_handles = [
            self._module_module.register_module_forward_pre_hook(self._forward_started),
            self._module_module.register_module_forward_hook(self._forward_done, always_call=True),
        ]

    def _unhook_modules(self) -> None:
        if self._module_handles and _dynamo_compiled():
            return  # a compiled model is guarded on the global hooks: a change recompiles it
        for handle in self._module_handles:
            handle.remove()
        self._module_handles = []

    def _fail(self, err: BaseException) -> None:
        """A hook went wrong: stop timing, say why once in the log, never fail the step."""
        if not self.failed:
            self.failed = f"{type(err).__name__}: {err}"
            print(
                f"ddptui: step timing stopped on rank {self.rank}: {self.failed}", file=sys.stderr
            )
        self._forget()

    # -- the hooks (they return None: nothing of the call changes) ------------------------------

    def _forward_started(self, module: Any, _args: Any) -> None:
        if self._compiling():  # traced into a compiled graph: a no-op there
            return
        step = self._step
        if step is None or threading.get_ident() != self._thread:
            return
        self._depth += 1
        step.module_calls += 1
        if self._depth != 1:
            return
        try:
            if next(iter(module.parameters()), None) is not None:
                step.forwards.append([self.clock.mark() if self.clock else None, None])
                self._outer = module
        except Exception as err:
            self._fail(err)

    def _forward_done(self, module: Any, _args: Any, _output: Any) -> None:
        if self._compiling():
            return
        step = self._step
        if step is None or threading.get_ident() != self._thread:
            return
        self._depth = max(0, self._depth - 1)
        if self._depth != 0 or self._outer is not module:
            return
        self._outer = None
        try:
            step.forwards[-1][1] = self.clock.mark() if self.clock else None
        except Exception as err:
            self._fail(err)

    def _optimizer_started(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        step = self._step
        if step is None or self.clock is None:
            return
        try:
            step.optimizer_start = self.clock.mark()
        except Exception as err:
            self._fail(err)

    def _optimizer_done(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        try:
            self._step_done(optimizer)
        except Exception as err:
            self._fail(err)

    # -- steps -----------------------------------------------------------------------------------

    def _clock(self, device: Any = None) -> Clock:
        if self.clock is None:
            self.clock = self._make_clock(device)
            self.clock_name = getattr(self.clock, "name", "cpu")
        return self.clock

    def _step_done(self, optimizer: Any = None) -> None:
        clock = self._clock(parameters_device(optimizer) if self.clock is None else None)
        self._thread = threading.get_ident()
        now = None
        step = self._step
        if step is not None and step.optimizer_start is not None:
            now = step.end = clock.mark()
            step.stands_for = self._untimed + 1
            self._untimed = 0
            self._pending.append(step)
        elif self._started:  # a script's first step started nothing: it is no step's end
            self._untimed += 1
        self._started = True
        self._step = None
        self._resolve(wait=False)
        self._countdown -= 1
        if self._countdown <= 0:
            self._begin(now if now is not None else clock.mark())
        else:
            self._unhook_modules()
        self._maybe_report()

    def _begin(self, start: Any) -> None:
        self._step = TimedStep(start=start)
        self._outer = None
        self._countdown = self._gap
        self._hook_modules()

    def restart(self) -> None:
        """The next step starts now (an epoch's first, the engine's first step included): a
        step being timed is timed again from here, as is one the last ``flush`` put aside."""
        if not self._handles:
            return
        first = self.clock is None
        clock = self._clock()
        self._started = True
        if first or self._step is not None or self._countdown <= 0:
            self._thread = threading.get_ident()
            self._begin(clock.mark())

    def _resolve(self, wait: bool) -> None:
        """Split the finished steps the clock can read (the GPU has passed their marks)."""
        clock = self.clock
        if clock is None:
            return
        while self._pending:
            step = self._pending[0]
            # the step's end first: one query, and no list of marks, while the device is behind
            # (the end passes last)
            if not wait and not clock.passed(step.end):
                break
            marks = step.marks()
            if wait:
                for mark in marks:
                    clock.wait(mark)
            elif not all(map(clock.passed, marks)):
                break
            self._pending.popleft()
            with self._lock:
                parts = split_step(step, clock, self.sync_timed)
            clock.release(marks)
            self._window.add(parts, step.stands_for)
            self._last_parts = parts
            self.timed += 1
            self._gap = next_gap(step.module_calls, parts.total, self.timed, self._rng)
        while len(self._pending) > PENDING_KEPT:  # the GPU is far behind: drop, never wait
            clock.release(self._pending.popleft().marks())

    def _maybe_report(self, force: bool = False) -> None:
        if self._window.timed == 0:  # its steps stay in the window until one is timed
            return
        now = time.monotonic()
        if not force and now - self._last_report < self.interval:
            return
        self.events.write(self._window.event(self.rank, self.clock_name))
        self._window = _Window()
        self._last_report = now

    def flush(self) -> None:
        """Every finished step split (waiting for the GPU if it must) and written now. A step
        being timed is put aside until the next ``restart`` or optimizer step: what runs
        between (an evaluation) is no step's."""
        if self._step is not None:
            self._step = None
            self._countdown = 0
        self._unhook_modules()
        self._resolve(wait=True)
        if self._untimed and self._last_parts is not None and self._window.timed:
            # the last steps, after the last timed one: it stands for them too
            self._window.add(self._last_parts, self._untimed, timed=0)
            self._untimed = 0
        self._maybe_report(force=True)

    # -- the gradient sync ---------------------------------------------------------------------

    def _mark_into(self, marks: list[Any], clock: Clock) -> None:
        """A mark from the gradient sync's threads; a failure there stops the timing and never
        reaches the sync."""
        try:
            with self._lock:
                marks.append(clock.mark())
        except Exception as err:
            self._fail(err)

    def bucket_hook(self, allreduce: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """A DDP communication hook: ``allreduce`` (the default all-reduce hook: the same mean
        of the gradients), with when each bucket went to sync and when its sync was done marked
        on the timed steps."""

        def timed_allreduce(process_group: Any, bucket: Any) -> Any:
            step = self._step
            clock = self.clock
            if step is None or clock is None:
                return allreduce(process_group, bucket)
            self._mark_into(step.bucket_ready, clock)
            synced = allreduce(process_group, bucket)

            def done(future: Any) -> Any:
                value = future.value()  # first: a failed sync raises here, as without the timer
                self._mark_into(step.bucket_synced, clock)
                return value

            return synced.then(done)

        # DDP checks a hook's annotations against torch's own types: give it allreduce's.
        timed_allreduce.__signature__ = inspect.signature(allreduce)  # type: ignore[attr-defined]
        return timed_allreduce


# ---- putting it in place ---------------------------------------------------------------------


def parameters_device(optimizer: Any) -> Any:
    """The device of the optimizer's first parameter (where the model trains), or None."""
    with contextlib.suppress(Exception):
        return optimizer.param_groups[0]["params"][0].device
    return None


def clock_for_this_process(device: Any = None) -> Clock:
    """The GPU's clock for a CUDA ``device`` (where the optimizer's parameters are), else the
    host's; with no device known (the engine's first epoch starting), CUDA's current device
    where this process has initialised CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return HostClock()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return CudaClock(torch, device) if device.type == "cuda" else HostClock()


def _dynamo_compiled() -> bool:
    """Whether TorchDynamo (``torch.compile``) has made a graph in this process. Its graphs are
    guarded on the global module hooks, so from then on the module hooks stay in place: taking
    them out and back between timed steps would compile the user's model again at every timed
    step, until Dynamo gives up and runs it uncompiled."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    try:
        return bool(counters is not None and counters["stats"]["unique_graphs"])
    except Exception:  # a torch whose counters are kept otherwise: as before
        return False


def start_step_timing(
    events: EventWriter, rank: int, interval: float, device: Any = None
) -> StepTimer:
    """A timer with its optimizer hooks in place, in a process that has imported torch; its
    clock for ``device`` when given, else for where the optimizer's parameters are."""
    optimizer = sys.modules["torch.optim.optimizer"]
    modules = sys.modules["torch.nn.modules.module"]
    timer = StepTimer(
        events,
        rank,
        interval,
        make_clock=lambda found: clock_for_this_process(device if device is not None else found),
    )
    timer.install(optimizer, modules)
    return timer


def time_gradient_sync(model: Any, timer: StepTimer) -> None:
    """Time the gradient sync of a DistributedDataParallel module the engine made: the default
    all-reduce as its communication hook, timed (before its first backward, as DDP requires)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model.register_comm_hook(None, timer.bucket_hook(allreduce_hook))
    timer.sync_timed = True


def step_timer_for_rank(
    enabled: bool, events: EventWriter, rank: int, interval: float, model: Any, device: Any = None
) -> StepTimer:
    """The engine rank's timer on ``device`` (the rank's), with the gradient sync timed apart
    when ``model`` is the DistributedDataParallel module the engine made; with
    ``training.step_timing`` off, one that installs no hook and times nothing."""
    if not enabled:
        return StepTimer(events, rank, interval)
    timer = start_step_timing(events, rank, interval, device)
    if hasattr(model, "register_comm_hook"):
        time_gradient_sync(model, timer)
    return timer
