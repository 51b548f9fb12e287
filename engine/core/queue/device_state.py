"""What the queue's devices are busy with at one moment: each GPU's holders (every process of
anyone, NVML's and the device-file holders, as the GPUs screen sees them) and memory in use, and
the machine's CPU slots. The line (``engine.core.queue.line``) decides from this alone, so a test
or the bench gives its own. Plain Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.core.common.formatting import short_bytes
from engine.core.common.visible_text import visible
from engine.core.host.capacity import usable_cores
from engine.core.host.gpus import GpuInventory
from engine.core.jobs.gpu_view import GpuScanner, GpuView

CPU_SLOTS_ENV = "DDPTUI_QUEUE_CPU_SLOTS"
MEMORY_THRESHOLD_ENV = "DDPTUI_QUEUE_GPU_MEMORY_MIB"
# A card's driver and display take a few hundred MiB with nobody on it; more is someone's work.
DEFAULT_MEMORY_THRESHOLD = 1024 * 2**20
COMMAND_SHOWN = 28  # characters of a holder's command line in a reason: one line at 80 columns


@dataclass(frozen=True)
class GpuHolder:
    """One process holding a GPU."""

    pid: int
    user: str
    command: str
    memory_bytes: int | None

    def describe(self) -> str:
        """``pid 4411 (alice, python train.py), 38.0G``: the command made visible and short."""
        program, _, rest = self.command.partition(" ")
        command = f"{os.path.basename(program)} {rest}".strip()
        if len(command) > COMMAND_SHOWN:  # cut before escaping: an escape is never cut in two
            command = command[: COMMAND_SHOWN - 1] + "…"
        command = visible(command, one_line=True)
        memory = f", {short_bytes(self.memory_bytes)}" if self.memory_bytes else ""
        return f"pid {self.pid} ({visible(self.user, one_line=True)}, {command}){memory}"


@dataclass(frozen=True)
class GpuState:
    index: int
    holders: tuple[GpuHolder, ...] = ()
    memory_used_bytes: int | None = None
    error: str | None = None  # NVML failed on this card: never free


@dataclass(frozen=True)
class MachineState:
    """The devices a queued run may get: ``cpu_slots`` and the GPUs (() without NVML)."""

    cpu_slots: int
    gpus: tuple[GpuState, ...] = ()
    memory_threshold: int = DEFAULT_MEMORY_THRESHOLD
    gpu_error: str | None = None  # why no GPU can be seen, when NVML cannot be used

    def gpu(self, index: int) -> GpuState | None:
        return next((g for g in self.gpus if g.index == index), None)


def cpu_slots() -> int:
    """The CPU slots queued CPU runs share: the usable cores, or ``DDPTUI_QUEUE_CPU_SLOTS``."""
    given = os.environ.get(CPU_SLOTS_ENV, "")
    return int(given) if given.isdigit() and int(given) > 0 else usable_cores()


def memory_threshold() -> int:
    given = os.environ.get(MEMORY_THRESHOLD_ENV, "")
    return int(given) * 2**20 if given.isdigit() else DEFAULT_MEMORY_THRESHOLD


def state_of_view(view: GpuView) -> MachineState:
    """The machine as one GPU view (``ddptui gpus``'s) shows it."""
    gpus = []
    for gpu in view.gpus:
        holders = tuple(
            GpuHolder(row.pid, row.user, row.command or row.what, row.gpu_memory_bytes)
            for row in view.rows_of(gpu.index)
        )
        gpus.append(GpuState(gpu.index, holders, gpu.memory_used_bytes, gpu.error))
    return MachineState(cpu_slots(), tuple(gpus), memory_threshold(), view.error)


class MachineWatcher:
    """Scans the machine for the line: the GPUs only when some claim waits for one (a process
    scan is the dearest part), the scanner kept between scans."""

    def __init__(self, device_glob: str | None = None, inventory: GpuInventory | None = None):
        self.scanner = GpuScanner(device_glob)
        self.inventory = inventory  # a stand-in's (tests); None: NVML's, sampled at each scan

    def state(self, *, gpus: bool) -> MachineState:
        if not gpus:
            return MachineState(cpu_slots(), memory_threshold=memory_threshold())
        return state_of_view(self.scanner.scan(self.inventory))
