"""Tie a rank's life to the process that started it, before anything heavy is imported.

Standard library only, and it must stay so: it runs first in every rank (``engine.train.launch`` calls it
at the top of the module a spawned rank re-imports as ``__mp_main__``, ``engine.train.worker`` at the top
of its torchrun entry) and first in every DataLoader worker (its ``worker_init_fn``). Importing
torch takes seconds; a launcher SIGKILLed or OOM-killed during those seconds must not leave the
rank behind with parent 1, which is what a watchdog thread started after ``import torch`` allowed.

On Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill this process the moment its
parent (the thread that forked it) ends. The parent may already have ended before the call, so the
parent is checked again after it. Elsewhere there is no such call: ``bind_to_parent`` returns
False and the watchdog thread in ``engine.train.worker`` is what ends an orphaned rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

from engine.core.run_environment import LAUNCHER_PID_ENV

PR_SET_PDEATHSIG = 1
ORPHANED_EXIT_CODE = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent ends; False where the
    platform has no PR_SET_PDEATHSIG (not Linux) or the call failed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def orphaned_reason(parent: int) -> str | None:
    """Why this process has already lost the process that started it, or None.

    ``parent`` is the parent pid read before the death signal was armed: a different parent now
    means it ended in between. Parent 1 means this process was reparented to init. And a launcher
    named in the environment that is gone, while the parent is not that launcher, means the
    launcher ended before this process could look (its parent is then a subreaper)."""
    now = os.getppid()
    if now != parent:
        return f"its parent {parent} ended while it started"
    if now == 1:
        return "it was reparented to init: the process that started it is gone"
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    if launcher.isdigit() and int(launcher) != now and not _pid_alive(int(launcher)):
        return f"its launcher {launcher} ({LAUNCHER_PID_ENV}) is gone"
    return None


def bind_to_parent() -> bool:
    """Arm the parent-death signal, then end this process at once if the parent is already gone.

    Returns whether the kernel will end this process with its parent (False: not Linux, so only
    the watchdog does). Idempotent: calling it again re-arms the same signal."""
    parent = os.getppid()
    armed = set_parent_death_signal()
    reason = orphaned_reason(parent)
    if reason is not None:
        with contextlib.suppress(Exception):
            print(f"ddptui rank bootstrap: {reason}; exiting", file=sys.stderr, flush=True)
        os._exit(ORPHANED_EXIT_CODE)
    return armed


def bind_dataloader_worker(_worker_id: int) -> None:
    """``worker_init_fn`` of every DataLoader: a forked worker does not inherit the death signal,
    and torch's own check on the rank runs only between batches."""
    bind_to_parent()
