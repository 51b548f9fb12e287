"""environment.json: what a run's ranks ran with, beside run.json, so two runs can be compared
(``engine.core.runs.run_diff``) long after they ended.

Recorded by the launcher as the ranks start (``engine.train.environment_record`` adds the torch
part, which only a process that may import torch knows), and once more at its end with the load
other processes put on the host meanwhile. Bounded and free of secrets: only the variables
``RECORDED_VARIABLES`` / ``RECORDED_PREFIXES`` name are kept, each value cut at
``VALUE_MAX_CHARS``, at most ``VARIABLES_MAX`` of them. Read back into the same typed object; a
file of a newer ddptui is refused with one sentence, and a run from before ddptui recorded it has
none (``read_environment`` returns None: "not recorded").
"""

from __future__ import annotations

import json
import os
import platform
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.core.common.run_files import UnsafeRunFile, read_run_bytes, write_json_atomic
from engine.core.host.gpus import GpuInventory
from engine.core.runs.rundir import RunDir, RunDirError

ENVIRONMENT_SCHEMA_VERSION = 1
ENVIRONMENT_MAX_BYTES = 256 << 10
VALUE_MAX_CHARS = 200
VARIABLES_MAX = 64
GPUS_MAX = 64
# The variables that change how a rank computes or talks, and never hold a secret.
RECORDED_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_MODULE_LOADING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_DISTRIBUTED_DEBUG",
    "GLOO_SOCKET_IFNAME",
)
RECORDED_PREFIXES = ("NCCL_", "TORCH_NCCL_")


def recorded_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The listed variables of ``environ``, sorted by name, each value cut to
    ``VALUE_MAX_CHARS``, at most ``VARIABLES_MAX`` of them."""
    names = sorted(
        name for name in environ if name in RECORDED_VARIABLES or name.startswith(RECORDED_PREFIXES)
    )[:VARIABLES_MAX]
    return {name: _bounded(environ[name]) for name in names}


def _bounded(value: Any) -> str:
    text = str(value)
    return text if len(text) <= VALUE_MAX_CHARS else text[: VALUE_MAX_CHARS - 3] + "..."


@dataclass(frozen=True)
class RecordedGpu:
    """One GPU the run could use, as NVML described it at the run's start."""

    index: int
    name: str
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None

    def describe(self) -> str:
        clocks = (
            f" {self.sm_clock_mhz}/{self.max_sm_clock_mhz} MHz"
            if self.sm_clock_mhz is not None and self.max_sm_clock_mhz is not None
            else ""
        )
        return f"{self.name}{clocks}"


@dataclass(frozen=True)
class RecordedEnvironment:
    """What a run's ranks ran with. Empty strings and None: not known (said as such)."""

    host: str = ""
    python: str = ""
    torch: str = ""
    cuda: str = ""
    nccl: str = ""
    cpu_count: int = 0
    threads_per_rank: int | None = None
    variables: dict[str, str] = field(default_factory=dict)
    gpus: tuple[RecordedGpu, ...] = ()
    gpu_driver: str = ""
    load_average_at_start: float | None = None  # the host's 1-minute load as the ranks started
    # cores other processes kept busy while the run went on (engine.core.host.outside_load),
    # known once the launcher has reaped its ranks
    outside_load_cores: float | None = None

    def facts(self) -> dict[str, str]:
        """Every recorded fact as (name, value in words), the variables under their own names:
        what two runs are compared by."""
        found = {
            "host": self.host,
            "python": self.python,
            "torch": self.torch,
            "cuda": self.cuda,
            "nccl": self.nccl,
            "cpu cores": str(self.cpu_count) if self.cpu_count else "",
            "threads per rank": "" if self.threads_per_rank is None else str(self.threads_per_rank),
            "gpus": ", ".join(g.describe() for g in self.gpus) or "none",
            "gpu driver": self.gpu_driver,
        }
        found.update(self.variables)
        return found

    def to_json(self) -> dict[str, Any]:
        return {"schema": ENVIRONMENT_SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecordedEnvironment:
        """What ``to_json`` wrote, bounded again (a file may have been edited); unknown keys are
        ignored; a value of the wrong kind raises TypeError or ValueError."""
        variables = data.get("variables") or {}
        if not isinstance(variables, dict):
            raise TypeError("variables: expected a JSON object")
        gpus = data.get("gpus") or []
        if not isinstance(gpus, list):
            raise TypeError("gpus: expected a JSON list")
        return cls(
            host=_bounded(data.get("host", "")),
            python=_bounded(data.get("python", "")),
            torch=_bounded(data.get("torch", "")),
            cuda=_bounded(data.get("cuda", "")),
            nccl=_bounded(data.get("nccl", "")),
            cpu_count=int(data.get("cpu_count") or 0),
            threads_per_rank=_int_or_none(data.get("threads_per_rank")),
            variables=recorded_variables({str(k): str(v) for k, v in variables.items()}),
            gpus=tuple(
                RecordedGpu(
                    index=int(g["index"]),
                    name=_bounded(g.get("name", "")),
                    sm_clock_mhz=_int_or_none(g.get("sm_clock_mhz")),
                    max_sm_clock_mhz=_int_or_none(g.get("max_sm_clock_mhz")),
                )
                for g in gpus[:GPUS_MAX]
            ),
            gpu_driver=_bounded(data.get("gpu_driver", "")),
            load_average_at_start=_float_or_none(data.get("load_average_at_start")),
            outside_load_cores=_float_or_none(data.get("outside_load_cores")),
        )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def environment_path(run_dir: RunDir) -> Path:
    return run_dir.layout.environment


def environment_here(
    environ: Mapping[str, str],
    inventory: GpuInventory,
    *,
    gpu_indices: tuple[int, ...] = (),
    clocks: Mapping[int, tuple[int | None, int | None]] | None = None,
    threads_per_rank: int | None = None,
) -> RecordedEnvironment:
    """This machine's part of the record (the torch part is the launcher's to add): the listed
    variables of ``environ`` (the ranks' environment), the GPUs of ``gpu_indices`` as NVML saw
    them, with their SM clocks (now, most) where ``clocks`` has them."""
    clocks = clocks or {}
    gpus = tuple(
        RecordedGpu(
            index=g.index,
            name=_bounded(g.name or f"GPU {g.index} ({g.error})"),
            sm_clock_mhz=clocks.get(g.index, (None, None))[0],
            max_sm_clock_mhz=clocks.get(g.index, (None, None))[1],
        )
        for g in inventory.gpus
        if g.index in gpu_indices
    )
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return RecordedEnvironment(
        host=socket.gethostname(),
        python=platform.python_version(),
        cpu_count=os.cpu_count() or 0,
        threads_per_rank=threads_per_rank,
        variables=recorded_variables(environ),
        gpus=gpus,
        gpu_driver=_bounded(inventory.driver_version),
        load_average_at_start=load,
    )


def write_environment(run_dir: RunDir, environment: RecordedEnvironment) -> None:
    """Replace environment.json atomically (raises WriteFailed on a full disk)."""
    write_json_atomic(environment_path(run_dir), environment.to_json())


def with_outside_load(environment: RecordedEnvironment, cores: float) -> RecordedEnvironment:
    return replace(environment, outside_load_cores=round(max(0.0, cores), 3))


def read_environment(run_dir: RunDir) -> RecordedEnvironment | None:
    """The run's environment.json, or None where the run has none (a run from before ddptui
    recorded it, or one that never started). RunDirError, one sentence, when it is corrupt,
    too large, not the run directory owner's, or written by a newer ddptui."""
    path = environment_path(run_dir)
    if not os.path.lexists(path):
        return None
    try:
        data = json.loads(read_run_bytes(run_dir.path, path, ENVIRONMENT_MAX_BYTES))
    except UnsafeRunFile as err:
        raise RunDirError(str(err)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunDirError(f"{path}: environment.json is corrupt ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("schema"), int):
        raise RunDirError(f"{path}: environment.json is corrupt (no schema version)")
    if data["schema"] > ENVIRONMENT_SCHEMA_VERSION:
        raise RunDirError(
            f"{path}: environment.json was written by a newer ddptui (schema {data['schema']}, "
            f"this one reads {ENVIRONMENT_SCHEMA_VERSION}); upgrade ddptui to read it"
        )
    try:
        return RecordedEnvironment.from_json(data)
    except (KeyError, TypeError, ValueError) as err:
        raise RunDirError(f"{path}: environment.json is corrupt ({err!r})") from None
