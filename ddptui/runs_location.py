"""Where the runs directory is when a command or the app is given none: ``$DDPTUI_RUNS_DIR``, else
``runs`` in the working directory. One decision for the CLI and the app; an empty
``DDPTUI_RUNS_DIR`` counts as unset (never the working directory itself)."""

from __future__ import annotations

import os
from pathlib import Path

from engine.core.runs.rundir import DEFAULT_RUNS_DIR

RUNS_DIR_ENV = "DDPTUI_RUNS_DIR"


def default_runs_dir() -> Path:
    return Path(os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_DIR)
