"""The launcher's part of environment.json (``engine.core.runs.recorded_environment``): the torch,
CUDA and NCCL versions the ranks ran with, which only a process that may import torch knows, and
the load other processes put on the host while the run went on.

Never fails a run: a record that cannot be written is left out (a full disk is the summary's to
report), and a version that cannot be read is recorded as "unknown (why)".
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import sys
from dataclasses import replace

from engine.core.common.disk_space import WriteFailed
from engine.core.common.run_environment import THREADS_ENV
from engine.core.host import gpus
from engine.core.host.outside_load import OutsideLoad
from engine.core.plan.run_plan import RunPlan
from engine.core.runs.recorded_environment import (
    RecordedEnvironment,
    environment_here,
    with_outside_load,
    write_environment,
)
from engine.core.runs.rundir import RunDir


def torch_versions() -> tuple[str, str, str]:
    """(torch, CUDA, NCCL) versions: from torch itself where this process imported it (the
    engine's ranks are spawned through it), else torch's installed version, without importing
    it (a script run's launcher never does), and its CUDA and NCCL as not known here."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        unknown = "unknown (the launcher of a script run does not import torch)"
        return version, unknown, unknown
    cuda = torch.version.cuda or "none (CPU build)"
    nccl = "not used (no CUDA device)"
    try:
        if torch.cuda.is_available():
            found = torch.cuda.nccl.version()
            nccl = ".".join(map(str, found)) if isinstance(found, tuple) else str(found)
    except Exception as err:  # a build without NCCL, a driver that fails: said, not raised
        nccl = f"unknown ({type(err).__name__})"
    return str(torch.__version__), cuda, nccl


def record_environment(run_dir: RunDir, plan: RunPlan) -> RecordedEnvironment:
    """Write environment.json from this launcher's environment (the ranks inherit it) and the
    run's GPUs; returns what it recorded, for ``record_outside_load`` at the end."""
    indices = tuple(plan.devices.gpu_indices) if plan.devices.kind == "cuda" else ()
    threads = os.environ.get(THREADS_ENV, "")
    here = environment_here(
        os.environ,
        gpus.sample_gpus() if indices else gpus.GpuInventory(),
        gpu_indices=indices,
        clocks=gpus.sm_clocks(indices) if indices else {},
        threads_per_rank=int(threads) if threads.isdigit() else None,
    )
    torch, cuda, nccl = torch_versions()
    recorded = replace(here, torch=torch, cuda=cuda, nccl=nccl)
    with contextlib.suppress(WriteFailed, OSError):
        write_environment(run_dir, recorded)
    return recorded


def record_outside_load(
    run_dir: RunDir, recorded: RecordedEnvironment | None, load: OutsideLoad
) -> None:
    """environment.json once more, with the cores other processes kept busy since the start
    (read once this launcher has reaped its ranks, so their own time is not counted)."""
    if recorded is None:
        return
    with contextlib.suppress(WriteFailed, OSError):
        write_environment(run_dir, with_outside_load(recorded, load.cores()))
