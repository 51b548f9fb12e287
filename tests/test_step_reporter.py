"""The one throttled step reporter (engine.core.runs.step_reporter) and the script rank's reporter
built on it (engine.core.runs.script_reporting): which steps are reported, with which figures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.core.runs.events import EventWriter, MetricsReported, StepProgress, read_events
from engine.core.runs.script_reporting import ScriptReporter
from engine.core.runs.step_reporter import StepReporter


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def events(tmp_path: Path) -> Iterator[EventWriter]:
    writer = EventWriter(tmp_path / "events" / "rank-1.jsonl")
    yield writer
    writer.close()


def steps_written(events: EventWriter) -> list[StepProgress]:
    return [e for e in read_events(events.path) if isinstance(e, StepProgress)]


def test_a_report_is_due_once_the_interval_has_passed_and_covers_the_window(
    events: EventWriter,
) -> None:
    clock = FakeClock()
    reporter = StepReporter(events, rank=1, interval=1.0, clock=clock)
    due = []
    for _ in range(4):  # four steps of 0.3 s, 32 images each
        clock.now += 0.3
        due.append(reporter.step_done(images=32))
    assert due == [False, False, False, True]  # 1.2 s since the window began
    event = reporter.report(epoch=0, step=4, steps=10, global_step=4, loss=2.5, lr=0.1)

    assert steps_written(events) == [event]
    assert (event.rank, event.epoch, event.step, event.steps, event.global_step) == (1, 0, 4, 10, 4)
    assert (event.loss, event.lr) == (2.5, 0.1)
    assert event.step_seconds == pytest.approx(0.3)
    assert event.images_per_s == pytest.approx(4 * 32 / 1.2)
    # The next window starts at the report: one more step is not due yet.
    clock.now += 0.5
    assert reporter.step_done(images=32) is False
    assert reporter.pending_steps == 1


def test_restart_drops_the_time_and_steps_before_it(events: EventWriter) -> None:
    clock = FakeClock()
    reporter = StepReporter(events, rank=0, interval=1.0, clock=clock)
    reporter.step_done(images=10)
    clock.now += 50.0  # an evaluation, a checkpoint: in no step's time
    reporter.restart()
    assert reporter.pending_steps == 0
    clock.now += 0.2
    reporter.step_done(images=10)
    clock.now += 0.2
    reporter.step_done(images=10)
    event = reporter.report(epoch=1, step=2, steps=2, global_step=12, loss=1.0, lr=0.1)
    assert event.step_seconds == pytest.approx(0.2)
    assert event.images_per_s == pytest.approx(20 / 0.4)


def test_a_forced_report_and_the_callers_own_rate(events: EventWriter) -> None:
    clock = FakeClock()
    reporter = StepReporter(events, rank=0, interval=60.0, clock=clock)
    clock.now += 0.5
    assert reporter.step_done() is False  # no images counted: the caller knows none
    event = reporter.report(epoch=0, step=1, steps=0, global_step=1, loss=None, lr=None)
    assert event.images_per_s is None and event.step_seconds == pytest.approx(0.5)
    clock.now += 0.5
    reporter.step_done(images=8)
    mine = reporter.report(
        epoch=0, step=2, steps=0, global_step=2, loss=None, lr=None, images_per_s=123.0
    )
    assert mine.images_per_s == 123.0  # the script's figure wins over the count
    # A report with no step in its window says so rather than dividing by zero.
    empty = reporter.report(epoch=0, step=2, steps=0, global_step=2, loss=None, lr=None)
    assert empty.step_seconds == 0.0


def test_interval_zero_reports_every_step(events: EventWriter) -> None:
    reporter = StepReporter(events, rank=0, interval=0.0)
    assert reporter.step_done(images=1) is True


def test_the_script_reporter_counts_from_the_first_step_and_flushes_the_rest(
    events: EventWriter,
) -> None:
    reporter = ScriptReporter(events, rank=1, report_interval=3600.0)
    for _ in range(5):
        reporter.on_step(lr=0.05)
    assert steps_written(events) == []  # not due within the hour
    reporter.on_metrics({"loss": 0.75, "epoch": 2, "note": "text is dropped", "flag": True})
    reporter.on_bar(40, 100)
    reporter.flush()
    reporter.flush()  # nothing new since: no second report

    (step,) = steps_written(events)
    # Four steps after the first one: the first only starts the clock.
    assert (step.rank, step.global_step, step.lr, step.loss) == (1, 5, 0.05, 0.75)
    assert (step.epoch, step.step, step.steps) == (2, 40, 100)
    assert step.images_per_s is None and step.step_seconds > 0
    (metrics,) = [e for e in read_events(events.path) if isinstance(e, MetricsReported)]
    assert metrics.metrics == {"loss": 0.75, "epoch": 2.0}


def test_the_script_reporter_reports_each_step_at_interval_zero(events: EventWriter) -> None:
    reporter = ScriptReporter(events, rank=0, report_interval=0.0)
    for _ in range(3):
        reporter.on_step()
    reporter.flush()  # every step already reported
    assert [s.global_step for s in steps_written(events)] == [2, 3]
    # No bar printed: the step is the optimizer step count and the epoch's length unknown.
    assert [(s.step, s.steps, s.epoch) for s in steps_written(events)] == [(2, 0, 0), (3, 0, 0)]
