"""The one join of NVML's GPU processes with the open device files: which process holds which card
and how much of it. The process table (``ddptui ps``) takes each process's GPU use from it and the
GPU view (``ddptui gpus``, the GPUs screen) its rows; neither joins again.

Plain Python. NVML pids are host pids in a container, so a pid NVML lists is a process here only
when a process with that pid is visible and holds a GPU device open (or its descriptors cannot be
read, or it is a zombie, which has no open files left to show); a local process with that pid and
no device open is someone else. A process with a card's device file open that NVML does not list
(another PID namespace, the workers of a dead job pinning memory; every one without NVML) is a
hidden holder, shown on that card all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.core.host.gpus import GpuInventory
from engine.core.procs.device_holders import DeviceHolder, HolderScan


@dataclass(frozen=True)
class GpuUse:
    gpu_index: int
    used_bytes: int | None  # None: NVML did not say
    listed: bool = True  # False: NVML does not list it; it holds the card's device file open


@dataclass(frozen=True)
class GpuHolding:
    """One process on one GPU, as NVML and the device files say together."""

    gpu_index: int
    pid: int
    used_bytes: int | None  # None: NVML did not say (or does not list it)
    listed: bool = True  # NVML lists it; False: found by its open device file only
    here: bool = True  # the pid names a process visible here (not another namespace's)


@dataclass(frozen=True)
class GpuJoin:
    holdings: tuple[GpuHolding, ...] = ()  # NVML's processes card by card, then hidden holders
    hidden: tuple[DeviceHolder, ...] = ()  # processes with a card open that NVML does not list

    def uses(self) -> dict[int, tuple[GpuUse, ...]]:
        """GPU use of each process here, by pid."""
        found: dict[int, list[GpuUse]] = {}
        for h in self.holdings:
            if h.here:
                found.setdefault(h.pid, []).append(GpuUse(h.gpu_index, h.used_bytes, h.listed))
        return {pid: tuple(uses) for pid, uses in found.items()}


def hidden_holders(inventory: GpuInventory, holders: HolderScan) -> tuple[DeviceHolder, ...]:
    """Processes with a card's device file open that NVML does not list (another PID namespace,
    the workers of a dead job pinning memory); without NVML, every process with a card open."""
    listed = inventory.listed_pids() if inventory.error is None else set()
    return tuple(h for h in holders.holders if h.any_card and h.pid not in listed)


def card_index(inventory: GpuInventory, minor: int) -> int:
    """The NVML index of /dev/nvidia<minor> (the minor itself when NVML cannot say)."""
    index = inventory.index_of_minor(minor) if inventory.error is None else None
    return index if index is not None else minor


def join_gpus(inventory: GpuInventory, holders: HolderScan, visible: Mapping[int, bool]) -> GpuJoin:
    """Join an NVML sample with a device-file scan. ``visible`` holds every pid visible here, True
    for a zombie. Cards NVML cannot read are left out (the process table says why)."""
    holdings: list[GpuHolding] = []
    if inventory.error is None:
        for gpu in inventory.gpus:
            if not gpu.available:
                continue
            for nv in gpu.processes:
                here = nv.pid in visible and (visible[nv.pid] or holders.holds(nv.pid) is not False)
                holdings.append(GpuHolding(gpu.index, nv.pid, nv.used_memory_bytes, True, here))
    hidden = hidden_holders(inventory, holders)
    for h in hidden:
        holdings += [GpuHolding(card_index(inventory, m), h.pid, None, False) for m in h.minors]
    return GpuJoin(tuple(holdings), hidden)
