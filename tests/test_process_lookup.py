"""The one process lookup (``engine.core.procs.process_identity.lookup``) on real processes: a live
child, one stopped by SIGSTOP, a zombie, a pid named with the wrong start time (reused) and a pid
that is gone, and the callers that go by it (the probe, the scan, the stack capture)."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil

from engine.core.common.statuses import ProcessState
from engine.core.procs.process_identity import (
    ProcessProbe,
    ProcessRef,
    find_process,
    lookup,
    process_ended,
    state_of,
)
from engine.core.procs.process_scan import snapshot_processes
from engine.core.stacks.capture import capture_stack
from tests.fixtures.made_runs import ProcessPen, ref_of

RUNNING, STOPPED, ZOMBIE = ProcessState.RUNNING, ProcessState.STOPPED, ProcessState.ZOMBIE
GONE, REUSED = ProcessState.GONE, ProcessState.REUSED


def test_a_live_child_is_running_and_handed_out(pen: ProcessPen) -> None:
    child = pen.python()
    state, proc = lookup(ref_of(child))
    assert state == RUNNING and state.alive and not state.ended
    assert proc is not None and proc.pid == child.pid
    assert find_process(ref_of(child)) is not None


def test_a_sigstopped_process_is_stopped_everywhere(pen: ProcessPen) -> None:
    child = pen.python()
    ref = ref_of(child)
    child.send_signal(signal.SIGSTOP)
    try:
        assert pen.wait_until(lambda: lookup(ref)[0] == STOPPED)
        state, proc = lookup(ref)
        assert state.alive and proc is not None
        assert ProcessProbe().stopped([ref]) == {child.pid}
        assert snapshot_processes()[child.pid].state == STOPPED
        # the same pid named with another start time is not that process: never "stopped"
        assert ProcessProbe().stopped([ProcessRef(child.pid, ref.start_time - 50)]) == frozenset()
    finally:
        child.send_signal(signal.SIGCONT)
    assert pen.wait_until(lambda: lookup(ref)[0] == RUNNING)


def test_a_zombie_is_ended_but_still_that_process(pen: ProcessPen) -> None:
    child = pen.python("pass")
    ref = ref_of(child)
    assert pen.wait_until(lambda: lookup(ref)[0] == ZOMBIE)
    state, proc = lookup(ref)
    assert state.ended and not state.alive
    assert proc is not None and proc.pid == child.pid  # its parent may still want to reap it
    assert find_process(ref) is None and process_ended(proc)
    assert snapshot_processes()[child.pid].zombie
    child.wait()
    assert lookup(ref) == (GONE, None)
    assert state_of(proc) == GONE


def test_a_pid_named_with_the_wrong_start_time_is_reused_and_never_handed_out(
    pen: ProcessPen,
) -> None:
    innocent = pen.python()
    reused = ProcessRef(innocent.pid, ref_of(innocent).start_time - 3600)
    assert lookup(reused) == (REUSED, None)
    assert find_process(reused) is None
    # the stack capture takes the rank it named as gone, and never signals the newcomer
    stack = capture_stack(reused, use_py_spy=False)
    assert stack.process_state == GONE and not stack.method
    assert innocent.poll() is None


def test_a_gone_pid_is_gone() -> None:
    done = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = psutil.Process(done.pid).create_time()
    done.kill()
    done.wait()
    assert lookup(ProcessRef(done.pid, start)) == (GONE, None)
