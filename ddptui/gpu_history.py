"""The recent utilisation and memory figures of each GPU (the app keeps one, fed by every NVML
sample; the GPU panels draw sparklines from it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GpuHistory:
    """The last ``size`` utilisation and memory figures of each GPU, for the sparklines."""

    size: int = 60
    utilization: dict[int, list[float]] = field(default_factory=dict)
    memory: dict[int, list[float]] = field(default_factory=dict)

    def add(self, index: int, utilization: float | None, memory_fraction: float | None) -> None:
        for series, value in ((self.utilization, utilization), (self.memory, memory_fraction)):
            values = series.setdefault(index, [])
            values.append(float("nan") if value is None else value)
            del values[: -self.size]
