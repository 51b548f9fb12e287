"""Utilisation and memory of the GPUs a run uses, with a short history, temperature and power where
NVML gives them; for runs without NVML (CPU runs, no driver), CPU and memory of the rank processes.

A GPU whose NVML queries fail shows "not available" with the reason, on its own line only.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ddptui import text_figures
from ddptui.gpu_history import GpuHistory
from engine.core.common import formatting
from engine.core.host.gpus import GpuInventory, GpuSample
from engine.core.runs.rank_states import RankState

CPU_HISTORY = 60


def _percent_style(value: float | None) -> str:
    if value is None:
        return "dim"
    if value >= 90:
        return "bold green"
    if value >= 40:
        return "green"
    return "yellow"


def gpu_line(gpu: GpuSample, history: GpuHistory, width: int) -> Text:
    line = Text(f"GPU{gpu.index} ", style="bold")
    if gpu.error is not None:
        name = f"{gpu.name} " if gpu.name else ""
        line.append(f"{name}not available: {gpu.error}", style="red")
        line.truncate(width, overflow="ellipsis")
        return line
    spark = min(30, max(4, (width - 58) // 2))
    name_width = 14 if width < 100 else 24
    name = gpu.name.removeprefix("NVIDIA ")
    line.append(f"{name[:name_width]:<{name_width}} ")
    util = gpu.utilization_percent
    line.append("util ")
    line.append(text_figures.sparkline(history.utilization.get(gpu.index, []), spark), style="cyan")
    line.append(f" {util:>3}%" if util is not None else "   ?%", style=_percent_style(util))
    line.append("  mem ")
    line.append(
        text_figures.sparkline(history.memory.get(gpu.index, []), spark, maximum=1.0),
        style="magenta",
    )
    line.append(
        f" {formatting.gib(gpu.memory_used_bytes)}/{formatting.gib(gpu.memory_total_bytes)}G"
    )
    if gpu.temperature_c is not None:
        line.append(f" {gpu.temperature_c}°C")
    if gpu.power_watts is not None:
        line.append(f" {gpu.power_watts:.0f}W")
    line.truncate(width, overflow="ellipsis")
    return line


def gpu_cell(gpu: GpuSample, history: GpuHistory, width: int) -> Text:
    """One GPU in half a line (a short terminal): utilisation history and figure, memory."""
    cell = Text(f"GPU{gpu.index} ", style="bold")
    if gpu.error is not None:
        cell.append(f"not available: {gpu.error}", style="red")
        return cell
    util = gpu.utilization_percent
    spark = max(3, min(12, width - 30))
    cell.append(text_figures.sparkline(history.utilization.get(gpu.index, []), spark), style="cyan")
    cell.append(f" {util:>3}%" if util is not None else "   ?%", style=_percent_style(util))
    cell.append(
        f" {formatting.gib(gpu.memory_used_bytes)}/{formatting.gib(gpu.memory_total_bytes)}G"
    )
    if gpu.temperature_c is not None:
        cell.append(f" {gpu.temperature_c}°C")
    return cell


def gpu_bar_line(gpu: GpuSample, history: GpuHistory, width: int, held: int | None = None) -> Text:
    """One GPU for the GPUs screen: utilisation and memory as bars, each with its recent history,
    temperature, power, and how many processes hold it."""
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append(f"GPU{gpu.index} ", style="bold")
    if gpu.error is not None:
        name = f"{gpu.name} " if gpu.name else ""
        line.append(f"{name}not available: {gpu.error}", style="red")
        line.truncate(width, overflow="ellipsis")
        return line
    wide = width >= 120
    name_width = 14 if wide else 9
    bar_width = 10 if wide else 6
    # GPU0 + name + util bar pct + spark + mem bar + figures + temp + power + processes
    fixed = 5 + name_width + 1 + 5 + bar_width + 5 + 5 + bar_width + 11 + 5 + 5 + 8
    spark = max(0, min(40, (width - fixed) // 2))
    name = gpu.name.removeprefix("NVIDIA ")
    line.append(f"{name[:name_width]:<{name_width}} ", style="dim")
    util = gpu.utilization_percent
    line.append("util ")
    line.append(text_figures.bar(util or 0, 100, bar_width), style=_percent_style(util))
    line.append(f"{util:>4}%" if util is not None else "   ?%", style=_percent_style(util))
    if spark:
        line.append(" ")
        line.append(text_figures.sparkline(history.utilization.get(gpu.index, []), spark), "cyan")
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    line.append("  mem ")
    line.append(text_figures.bar(used or 0, total or 0, bar_width), style="magenta")
    line.append(f" {formatting.gib(used)}/{formatting.gib(total)}G")
    if spark:
        line.append(" ")
        memory = history.memory.get(gpu.index, [])
        line.append(text_figures.sparkline(memory, spark, maximum=1.0), style="magenta")
    if gpu.temperature_c is not None:
        line.append(f" {gpu.temperature_c}°C")
    if gpu.power_watts is not None:
        line.append(f" {gpu.power_watts:.0f}W")
    if held is not None:
        line.append(f" {held}p" if held else " free", style="yellow" if held else "green")
    line.truncate(width, overflow="ellipsis")
    return line


class GpuPanel(Widget):
    """Set ``inventory`` (with ``history``), ``indices`` (the run's GPUs) and ``ranks``."""

    DEFAULT_CSS = """
    GpuPanel { height: 1; }
    """

    # No layout on change (see RankTable): the height is set from the line count when it changes.
    inventory: reactive[GpuInventory | None] = reactive(None)
    indices: reactive[tuple[int, ...]] = reactive(())
    ranks: reactive[tuple[RankState, ...]] = reactive(())
    compact: reactive[bool] = reactive(False)  # a short terminal: two GPUs to a line

    def __init__(self, history: GpuHistory, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.history = history
        self._cpu: dict[int, list[float]] = {}

    def watch_ranks(self, ranks: tuple[RankState, ...]) -> None:
        for r in ranks:
            if r.pid is None or r.usage is None:
                continue
            values = self._cpu.setdefault(r.pid, [])
            values.append(r.usage.cpu_percent if r.usage.cpu_percent is not None else float("nan"))
            del values[:-CPU_HISTORY]

    def render(self) -> Group:
        return Group(*self._lines(self.size.width or 80))

    def line_count(self) -> int:
        return len(self._lines(self.size.width or 80))

    def fit(self) -> None:
        """Set the height to the line count; the screen calls this after changing the data."""
        count = self.line_count()
        if self.styles.height is None or self.styles.height.value != count:
            self.styles.height = count

    def _lines(self, width: int) -> list[Text]:
        lines: list[Text] = []
        inventory = self.inventory
        if self.indices:
            if inventory is None:
                lines.append(Text("GPUs: sampling NVML…", style="dim"))
            elif inventory.error is not None:
                lines.append(Text(f"GPUs not available: {inventory.error}", style="red"))
            else:
                by_index = {g.index: g for g in inventory.gpus}
                cells = []
                for index in self.indices:
                    gpu = by_index.get(index)
                    if gpu is None:
                        cells.append(
                            Text(f"GPU{index} not available: NVML does not list it", style="red")
                        )
                    elif self.compact:
                        cells.append(gpu_cell(gpu, self.history, (width - 2) // 2))
                    else:
                        cells.append(gpu_line(gpu, self.history, width))
                if not self.compact:
                    return cells
                for start in range(0, len(cells), 2):
                    pair = cells[start : start + 2]
                    line = Text(no_wrap=True, overflow="ellipsis")
                    for i, cell in enumerate(pair):
                        if i:
                            line.append("  ")
                        cell.truncate((width - 2) // 2, overflow="ellipsis", pad=True)
                        line.append_text(cell)
                    lines.append(line)
                return lines
        lines.extend(self._process_lines(width))
        return lines

    def _process_lines(self, width: int) -> list[Text]:
        """Several ranks to a line: ``rank 0 ▂▃▅▇ 97% 310M``, so eight ranks fit 80 columns."""
        running = [r for r in self.ranks if r.pid is not None and r.usage is not None]
        if not running:
            return [Text("rank processes: none running", style="dim")]
        spark = 8 if width < 120 else 16
        cell = 7 + spark + 12  # "rank 0 " + sparkline + " 100% 1234M"
        per_line = max(1, (width + 2) // (cell + 2))
        lines = []
        for start in range(0, len(running), per_line):
            line = Text(no_wrap=True, overflow="ellipsis")
            for i, r in enumerate(running[start : start + per_line]):
                assert r.pid is not None and r.usage is not None
                if i:
                    line.append("  ")
                line.append(f"rank {r.rank} ", style="bold")
                cpu = r.usage.cpu_percent
                line.append(text_figures.sparkline(self._cpu.get(r.pid, []), spark), style="cyan")
                line.append(f" {cpu:>3.0f}%" if cpu is not None else "   -%", _percent_style(cpu))
                line.append(f" {formatting.mib(r.usage.rss_bytes):>5}")
            lines.append(line)
        return lines

    def on_resize(self) -> None:
        self.fit()  # the rank-process lines pack more ranks to a line on a wider terminal
