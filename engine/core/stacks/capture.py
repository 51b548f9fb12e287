"""Asking a process for its stack without its cooperation: py-spy where it may attach, else the
faulthandler file the rank bootstrap registered. Plain Python.

``capture_stack(pid, start_time, dump_file)`` tries ``py-spy dump --json [--native]`` first (native
frames, where the kernel and the container allow a ptrace attach by this user), then sends the
rank ``STACK_DUMP_SIGNAL`` and reads what faulthandler appended to its file. Either way the result
is a ``ProcessStack``: every thread's frames, innermost first, the text as the method printed it,
and which method produced it. A process that is gone, a zombie or stopped (SIGSTOP) says so, as the
one process lookup (``engine.core.procs.process_identity.lookup``) finds it.

The only module of ``engine.core.stacks`` that runs a program or signals a process: run-directory
readers never import it (an import-linter contract in pyproject.toml).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.common.run_environment import STACK_DUMP_SIGNAL
from engine.core.common.run_files import open_in_run
from engine.core.common.statuses import ProcessState
from engine.core.procs.process_identity import ProcessRef, lookup
from engine.core.stacks.snapshot import Frame, ThreadStack, ordered_threads, thread_lines

PY_SPY_TIMEOUT_SECONDS = 5.0  # per attempt: with native frames, then without
DUMP_WAIT_SECONDS = 5.0  # for faulthandler to write the dump after the signal
DUMP_QUIET_SECONDS = 0.15  # the dump is complete once the file stops growing this long
DUMP_MAX_BYTES = 4 << 20  # of one dump: every thread's stack of any real process fits

PY_SPY = "py-spy"
FAULTHANDLER = "faulthandler"


@dataclass(frozen=True)
class ProcessStack:
    """One process's stack at one moment, or why there is none."""

    pid: int
    method: str = ""  # py-spy | faulthandler | "" (none could be taken)
    process_state: ProcessState = ProcessState.RUNNING
    threads: tuple[ThreadStack, ...] = ()
    text: str = ""  # as the method printed it
    problem: str = ""  # why there is no stack, one sentence
    notes: tuple[str, ...] = field(default=())  # e.g. why py-spy could not attach

    def __post_init__(self) -> None:
        object.__setattr__(self, "process_state", ProcessState(self.process_state))

    @property
    def main_thread(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), self.threads[0] if self.threads else None)


# ---- parsing ---------------------------------------------------------------------------------

_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')


def parse_faulthandler(text: str) -> tuple[ThreadStack, ...]:
    """Threads from faulthandler's ``dump_traceback`` text. The main thread is the one whose
    outermost frame is a module (``<module>``) or the multiprocessing spawn entry."""
    threads: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        head = _FH_THREAD.match(line)
        if head:
            threads.append((f"Thread {head.group(2)}", []))
            continue
        frame = _FH_FRAME.match(line)
        if frame and threads:
            threads[-1][1].append(
                Frame(frame.group("func"), frame.group("file"), int(frame.group("line")))
            )
    stacks = [ThreadStack(name, tuple(frames)) for name, frames in threads]
    main = next((i for i, t in enumerate(stacks) if _looks_main(t)), 0 if stacks else None)
    return tuple(ThreadStack(t.name, t.frames, main=(i == main)) for i, t in enumerate(stacks))


def _looks_main(thread: ThreadStack) -> bool:
    if not thread.frames:
        return False
    outer = thread.frames[-1]
    return outer.function == "<module>" or outer.function in ("spawn_main", "_main")


def parse_py_spy_json(data: Any, pid: int) -> tuple[ThreadStack, ...]:
    """Threads from ``py-spy dump --json``: the main thread is the one whose OS thread id is the
    process id."""
    threads = []
    for raw in data if isinstance(data, list) else []:
        frames = tuple(
            Frame(
                function=str(f.get("name", "?")),
                filename=str(f.get("filename") or f.get("short_filename") or ""),
                line=f.get("line") if isinstance(f.get("line"), int) and f.get("line") else None,
                native=not str(f.get("filename") or "").endswith(".py")
                and not str(f.get("filename") or "").startswith("<"),
            )
            for f in raw.get("frames") or []
        )
        name = raw.get("thread_name") or f"Thread {raw.get('os_thread_id') or raw.get('thread_id')}"
        if raw.get("active") is False:
            name += " (idle)"
        threads.append(ThreadStack(str(name), frames, main=raw.get("os_thread_id") == pid))
    return tuple(threads)


def format_threads(threads: tuple[ThreadStack, ...]) -> str:
    """Threads as text, the main thread first, innermost frame last within each thread (as a
    Python traceback reads)."""
    lines = []
    for t in ordered_threads(threads):
        lines += thread_lines(t)
    return "\n".join(lines)


# ---- capturing -------------------------------------------------------------------------------


def py_spy_path() -> str | None:
    """py-spy beside this interpreter (installed with ddptui), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


def py_spy_dump(pid: int, *, native: bool = True) -> tuple[tuple[ThreadStack, ...], str]:
    """(threads, "") from py-spy, or ((), why it could not)."""
    exe = py_spy_path()
    if exe is None:
        return (), "py-spy is not installed"
    why = ""
    # Native frames may be refused (or miss on a busy machine) where plain ones are not.
    for native_frames in [True, False] if native else [False]:
        command = [exe, "dump", "--json", "--pid", str(pid)]
        if native_frames:
            command.insert(2, "--native")
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=PY_SPY_TIMEOUT_SECONDS,
                check=False,
            )
        except subprocess.TimeoutExpired:
            why = f"no answer within {PY_SPY_TIMEOUT_SECONDS:g} s"
            continue
        except OSError as err:
            return (), f"py-spy could not run ({err})"
        if done.returncode == 0:
            try:
                threads = parse_py_spy_json(json.loads(done.stdout), pid)
            except json.JSONDecodeError:
                threads = ()
            if threads:
                return threads, ""
        why = (done.stderr.strip().splitlines() or ["no output"])[0]
    return (), f"py-spy could not attach ({why})"


def faulthandler_dump(
    pid: int, dump_file: Path, *, wait: float = DUMP_WAIT_SECONDS
) -> tuple[str, str]:
    """(text, "") of the stack the process wrote after ``STACK_DUMP_SIGNAL``, or ("", why)."""
    try:
        start = dump_file.stat().st_size
    except OSError:
        return "", f"it registered no stack dump file ({dump_file.name})"
    try:
        os.kill(pid, STACK_DUMP_SIGNAL)
    except OSError as err:
        return "", f"it could not be signalled ({err.strerror})"
    deadline = time.monotonic() + wait
    size, changed = start, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            now_size = dump_file.stat().st_size
        except OSError:
            break
        if now_size != size:
            size, changed = now_size, time.monotonic()
        elif size > start and time.monotonic() - changed >= DUMP_QUIET_SECONDS:
            break
    if size <= start:
        return "", f"it wrote no stack within {wait:g} s"
    return _read_dump(dump_file, start, size)


def _read_dump(dump_file: Path, start: int, size: int) -> tuple[str, str]:
    """What a process appended to its dump file between ``start`` and ``size`` (at most
    ``DUMP_MAX_BYTES``), or "" and why it could not be read. RUN_DIR/stacks/pid-N.txt is read
    as every run file is, through no planted link."""
    try:
        with open_in_run(dump_file.parent.parent, dump_file) as f:
            f.seek(start)
            return f.read(min(size - start, DUMP_MAX_BYTES)).decode("utf-8", errors="replace"), ""
    except OSError as err:
        return "", f"its stack file could not be read ({err})"


def capture_stack(
    ref: ProcessRef, dump_file: Path | None = None, *, use_py_spy: bool = True
) -> ProcessStack:
    """The stack of one process: py-spy first, then faulthandler through ``dump_file``."""
    state = lookup(ref)[0]
    if state.ended:  # a reused pid is the rank's process gone: never read the newcomer
        gone = ProcessState.ZOMBIE if state == ProcessState.ZOMBIE else ProcessState.GONE
        return ProcessStack(ref.pid, process_state=gone, problem=f"the process is {gone}")
    if state == ProcessState.UNREADABLE:  # which process has the pid cannot be told: not touched
        return ProcessStack(
            ref.pid, process_state=state, problem="this user cannot tell which process it is"
        )
    notes: list[str] = []
    if use_py_spy:
        threads, why = py_spy_dump(ref.pid)
        if threads:
            return ProcessStack(ref.pid, PY_SPY, state, threads, text=format_threads(threads))
        notes.append(why)
    if state == ProcessState.STOPPED:  # it cannot run its signal handler until SIGCONT
        return ProcessStack(
            ref.pid,
            process_state=state,
            problem="it is stopped (SIGSTOP) and py-spy could not read it",
            notes=tuple(notes),
        )
    if dump_file is None:
        return ProcessStack(
            ref.pid, process_state=state, problem="; ".join(notes), notes=tuple(notes)
        )
    text, why = faulthandler_dump(ref.pid, dump_file)
    if not text:
        return ProcessStack(ref.pid, process_state=state, problem=why, notes=tuple(notes))
    return ProcessStack(
        ref.pid, FAULTHANDLER, state, parse_faulthandler(text), text=text, notes=tuple(notes)
    )


def capture_by_signal(
    dumps: dict[int, tuple[int, Path]],
    deliver: Callable[[], str],
    *,
    wait: float = DUMP_WAIT_SECONDS,
) -> dict[int, ProcessStack]:
    """Stacks of processes this machine may not see (ranks on other nodes): ``deliver`` has the
    stack-dump signal sent to every one of them (returning "" or why it could not), and each
    answers by appending its faulthandler dump to its file on storage every node sees.
    ``dumps`` maps a key (the rank) to (pid, dump file). A process whose file does not grow
    within ``wait`` seconds gets a ProcessStack saying so."""
    before: dict[int, int] = {}
    for key, (_, path) in dumps.items():
        try:
            before[key] = path.stat().st_size
        except OSError:
            before[key] = -1
    problem = deliver()
    if problem:
        return {k: ProcessStack(pid, problem=problem) for k, (pid, _) in dumps.items()}
    sizes = dict(before)
    changed = dict.fromkeys(dumps, time.monotonic())
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        time.sleep(0.05)
        for key, (_, path) in dumps.items():
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size != sizes[key]:
                sizes[key], changed[key] = size, time.monotonic()
        quiet = time.monotonic() - max(changed.values()) >= DUMP_QUIET_SECONDS
        if quiet and all(sizes[k] > max(before[k], 0) for k in dumps):
            break
    taken = {}
    for key, (pid, path) in dumps.items():
        start = max(before[key], 0)
        if before[key] < 0:
            why = f"it registered no stack dump file ({path.name})"
        elif sizes[key] <= start:
            why = f"it wrote no stack within {wait:g} s"
        else:
            why = ""
        text = ""
        if not why:
            text, why = _read_dump(path, start, sizes[key])
        if why:
            taken[key] = ProcessStack(pid, problem=why)
        else:
            taken[key] = ProcessStack(
                pid, FAULTHANDLER, threads=parse_faulthandler(text), text=text
            )
    return taken
