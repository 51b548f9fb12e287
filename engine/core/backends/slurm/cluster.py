"""The Slurm cluster this machine submits to, as its own commands tell it: its partitions and nodes
(``sinfo``), node lists expanded, and the one way ddptui runs a Slurm command.

Plain Python. Slurm's commands are found on PATH and read ``SLURM_CONF`` from the environment, as
they do for the user. Every failure is one sentence (``SlurmUnavailable``), never a traceback.
The JSON layout of Slurm's commands changes between releases (openapi v0.0.38 in 22.05): it is
read defensively, and a missing field is "unknown", not an error.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

COMMAND_TIMEOUT_SECONDS = 15.0
OUTPUT_LIMIT = 64 * 1024 * 1024  # squeue --json of a large cluster is megabytes, never more


class SlurmUnavailable(Exception):
    """A Slurm command is missing or failed; the message is one sentence saying which and why."""


def slurm_command(program: str) -> str:
    """The path of one of Slurm's commands, or SlurmUnavailable naming it."""
    path = shutil.which(program)
    if path is None:
        raise SlurmUnavailable(
            f"Slurm's {program} is not on PATH (run ddptui where Slurm's client commands are "
            "installed, such as the cluster's login node)"
        )
    return path


def run_slurm(
    program: str, *args: str, timeout: float = COMMAND_TIMEOUT_SECONDS, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command and return it; SlurmUnavailable (one sentence: the command, Slurm's
    own message) when it cannot run, times out, or (``check``) exits non-zero."""
    command = [slurm_command(program), *args]
    shown = " ".join([program, *args])
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"`{shown}` gave no answer within {timeout:g} s") from None
    except OSError as err:
        raise SlurmUnavailable(f"`{shown}` could not run ({err.strerror})") from None
    if check and done.returncode != 0:
        raise SlurmUnavailable(f"`{shown}` failed: {first_line(done.stderr or done.stdout)}")
    if len(done.stdout) > OUTPUT_LIMIT:
        raise SlurmUnavailable(f"`{shown}` printed more than {OUTPUT_LIMIT // 2**20} MiB")
    return done


def first_line(text: str) -> str:
    """Slurm's message, one line, without its ``sbatch: error:`` prefix."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "no message"
    line = next((ln for ln in lines if "error" in ln.lower()), lines[0])
    return re.sub(r"^\w+: (error: )?", "", line)


def read_json(program: str, *args: str) -> dict[str, Any]:
    """``program ARGS --json`` parsed; SlurmUnavailable when it is not JSON."""
    done = run_slurm(program, *args, "--json")
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SlurmUnavailable(
            f"`{program} --json` printed no JSON (Slurm before 21.08?)"
        ) from None
    if not isinstance(data, dict):
        raise SlurmUnavailable(f"`{program} --json` printed no JSON object")
    return data


# ---- node lists --------------------------------------------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's compressed node list (``n[1-3,7],gpu01``) as names, in order."""
    names: list[str] = []
    for part in _split_top(text.strip()):
        head, bracket, rest = part.partition("[")
        if not bracket:
            if part:
                names.append(part)
            continue
        ranges, _, tail = rest.partition("]")
        for item in ranges.split(","):
            found = _RANGE.match(item.strip())
            if not found:
                names.append(part)
                break
            first, last = found.group(1), found.group(2) or found.group(1)
            width = len(first)
            names.extend(
                f"{head}{number:0{width}d}{tail}" for number in range(int(first), int(last) + 1)
            )
    return tuple(names)


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p]


# ---- partitions and nodes ------------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmNode:
    name: str
    hostname: str = ""
    address: str = ""
    state: str = ""  # idle, mixed, allocated, down, drained ... ("down*": not responding)
    reason: str = ""
    partitions: tuple[str, ...] = ()
    cpus: int | None = None
    gres: str = ""
    slurmd_started: float | None = None  # when its slurmd last started (a node back from a loss)

    @property
    def down(self) -> bool:
        """Slurm counts it out: down, drained, failed or not responding."""
        word = self.state.lower()
        return any(w in word for w in ("down", "drain", "fail", "not_responding")) or (
            word.endswith("*")
        )


@dataclass(frozen=True)
class SlurmPartition:
    name: str
    nodes: tuple[str, ...] = ()
    default: bool = False
    up: bool = True
    max_time: str = ""  # as sinfo prints it: infinite, 1:00:00, 2-00:00:00


@dataclass(frozen=True)
class SlurmCluster:
    partitions: tuple[SlurmPartition, ...]
    nodes: tuple[SlurmNode, ...]

    def partition(self, name: str) -> SlurmPartition | None:
        """The partition of that name; "" is the default one."""
        if not name:
            return next((p for p in self.partitions if p.default), None)
        return next((p for p in self.partitions if p.name == name), None)

    def node(self, name: str) -> SlurmNode | None:
        return next((n for n in self.nodes if n.name == name), None)


def _node(raw: dict[str, Any]) -> SlurmNode:
    state = raw.get("state")
    flags = raw.get("state_flags") or []
    words = [str(state).lower()] if state else []
    words += [str(f).lower() for f in flags if isinstance(f, str)]
    cpus = raw.get("cpus")
    started = raw.get("slurmd_start_time")
    return SlurmNode(
        name=str(raw.get("name", "")),
        hostname=str(raw.get("hostname") or ""),
        address=str(raw.get("address") or ""),
        state="+".join(words),
        reason=str(raw.get("reason") or ""),
        partitions=tuple(str(p) for p in raw.get("partitions") or ()),
        cpus=cpus if isinstance(cpus, int) else None,
        gres=str(raw.get("gres") or ""),
        slurmd_started=float(started) if isinstance(started, int) and started > 0 else None,
    )


def read_cluster() -> SlurmCluster:
    """Partitions and nodes from ``sinfo``; SlurmUnavailable when Slurm cannot be asked."""
    nodes = tuple(_node(n) for n in read_json("sinfo").get("nodes") or [] if isinstance(n, dict))
    summary = run_slurm("sinfo", "-h", "-o", "%P|%a|%l").stdout
    partitions = []
    for line in summary.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3 or not fields[0]:
            continue
        name, default = fields[0].rstrip("*"), fields[0].endswith("*")
        members = tuple(n.name for n in nodes if name in n.partitions)
        partitions.append(
            SlurmPartition(
                name=name, nodes=members, default=default, up=fields[1] == "up", max_time=fields[2]
            )
        )
    return SlurmCluster(partitions=tuple(partitions), nodes=nodes)
