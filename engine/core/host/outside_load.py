"""How busy other processes kept the machine while a run of ours went on: a bench row measured under
outside load is slower than it should be, and its baseline row faster or slower than its peers,
so the speedup table flags it. Plain Python (psutil).

The measure is CPU time: the machine's busy CPU time (psutil.cpu_times, all cores, steal
included: on a virtual machine the host's other guests count) minus this process's own and that of
its waited-for children (``os.times``): the launcher this process started and reaped, whose
ranks it reaped, whose DataLoader workers they reaped. What is left is every other process.
"""

from __future__ import annotations

import os
import time

import psutil


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    total = sum(t)
    idle = t.idle + getattr(t, "iowait", 0.0)
    # guest time is counted in user time already
    guest = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    return total - idle - guest


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class OutsideLoad:
    """Started before a run, read after its launcher was reaped: ``cores()`` is the average
    number of cores other processes kept busy meanwhile."""

    def __init__(self) -> None:
        self._started = (time.monotonic(), _busy_seconds(), _own_seconds())

    def cores(self) -> float:
        wall0, busy0, own0 = self._started
        wall = time.monotonic() - wall0
        if wall <= 0:
            return 0.0
        others = (_busy_seconds() - busy0) - (_own_seconds() - own0)
        return max(0.0, others / wall)
