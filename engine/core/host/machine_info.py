"""The machine a bench ran on: host, CPU, GPUs and driver, torch / CUDA / NCCL versions.

Plain Python: the CLI and the UI call this without importing torch. Torch's versions come from a
short ``python -c`` subprocess (the same interpreter the runs use), GPU names and the driver from
NVML through ``engine.core.host.gpus``. Nothing here raises: what cannot be found is recorded as
"unknown (reason)", so a bench is always recorded.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, fields
from typing import Any

import psutil

from engine.core.host.gpus import sample_gpus

_TORCH_PROBE = """
import json, torch
nccl = ""
try:
    if torch.cuda.is_available() or hasattr(torch.cuda, "nccl"):
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as err:
    nccl = f"unknown ({type(err).__name__})"
print(json.dumps({
    "torch": torch.__version__,
    "cuda": torch.version.cuda or "none (CPU build)",
    "nccl": nccl or "none",
    "cuda_available": torch.cuda.is_available(),
    "threads": torch.get_num_threads(),
}))
"""


@dataclass(frozen=True)
class MachineInfo:
    host: str = ""
    os: str = ""
    python: str = ""
    cpu_model: str = ""
    cpu_count: int = 0
    memory_gib: float = 0.0
    gpus: tuple[str, ...] = ()  # one name per GPU, NVML order
    gpu_driver: str = ""
    torch: str = ""
    cuda: str = ""
    nccl: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "gpus": list(self.gpus)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MachineInfo:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["gpus"] = tuple(values.get("gpus", ()))
        return cls(**values)

    @property
    def gpu_summary(self) -> str:
        """``4x NVIDIA A100-SXM4-40GB`` or ``none``; mixed cards are listed one by one."""
        if not self.gpus:
            return "none"
        if len(set(self.gpus)) == 1:
            return f"{len(self.gpus)}x {self.gpus[0]}"
        return ", ".join(self.gpus)

    def describe(self) -> list[tuple[str, str]]:
        """(field, value) pairs for showing a machine, and two machines side by side."""
        return [
            ("host", self.host),
            ("os", self.os),
            ("cpu", f"{self.cpu_model} ({self.cpu_count} logical cores)"),
            ("memory", f"{self.memory_gib:.0f} GiB" if self.memory_gib else "unknown"),
            ("gpus", self.gpu_summary),
            ("gpu driver", self.gpu_driver or "none"),
            ("python", self.python),
            ("torch", self.torch),
            ("cuda", self.cuda),
            ("nccl", self.nccl),
        ]

    def one_line(self) -> str:
        return f"{self.host}: {self.cpu_model}, GPUs {self.gpu_summary}, torch {self.torch}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> float:
    try:
        return float(psutil.virtual_memory().total) / 2**30
    except Exception:
        return 0.0


def torch_versions(python: str = sys.executable, timeout: float = 60.0) -> dict[str, str]:
    """torch / CUDA / NCCL versions from a subprocess, so this process never imports torch."""
    try:
        done = subprocess.run(
            [python, "-c", _TORCH_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        reason = f"unknown ({type(err).__name__})"
        return {"torch": reason, "cuda": reason, "nccl": reason}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        reason = f"unknown ({last[:120]})"
        return {"torch": reason, "cuda": reason, "nccl": reason}
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        reason = "unknown (unreadable probe output)"
        return {"torch": reason, "cuda": reason, "nccl": reason}
    return {key: str(data.get(key, "unknown")) for key in ("torch", "cuda", "nccl")}


def collect_machine_info(*, probe_torch: bool = True) -> MachineInfo:
    """This machine, now. Takes a second or two (the torch probe); never raises."""
    inventory = sample_gpus()
    versions = torch_versions() if probe_torch else {"torch": "", "cuda": "", "nccl": ""}
    return MachineInfo(
        host=socket.gethostname(),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count() or 0,
        memory_gib=_memory_gib(),
        gpus=tuple(g.name or f"GPU {g.index} ({g.error})" for g in inventory.gpus),
        gpu_driver=inventory.driver_version
        or (f"none ({inventory.error})" if inventory.error else ""),
        torch=versions["torch"],
        cuda=versions["cuda"],
        nccl=versions["nccl"],
    )
