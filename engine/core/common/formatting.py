"""How sizes and durations are written: one place for the engine's sentences, the CLI's tables and
the UI's columns. Pure functions of plain values; an unknown value (None, NaN, negative time) is
``-`` unless a caller names another word.

- sentences: ``format_bytes`` (``1.5 GiB``, ``612 MiB``, ``12 KiB``, ``12 bytes``), ``format_duration``
  (``42s``, ``3m07s``, ``2h05m``, ``1d02h``);
- narrow columns: ``short_bytes`` (``612M``, ``30.2G``), ``mib`` (``612M``), ``gib`` (``30.2``, for
  ``used/totalG`` pairs), ``format_age`` (one decimal under ten seconds, then as a duration).
"""

from __future__ import annotations

import math

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def format_bytes(value: int | None, unknown: str = "-") -> str:
    """Bytes in words for a sentence or a table: GiB with one decimal, else whole MiB, KiB or bytes."""
    if value is None:
        return unknown
    if value >= GIB:
        return f"{value / GIB:.1f} GiB"
    if value >= MIB:
        return f"{value / MIB:.0f} MiB"
    if value >= KIB:
        return f"{value / KIB:.0f} KiB"
    return f"{value} bytes"


def short_bytes(value: int | None) -> str:
    """Bytes in four or five columns: ``612M``, ``30.2G``."""
    if value is None:
        return "-"
    if value >= GIB:
        return f"{value / GIB:.1f}G"
    return f"{value / MIB:.0f}M"


def gib(value: int | None) -> str:
    """GiB with one decimal and no unit, for ``used/total`` pairs; ``?`` when unknown."""
    return "?" if value is None else f"{value / GIB:.1f}"


def mib(value: int | None) -> str:
    """Whole MiB with its letter (``612M``); ``?`` when unknown."""
    return "?" if value is None else f"{value / MIB:.0f}M"


def format_duration(seconds: float | None) -> str:
    """``42s``, ``3m07s``, ``2h05m``, ``1d02h``: the two largest units, rounded to the second."""
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def format_age(seconds: float | None) -> str:
    """Time since something happened: one decimal under ten seconds (``3.4s``), then as
    ``format_duration``."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 10:
        return f"{max(0.0, seconds):.1f}s"
    return format_duration(seconds)
