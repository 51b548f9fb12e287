"""A stop the user asked for, told to the run's launchers through the run directory, so that the
run ends saying so ("stopped by ddptui kill", "stopped with Ctrl-C", "stopped from the UI") and
never as a failure with a culprit.

One record, ``stop-request``, for every backend: whoever asks (``ddptui kill``, the UI's kill,
``ddptui run``'s Ctrl-C) writes it just before the run's launchers get their SIGTERM (from it, or
from the scheduler that placed them), and every launcher, this machine's and each node launcher
of a run across nodes, reads it when the signal arrives (``read_stop_request``: a fresh one only).
A SIGTERM with no fresh request came from someone else, and the run says only that the launcher
received it. A backend whose scheduler ends the run also reads the record whatever its age
(``read_stop_record``): a job ddptui asked to end ends ``killed``, not cancelled from elsewhere.
Only the run directory's owner writes there: root stopping another user's run leaves no request,
and that run says "the launcher received SIGTERM". Plain Python.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from engine.core.common.run_files import (
    read_run_text,
    refuse_writing,
    user_name,
    write_json_atomic,
)
from engine.core.common.statuses import StopRequester
from engine.core.runs.rundir import RunDir

FRESH_SECONDS = 120.0  # a request older than this is an earlier stop's, not this signal's
REQUEST_MAX_BYTES = 4096


@dataclass(frozen=True)
class StopRequest:
    """Who asked the run to stop, when, and as which user."""

    by: StopRequester
    time: float
    user: str = ""

    def to_json(self) -> dict[str, object]:
        return {"by": self.by.value, "time": self.time, "user": self.user}


def request_stop(run_dir: RunDir, by: StopRequester) -> bool:
    """Leave word that ``by`` asks the run to stop; False when it could not (another user's run
    directory, a full disk): the stop goes on, said less precisely."""
    if refuse_writing(run_dir.path):
        return False
    asked = StopRequest(by, time.time(), user_name(os.getuid()))
    try:
        write_json_atomic(run_dir.layout.stop_request, asked.to_json())
    except OSError:
        return False
    return True


def read_stop_record(run_dir: RunDir) -> StopRequest | None:
    """The request the run directory holds, however old; None when there is none to read."""
    try:
        data = json.loads(
            read_run_text(run_dir.path, run_dir.layout.stop_request, REQUEST_MAX_BYTES)
        )
        return StopRequest(
            StopRequester(data["by"]), float(data["time"]), str(data.get("user", ""))
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def read_stop_request(run_dir: RunDir, now: float | None = None) -> StopRequester | None:
    """Who asked this run to stop, when a fresh request is there, else None."""
    now = time.time() if now is None else now
    asked = read_stop_record(run_dir)
    return asked.by if asked is not None and 0 <= now - asked.time <= FRESH_SECONDS else None
