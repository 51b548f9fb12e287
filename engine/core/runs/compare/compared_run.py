"""One run as a comparison sees it: its resolved config as dotted keys, its summary's figures and
step split, what its ranks ran with (environment.json) and how much its step time varies on its
own. Reading only; a run directory of another user is refused as every reader refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.core.common.config_error import ConfigError
from engine.core.common.visible_text import visible
from engine.core.config.toml_io import to_mapping
from engine.core.runs.compare.step_spread import step_time_spread
from engine.core.runs.recorded_environment import RecordedEnvironment, read_environment
from engine.core.runs.rundir import RunDir, RunDirError, run_dir_owner
from engine.core.runs.summary import RunSummary

# Config keys that say nothing of how a run computes.
UNCOMPARED_KEYS = frozenset({"description"})
CONFIG_VALUE_MAX_CHARS = 120


@dataclass(frozen=True)
class ComparedRun:
    run_id: str
    preset: str
    config: dict[str, str]  # dotted key -> value in words ("data.num_workers" -> "2")
    summary: RunSummary | None = None  # None while it has not ended
    environment: RecordedEnvironment | None = None  # None: not recorded (an older run)
    step_spread: float | None = None  # interquartile range / median of its step reports
    notes: tuple[str, ...] = field(default=())  # what could not be read, one sentence each


def flat_config(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config mapping as dotted keys with values in words, each bounded."""
    flat: dict[str, str] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if name in UNCOMPARED_KEYS:
            continue
        if isinstance(value, Mapping) and value:
            flat.update(flat_config(value, f"{name}."))
        else:
            flat[name] = _words(value)
    return flat


def _words(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(_words(v) for v in value) + "]"
    elif isinstance(value, Mapping):
        text = "{}"
    elif isinstance(value, str):
        text = repr(value) if value == "" else value
    else:
        text = str(value)
    text = visible(text, one_line=True)
    return text if len(text) <= CONFIG_VALUE_MAX_CHARS else text[:117] + "..."


def read_compared_run(run_dir: RunDir, *, all_users: bool = False) -> ComparedRun:
    """The run at ``run_dir`` as a comparison needs it. RunDirError, one sentence, for a run
    directory of another user (unless ``all_users``), or one whose config.toml or summary.json
    cannot be read or was written by a newer ddptui; an environment.json that cannot be read is
    a note."""
    owner = run_dir_owner(run_dir)
    if owner is not None and not all_users:
        raise RunDirError(
            f"{run_dir.path} belongs to {owner}: not compared (a run directory is the word of "
            "whoever wrote it)"
        )
    try:
        config = run_dir.load_config()
    except ConfigError as err:
        raise RunDirError(str(err)) from None
    summary = run_dir.read_summary()
    notes: list[str] = []
    try:
        environment = read_environment(run_dir)
    except RunDirError as err:
        environment, notes = None, [str(err)]
    return ComparedRun(
        run_id=run_dir.run_id,
        preset=config.name,
        config=flat_config(to_mapping(config)),
        summary=summary,
        environment=environment,
        step_spread=step_time_spread(run_dir.path, run_dir.rank_event_paths().values()),
        notes=tuple(notes),
    )
