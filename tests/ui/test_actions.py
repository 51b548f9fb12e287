"""The engine calls behind the results screen: a session's runs become table rows (a run still
going is a row that says so), and a stored bench can be re-baselined from its recorded runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddptui.actions import EngineActions
from engine.core.bench.result_history import RecordedRun, ResultHistory
from engine.core.bench.speedup_table import RowResult
from engine.core.bench.table_compute import build_speedup_table
from engine.core.bench.table_rows import session_rows
from engine.core.host.machine_info import MachineInfo
from engine.core.runs.rundir import RunDir
from engine.core.runs.summary import RunSummary
from tests.fixtures.repo import REPO_ROOT
from tests.ui.standins import FAILED_RUN, GPU_RUN, LIVE_PIDS, LIVE_RUN, RECORDED, StandInProbe

RUNS = REPO_ROOT / RECORDED


def test_session_rows_say_what_each_run_is() -> None:
    runs = [RunDir(RUNS / r) for r in (GPU_RUN, FAILED_RUN, LIVE_RUN)]
    rows = session_rows(runs, StandInProbe(alive=LIVE_PIDS))  # the live run's launcher lives
    assert [r.label for r in rows] == ["fast-ddp-a1b2", "cpu-demo-c3d4", "cpu-demo-e5f6"]
    assert rows[0].summaries and rows[0].summaries[0].status == "completed"
    assert rows[1].summaries[0].status == "failed"
    assert rows[2].skipped == "still running"
    table = build_speedup_table(rows)
    assert table.baseline == "fast-ddp-a1b2"
    assert [r.status for r in table.rows] == ["ok", "failed", "skipped"]


def test_a_stored_bench_is_rebaselined_from_its_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDPTUI_DATA_DIR", str(tmp_path))
    fast = RunSummary.from_json(json.loads((RUNS / GPU_RUN / "summary.json").read_text()))
    data = fast.to_json()
    data["run_id"] = "slow"
    for epoch in data["epochs"]:
        epoch["steady_images_per_s"] /= 4
    slow = RunSummary.from_json(data)

    def row(label: str, summary: RunSummary) -> RowResult:
        return RowResult(label, "fast-ddp", "ddp", "gpu:0,1", 2, "bf16", 512, summaries=(summary,))

    table = build_speedup_table([row("fast", fast), row("slow", slow)], title="two rows")
    with ResultHistory() as history:
        bench_id = history.record(
            title="two rows",
            command="ddptui bench",
            machine=MachineInfo(host="trainbox"),
            table=table,
            runs=[RecordedRun("fast", 1, "runs/a", fast), RecordedRun("slow", 1, "runs/b", slow)],
        )
    actions = EngineActions(tmp_path / "runs")
    (listing,) = actions.list_benches()
    assert listing.id == bench_id
    assert actions.bench_table(bench_id, None).baseline == "fast"
    rebased = actions.bench_table(bench_id, "slow")
    assert rebased.baseline == "slow"
    assert rebased.row("fast").speedup == pytest.approx(4.0)
