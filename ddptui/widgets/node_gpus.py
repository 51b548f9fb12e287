"""The GPUs of every node of a run across nodes, as each node launcher last sampled them (NVML on
that node, ``gpus/<node>.json``): a line per node. The machine this UI runs on is not where such a
run's ranks are, so its own GPU panel gives way to this one."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from engine.core.common import formatting
from engine.core.runs.node_files import NodeGpus


def node_gpu_lines(samples: dict[str, NodeGpus], now: float) -> list[Text]:
    head = Text("GPUs of each node (sampled there)", style="bold")
    if not samples:
        return [head, Text("  no node has sampled its GPUs yet", style="dim")]
    lines = [head]
    for node, sample in sorted(samples.items()):
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"  {node:<10}", style="bold")
        inventory = sample.inventory
        if inventory.error or not inventory.gpus:
            line.append(f"no GPU: {inventory.error or 'NVML lists none'}", style="dim")
        for gpu in inventory.gpus:
            if gpu.error:
                line.append(f" GPU{gpu.index} not available ({gpu.error})", style="red")
                continue
            util = f"{gpu.utilization_percent}%" if gpu.utilization_percent is not None else "?%"
            used = formatting.gib(gpu.memory_used_bytes)
            total = formatting.gib(gpu.memory_total_bytes)
            line.append(f" GPU{gpu.index} {util} {used}/{total} GiB")
        line.append(f"  ({formatting.format_age(now - sample.time)} ago)", style="dim")
        lines.append(line)
    return lines


class NodeGpusPanel(Static):
    DEFAULT_CSS = "NodeGpusPanel { height: auto; }"

    def show(self, samples: dict[str, NodeGpus], now: float) -> None:
        self.update(Group(*node_gpu_lines(samples, now)))
