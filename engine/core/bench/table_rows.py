"""Turning runs into speedup-table rows, one way for every caller: a bench's rows, the UI's table of
the runs launched in a session, and a stored bench rebuilt with another baseline.

A run's summary is what the run observer returns: summary.json, or for a run whose launcher died
the ``lost`` summary it builds (a row of it is failed, with that reason); a run still going is a
skipped row saying so. Plain Python.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from engine.core.bench.speedup_table import RowResult, SpeedupTable
from engine.core.bench.table_compute import build_speedup_table
from engine.core.common.statuses import RowStatus, RunStatus
from engine.core.config.devices import parse_device_spec
from engine.core.config.schema import ConfigError, RunConfig
from engine.core.procs.process_identity import ProcessProbe
from engine.core.runs.observer import RunObserver
from engine.core.runs.rundir import RunDir
from engine.core.runs.summary import RunSummary

if TYPE_CHECKING:
    from engine.core.bench.result_history import BenchRecord
    from engine.core.plan.run_plan import RunPlan
    from engine.core.plan.suite_plan import ResolvedRow


def nominal_shape(config: RunConfig) -> tuple[str, int, int]:
    """(devices, device count, global batch) as the preset asks, for a row that cannot be planned
    here: ``devices.spec = "4"`` still reads as 4 GPUs and a DDP global batch of 4 x batch."""
    try:
        spec = parse_device_spec(config.devices.spec)
    except ConfigError:
        return config.devices.spec, 0, 0
    if spec.kind == "count":
        devices, count = f"{spec.count} GPU{'s' if spec.count != 1 else ''}", spec.count
    elif spec.kind == "gpus":
        devices, count = "gpu:" + ",".join(map(str, spec.gpu_indices)), len(spec.gpu_indices)
    elif spec.kind == "cpu":
        devices, count = f"cpu:{spec.count}", spec.count
    else:
        return config.devices.spec, 0, 0
    batch = config.training.batch_size
    return devices, count, batch * count if config.strategy.name == "ddp" else batch


def skipped_row(resolved: ResolvedRow, reason: str) -> RowResult:
    """A row that never ran, with its planned (or nominal) shape and why."""
    devices, count, global_batch = nominal_shape(resolved.config)
    if resolved.plan is not None:
        devices = resolved.plan.devices.describe()
        count = resolved.plan.device_count
        global_batch = resolved.plan.global_batch
    return RowResult(
        label=resolved.label,
        preset=resolved.row.preset,
        strategy=resolved.config.strategy.name,
        devices=devices,
        device_count=count,
        precision=resolved.config.precision.mode,
        global_batch=global_batch,
        skipped=reason,
    )


def planned_row(
    resolved: ResolvedRow, plan: RunPlan, summaries: tuple[RunSummary, ...]
) -> RowResult:
    """A row that ran, with the summaries of its repeats."""
    return RowResult(
        label=resolved.label,
        preset=resolved.row.preset,
        strategy=plan.config.strategy.name,
        devices=plan.devices.describe(),
        device_count=plan.device_count,
        precision=plan.config.precision.mode,
        global_batch=plan.global_batch,
        summaries=summaries,
    )


def unfinished_summary(run_id: str, config: RunConfig, plan: RunPlan, reason: str) -> RunSummary:
    """The summary of a row's run that has none to give (it could not start, or its ranks
    outlived its launcher): failed, with the reason."""
    now = time.time()
    return RunSummary(
        run_id=run_id,
        preset=config.name,
        status=RunStatus.FAILED,
        strategy=config.strategy.name,
        precision=config.precision.mode,
        model=config.workload[0],
        dataset=config.workload[1],
        devices=plan.devices.describe(),
        device_count=plan.device_count,
        world_size=plan.world_size,
        global_batch=plan.global_batch,
        started=now,
        finished=now,
        reason=reason,
    )


def row_of_run(label: str, run_dir: RunDir, probe: ProcessProbe | None = None) -> RowResult:
    """One row of one run directory, as the run observer sees it (nothing is written)."""
    try:
        state = RunObserver(run_dir, probe=probe).observe()
    except OSError as err:  # a broken run is a row that says so, not a broken table
        return RowResult(label, "", "", "", 0, "", 0, skipped=f"{run_dir.path}: {err}")
    summary = state.summary
    if summary is None:
        why = (
            "still running" if state.active else f"{state.status}: {state.reason or state.problem}"
        )
        return RowResult(label, state.preset, "", state.devices, 0, "", 0, skipped=why)
    return RowResult(
        label=label,
        preset=summary.preset,
        strategy=summary.strategy,
        devices=summary.devices,
        device_count=summary.device_count,
        precision=summary.precision,
        global_batch=summary.global_batch,
        summaries=(summary,),
    )


def session_rows(run_dirs: list[RunDir], probe: ProcessProbe | None = None) -> list[RowResult]:
    """One row per run (the UI's table of the runs launched in this session)."""
    labels = short_labels([r.run_id for r in run_dirs])
    return [row_of_run(labels[r.run_id], r, probe) for r in run_dirs]


def short_labels(run_ids: list[str]) -> dict[str, str]:
    """``20261202-105133-cpu-demo-3f9a`` -> ``cpu-demo-3f9a``, unless that would not be unique."""
    short = {}
    for run_id in run_ids:
        parts = run_id.split("-", 2)
        ok = len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit()
        short[run_id] = parts[2] if ok else run_id
    if len(set(short.values())) != len(short):
        return {r: r for r in run_ids}
    return short


def rebaseline(record: BenchRecord, baseline: str) -> SpeedupTable:
    """Rebuild a stored bench's table from its recorded runs with another baseline row."""
    runs_by_row: dict[str, list[RunSummary]] = {}
    for run in record.runs:
        runs_by_row.setdefault(run.row_label, []).append(run.summary)
    rows = [
        RowResult(
            label=row.label,
            preset=row.preset,
            strategy=row.strategy,
            devices=row.devices,
            device_count=row.device_count,
            precision=row.precision,
            global_batch=row.global_batch,
            summaries=tuple(runs_by_row.get(row.label, ())),
            skipped=row.reason if row.status == RowStatus.SKIPPED else "",
        )
        for row in record.table.rows
    ]
    return build_speedup_table(
        rows, title=record.table.title, baseline=baseline, header_lines=record.table.header_lines
    )
