"""Was a SIGKILLed process of a run killed by the kernel's out-of-memory killer? Plain Python.

A SIGKILL says nothing of who sent it. A verdict must rest on evidence about *this* run, never on
the machine at large (the machine-wide ``/proc/vmstat`` ``oom_kill`` counter moves whenever any
process anywhere is OOM-killed, so a copied or old run would be called "out of memory" for it):

- the kernel log names the victim: ``Out of memory: Killed process 1234 (python)`` (or ``Memory
  cgroup out of memory: ...``, and ``oom-kill:...,pid=1234,...``), in a line logged after the run
  started, in the same boot; reading it may need root (``kernel.dmesg_restrict``);
- the run's own memory cgroup counted an OOM kill during the run (cgroup v2 ``memory.events``,
  which counts its descendants too, such as the capped cgroup of an ``oom`` fault; v1
  ``memory.oom_control``), in the same boot.

The launcher records an ``OomBaseline`` at its start (run.json ``oom_baseline``): the boot, the
uptime, its memory cgroup and that cgroup's count. ``sigkill_cause`` turns the evidence into a
phrase for a summary; "" when there is none.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.host.cgroups import cgroup_oom_kills, own_memory_cgroup

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
UPTIME = Path("/proc/uptime")
DMESG_TIMEOUT_SECONDS = 3.0
_STAMP = re.compile(r"^\[\s*(\d+\.\d+)\]")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def boot_id() -> str | None:
    text = _read(BOOT_ID)
    return text.strip() if text else None


def uptime_seconds() -> float | None:
    text = _read(UPTIME)
    try:
        return float(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True)
class OomBaseline:
    """What the launcher records at its start, so that an OOM kill can be tied to its run."""

    boot_id: str | None
    uptime: float | None  # seconds since boot when the run started
    cgroup: str | None  # the memory cgroup the run's processes are in
    cgroup_oom_kills: int | None  # its OOM kill count then

    def to_json(self) -> dict[str, Any]:
        return {
            "boot_id": self.boot_id,
            "uptime": self.uptime,
            "cgroup": self.cgroup,
            "cgroup_oom_kills": self.cgroup_oom_kills,
        }

    @classmethod
    def from_json(cls, data: Any) -> OomBaseline | None:
        if not isinstance(data, dict):
            return None
        kills = data.get("cgroup_oom_kills")
        uptime = data.get("uptime")
        return cls(
            boot_id=str(data["boot_id"]) if data.get("boot_id") else None,
            uptime=float(uptime) if isinstance(uptime, (int, float)) else None,
            cgroup=str(data["cgroup"]) if data.get("cgroup") else None,
            cgroup_oom_kills=kills
            if isinstance(kills, int) and not isinstance(kills, bool)
            else None,
        )


def oom_baseline() -> OomBaseline:
    """This process's baseline, now (the launcher calls it at its start)."""
    cgroup = own_memory_cgroup()
    return OomBaseline(
        boot_id=boot_id(),
        uptime=uptime_seconds(),
        cgroup=str(cgroup) if cgroup else None,
        cgroup_oom_kills=cgroup_oom_kills(cgroup) if cgroup else None,
    )


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


def kernel_log_names_oom_kill(pid: int, kernel_log: str | None, since: float | None = None) -> bool:
    """Whether the kernel log says its OOM killer killed ``pid``, in a line logged at or after
    ``since`` seconds of uptime when given (an older line names an earlier process of that pid)."""
    if not kernel_log:
        return False
    pattern = re.compile(rf"Killed process {pid}\b|oom-kill:.*[,:]pid={pid},")
    for line in kernel_log.splitlines():
        if not pattern.search(line):
            continue
        stamp = _STAMP.match(line)
        if since is None or stamp is None or float(stamp.group(1)) >= since - 1.0:
            return True
    return False


def sigkill_cause(
    pid: int,
    baseline: OomBaseline | None,
    *,
    kernel_log: str | None = None,
    cgroup_kills_now: int | None = None,
    this_boot: str | None = None,
) -> str:
    """Why ``pid``, a process of the run ``baseline`` belongs to, was likely SIGKILLed, as a
    phrase; "" without evidence about this run. Figures are read from the machine when not given
    (tests give them)."""
    if baseline is None or baseline.boot_id is None:
        return ""  # a run from before this was recorded, or copied from elsewhere: no evidence
    if (this_boot if this_boot is not None else boot_id()) != baseline.boot_id:
        return ""  # another boot (or another machine): its pids and counts mean nothing now
    log = kernel_log if kernel_log is not None else read_kernel_log()
    if kernel_log_names_oom_kill(pid, log, since=baseline.uptime):
        return "killed by the kernel's out-of-memory killer (the kernel log names it)"
    if baseline.cgroup is None or baseline.cgroup_oom_kills is None:
        return ""
    now = (
        cgroup_kills_now
        if cgroup_kills_now is not None
        else cgroup_oom_kills(Path(baseline.cgroup))
    )
    if now is not None and now > baseline.cgroup_oom_kills:
        kills = now - baseline.cgroup_oom_kills
        return (
            f"likely out of memory: the run's memory cgroup ({baseline.cgroup}) counted {kills} "
            f"OOM kill{'s' if kills != 1 else ''} during the run"
        )
    return ""
