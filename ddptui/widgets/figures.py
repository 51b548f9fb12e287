"""How figures are written in the UI: durations, sizes, rates and text sparklines. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"


def duration(seconds: float | None) -> str:
    """``42s``, ``3m07s``, ``2h05m``; ``-`` when unknown."""
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def age(seconds: float | None) -> str:
    """Seconds since a report: one decimal under ten seconds, then whole units."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{max(0.0, seconds):.1f}s"
    return duration(seconds)


def gib(value: int | None) -> str:
    if value is None:
        return "?"
    return f"{value / 2**30:.1f}"


def mib(value: int | None) -> str:
    if value is None:
        return "?"
    return f"{value / 2**20:.0f}M"


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
