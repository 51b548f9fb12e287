"""A suite's rows made concrete for this machine: each row's config and its plan, or the planner's
reason it cannot run here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.core.common.config_error import ConfigError
from engine.core.config.schema import RunConfig
from engine.core.config.suites import Suite, SuiteRow, row_config
from engine.core.plan.run_plan import RunPlan, plan_run


@dataclass(frozen=True)
class ResolvedRow:
    """A suite row made concrete for this machine: its config, and its plan or why it cannot run."""

    row: SuiteRow
    config: RunConfig
    plan: RunPlan | None = None
    skipped: str = ""  # the planner's refusal, one sentence

    @property
    def label(self) -> str:
        return self.row.label


def resolve_rows(
    suite: Suite, gpu_count: int, extra: Mapping[str, Any] | None = None
) -> list[ResolvedRow]:
    """Every row's config, and its plan or the reason it cannot run on a machine with
    ``gpu_count`` GPUs. Bad input (unknown preset, bad override) raises; a row this machine cannot
    run (too few GPUs, fp16 on the CPU, missing data set) is returned with ``skipped`` set."""
    resolved = []
    for row in suite.rows:
        config = row_config(suite, row, extra)
        try:
            resolved.append(ResolvedRow(row=row, config=config, plan=plan_run(config, gpu_count)))
        except ConfigError as err:
            resolved.append(ResolvedRow(row=row, config=config, skipped=str(err)))
    return resolved
