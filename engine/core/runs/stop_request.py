"""A stop the user asked for, told to the run's launcher through the run directory, so that the
run ends saying so ("stopped by ddptui kill", "stopped with Ctrl-C", "stopped from the UI") and
never as a failure with a culprit.

Whoever asks (``ddptui kill``, the UI's kill, ``ddptui run``'s Ctrl-C) writes ``stop-request``
just before it sends the launcher SIGTERM; the launcher reads it when the signal arrives. A
SIGTERM with no fresh request came from someone else, and the run says only that the launcher
received it. Only the run directory's owner writes there: root stopping another user's run
leaves no request, and that run says "the launcher received SIGTERM". Plain Python.
"""

from __future__ import annotations

import json
import time

from engine.core.common.run_files import read_run_text, refuse_writing, write_json_atomic
from engine.core.common.statuses import StopRequester
from engine.core.runs.rundir import RunDir

FRESH_SECONDS = 120.0  # a request older than this is an earlier stop's, not this signal's
REQUEST_MAX_BYTES = 4096


def request_stop(run_dir: RunDir, by: StopRequester) -> bool:
    """Leave word that ``by`` asks the run to stop; False when it could not (another user's run
    directory, a full disk): the stop goes on, said less precisely."""
    if refuse_writing(run_dir.path):
        return False
    try:
        write_json_atomic(run_dir.layout.stop_request, {"by": by.value, "time": time.time()})
    except OSError:
        return False
    return True


def read_stop_request(run_dir: RunDir, now: float | None = None) -> StopRequester | None:
    """Who asked this run to stop, when a fresh request is there, else None."""
    now = time.time() if now is None else now
    try:
        data = json.loads(
            read_run_text(run_dir.path, run_dir.layout.stop_request, REQUEST_MAX_BYTES)
        )
        by, asked = StopRequester(data["by"]), float(data["time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return by if 0 <= now - asked <= FRESH_SECONDS else None
