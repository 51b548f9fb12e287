"""The machine's queue as the UI tests see it: a line decided by the real decision
(``engine.core.queue.line.decide``) on a stand-in machine, with the clock the snapshots pin."""

from __future__ import annotations

from dataclasses import replace

from engine.core.procs.process_identity import ProcessRef
from engine.core.queue.claims import Claim, DeviceWant
from engine.core.queue.device_state import GpuHolder, GpuState, MachineState
from engine.core.queue.line import Verdict, decide
from tests.ui.standins import NOW

QUEUE_HOLDER = "python train.py --epochs 90 --lr 0.1"


def standin_line() -> list[Verdict]:
    """The machine's line as the queue decides it (``engine.core.queue.line.decide``) on two
    CPU slots and two GPUs, GPU 1 held by a process of alice's outside any claim: a run of root's
    holds cpu:2; one of nobody's waits for GPU 1, another of root's for the two CPU slots."""

    def claim(ticket: int, run_id: str, want: DeviceWant, uid: int, minutes: float) -> Claim:
        waiter = ProcessRef(424300 + ticket, 1.0)
        return Claim(ticket, run_id, f"/runs/{run_id}", want, waiter, NOW - minutes * 60, uid=uid)

    holder = GpuHolder(4411, "alice", QUEUE_HOLDER, 38 * 2**30)
    machine = MachineState(
        cpu_slots=2, gpus=(GpuState(0), GpuState(1, (holder,), 38 * 2**30 + 2**29))
    )
    claims = [
        claim(1, "20261202-100000-cpu-demo-1a2b", DeviceWant("cpu", 2), 0, 25).holding(()),
        replace(
            claim(2, "20261202-101200-script-7c3d", DeviceWant("gpu", 1, (1,)), 65534, 12.5),
            label="train.py",
        ),
        replace(
            claim(3, "20261202-102000-cpu-demo-9e8f", DeviceWant("cpu", 2), 0, 3), label="cpu-demo"
        ),
    ]
    return decide(claims, machine)
