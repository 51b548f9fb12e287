"""The faults a rank acts out for tests and the soak (``--fault KIND:RANK:STEP[:ATTEMPTS]``, parsed
by ``engine.core.config.faults``: the first attempt only, unless ATTEMPTS asks for more). Each kind
is one function, so a stack taken during a fault names it: ``faults.py:NN in hang``.

- ``crash``: raise; ``exit``: ``os._exit(3)``; ``slow``: sleep every step from then on;
- ``hang``: block forever at the start of the step (before its forward);
- ``hang-collective``: block forever just before the step's backward, so the other ranks block
  in the all-reduce their backward starts;
- ``hang-setup``: block forever in the rank's setup, after it joined the process group and before
  its model is built (the others block in DDP's first broadcast);
- ``hang-eval``: block forever as the evaluation after epoch STEP (from 0) starts (the others block
  in its all-reduce);
- ``sigstop``: stop itself with SIGSTOP (alive, runs nothing until SIGCONT);
- ``oom``: allocate until the kernel's OOM killer ends it (``engine.train.memory_fault``);
- ``kill-launcher``: SIGKILL its launcher, as an OOM kill of the launcher would end it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterable

from engine.core.common.run_environment import LAUNCHER_PID_ENV
from engine.core.config.faults import parse_fault
from engine.train.memory_fault import allocate_until_killed

SLOW_FAULT_SECONDS = 0.5
BEFORE_BACKWARD = ("hang-collective",)


def crash(global_step: int) -> None:
    raise RuntimeError(f"injected crash at step {global_step}")


def hang() -> None:
    threading.Event().wait()  # forever: only a signal ends this rank


def stop_self() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def kill_launcher() -> None:
    """SIGKILL the launcher of this rank (the parent under torchrun); the rank's parent-death
    signal then ends it too."""
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    os.kill(int(launcher) if launcher.isdigit() else os.getppid(), signal.SIGKILL)


class FaultInjector:
    """Acts on this rank's ``faults`` entries ("KIND:RANK:STEP[:ATTEMPTS]") when it reaches global
    step STEP: ``at_step`` at the start of the step, ``before_backward`` just before its backward.
    Only the faults that fire in the run's ``attempt`` (the first only, unless ATTEMPTS says)."""

    def __init__(self, specs: Iterable[str], rank: int, attempt: int = 1) -> None:
        self.faults = [f for f in map(parse_fault, specs) if f.rank == rank and f.fires_in(attempt)]
        self.slow = False

    def _due(self, global_step: int, *, before_backward: bool) -> list[str]:
        due = [
            f.kind
            for f in self.faults
            if f.step == global_step
            and f.kind not in ("hang-setup", "hang-eval")
            and (f.kind in BEFORE_BACKWARD) == before_backward
        ]
        for kind in due:
            print(f"fault injection: {kind} at step {global_step}", flush=True)
        return due

    def at_step(self, global_step: int) -> None:
        for kind in self._due(global_step, before_backward=False):
            if kind == "crash":
                crash(global_step)
            elif kind == "exit":
                os._exit(3)
            elif kind == "hang":
                hang()
            elif kind == "slow":
                self.slow = True
            elif kind == "sigstop":
                stop_self()
            elif kind == "oom":
                allocate_until_killed()
            elif kind == "kill-launcher":
                kill_launcher()
        if self.slow:
            time.sleep(SLOW_FAULT_SECONDS)

    def in_setup(self) -> None:
        if any(f.kind == "hang-setup" for f in self.faults):
            print("fault injection: hang-setup", flush=True)
            hang()

    def before_evaluation(self, epoch: int) -> None:
        if any(f.kind == "hang-eval" and f.step == epoch for f in self.faults):
            print(f"fault injection: hang-eval at epoch {epoch}", flush=True)
            hang()

    def before_backward(self, global_step: int) -> None:
        for kind in self._due(global_step, before_backward=True):
            if kind == "hang-collective":
                hang()
