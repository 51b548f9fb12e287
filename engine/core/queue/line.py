"""The one decision of the queue: which claims may start now, on which devices, and why each of
the others may not yet. First come, first served: devices a claim ahead in line waits for are
kept for it, so a later run never takes them first; a later run that wants other devices goes on.

Free means: no ddptui claim holds the device, no process of anyone holds it (NVML's processes and
the device-file holders), and its memory in use is under the threshold. CPU runs share the
machine's CPU slots, claimed by ddptui runs only. Plain Python, no I/O: the claims and the machine
state are given (``engine.core.queue.claims``, ``engine.core.queue.device_state``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.common.formatting import short_bytes
from engine.core.common.run_files import user_name
from engine.core.queue.claims import Claim, ClaimState
from engine.core.queue.device_state import GpuState, MachineState

REASONS_SHOWN = 2  # busy devices named in one reason; more are counted


@dataclass(frozen=True)
class Verdict:
    """One claim's place in the decision: ``devices`` it may start on now (GPU indices, () for a
    CPU claim), or None and ``reason`` why not yet. A holding claim's reason says what it holds."""

    claim: Claim
    place: int  # 1 for the first claim that waits; 0 for one that holds its devices
    devices: tuple[int, ...] | None
    reason: str

    @property
    def may_start(self) -> bool:
        return self.claim.state == ClaimState.WAITING and self.devices is not None

    @property
    def said(self) -> str:
        """The verdict in words, for every surface: why it waits, what it runs on, or that it
        starts now."""
        return self.reason or "starting now"


def who(claim: Claim) -> str:
    return f"run {claim.run_id} ({user_name(claim.uid) if claim.uid >= 0 else '?'})"


class _Line:
    """What the claims before the one being decided hold or are kept for."""

    def __init__(self, machine: MachineState) -> None:
        self.machine = machine
        self.gpu_taken: dict[int, str] = {}  # GPU -> who has it, or waits for it ahead
        self.cpu_taken: list[tuple[int, str]] = []  # (slots, who)

    def take(self, claim: Claim, devices: tuple[int, ...], how: str) -> None:
        if claim.want.kind == "cpu":
            self.cpu_taken.append((claim.want.count, f"{how} {who(claim)}"))
        for index in devices:
            self.gpu_taken.setdefault(index, f"{how} {who(claim)}")

    def gpu_busy(self, index: int) -> str:
        """Why GPU ``index`` is not free for the claim being decided; "" when it is."""
        if index in self.gpu_taken:
            return f"GPU {index} {self.gpu_taken[index]}"
        gpu = self.machine.gpu(index)
        if gpu is None:
            return f"GPU {index} is not visible ({self.machine.gpu_error or 'no such GPU'})"
        return gpu_busy(gpu, self.machine.memory_threshold)

    def cpu_free(self) -> int:
        return self.machine.cpu_slots - sum(slots for slots, _ in self.cpu_taken)


def gpu_busy(gpu: GpuState, threshold: int) -> str:
    if gpu.error:
        return f"GPU {gpu.index} cannot be read ({gpu.error})"
    if gpu.holders:
        more = f" and {len(gpu.holders) - 1} more" if len(gpu.holders) > 1 else ""
        return f"GPU {gpu.index} held by {gpu.holders[0].describe()}{more}"
    used = gpu.memory_used_bytes
    if used is not None and used >= threshold:
        return f"GPU {gpu.index} has {short_bytes(used)} in use, over {short_bytes(threshold)}"
    return ""


def _listed(busy: list[str]) -> str:
    shown = "; ".join(busy[:REASONS_SHOWN])
    return shown + (f"; {len(busy) - REASONS_SHOWN} more busy" if len(busy) > REASONS_SHOWN else "")


def _decide_cpu(line: _Line, claim: Claim) -> tuple[tuple[int, ...] | None, str]:
    free = line.cpu_free()
    if claim.want.count <= free:
        return (), ""
    holders = "; ".join(f"{slots} {by}" for slots, by in line.cpu_taken[:REASONS_SHOWN])
    return None, (
        f"needs {claim.want.count} CPU slots, {max(0, free)} of {line.machine.cpu_slots} free: "
        f"{holders}"
    )


def _decide_gpus(line: _Line, claim: Claim) -> tuple[tuple[int, ...] | None, str, tuple[int, ...]]:
    """(devices to start on or None, why not, the GPUs to keep for it)."""
    want = claim.want
    if want.indices:
        named = [why for i in want.indices if (why := line.gpu_busy(i))]
        return (None, _listed(named), want.indices) if named else (want.indices, "", want.indices)
    free: list[int] = []
    busy: list[str] = []
    for gpu in line.machine.gpus:
        why = line.gpu_busy(gpu.index)
        if why:
            busy.append(why)
        else:
            free.append(gpu.index)
    chosen = tuple(free[: want.count])
    if len(chosen) == want.count:
        return chosen, "", chosen
    reason = f"needs {want.count} GPUs, {len(free)} free: " + _listed(busy)
    return None, reason, chosen


def decide(claims: list[Claim], machine: MachineState) -> list[Verdict]:
    """Every live claim's verdict, in line order (``claims`` first in line first)."""
    line = _Line(machine)
    verdicts = []
    for claim in claims:
        if claim.state == ClaimState.HOLDING:
            line.take(claim, claim.held, "claimed by")
            held = claim.want.describe() if claim.want.kind == "cpu" else _gpus(claim.held)
            verdicts.append(Verdict(claim, 0, claim.held, f"runs on {held}"))
    place = 0
    for claim in claims:
        if claim.state != ClaimState.WAITING:
            continue
        place += 1
        if claim.want.kind == "cpu":
            devices, reason = _decide_cpu(line, claim)
            kept: tuple[int, ...] = ()
        else:
            devices, reason, kept = _decide_gpus(line, claim)
        # Kept for it whether it starts now or waits: nobody behind it in line takes them.
        line.take(
            claim,
            devices if devices is not None else kept,
            "kept for" if devices is None else "taken by",
        )
        verdicts.append(Verdict(claim, place, devices, reason))
    return verdicts


def _gpus(indices: tuple[int, ...]) -> str:
    return ("GPU " if len(indices) == 1 else "GPUs ") + ",".join(str(i) for i in indices)
