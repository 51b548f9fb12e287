"""The files a run across nodes keeps for each node, whichever backend placed it there: node names
that may name a file (``check_node_name``), a node's small JSON file read with a bound and through
no planted link (``read_json_file``), and each node's GPUs as its node launcher last sampled them
(``gpus/<node>.json``: ``NodeGpus``), for the Run screen. Plain Python.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from engine.core.common.run_files import make_dirs, read_run_bytes, write_json_atomic
from engine.core.common.run_layout import RunLayout
from engine.core.host.gpus import GpuInventory, GpuSample

RECORD_LIMIT = 1024 * 1024  # a node's file is a few KiB; more is not one
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def check_node_name(node: str) -> str:
    """``node`` when it can name a file (a scheduler's node names can); ValueError else."""
    if not _NODE_NAME.match(node) or len(node) > 200:
        raise ValueError(f"{node!r} is not a node name")
    return node


def read_json_file(run_path: Path, path: Path) -> dict[str, Any] | None:
    """A small JSON object of the run directory (read as ``open_in_run`` allows, at most
    ``RECORD_LIMIT`` bytes); None when it is not there. ValueError when it cannot be read."""
    try:
        raw = read_run_bytes(run_path, path, RECORD_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as err:  # a planted link, another user's file, over the limit
        raise ValueError(str(err)) from None
    try:
        data = json.loads(raw.decode("utf-8", errors="replace"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def node_gpus_path(run_path: Path, node: str) -> Path:
    """The node's GPUs as its launcher last sampled them (NVML)."""
    return RunLayout(Path(run_path)).node_gpus(check_node_name(node))


_SAMPLE_FIELDS = (
    "index", "name", "uuid", "memory_used_bytes", "memory_total_bytes", "utilization_percent",
    "temperature_c", "power_watts", "error",
)  # fmt: skip


@dataclass(frozen=True)
class NodeGpus:
    """One node's GPUs as its launcher last sampled them (NVML there), and when."""

    node: str
    time: float
    inventory: GpuInventory

    def to_json(self) -> dict[str, Any]:
        inv = self.inventory
        return {
            "node": self.node,
            "time": self.time,
            "error": inv.error,
            "driver_version": inv.driver_version,
            "gpus": [{k: getattr(g, k) for k in _SAMPLE_FIELDS} for g in inv.gpus],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeGpus:
        gpus = tuple(
            _sample(g)
            for g in data.get("gpus") or []
            if isinstance(g, dict) and isinstance(g.get("index"), int)
        )
        return cls(
            node=check_node_name(str(data["node"])),
            time=float(data.get("time") or 0.0),
            inventory=GpuInventory(
                gpus=gpus,
                driver_version=str(data.get("driver_version") or ""),
                error=str(data["error"]) if data.get("error") else None,
            ),
        )


def _sample(data: dict[str, Any]) -> GpuSample:
    def number(key: str) -> Any:
        value = data.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return GpuSample(
        index=int(data["index"]),
        name=str(data.get("name") or ""),
        uuid=str(data.get("uuid") or ""),
        memory_used_bytes=number("memory_used_bytes"),
        memory_total_bytes=number("memory_total_bytes"),
        utilization_percent=number("utilization_percent"),
        temperature_c=number("temperature_c"),
        power_watts=number("power_watts"),
        error=str(data["error"]) if data.get("error") else None,
    )


def write_node_gpus(run_path: Path, sample: NodeGpus) -> None:
    path = node_gpus_path(run_path, sample.node)
    make_dirs(path.parent)
    write_json_atomic(path, sample.to_json())


def read_node_gpus(run_path: Path) -> dict[str, NodeGpus]:
    """Every node's last GPU sample by node; a sample that cannot be read is left out."""
    return read_each_node(run_path, RunLayout(Path(run_path)).gpus_dir, NodeGpus.from_json)[0]


class NodeFile(Protocol):
    """What each node's file is read into: it names its node."""

    @property
    def node(self) -> str: ...


File = TypeVar("File", bound=NodeFile)


def read_each_node(
    run_path: Path, directory: Path, parse: Callable[[dict[str, Any]], File]
) -> tuple[dict[str, File], tuple[str, ...]]:
    """Each node's ``*.json`` in ``directory`` read into what ``parse`` makes of it, by node, and
    a sentence for each file that could not be read."""
    found: dict[str, File] = {}
    problems: list[str] = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return {}, ()
    for path in paths:
        try:
            data = read_json_file(run_path, path)
            if data is not None:
                item = parse(data)
                found[item.node] = item
        except (ValueError, KeyError, TypeError) as err:
            problems.append(f"{path}: {err}")
    return found, tuple(problems)
