"""torch's flight recorder in a rank: the last collectives of every process group, kept in a
ring buffer and written into the run directory's ``flight-recorder/`` (NCCL dumps it on a
collective's timeout and on demand through its debug pipe; ``dump_flight_recorder`` writes it for
any backend when a rank fails), for ``python -m torch.distributed.flight_recorder.fr_trace`` and
``ddptui stacks`` / ``show`` to read.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import torch

from engine.core.common.run_files import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    make_dirs,
    write_atomic,
)
from engine.core.runs.rundir import RunDir

FLIGHT_RECORDER_ENTRIES = 2000
# The first torch that reads the flight recorder's size from TORCH_FR_BUFFER_SIZE (pytorch#152563).
FLIGHT_RECORDER_RENAMED_IN = (2, 8)
FLIGHT_RECORDER_SIZE_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder_size_variable(torch_version: str) -> str:
    """The variable ``torch_version`` reads the flight recorder's size from. torch 2.8 renamed
    TORCH_NCCL_TRACE_BUFFER_SIZE to TORCH_FR_BUFFER_SIZE, still reads the old name, and prints a
    deprecation warning at the top of every rank's log when it is set; torch before 2.8 reads
    only the old name."""
    found = re.match(r"(\d+)\.(\d+)", torch_version)
    major_minor = (int(found[1]), int(found[2])) if found else FLIGHT_RECORDER_RENAMED_IN
    if major_minor >= FLIGHT_RECORDER_RENAMED_IN:
        return "TORCH_FR_BUFFER_SIZE"
    return "TORCH_NCCL_TRACE_BUFFER_SIZE"


def enable_flight_recorder(run_dir: RunDir) -> Path:
    """Turn on torch's flight recorder (the last collectives of every process group, gloo
    included in recent torch) before the process group is made: NCCL dumps it into the run
    directory on a timeout and on demand (a write to its debug pipe); ``dump_flight_recorder``
    does it for any backend when a rank fails. Settings the user made stay, under either name."""
    directory = run_dir.flight_recorder_dir.resolve()
    make_dirs(directory, PRIVATE_DIR_MODE)
    prefix = str(directory / "rank_")
    if not any(name in os.environ for name in FLIGHT_RECORDER_SIZE_VARIABLES):
        os.environ[flight_recorder_size_variable(torch.__version__)] = str(FLIGHT_RECORDER_ENTRIES)
    settings = {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        # Both names of the dump prefix: torch warns about the old one only when NCCL writes a
        # dump, and the release that added the new one is not pinned down here.
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(directory / "pipe_rank_"),
    }
    for name, value in settings.items():
        os.environ.setdefault(name, value)
    return directory


def dump_flight_recorder(run_dir: RunDir, rank: int) -> Path | None:
    """Write this rank's flight-recorder buffer as ``flight-recorder/rank_<rank>`` (the format
    ``python -m torch.distributed.flight_recorder.fr_trace`` reads); None where this torch has no
    recorder or nothing could be written."""
    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        return None
    path = run_dir.flight_recorder_dir / f"rank_{rank}"
    try:
        # Atomic: a reader (``ddptui show``) sees the whole dump or none, never half of one.
        write_atomic(path, dump(), PRIVATE_FILE_MODE)
    except Exception as err:  # the failure being reported matters more than this dump
        # The log may be on the disk that just filled: this line must not replace that failure.
        with contextlib.suppress(OSError):
            print(f"ddptui: no flight-recorder dump ({type(err).__name__}: {err})", flush=True)
        return None
    return path
