"""The one decision behind ``--max-restarts``: only a failed attempt restarts, at most N times,
with a back-off that doubles, from the newest checkpoint; the same error at the same step twice
stops it. Also the fault spec's fourth field (which attempts a fault fires in) and what a
restarted script is given."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from engine.core.common.config_error import ConfigError
from engine.core.common.statuses import RunStatus
from engine.core.config.faults import parse_fault
from engine.core.config.schema import RunConfig, ScriptConfig
from engine.core.runs.checkpoint_record import CheckpointRecord
from engine.core.runs.restart_policy import (
    MAX_BACKOFF_SECONDS,
    SAME_FAILURE,
    backoff,
    decide_restart,
    restarts_made,
)
from engine.core.runs.resume_point import ResumePoint
from engine.core.runs.summary import AttemptRecord, AttemptStart, Failure
from engine.train.script_rank import script_args

CRASH = Failure(rank=1, error="RuntimeError: injected crash at step 60")
POINT = ResumePoint(
    Path("/runs/r/checkpoint.pt"),
    CheckpointRecord(
        epoch=1, step=0, global_step=46, steps_per_epoch=46, world_size=2, model="small_cnn",
        bytes=1, saved_at=0.0,
    ),
)  # fmt: skip


def failed(
    attempt: int, step: int | None = 60, *, exact: bool = True, error: str = ""
) -> AttemptRecord:
    failure = Failure(rank=1, error=error) if error else CRASH
    return AttemptRecord(
        attempt, RunStatus.FAILED, 0.0, 1.0, reached_step=step, step_exact=exact, failure=failure
    )


def test_a_failed_attempt_restarts_from_the_newest_checkpoint_after_its_back_off() -> None:
    decision = decide_restart(
        [failed(1)], max_restarts=3, restarts_done=0, backoff_seconds=2.0, resume_from=POINT
    )
    assert (decision.restart, decision.number, decision.delay) == (True, 1, 2.0)
    assert decision.from_step == 46
    assert decision.why == "restart 1 of 3 in 2 s, from step 46 (epoch 2, step 0 of 46)"
    # without a checkpoint it begins again at step 0, and says so
    at_zero = decide_restart(
        [failed(1)], max_restarts=3, restarts_done=0, backoff_seconds=2.0, resume_from=None
    )
    assert at_zero.restart and at_zero.from_step is None
    assert at_zero.why.endswith("from step 0 (no checkpoint yet)")


def test_the_back_off_doubles_and_is_capped() -> None:
    assert [backoff(n, 2.0) for n in range(4)] == [2.0, 4.0, 8.0, 16.0]
    assert backoff(20, 2.0) == MAX_BACKOFF_SECONDS
    second = decide_restart(
        [failed(1, 10), failed(2, 20)], max_restarts=3, restarts_done=1, backoff_seconds=2.0,
        resume_from=POINT,
    )  # fmt: skip
    assert (second.restart, second.number, second.delay) == (True, 2, 4.0)


@pytest.mark.parametrize(
    "status",
    [RunStatus.COMPLETED, RunStatus.KILLED, RunStatus.LOST, RunStatus.TIMEOUT, RunStatus.CANCELLED],
)
def test_only_a_failed_attempt_restarts(status: RunStatus) -> None:
    ended = AttemptRecord(1, status, 0.0, 1.0)
    decision = decide_restart(
        [ended], max_restarts=3, restarts_done=0, backoff_seconds=2.0, resume_from=POINT
    )
    assert not decision.restart
    assert decision.why == f"attempt 1 {status}"


def test_a_lost_node_restarts_and_never_counts_as_the_same_error_twice() -> None:
    lost = Failure(rank=None, node="n2", error="node n2 (down: Not responding) failed")
    node_failure = AttemptRecord(1, RunStatus.NODE_FAILURE, 0.0, 1.0, reached_step=75, failure=lost)
    again = replace(node_failure, attempt=2, start=AttemptStart.RESTART)
    decision = decide_restart(
        [node_failure, again], max_restarts=3, restarts_done=1, backoff_seconds=2.0,
        resume_from=POINT,
    )  # fmt: skip
    assert decision.restart and decision.number == 2  # its step is no failing rank's step


def test_the_restarts_of_one_start_of_the_run_are_counted_from_its_records() -> None:
    first, restart, resume = AttemptStart.FIRST, AttemptStart.RESTART, AttemptStart.RESUME
    records = [
        replace(failed(n), start=start)
        for n, start in enumerate((first, restart, restart, resume, restart), 1)
    ]
    assert restarts_made(records[:1]) == 0
    assert restarts_made(records[:3]) == 2
    assert restarts_made(records[:4]) == 0  # ddptui resume starts the count again
    assert restarts_made(records) == 1


def test_no_restart_without_max_restarts_nor_past_it() -> None:
    none = decide_restart(
        [failed(1)], max_restarts=0, restarts_done=0, backoff_seconds=2.0, resume_from=POINT
    )
    assert not none.restart and "max_restarts is 0" in none.why
    spent = decide_restart(
        [failed(1, 10), failed(2, 30)], max_restarts=1, restarts_done=1, backoff_seconds=2.0,
        resume_from=POINT,
    )  # fmt: skip
    assert not spent.restart
    assert spent.why == "it failed again after 1 restart, all that --max-restarts 1 allows"


def test_the_same_error_at_the_same_step_twice_stops_restarting() -> None:
    decision = decide_restart(
        [failed(1), failed(2)], max_restarts=5, restarts_done=1, backoff_seconds=2.0,
        resume_from=POINT,
    )  # fmt: skip
    assert not decision.restart
    assert SAME_FAILURE in decision.why
    assert decision.why == (
        "not restarting: the same error at the same step twice (attempts 1 and 2 failed at step "
        "60: RuntimeError: injected crash at step 60)"
    )


@pytest.mark.parametrize(
    "earlier",
    [
        failed(1, 59),  # another step
        failed(1, error="RuntimeError: CUDA error: an illegal memory access"),  # another error
        failed(1, exact=False),  # a step known only from the throttled reports
    ],
)
def test_a_failure_that_differs_or_whose_step_is_not_known_exactly_restarts(
    earlier: AttemptRecord,
) -> None:
    decision = decide_restart(
        [earlier, failed(2)], max_restarts=5, restarts_done=1, backoff_seconds=2.0,
        resume_from=POINT,
    )  # fmt: skip
    assert decision.restart


def test_a_fault_fires_in_the_first_attempt_unless_its_fourth_field_asks_for_more() -> None:
    once, twice, every = (
        parse_fault(s) for s in ("crash:1:60", "crash:1:60:2", "crash:1:60:every")
    )
    assert [once.fires_in(a) for a in (1, 2)] == [True, False]
    assert [twice.fires_in(a) for a in (1, 2, 3)] == [True, True, False]
    assert all(every.fires_in(a) for a in (1, 2, 50))
    for bad in ("crash:1:60:0", "crash:1:60:often", "crash:1:60:1:2"):
        with pytest.raises(ConfigError, match=r"is not KIND:RANK:STEP\[:ATTEMPTS\]"):
            parse_fault(bad)


def test_a_restarted_script_gets_its_resume_option_and_the_checkpoint() -> None:
    def args(option: str, resume_from: str) -> list[str]:
        script = ScriptConfig(path="train.py", args=("--epochs", "3"), resume_arg=option)
        return script_args(RunConfig(script=script), resume_from)

    assert args("--resume", "") == ["--epochs", "3"]  # the first attempt: nothing added
    assert args("", "/r/checkpoints/c.pt") == ["--epochs", "3"]  # no option named: none
    assert args("--resume", "/r/checkpoints/c.pt") == [
        "--epochs",
        "3",
        "--resume",
        "/r/checkpoints/c.pt",
    ]
    assert args("--ckpt=", "/r/c.pt") == ["--epochs", "3", "--ckpt=/r/c.pt"]
    with pytest.raises(ConfigError, match=r"script\.resume_arg is 'resume'; expected an option"):
        ScriptConfig(path="train.py", resume_arg="resume")
