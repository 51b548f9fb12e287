"""One run as a comparison sees it: its resolved config as dotted keys, its summary's figures and
step split, what its ranks ran with (environment.json) and how much its step time varies on its
own. Reading only; a run directory of another user is refused as every reader refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.core.common.config_error import ConfigError
from engine.core.common.statuses import RunStatus
from engine.core.common.visible_text import visible
from engine.core.config.toml_io import to_mapping
from engine.core.runs.compare.step_spread import read_step_reports
from engine.core.runs.recorded_environment import RecordedEnvironment, read_environment
from engine.core.runs.rundir import (
    RunDir,
    RunDirError,
    list_runs,
    preset_of_run_id,
    run_dir_owner,
)
from engine.core.runs.step_breakdown import StepBreakdown
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
    # each rank's split without its first report (its start-up); () where too few reports
    steady_split: tuple[StepBreakdown, ...] = ()
    notes: tuple[str, ...] = field(default=())  # what could not be read, one sentence each


def flat_config(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config mapping as dotted keys with values in words, each bounded."""
    flat: dict[str, str] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if name in UNCOMPARED_KEYS:
            continue
        if isinstance(value, Mapping):  # an empty table has no keys to differ in
            flat.update(flat_config(value, f"{name}."))
        else:
            flat[name] = _words(value)
    return flat


def _words(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(_words(v) for v in value) + "]"
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
    reports = read_step_reports(run_dir.path, run_dir.rank_event_paths().values())
    return ComparedRun(
        run_id=run_dir.run_id,
        preset=config.name,
        config=flat_config(to_mapping(config)),
        summary=summary,
        environment=environment,
        step_spread=reports.spread,
        steady_split=reports.steady_split,
        notes=tuple(notes),
    )


def previous_completed_run(run: RunDir) -> RunDir:
    """What one run is compared with: the newest completed run of its preset (by its id) started
    before it, else the newest after it; RunDirError, one sentence, when there is none."""
    preset = preset_of_run_id(run.run_id)
    if preset is None:
        raise RunDirError(
            f"{run.run_id} is not named after a preset, so it has no runs of its own kind; "
            "name the run to compare it with: ddptui diff RUN_A RUN_B"
        )
    others = [
        r
        for r in list_runs(run.path.parent)
        if r.run_id != run.run_id and preset_of_run_id(r.run_id) == preset
    ]
    before = [r for r in others if r.run_id < run.run_id]
    after = [r for r in others if r.run_id > run.run_id]
    for candidate in [*reversed(before), *reversed(after)]:
        try:
            summary = candidate.read_summary()
        except RunDirError:
            continue
        if summary is not None and summary.status == RunStatus.COMPLETED:
            return candidate
    raise RunDirError(
        f"no other completed run of {preset} in {run.path.parent} to compare {run.run_id} with; "
        "name both runs: ddptui diff RUN_A RUN_B"
    )
