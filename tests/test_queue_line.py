"""The claim store and the queue's one decision (engine.core.queue): order, free devices, reasons."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.core.common.run_files import user_name
from engine.core.procs.process_identity import ProcessRef, identify
from engine.core.queue.claims import Claim, ClaimState, ClaimStoreError, DeviceWant, open_store
from engine.core.queue.device_state import GpuHolder, GpuState, MachineState
from engine.core.queue.line import decide

GIB = 2**30
ME = user_name(os.getuid())


def me() -> ProcessRef:
    ref = identify(os.getpid())
    assert ref is not None
    return ref


def claim(ticket: int, want: DeviceWant, *, held: tuple[int, ...] | None = None) -> Claim:
    made = Claim(ticket, f"run-{ticket}", f"/runs/run-{ticket}", want, me(), 1000.0 + ticket)
    made = Claim(**{**made.__dict__, "uid": os.getuid()})
    return made.holding(held) if held is not None else made


def test_cpu_claims_go_one_after_the_other_first_come_first_served() -> None:
    machine = MachineState(cpu_slots=2)
    first, second = claim(1, DeviceWant("cpu", 2)), claim(2, DeviceWant("cpu", 2))
    verdicts = decide([first, second], machine)
    assert [v.may_start for v in verdicts] == [True, False]
    assert [v.place for v in verdicts] == [1, 2]
    assert verdicts[1].reason == f"needs 2 CPU slots, 0 of 2 free: 2 taken by run run-1 ({ME})"
    # Once the first holds its slots, the second still waits, and says who holds them.
    holding = decide([first.holding(()), second], machine)
    assert holding[0].place == 0 and holding[0].reason == "runs on cpu:2"
    assert not holding[1].may_start and "claimed by run run-1" in holding[1].reason
    # When the first is gone from the line, the second may start.
    assert decide([second], machine)[0].may_start


def test_a_gpu_held_by_a_foreign_process_is_named_with_its_user_command_and_memory() -> None:
    holder = GpuHolder(4411, "alice", "python train.py --lr 0.1\x1b[2J", 38 * GIB)
    machine = MachineState(
        cpu_slots=4,
        gpus=(GpuState(0), GpuState(1), GpuState(2, (holder,), 38 * GIB), GpuState(3)),
    )
    verdict = decide([claim(1, DeviceWant("gpu", 2, (0, 2)))], machine)[0]
    assert verdict.devices is None
    assert (
        verdict.reason == "GPU 2 held by pid 4411 (alice, python train.py --lr 0.1\\x1b[2J), 38.0G"
    )
    # any two: 0 and 1 are free
    assert decide([claim(1, DeviceWant("gpu", 2))], machine)[0].devices == (0, 1)


def test_gpus_kept_for_a_claim_ahead_are_not_taken_by_one_behind() -> None:
    machine = MachineState(cpu_slots=4, gpus=(GpuState(0), GpuState(1, memory_used_bytes=3 * GIB)))
    first = claim(1, DeviceWant("gpu", 2, (0, 1)))  # waits: GPU 1 has memory in use
    second = claim(2, DeviceWant("gpu", 1))  # GPU 0 is free, but kept for the first
    third = claim(3, DeviceWant("cpu", 1))  # wants other devices: goes on
    v1, v2, v3 = decide([first, second, third], machine)
    assert v1.reason == "GPU 1 has 3.0G in use, over 1.0G"
    assert not v2.may_start and v2.reason.startswith(
        "needs 1 GPUs, 0 free: GPU 0 kept for run run-1"
    )
    assert v3.may_start


def test_a_gpu_that_does_not_exist_or_cannot_be_read_is_never_free() -> None:
    machine = MachineState(cpu_slots=1, gpus=(GpuState(0, error="Unknown Error"),))
    assert decide([claim(1, DeviceWant("gpu", 1, (0,)))], machine)[0].reason == (
        "GPU 0 cannot be read (Unknown Error)"
    )
    assert (
        "GPU 5 is not visible" in decide([claim(1, DeviceWant("gpu", 1, (5,)))], machine)[0].reason
    )


def test_store_is_made_sticky_and_world_writable_and_claims_round_trip(tmp_path: Path) -> None:
    store = open_store(tmp_path / "claims")
    mode = os.stat(store.path).st_mode
    assert stat.S_IMODE(mode) == 0o1777
    with store.locked():
        ticket = store.next_ticket(store.read())
        made = Claim(
            ticket, "r1", "/runs/r1", DeviceWant("gpu", 1, (2,)), me(), time.time(), "cpu-demo"
        )
        store.write(made, new=True)
        store.write(made.holding((2,)))
    (read,) = store.read()
    assert read.state == ClaimState.HOLDING and read.held == (2,) and read.uid == os.getuid()
    assert read.label == "cpu-demo" and read.want == DeviceWant("gpu", 1, (2,))
    assert stat.S_IMODE(os.stat(store.path / read.file_name).st_mode) == 0o644
    assert not [n for n in os.listdir(store.path) if n.startswith(".r1")]  # no temporary left


def test_a_claim_whose_process_is_gone_is_released_by_the_next_check(tmp_path: Path) -> None:
    store = open_store(tmp_path / "claims")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    ref = identify(gone.pid)
    gone.wait()
    assert ref is not None
    dead = Claim(1, "dead", "/runs/dead", DeviceWant("cpu", 1), ref, time.time())
    # same pid, another start time: not the claim's process either
    reused = Claim(
        2, "reused", "/runs/reused", DeviceWant("cpu", 1), ProcessRef(os.getpid(), 1.0), 0.0
    )
    alive = Claim(3, "alive", "/runs/alive", DeviceWant("cpu", 1), me(), time.time())
    for c in (dead, reused, alive):
        store.write(c, new=True)
    with store.locked():
        assert [c.run_id for c in store.live_claims()] == ["alive"]
    assert [c.run_id for c in store.read()] == ["alive"]


# A store a normal user cannot write: tests/test_queue_shared.py, as a user made for it when root.
@pytest.mark.parametrize("kind", ["symlink", "file", "open-to-all"])
def test_an_untrusted_store_is_refused_in_one_sentence(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "claims"
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
    elif kind == "file":
        path.write_text("x")
    else:
        path.mkdir()
        path.chmod(0o777)
    with pytest.raises(ClaimStoreError) as refused:
        open_store(path)
    sentence = str(refused.value)
    assert sentence.startswith(f"the claim store {path} ") and sentence.count(";") == 1
    assert "\n" not in sentence
