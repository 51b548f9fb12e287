"""The speedup table from hand-made run summaries: its arithmetic, its flags and its three formats."""

from __future__ import annotations

import csv
import io
import json
import re
import time
from dataclasses import replace
from typing import Any

import pytest

from engine.core.bench.speedup_table import RowResult, SpeedupTable, TableError
from engine.core.bench.table_compare import compare_tables
from engine.core.bench.table_compute import build_speedup_table
from engine.core.bench.table_render import (
    CSV_COLUMNS,
    DISPLAY_HEADERS,
    display_rows,
    render_table,
    row_cells,
    table_markdown,
)
from engine.core.common.statuses import RowStatus
from engine.core.runs.summary import EpochFigures, Failure, RunSummary

FAILED, OK, SKIPPED = RowStatus.FAILED, RowStatus.OK, RowStatus.SKIPPED


def summary(
    run_id: str,
    *,
    steady_seconds: float,
    images: int = 10_000,
    devices: int = 1,
    strategy: str = "single",
    global_batch: int = 256,
    precision: str = "fp32",
    data_wait: float = 1.0,
    accuracy: float | None = 0.27,
    status: str = "completed",
    epochs: int = 2,
    failure: Failure | None = None,
    reason: str = "",
) -> RunSummary:
    """A summary whose last epoch has the given steady seconds (earlier epochs are slower)."""
    figures = tuple(
        EpochFigures(
            epoch=e,
            seconds=steady_seconds * (1.5 if e < epochs - 1 else 1.1),
            data_wait_seconds=data_wait,
            images=images,
            steps=images // global_batch,
            warmup_steps=5,
            steady_images_per_s=images / (steady_seconds * (1.5 if e < epochs - 1 else 1.0)),
            steady_epoch_seconds=steady_seconds * (1.5 if e < epochs - 1 else 1.0),
            train_loss=2.0,
            test_accuracy=accuracy,
            test_loss=2.1,
        )
        for e in range(epochs)
    )
    kind = "gpu" if devices > 1 or strategy != "single" else "cpu"
    desc = f"gpu:{','.join(str(i) for i in range(devices))}" if kind == "gpu" else "cpu:1"
    return RunSummary(
        run_id=run_id,
        preset=run_id.split("-")[0],
        status=status,
        strategy=strategy,
        precision=precision,
        model="resnet50",
        dataset="cifar10",
        devices=desc,
        device_count=devices,
        world_size=devices if strategy == "ddp" else 1,
        global_batch=global_batch,
        started=1000.0,
        finished=1100.0,
        elapsed_seconds=100.0,
        epochs=figures if status == "completed" else figures[:1],
        failure=failure,
        reason=reason,
    )


def row(label: str, *summaries: RunSummary, skipped: str = "", devices: int = 1) -> RowResult:
    first = summaries[0] if summaries else None
    return RowResult(
        label=label,
        preset=first.preset if first else label,
        strategy=first.strategy if first else "ddp",
        devices=first.devices if first else f"{devices} GPUs",
        device_count=first.device_count if first else devices,
        precision=first.precision if first else "fp32",
        global_batch=first.global_batch if first else 256 * devices,
        summaries=summaries,
        skipped=skipped,
    )


def seed_like_table() -> SpeedupTable:
    """The tutorial's five rows, with its A100 seconds as steady epoch seconds."""
    return build_speedup_table(
        [
            row("single", summary("single-1", steady_seconds=13.2)),
            row(
                "DataParallel x4",
                summary(
                    "dp-1",
                    steady_seconds=19.1,
                    devices=4,
                    strategy="dataparallel",
                    global_batch=1024,
                    data_wait=8.0,
                ),
            ),
            row(
                "DDP x2",
                summary("ddp2-1", steady_seconds=9.8, devices=2, strategy="ddp", global_batch=512),
            ),
            row(
                "DDP x4",
                summary(
                    "ddp4-1",
                    steady_seconds=6.1,
                    devices=4,
                    strategy="ddp",
                    global_batch=1024,
                    accuracy=0.14,
                ),
            ),
            row(
                "DDP x4 + AMP",
                summary(
                    "amp-1",
                    steady_seconds=6.5,
                    devices=4,
                    strategy="ddp",
                    global_batch=1024,
                    precision="fp16",
                ),
            ),
        ],
        title="seed-table",
        baseline="single",
    )


def test_speedup_and_efficiency_follow_from_the_rows_own_times() -> None:
    table = seed_like_table()
    assert table.baseline == "single"
    base = table.row("single")
    assert base.baseline and base.speedup == pytest.approx(1.0) and base.efficiency == 1.0
    for r in table.rows:
        assert r.status == OK
        assert r.speedup == pytest.approx(base.epoch_seconds / r.epoch_seconds)  # type: ignore[operator]
        assert r.efficiency == pytest.approx(r.speedup / r.device_count)  # type: ignore[operator]
    assert table.row("DDP x4").speedup == pytest.approx(13.2 / 6.1)
    assert table.row("DDP x2").efficiency == pytest.approx(13.2 / 9.8 / 2)


def test_figures_come_from_the_last_epoch() -> None:
    table = seed_like_table()
    r = table.row("DataParallel x4")
    assert r.epoch_seconds == pytest.approx(19.1)  # not the slower first epoch's 28.65
    assert r.images_per_s == pytest.approx(10_000 / 19.1)
    assert r.data_wait_share == pytest.approx(8.0 / (19.1 * 1.1))
    assert r.test_accuracy == pytest.approx(0.27)
    assert table.row("DDP x4").test_accuracy == pytest.approx(0.14)


def test_more_devices_slower_than_fewer_is_flagged_with_the_faster_row() -> None:
    table = seed_like_table()
    dp = table.row("DataParallel x4")
    assert dp.slower_than == "single"
    assert "⚠" in row_cells(dp)[8]
    assert table.row("DDP x4").slower_than is None
    # Same device count, slower (AMP vs plain DDP x4): not "more devices slower than fewer".
    assert table.row("DDP x4 + AMP").slower_than is None
    assert any("DataParallel x4" in n and "slower than 'single'" in n for n in table.notes)


def test_the_slower_with_more_devices_flag_compares_within_one_precision() -> None:
    table = build_speedup_table(
        [
            row("1 fp32", summary("a", steady_seconds=5.0)),
            row("2 fp32", summary("b", steady_seconds=4.0, devices=2, strategy="ddp")),
            row("1 bf16", summary("c", steady_seconds=20.0, precision="bf16")),
            row("2 bf16", summary("d", steady_seconds=10.0, devices=2, precision="bf16")),
        ]
    )
    # 2 bf16 is slower than 1 fp32, but that is precision, not scaling.
    assert [r.slower_than for r in table.rows] == [None, None, None, None]
    slow = build_speedup_table(
        [
            row("1 bf16", summary("c", steady_seconds=9.0, precision="bf16")),
            row("2 bf16", summary("d", steady_seconds=10.0, devices=2, precision="bf16")),
        ]
    )
    assert slow.row("2 bf16").slower_than == "1 bf16"


def test_with_repeats_only_a_slowdown_beyond_the_spread_is_flagged() -> None:
    def rows(two: list[float]) -> list[RowResult]:
        return [
            row("one", *(summary(f"a{i}", steady_seconds=s) for i, s in enumerate([10, 11, 12]))),
            row(
                "two",
                *(
                    summary(f"b{i}", steady_seconds=s, devices=2, strategy="ddp")
                    for i, s in enumerate(two)
                ),
            ),
        ]

    overlapping = build_speedup_table(rows([10.5, 11.2, 11.5]))  # median slower, within noise
    assert overlapping.row("two").slower_than is None
    beyond = build_speedup_table(rows([12.5, 13.0, 14.0]))
    assert beyond.row("two").slower_than == "one"
    assert any("beyond the spread of the repeats" in n for n in beyond.notes)
    # One noisy repeat of the faster row (its range then overlaps) does not hide a clear gap.
    noisy = build_speedup_table(
        [
            row("one", *(summary(f"a{i}", steady_seconds=s) for i, s in enumerate([5, 6, 9]))),
            row(
                "two",
                *(
                    summary(f"b{i}", steady_seconds=s, devices=2, strategy="ddp")
                    for i, s in enumerate([8.0, 8.5, 9.5])
                ),
            ),
        ]
    )
    assert noisy.row("two").slower_than == "one"


def test_rows_whose_global_batch_differs_from_the_baselines_are_flagged() -> None:
    table = seed_like_table()
    flagged = {r.label for r in table.rows if r.batch_differs}
    assert flagged == {"DataParallel x4", "DDP x2", "DDP x4", "DDP x4 + AMP"}
    assert row_cells(table.row("DDP x2"))[4] == "512 †"
    assert row_cells(table.row("single"))[4] == "256"
    assert any(n.startswith("† Global batch differs") for n in table.notes)


def test_footer_says_warm_up_is_excluded_and_how_speedup_is_defined() -> None:
    notes = " ".join(seed_like_table().notes)
    assert "first 5 steps" in notes and "left out" in notes
    assert "data loading included" in notes
    assert "Speedup is a row's images/s over the baseline's, 'single'" in notes


def test_skipped_and_failed_rows_stay_in_the_table_with_their_reason() -> None:
    crashed = summary(
        "ddp2-1",
        steady_seconds=5.0,
        devices=2,
        strategy="ddp",
        global_batch=512,
        status="failed",
        failure=Failure(rank=1, exitcode=1, error="RuntimeError: injected crash at step 3"),
    )
    table = build_speedup_table(
        [
            row("single", summary("single-1", steady_seconds=10.0)),
            row("DDP x2", crashed),
            row(
                "DDP x8",
                skipped="devices.spec '8' asks for 8 GPUs, but this machine has 4",
                devices=8,
            ),
        ],
        baseline="single",
    )
    failed, skipped = table.row("DDP x2"), table.row("DDP x8")
    assert failed.status == FAILED
    assert failed.reason == "rank 1: RuntimeError: injected crash at step 3"
    assert failed.speedup is None and failed.epoch_seconds is None
    assert skipped.status == SKIPPED and "this machine has 4" in skipped.reason
    assert row_cells(skipped)[-1].startswith("skipped: devices.spec '8'")
    assert row_cells(skipped)[5] == "—"
    markdown = table_markdown(table)
    assert "failed: rank 1: RuntimeError" in markdown
    assert "skipped: devices.spec" in markdown


def test_one_failed_repeat_fails_the_row_and_says_which() -> None:
    table = build_speedup_table(
        [
            row(
                "single",
                summary("s-1", steady_seconds=10.0),
                summary("s-2", steady_seconds=10.0, status="killed", reason="stopped by Ctrl-C"),
            )
        ]
    )
    assert table.rows[0].status == FAILED
    assert table.rows[0].reason == "run 2 of 2: killed: stopped by Ctrl-C"
    assert table.baseline is None
    assert any("No row completed" in n for n in table.notes)


def test_a_named_baseline_that_did_not_complete_is_never_replaced() -> None:
    table = build_speedup_table(
        [
            row("single", skipped="needs a GPU"),
            row("DDP x2", summary("d-1", steady_seconds=5.0, devices=2, strategy="ddp")),
        ],
        baseline="single",
    )
    assert table.baseline is None
    assert table.row("DDP x2").speedup is None
    assert any("baseline row 'single' was skipped (needs a GPU)" in n for n in table.notes)


def test_without_a_named_baseline_the_first_completed_row_is_it_and_the_footer_says_so() -> None:
    table = build_speedup_table(
        [
            row("a", skipped="needs a GPU"),
            row("b", summary("b-1", steady_seconds=8.0)),
            row("c", summary("c-1", steady_seconds=4.0, devices=2, strategy="ddp")),
        ]
    )
    assert table.baseline == "b"
    assert table.row("c").speedup == pytest.approx(2.0)
    assert table.row("c").efficiency == pytest.approx(1.0)
    assert any("(the first row that completed)" in n for n in table.notes)


def test_repeats_give_the_median_and_the_spread() -> None:
    table = build_speedup_table(
        [
            row(
                "single", *(summary(f"s-{i}", steady_seconds=s) for i, s in enumerate([10, 12, 11]))
            ),
            row(
                "ddp",
                *(
                    summary(f"d-{i}", steady_seconds=s, devices=2, strategy="ddp")
                    for i, s in enumerate([6.0, 5.0, 5.5])
                ),
            ),
        ]
    )
    single, ddp = table.row("single"), table.row("ddp")
    assert single.repeats == 3
    assert single.epoch_seconds == 11 and single.epoch_seconds_min == 10
    assert single.epoch_seconds_max == 12
    assert single.images_per_s == pytest.approx(10_000 / 11)
    assert ddp.speedup == pytest.approx(11 / 5.5)
    assert row_cells(single)[5] == "11.00 (10.00–12.00)"
    assert any("median of 3 runs" in n for n in table.notes)


def test_different_images_per_epoch_compare_by_throughput_and_the_footer_says_so() -> None:
    # max_steps caps steps per rank: a 2-rank epoch holds twice the images in the same time.
    table = build_speedup_table(
        [
            row("one", summary("a-1", steady_seconds=4.0, images=2_000)),
            row("two", summary("b-1", steady_seconds=4.0, images=4_000, devices=2, strategy="ddp")),
        ]
    )
    assert table.row("two").speedup == pytest.approx(2.0)
    assert any("different numbers of images per epoch" in n for n in table.notes)


def test_duplicate_labels_and_unknown_baselines_are_refused() -> None:
    a = row("a", summary("a-1", steady_seconds=1.0))
    with pytest.raises(TableError, match="two rows are labelled 'a'"):
        build_speedup_table([a, a])
    with pytest.raises(TableError, match="baseline 'x' is not one of the rows"):
        build_speedup_table([a], baseline="x")


# ---- formats --------------------------------------------------------------------------------------


def _markdown_rows(text: str) -> dict[str, dict[str, str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    headers = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows[cells[0]] = dict(zip(headers, cells, strict=True))
    return rows


def _number(cell: str) -> float:
    return float(re.match(r"-?[\d.]+", cell).group(0))  # type: ignore[union-attr]


def test_markdown_csv_and_json_hold_the_same_numbers() -> None:
    table = seed_like_table()
    md = _markdown_rows(render_table(table, "markdown"))
    data = json.loads(render_table(table, "json"))
    from_csv = list(csv.DictReader(io.StringIO(render_table(table, "csv"))))
    assert list(from_csv[0]) == list(CSV_COLUMNS)
    assert [r["label"] for r in data["rows"]] == [r["label"] for r in from_csv] == list(md)
    for j, c in zip(data["rows"], from_csv, strict=True):
        m = md[j["label"]]
        for key in ("epoch_seconds", "images_per_s", "speedup", "efficiency", "test_accuracy"):
            assert float(c[key]) == pytest.approx(j[key], rel=1e-9), key
        assert int(c["global_batch"]) == j["global_batch"] == int(_number(m["global batch"]))
        assert c["batch_differs"] == ("true" if j["batch_differs"] else "false")
        assert _number(m["epoch s"]) == pytest.approx(j["epoch_seconds"], abs=0.005)
        assert _number(m["images/s"]) == pytest.approx(j["images_per_s"], abs=0.5)
        assert _number(m["speedup"]) == pytest.approx(j["speedup"], abs=0.005)
        assert _number(m["efficiency"]) == pytest.approx(j["efficiency"] * 100, abs=0.5)
        assert _number(m["data wait"]) == pytest.approx(j["data_wait_share"] * 100, abs=0.5)
        assert _number(m["test acc"]) == pytest.approx(j["test_accuracy"] * 100, abs=0.05)
        assert ("⚠" in m["speedup"]) == bool(j["slower_than"]) == bool(c["slower_than"])
    assert data["notes"] == list(table.notes)


def test_json_reads_back_to_an_equal_table() -> None:
    table = seed_like_table()
    assert SpeedupTable.from_json(json.loads(json.dumps(table.to_json()))) == table


def test_a_table_from_a_newer_ddptui_is_refused() -> None:
    data = seed_like_table().to_json()
    data["schema"] = 99
    with pytest.raises(TableError, match="newer ddptui"):
        SpeedupTable.from_json(data)


def test_display_rows_match_the_columns_for_a_data_table() -> None:
    table = seed_like_table()
    assert DISPLAY_HEADERS[0] == "row" and "speedup" in DISPLAY_HEADERS
    assert all(len(cells) == len(DISPLAY_HEADERS) for cells in display_rows(table))
    assert display_rows(table)[0][-1] == "baseline"


def test_a_reason_with_a_pipe_does_not_break_the_markdown_table() -> None:
    table = build_speedup_table([row("a", skipped="cannot | run here")])
    body = [line for line in table_markdown(table).splitlines() if line.startswith("| a")]
    assert "cannot \\| run here" in body[0]


def test_two_tables_compare_row_by_row() -> None:
    a = seed_like_table()
    b = build_speedup_table(
        [
            row("single", summary("single-2", steady_seconds=11.0)),
            row("DDP x8", summary("ddp8", steady_seconds=2.0, devices=8, strategy="ddp")),
        ],
        baseline="single",
    )
    pairs = {c.label: c for c in compare_tables(a, b)}
    assert list(pairs)[-1] == "DDP x8"
    assert pairs["single"].throughput_change == pytest.approx(13.2 / 11.0 - 1)
    assert pairs["DDP x2"].b is None and pairs["DDP x2"].cells()[2] == "absent"
    assert pairs["DDP x8"].a is None


# ---- figures that cannot be trusted are flagged (issue 16, finding 5) ------------------------


def with_repeats(label: str, devices: int, seconds: list[float], **kw: Any) -> RowResult:
    runs = tuple(
        summary(f"{label}-{i}", steady_seconds=s, devices=devices, **kw)
        for i, s in enumerate(seconds)
    )
    return RowResult(
        label, "p", kw.get("strategy", "single"), "", devices, "fp32", 256, summaries=runs
    )


def test_efficiency_above_100_percent_is_flagged_with_a_footnote() -> None:
    # the row: 2 ranks at 6.38x over a baseline slowed by outside load
    table = build_speedup_table(
        [
            with_repeats("one", 1, [6.38]),
            with_repeats("two", 2, [1.0], strategy="ddp"),
        ],
        baseline="one",
    )
    two = table.row("two")
    assert two.efficiency == pytest.approx(3.19)
    assert two.superlinear and not table.row("one").superlinear
    assert row_cells(two)[9] == "319% ‡"
    assert any(n.startswith("‡ Efficiency above 100 % beyond the spread") for n in table.notes)


def test_efficiency_above_100_percent_inside_the_spread_is_not_flagged() -> None:
    table = build_speedup_table(
        [
            with_repeats("one", 1, [2.2, 2.3, 1.6]),
            with_repeats("two", 2, [0.95, 1.05, 1.2], strategy="ddp"),
        ],
        baseline="one",
    )
    two = table.row("two")
    assert two.efficiency is not None and two.efficiency > 1.0
    assert not two.superlinear
    assert not any(n.startswith("‡") for n in table.notes)


def test_a_row_with_too_few_steady_steps_is_flagged() -> None:
    # 10 steps of 256 images, 5 of them warm-up: 5 steady steps
    few = with_repeats("few", 1, [1.0], images=2560)
    many = with_repeats("many", 1, [1.0], images=256 * 40)
    table = build_speedup_table([many, few])
    assert table.row("few").steady_steps == 5 and table.row("few").few_steps
    assert not table.row("many").few_steps
    assert row_cells(table.row("few"))[7].endswith(" §")
    note = next(n for n in table.notes if n.startswith("§"))
    assert "'few' 5" in note and "at least 20" in note


def test_outside_load_is_flagged_from_what_the_bench_measured() -> None:
    quiet = with_repeats("quiet", 1, [1.0])
    loaded = RowResult(
        "loaded", "p", "single", "", 1, "fp32", 256,
        summaries=(replace(summary("l", steady_seconds=1.0), outside_load_cores=1.4),),
    )  # fmt: skip
    table = build_speedup_table([quiet, loaded])
    assert table.row("loaded").loaded and not table.row("quiet").loaded
    assert row_cells(table.row("loaded"))[5].endswith(" ◊")
    assert any(n.startswith("◊ Outside load") and "'loaded' 1.40" in n for n in table.notes)
    back = SpeedupTable.from_json(json.loads(render_table(table, "json")))
    assert back.row("loaded").outside_load == pytest.approx(1.4)


def test_outside_load_counts_other_processes_not_the_runs_own(pen: Any) -> None:
    from engine.core.host.outside_load import OutsideLoad

    busy = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"
    load = OutsideLoad()
    pen.orphan(busy)  # not ours: its CPU time is another process's
    time.sleep(1.6)
    assert load.cores() > 0.5
