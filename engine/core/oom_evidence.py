"""Was a SIGKILLed process killed by the kernel's out-of-memory killer? Plain Python, best effort.

A SIGKILL says nothing of who sent it. Two things on Linux can tell an OOM kill from a ``kill -9``:

- the kernel log names the victim: ``Out of memory: Killed process 1234 (python)`` (or ``Memory
  cgroup out of memory: ...``, and ``oom-kill:...,pid=1234,...``); reading it may need root
  (``kernel.dmesg_restrict``), so it is only one of two sources;
- ``/proc/vmstat``'s ``oom_kill`` counts every OOM kill since boot, readable by anyone: the
  launcher records it at the start of a run (run.json ``oom_kills_at_start``), so a rise during the
  run makes an OOM kill likely, though the victim may have been another process.

``sigkill_cause`` turns that into a phrase for a summary; "" when there is no evidence.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

VMSTAT = Path("/proc/vmstat")
DMESG_TIMEOUT_SECONDS = 3.0


def oom_kill_count(vmstat: Path = VMSTAT) -> int | None:
    """OOM kills since boot (all cgroups), or None where /proc/vmstat has no such line."""
    try:
        text = vmstat.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def read_kernel_log() -> str | None:
    """The kernel ring buffer as ``dmesg`` prints it, or None when it cannot be read."""
    try:
        done = subprocess.run(
            ["dmesg"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=DMESG_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def kernel_log_names_oom_kill(pid: int, kernel_log: str | None) -> bool:
    """Whether the kernel log says its OOM killer killed ``pid``."""
    if not kernel_log:
        return False
    pattern = re.compile(rf"Killed process {pid}\b|oom-kill:.*[,:]pid={pid},")
    return bool(pattern.search(kernel_log))


def sigkill_cause(
    pid: int,
    oom_kills_at_start: int | None,
    *,
    oom_kills_now: int | None = None,
    kernel_log: str | None = None,
) -> str:
    """Why ``pid`` was likely SIGKILLed, as a phrase ("" without evidence). The figures read from
    the machine when not given (tests give them)."""
    log = kernel_log if kernel_log is not None else read_kernel_log()
    if kernel_log_names_oom_kill(pid, log):
        return "killed by the kernel's out-of-memory killer (the kernel log names it)"
    now = oom_kills_now if oom_kills_now is not None else oom_kill_count()
    if oom_kills_at_start is not None and now is not None and now > oom_kills_at_start:
        kills = now - oom_kills_at_start
        return (
            f"likely out of memory: the kernel's OOM killer killed {kills} process"
            f"{'es' if kills != 1 else ''} during the run"
        )
    return ""
