"""The step timer (engine.train.step_timing, its marks engine.train.step_marks) in this process, on
the CPU: a step's marks turned into its parts, the global hooks on a real model and optimizer
(what counts as the forward, whose thread), nothing of the training changed, every hook gone
after ``close``, a failing hook that turns timing off instead of failing the step, and the DDP
communication hook on one gloo rank."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.modules.module as module_hooks
import torch.optim.optimizer as optimizer_hooks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from engine.core.common.step_split import StepSplit
from engine.core.runs.events import EventWriter, StepBreakdownReported, read_events
from engine.train import step_timing
from engine.train.step_marks import HostClock, TimedStep, split_step
from engine.train.step_timing import (
    ALL_TIMED_FIRST,
    StepTimer,
    next_gap,
    start_step_timing,
    step_timer_for_rank,
)


@pytest.fixture
def events(tmp_path: Path) -> Iterator[EventWriter]:
    writer = EventWriter(tmp_path / "events" / "rank-0.jsonl")
    yield writer
    writer.close()


@pytest.fixture(autouse=True)
def no_hook_left_behind() -> Iterator[None]:
    before = (
        len(module_hooks._global_forward_pre_hooks),
        len(module_hooks._global_forward_hooks),
        len(optimizer_hooks._global_optimizer_pre_hooks),
        len(optimizer_hooks._global_optimizer_post_hooks),
    )
    torch.manual_seed(0)
    yield
    after = (
        len(module_hooks._global_forward_pre_hooks),
        len(module_hooks._global_forward_hooks),
        len(optimizer_hooks._global_optimizer_pre_hooks),
        len(optimizer_hooks._global_optimizer_post_hooks),
    )
    assert after == before, "the timer left a global hook behind"


def breakdowns(events: EventWriter) -> list[StepBreakdownReported]:
    return [e for e in read_events(events.path) if isinstance(e, StepBreakdownReported)]


def test_a_steps_marks_become_parts_that_add_up_to_it() -> None:
    step = TimedStep(
        start=10.0,
        forwards=[[10.5, 11.0], [11.25, 11.5]],  # two forwards, 0.25 s apart
        bucket_ready=[11.75, 12.5],  # the last bucket ready at 12.5 ...
        bucket_synced=[12.0, 13.0],  # ... and synced at 13.0: backward waited 0.5 s for it
        optimizer_start=13.25,
        end=13.5,
    )
    parts = split_step(step, HostClock(), sync_timed=True)
    assert parts.split == StepSplit(0.5, 0.75, 1.25, 0.5, 0.25, 0.25)
    assert parts.total == parts.split.total == 3.5
    # Without the comm hook the wait stays in backward; a step with no forward seen is "other".
    assert split_step(step, HostClock(), sync_timed=False).split.backward == 1.75
    blind = split_step(TimedStep(start=0.0, optimizer_start=2.0, end=3.0), HostClock(), False)
    assert blind.split == StepSplit(data=0.0, forward=0.0, backward=0.0, optimizer=1.0, other=2.0)


def test_the_gap_between_timed_steps_keeps_their_cost_to_the_share() -> None:
    rng = random.Random(0)
    assert next_gap(100, 0.001, ALL_TIMED_FIRST - 1, rng) == 1  # the first steps: every one
    # 7 hooked calls on a 12.5 ms step: (140 + 100) us / (0.2 % of 12.5 ms) = 9.6: 10 on average
    gaps = [next_gap(7, 0.0125, 100, rng) for _ in range(2000)]
    assert min(gaps) >= 1 and max(gaps) <= 19
    assert sum(gaps) / len(gaps) == pytest.approx(10, rel=0.05)
    assert next_gap(7, 10.0, 100, rng) == 1  # a slow step: every one is timed
    assert next_gap(10_000, 1e-4, 100, rng) <= 2 * step_timing.MAX_GAP - 1


class SlowForward(nn.Module):
    """Sleeps in the forward: a part of the step of known length that changes no number."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return nn.Sequential(nn.Flatten(), inner)


def train(
    steps: int, timer: StepTimer | None = None, data_sleep: float = 0.0, forward_sleep: float = 0.0
) -> nn.Module:
    model = tiny_model()
    if forward_sleep:
        model = nn.Sequential(SlowForward(forward_sleep), model)  # no parameter: the same weights
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    torch.manual_seed(1)
    batches = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(steps)]
    for x, y in batches:
        time.sleep(data_sleep)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    return model


def test_the_hooks_split_each_step_and_change_nothing_of_the_training(
    events: EventWriter,
) -> None:
    plain = train(30)
    timer = start_step_timing(events, rank=0, interval=3600.0)
    timed = train(30, timer, data_sleep=0.004, forward_sleep=0.02)
    timer.flush()
    timer.close()
    for a, b in zip(plain.state_dict().values(), timed.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # bit for bit: the hooks only read the clock

    (report,) = breakdowns(events)  # one report: the hour's interval never came, flush wrote it
    # The first optimizer step starts the timing; after the first ALL_TIMED_FIRST, one in N.
    assert report.steps == 29 and ALL_TIMED_FIRST <= report.timed < 29
    assert report.sync is None and report.clock == "cpu"
    assert report.data >= 0.004  # the sleep before each forward
    assert report.forward >= 0.02  # the sleep in it
    assert report.backward > 0 and report.optimizer > 0
    assert report.other == pytest.approx(0.0, abs=1e-4)  # one forward a step: no gap between
    # the data part holds the wait for data, not the forward after it (its sleep is 5x longer,
    # so a loaded machine's late wake-up from the 4 ms sleep cannot blur the two)
    assert report.data < report.forward


def test_only_outermost_calls_of_modules_with_parameters_on_the_stepping_thread_count(
    events: EventWriter,
) -> None:
    model = tiny_model()
    transform = nn.Identity()  # a transform or a loss: no parameters, not the forward
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    timer = start_step_timing(events, rank=0, interval=3600.0)
    x = torch.randn(4, 8)
    optimizer.step()  # the first step starts the timing
    step = timer._step
    assert step is not None
    transform(x)
    model(x)
    elsewhere = threading.Thread(target=model, args=(x,))  # DataParallel's replica threads
    elsewhere.start()
    elsewhere.join()
    model(transform(x))
    assert len(step.forwards) == 2 and all(end is not None for _, end in step.forwards)
    assert step.module_calls == 2 + 2 * 6  # every call on the thread counts toward the cost
    optimizer.step()
    timer.close()


def test_a_failing_hook_stops_the_timing_and_never_the_step(
    events: EventWriter, capsys: pytest.CaptureFixture[str]
) -> None:
    class BrokenClock(HostClock):
        def mark(self) -> float:
            raise RuntimeError("no clock today")

    timer = StepTimer(events, 0, 3600.0, make_clock=BrokenClock)
    timer.install(optimizer_hooks, module_hooks)
    trained = train(5, timer)  # no exception reaches the loop
    assert timer.failed == "RuntimeError: no clock today"
    assert "step timing stopped on rank 0: RuntimeError: no clock today" in capsys.readouterr().err
    assert not timer._handles and not timer._module_handles  # every hook already out
    assert all(torch.isfinite(p).all() for p in trained.parameters())
    timer.close()


def test_with_timing_off_no_hook_is_installed(events: EventWriter) -> None:
    timer = step_timer_for_rank(False, events, 0, 0.0, model=None)
    train(5, timer)
    timer.restart()
    timer.flush()
    timer.close()
    assert breakdowns(events) == []


def test_the_comm_hook_times_the_sync_and_averages_as_ddp_does(
    events: EventWriter, tmp_path: Path
) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))

        def four_steps(model: nn.Module) -> None:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(4):
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()

        reference = DistributedDataParallel(tiny_model())
        four_steps(reference)
        timed = DistributedDataParallel(tiny_model())
        timer = step_timer_for_rank(True, events, 0, 3600.0, timed)
        assert timer.sync_timed
        four_steps(timed)
        timer.flush()
        timer.close()
    finally:
        dist.destroy_process_group()
    for a, b in zip(reference.state_dict().values(), timed.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # the timed hook averages the gradients as DDP's own does
    (report,) = breakdowns(events)
    assert report.timed == 3 and report.sync is not None and report.sync >= 0.0


class LaggingGpuClock(HostClock):
    """A GPU's clock as the timer sees it: a mark is readable only once the device has passed
    it, here ``lag`` marks after it was made; ``wait`` (a synchronize) is counted."""

    name = "cuda"

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.made: list[float] = []
        self.waits = 0

    def mark(self) -> float:
        self.made.append(time.perf_counter())
        return self.made[-1]

    def passed(self, mark: float) -> bool:
        return self.made.index(mark) < len(self.made) - self.lag

    def wait(self, mark: float) -> None:
        self.waits += 1


def test_on_a_gpu_steps_are_read_once_the_device_passed_them_never_waited_for(
    events: EventWriter,
) -> None:
    clock = LaggingGpuClock(lag=12)  # about three steps behind
    timer = StepTimer(events, 0, 0.0, make_clock=lambda _device: clock)
    timer.install(optimizer_hooks, module_hooks)
    train(15, timer)
    assert clock.waits == 0  # nothing in the steps waited for the device
    during = breakdowns(events)
    assert during and all(e.clock == "cuda" for e in during)
    assert sum(e.timed for e in during) < 14  # the last steps are still on the device
    timer.flush()  # the epoch's or the script's end: now it may wait
    timer.close()
    assert clock.waits > 0
    after = breakdowns(events)
    assert sum(e.timed for e in after) == 14 and sum(e.steps for e in after) == 14


def test_the_gpu_clock_marks_on_the_training_devices_stream_from_any_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No GPU here: torch's CUDA calls are stood in for, to check which clock a rank gets and
    which stream its marks go to (the device of the optimizer's parameters, not the thread's
    current device: a collective's callback may run on a thread whose current device is 0)."""
    from types import SimpleNamespace

    from engine.train.step_marks import CudaClock
    from engine.train.step_timing import clock_for_this_process, parameters_device

    recorded: list[object] = []

    class StandInEvent:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing

        def record(self, stream: object) -> None:
            recorded.append(stream)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Event", StandInEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: f"stream of {device}")
    gpu3 = torch.device("cuda", 3)
    optimizer = SimpleNamespace(param_groups=[{"params": [SimpleNamespace(device=gpu3)]}])
    assert parameters_device(optimizer) == gpu3
    assert parameters_device(object()) is None
    clock = clock_for_this_process(gpu3)
    assert isinstance(clock, CudaClock) and clock.device == gpu3
    clock.mark()
    callback = threading.Thread(target=clock.mark)  # as from a collective's callback
    callback.start()
    callback.join()
    assert recorded == ["stream of cuda:3", "stream of cuda:3"]
    # A model trained on the CPU in a process that uses CUDA: the host's clock.
    assert isinstance(clock_for_this_process(torch.device("cpu")), HostClock)
    # No device known yet (the engine's first epoch): CUDA's current device.
    assert clock_for_this_process(None).device == torch.device("cuda", 0)  # type: ignore[attr-defined]


def test_inside_a_compiled_graph_the_hooks_break_nothing(events: EventWriter) -> None:
    """TorchDynamo traces a compiled module's call, global hooks included: the hooks must do
    nothing there that breaks the user's graph (the eager backend: no compiler needed)."""
    from torch._dynamo.utils import counters

    counters.clear()
    timer = start_step_timing(events, rank=0, interval=3600.0)
    model = tiny_model()
    model.compile(backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    for _ in range(5):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    timer.flush()
    timer.close()
    torch._dynamo.reset()
    assert dict(counters["graph_break"]) == {}
    (report,) = breakdowns(events)
    assert report.forward == 0.0 and report.other > 0  # compiled in place: its call is unseen


def test_a_compiled_model_is_not_recompiled_as_the_module_hooks_come_and_go(
    events: EventWriter,
) -> None:
    """The module hooks are registered for timed steps only; TorchDynamo must not see each
    change of the global hooks as a reason to compile the user's model again."""
    from torch._dynamo.utils import counters

    counters.clear()
    timer = start_step_timing(events, rank=0, interval=3600.0)
    model = tiny_model()
    model.compile(backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    for _ in range(300):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    timed = timer.timed
    timer.close()
    torch._dynamo.reset()
    assert timed > 20  # past the first 20: the hooks came and went between timed steps
    assert counters["stats"]["unique_graphs"] == 1
