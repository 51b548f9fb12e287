"""How figures are drawn as text, in the CLI and in the UI: rates, losses, sparklines, bars and
command lines cut to a width. Pure functions (no textual). Sizes and durations are
``engine.core.common.formatting``'s."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.host.host_usage import HostUsage

from engine.core.common.visible_text import visible

BLOCKS = "▁▂▃▄▅▆▇█"


def rate(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:.0f}"


def loss(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.3f}" if value < 100 else f"{value:.0f}"


def sparkline(values: Sequence[float], width: int, maximum: float = 100.0) -> str:
    """The last ``width`` values as block characters, scaled to ``maximum``; gaps are spaces."""
    shown = list(values)[-width:]
    chars = []
    for v in shown:
        if v is None or math.isnan(v):
            chars.append(" ")
            continue
        level = 0 if maximum <= 0 else min(1.0, max(0.0, v / maximum))
        chars.append(BLOCKS[min(len(BLOCKS) - 1, int(level * (len(BLOCKS) - 1) + 0.5))])
    return "".join(chars).rjust(width)


def resample(values: Sequence[float], width: int) -> list[float]:
    """``values`` in at most ``width`` points, first to last: each point the mean of its share
    of them (a sparkline of every epoch, not of the last ``width``)."""
    count = len(values)
    if count <= width or width <= 0:
        return list(values)
    points = []
    for i in range(width):
        share = values[i * count // width : (i + 1) * count // width]
        points.append(sum(share) / len(share))
    return points


def bar(done: int, total: int, width: int) -> str:
    """A progress bar of ``width`` cells with eighth-cell resolution."""
    if width <= 0:
        return ""
    if total <= 0:
        return "░" * width
    fraction = min(1.0, max(0.0, done / total))
    eighths = int(fraction * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part and full < width else ""
    return ("█" * full + partial).ljust(width, "░")[:width]


def host_line(host: HostUsage, width: int | None) -> str:
    """The host's CPU, memory and swap on one line, as nvitop shows them beside the GPUs: with
    bars where ``width`` has room for them (None: always)."""
    from engine.core.common.formatting import gib

    cpu = f"{host.cpu_percent:.0f}%" if host.cpu_percent is not None else "?%"
    memory = f"{gib(host.memory_used_bytes)}/{gib(host.memory_total_bytes)} GiB"
    swap = f"{gib(host.swap_used_bytes)}/{gib(host.swap_total_bytes)} GiB"
    load = f" · load {host.load_average:.2f}" if host.load_average is not None else ""
    plain = f"host CPU {cpu} of {host.cores} cores · memory {memory} · swap {swap}{load}"
    if width is not None and len(plain) > width:  # an 80-column terminal: the short words
        memory, swap = memory.replace(" GiB", "G"), swap.replace(" GiB", "G")
        return f"host CPU {cpu} of {host.cores} · mem {memory} · swap {swap}{load}"
    if width is not None and len(plain) + 24 > width:
        return plain
    cpu_bar = bar(int(host.cpu_percent or 0), 100, 10)
    mem_bar = bar(host.memory_used_bytes or 0, host.memory_total_bytes or 0, 10)
    swap_bar = bar(host.swap_used_bytes or 0, host.swap_total_bytes or 0, 4)
    return (
        f"host CPU {cpu_bar} {cpu} of {host.cores} cores · memory {mem_bar} {memory} · "
        f"swap {swap_bar} {swap}{load}"
    )


ELLIPSIS = "…"


def _script_end(tokens: Sequence[str]) -> int:
    """How many leading tokens name what runs: the program and its script (``x.py``, also the one
    a launcher such as torchrun starts), else its module (``-m mod``) or ``-c``; 1 when none."""
    for i, token in enumerate(tokens):
        if token.endswith(".py"):
            return i + 1
    for i, token in enumerate(tokens):
        if token == "-m" and i + 1 < len(tokens):
            return i + 2
        if i > 0 and token == "-c":
            return i + 1
    return 1


def short_command(command: str, width: int) -> str:
    """A command line in ``width`` columns that keeps the script name: paths are cut to their
    last part, then the middle is elided (never the program and its script, while they fit).
    What the process put in its arguments is shown, never acted on (``visible``, on one line)."""
    command = visible(command, one_line=True)
    if len(command) <= width:
        return command
    tokens = [
        t.rsplit("/", 1)[-1] if "/" in t and not t.startswith("-") and "=" not in t else t
        for t in command.split()
    ]
    text = " ".join(tokens)
    if len(text) <= width or width < 8:
        return text[:width] if len(text) > width else text
    head = " ".join(tokens[: _script_end(tokens)])
    if len(head) + 1 > width:  # the program's start, then the end of the head: the script
        start = min(len(tokens[0]), width // 3)
        return head[:start] + ELLIPSIS + head[len(head) - (width - 1 - start) :]
    rest = text[len(head) :]
    room = width - len(head) - 1  # one column for the ellipsis
    start = (room + 1) // 2
    return head + rest[:start] + ELLIPSIS + rest[len(rest) - (room - start) :]
