"""Make a rank watchable and orphan-proof, before anything heavy is imported.

Standard library only, and it must stay so: it runs first in every rank (``engine.train.launch`` calls it
at the top of the module a spawned rank re-imports as ``__mp_main__``, ``engine.train.worker`` at the top
of its torchrun entry) and first in every DataLoader worker (its ``worker_init_fn``). Importing
torch takes seconds; a launcher SIGKILLed or OOM-killed during those seconds must not leave the
rank behind with parent 1, which is what a watchdog thread started after ``import torch`` allowed.

On Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill this process the moment its
parent (the thread that forked it) ends. The parent may already have ended before the call, so the
parent is checked again after it. Elsewhere there is no such call: ``bind_to_parent`` returns
False and the watchdog thread in ``engine.train.worker`` is what ends an orphaned rank.

A rank can also be asked for its stack without its cooperation (``prepare_stack_dumps``):
``faulthandler`` is registered on ``STACK_DUMP_SIGNAL`` (all threads, chained to any handler that
was there, never to the default action, which would end the rank) and appends to ``RUN_DIR/stacks/pid-<pid>.txt``; being a C-level handler it answers even
while the rank is blocked in a gloo or NCCL wait or holds the GIL. And the run's own user may attach
a debugger or py-spy to it (``PR_SET_PTRACER``), where the kernel's Yama policy would otherwise
allow only the rank's ancestors. ``bootstrap_rank`` does all of it. At the other end,
``exit_at_once`` ends a finished rank without seconds of interpreter shutdown.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
from pathlib import Path
from typing import IO, NoReturn

from engine.core.common.run_environment import (
    LAUNCHER_PID_ENV,
    NODE_ENV,
    RUN_DIR_ENV,
    STACK_DUMP_SIGNAL,
)
from engine.core.common.run_files import PRIVATE_DIR_MODE, open_private
from engine.core.common.run_layout import RunLayout

PR_SET_PDEATHSIG = 1
PR_SET_PTRACER = 0x59616D61  # "Yama"
PR_SET_PTRACER_ANY = -1  # any process of this user (the kernel's own uid checks still apply)
ORPHANED_EXIT_CODE = 1
# The file faulthandler writes to must stay open for the life of the process.
_stack_file: dict[int, IO[str]] = {}


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; False elsewhere or when the kernel refused it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, ctypes.c_long(value), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent ends; False where the
    platform has no PR_SET_PDEATHSIG (not Linux) or the call failed."""
    return _prctl(PR_SET_PDEATHSIG, int(sig))


def allow_same_user_ptrace() -> bool:
    """Let any process of this user attach (py-spy, gdb): Yama's ptrace_scope 1 would otherwise
    allow only this process's ancestors. False where there is no Yama (nothing to allow) or it
    refused; the kernel's uid checks and the container's capabilities still apply."""
    return _prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)


def prepare_stack_dumps(run_dir: str | None = None) -> Path | None:
    """Register faulthandler on ``STACK_DUMP_SIGNAL``, appending every thread's stack to this
    process's file in the run directory's stacks folder, and allow a same-user ptrace attach.
    Returns the file, or None outside a ddptui run (no ``DDPTUI_RUN_DIR``) or where it cannot be
    opened. Idempotent per process: a forked child registers its own file."""
    pid = os.getpid()
    directory = run_dir or os.environ.get(RUN_DIR_ENV)
    if not directory:
        return None
    path = RunLayout(Path(directory)).stack_dump(pid, os.environ.get(NODE_ENV, ""))
    if pid in _stack_file:
        return path
    try:
        # Never follow a link planted where the file goes; readable by this user only.
        fd = open_private(path, "append", parents=PRIVATE_DIR_MODE)
    except OSError:
        return None
    stream = os.fdopen(fd, "a", encoding="utf-8")
    # Chain to a handler that was there (a framework's); never to the default action, which for
    # this signal is to end the process.
    previous = signal.getsignal(STACK_DUMP_SIGNAL)
    chain = previous not in (signal.SIG_DFL, None)
    faulthandler.register(STACK_DUMP_SIGNAL, file=stream, all_threads=True, chain=chain)
    _stack_file[pid] = stream
    allow_same_user_ptrace()
    return path


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


def bootstrap_rank() -> bool:
    """Everything a rank does first: tie it to its parent, then make its stack askable. Returns
    whether the kernel will end this process with its parent."""
    armed = bind_to_parent()
    prepare_stack_dumps()
    return armed


def bind_dataloader_worker(_worker_id: int) -> None:
    """``worker_init_fn`` of every DataLoader: a forked worker does not inherit the death signal,
    and torch's own check on the rank runs only between batches."""
    bind_to_parent()


def exit_at_once(code: int) -> NoReturn:
    """End this rank now with ``code``, once Python's and C's buffered output is flushed:
    ``os._exit``, skipping interpreter shutdown, which for a process that imported torch takes
    seconds and would wait for threads a script left running."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)
    os._exit(code)
