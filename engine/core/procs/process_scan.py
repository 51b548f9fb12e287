"""The /proc scan: every visible process as one ``ProcessInfo`` (one pass, environments included
where readable), and what one process is by evidence: a launcher (torchrun & co., or ddptui's), a
``multiprocessing`` spawn child, a Python interpreter, one with torch loaded, one with a
distributed-training environment. Grouping processes into jobs is ``engine.core.jobs``'s.

Plain Python (psutil), never torch. Nothing here is recognised by name alone: ``exec -a torchrun
sleep 600`` names itself torchrun and is no launcher.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import psutil

from engine.core.common.run_files import user_name
from engine.core.common.statuses import ProcessState
from engine.core.procs.process_identity import ProcessRef, status_state

DIST_ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)
TORCH_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*[a-z]?$")
_ATTRS = ["pid", "ppid", "name", "cmdline", "uids", "create_time", "status", "exe"]


@dataclass
class ProcessInfo:
    """One process as the scan saw it. ``environ`` is None when it could not be read."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    username: str
    uid: int | None
    create_time: float
    status: str
    environ: dict[str, str] | None
    environ_error: str = ""
    proc: psutil.Process | None = field(default=None, repr=False)
    exe: str | None = None  # the executable's path; None when it cannot be read

    @property
    def state(self) -> ProcessState:
        """Running, stopped by a signal or a zombie, as ``lookup`` would say of it at the scan."""
        return status_state(self.status)

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (SIGSTOP, Ctrl-Z): it runs again on SIGCONT."""
        return self.state == ProcessState.STOPPED

    @property
    def zombie(self) -> bool:
        return self.state == ProcessState.ZOMBIE

    @property
    def command(self) -> str:
        return " ".join(self.cmdline) if self.cmdline else f"[{self.name}]"

    @property
    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.create_time)


def _environment(proc: psutil.Process, uid: int | None) -> tuple[dict[str, str] | None, str]:
    """(environment, why it is missing) of one process."""
    try:
        return proc.environ(), ""
    except psutil.AccessDenied:
        if uid is not None and uid != os.getuid():
            return None, "environment not readable: another user's process"
        return None, "environment not readable: a protected process"
    except psutil.NoSuchProcess:  # gone meanwhile, or a kernel thread (no environment)
        return {}, ""
    except (psutil.Error, OSError) as err:
        return None, f"environment not readable ({type(err).__name__})"


def snapshot_processes() -> dict[int, ProcessInfo]:
    """Every visible process with its environment where readable (one pass over /proc)."""
    found: dict[int, ProcessInfo] = {}
    names: dict[int, str] = {}  # uid -> user name, looked up once a scan
    for proc in psutil.process_iter(_ATTRS):
        info = proc.info
        if info.get("create_time") is None:
            continue
        uids = info.get("uids")
        uid = uids.real if uids else None
        if uid is not None and uid not in names:
            names[uid] = user_name(uid)
        environ, error = _environment(proc, uid)
        found[proc.pid] = ProcessInfo(
            pid=proc.pid,
            ppid=info.get("ppid") or 0,
            name=info.get("name") or "",
            cmdline=tuple(info.get("cmdline") or ()),
            username=names[uid] if uid is not None else "?",
            uid=uid,
            create_time=float(info["create_time"]),
            status=info.get("status") or "",
            environ=environ,
            environ_error=error,
            proc=proc,
            exe=info.get("exe") or None,
        )
    return found


# ---- what one process is ---------------------------------------------------------------------


def launcher_kind(cmdline: Iterable[str]) -> str | None:
    """'torchrun', 'torch.distributed.launch' / '.run', or 'ddptui' for a launcher command line."""
    args = list(cmdline)
    for i, arg in enumerate(args[:3]):  # the program, or the script python runs
        if os.path.basename(arg) == "torchrun":
            return "torchrun"
        if arg == "-m" and i + 1 < len(args):
            module = args[i + 1]
            if module in TORCH_LAUNCHERS:
                return module
            if module in (
                "engine.train.launch",
                "engine.train.node_launch",
            ):  # one node's, of a run across nodes
                return "ddptui"
    return None


def is_spawn_child(cmdline: Iterable[str]) -> bool:
    """A ``multiprocessing`` spawn / forkserver child (what torch.multiprocessing.spawn starts)."""
    text = " ".join(cmdline)
    return (
        "multiprocessing.spawn" in text
        or "spawn_main" in text
        or "--multiprocessing-fork" in text
        or "multiprocessing.forkserver" in text
    )


def loads_torch(pid: int) -> bool | None:
    """Whether ``pid`` has PyTorch's native library mapped; None when its maps are not readable."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            return any("libtorch" in line or "torch/_C" in line for line in f)
    except OSError:
        return None


def is_python(p: ProcessInfo) -> bool:
    """A Python interpreter, by what it executes (``/proc/PID/exe``), not by what it calls itself:
    ``exec -a torchrun sleep 600`` names itself torchrun. Only where the executable cannot be read
    (another user's process) does its name stand in."""
    if p.exe is not None:
        return bool(_PYTHON.match(os.path.basename(p.exe)))
    names = [os.path.basename(p.cmdline[0])] if p.cmdline else []
    return any(_PYTHON.match(n) for n in [*names, p.name])


def launcher_of(p: ProcessInfo) -> str | None:
    """The kind of launcher ``p`` is, by evidence: a Python interpreter whose command line is a
    launcher's (``launcher_kind``) and that has not been seen without torch loaded. A program that
    only calls itself torchrun is none."""
    kind = launcher_kind(p.cmdline)
    if kind is None or not is_python(p) or loads_torch(p.pid) is False:
        return None
    return kind


def distributed_env(env: dict[str, str]) -> bool:
    """A distributed-training environment, by strong evidence only: a lone RANK is common in
    unrelated programs."""
    if "TORCHELASTIC_RUN_ID" in env:
        return True
    if "WORLD_SIZE" in env and ("RANK" in env or "LOCAL_RANK" in env):
        return True
    return "MASTER_ADDR" in env and "MASTER_PORT" in env


def env_int(value: str | None) -> int | None:
    """An integer environment value (``RANK``, ``LOCAL_RANK``), None when absent or not one."""
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
