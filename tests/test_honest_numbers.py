"""Numbers that cannot lie (issue 16, finding 5): NaN and infinity are refused in every float key,
a loss that becomes NaN or infinite fails the run (or, by choice, is a warning), and every JSON
ddptui writes parses under a strict parser."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from engine.core.common.strict_json import dumps
from engine.core.config.schema import ConfigError, RunConfig
from engine.core.config.toml_io import SECTION_TYPES, apply_overrides, load_config
from engine.core.runs.events import EpochEnded, StepProgress, event_from_json
from engine.core.runs.rundir import RunDir, list_runs
from engine.core.runs.summary import EpochFigures, RunSummary
from tests.fixtures.live_runs import ddptui
from tests.fixtures.made_runs import strict_json_load


def strict_load(text: str) -> Any:
    return strict_json_load(text)


FLOAT_KEYS = [
    f"{section}.{key}"
    for section, cls in SECTION_TYPES.items()
    for key, hint in get_type_hints(cls).items()
    if hint is float
]


def test_there_are_float_keys_to_check() -> None:
    assert "optimizer.lr" in FLOAT_KEYS and "supervision.stall_seconds" in FLOAT_KEYS


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+inf", "1e999"])
def test_nan_and_infinity_are_refused_in_every_float_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"{key} is .*; it must be a finite number"):
        apply_overrides(RunConfig(), {key: value})


def test_a_preset_file_with_nan_is_refused_naming_file_and_key(tmp_path: Path) -> None:
    preset = tmp_path / "nan.toml"
    preset.write_text("[optimizer]\nlr = nan\n")
    with pytest.raises(ConfigError, match=rf"{preset}: optimizer.lr is nan; it must be a finite"):
        load_config(preset)


def test_strict_json_writes_null_for_what_is_not_a_number() -> None:
    text = dumps({"a": math.nan, "b": [math.inf, 1.5, -math.inf], "c": (2, "x")})
    assert strict_load(text) == {"a": None, "b": [None, 1.5, None], "c": [2, "x"]}


def test_an_event_and_a_summary_with_nan_read_back_as_nan() -> None:
    event = EpochEnded(
        rank=0, epoch=0, steps=2, images=10, seconds=1.0, data_wait_seconds=0.0, warmup_steps=0,
        steady_images_per_s=10.0, train_loss=math.nan, global_images=10, global_seconds=1.0,
        global_data_wait_seconds=0.0, global_steady_images_per_s=10.0, global_train_loss=math.nan,
    )  # fmt: skip
    line = event.to_json()
    assert strict_load(line)["train_loss"] is None
    back = event_from_json(line)
    assert isinstance(back, EpochEnded) and math.isnan(back.global_train_loss)
    # a figure a script's rank did not report is absent (None), not a NaN
    unreported = StepProgress(
        rank=0, epoch=0, step=1, steps=0, global_step=1, loss=None, images_per_s=None,
        step_seconds=0.1, lr=None,
    )  # fmt: skip
    again = event_from_json(unreported.to_json())
    assert isinstance(again, StepProgress) and again.loss is None and again.lr is None
    figures = EpochFigures(
        epoch=0, seconds=1.0, data_wait_seconds=0.0, images=10, steps=2, warmup_steps=0,
        steady_images_per_s=10.0, steady_epoch_seconds=1.0, train_loss=math.inf,
    )  # fmt: skip
    summary = RunSummary(
        run_id="r", preset="p", status="completed", strategy="ddp", precision="fp32",
        model="m", dataset="d", devices="cpu:1", device_count=1, world_size=1, global_batch=1,
        started=0.0, epochs=(figures,),
    )  # fmt: skip
    data = strict_load(dumps(summary.to_json()))
    assert data["epochs"][0]["train_loss"] is None
    assert math.isnan(RunSummary.from_json(data).epochs[0].train_loss)
    # every float figure of an epoch, not only the loss: what is not a number reads back NaN
    floats = [f.name for f in fields(EpochFigures) if f.type == "float"]
    assert {"seconds", "steady_images_per_s", "train_loss"} <= set(floats)
    broken = replace(figures, **dict.fromkeys(floats, math.nan))
    text = dumps(replace(summary, epochs=(broken,)).to_json())
    assert all(strict_load(text)["epochs"][0][name] is None for name in floats)
    back_figures = RunSummary.from_json(strict_load(text)).epochs[0]
    assert [name for name in floats if not math.isnan(getattr(back_figures, name))] == []
    assert back_figures.test_accuracy is None  # an optional figure never given stays absent


# ---- real runs ----------------------------------------------------------------------------------

DIVERGING = [
    "--devices", "cpu:2", "--epochs", "1", "--max-steps", "12",
    "--set", "training.evaluate=false", "--set", "optimizer.lr=1e30",
]  # fmt: skip


def only_run(runs_dir: Path) -> RunDir:
    (run_dir,) = list_runs(runs_dir)
    return run_dir


@pytest.mark.slow
def test_a_diverging_run_fails_naming_epoch_step_and_rank(runs_dir: Path, run_reaper: None) -> None:
    done = ddptui("run", "cpu-demo", *DIVERGING, "--json", "--runs-dir", str(runs_dir), timeout=120)
    assert done.returncode == 1, done.stderr
    printed = strict_load(done.stdout)
    run_dir = only_run(runs_dir)
    on_disk = strict_load(run_dir.summary_path.read_text())
    assert printed["status"] == on_disk["status"] == "failed"
    error = on_disk["failure"]["error"]
    assert "training diverged at epoch 1 step " in error
    assert f"on rank {on_disk['failure']['rank']}" in error
    assert "diverged at epoch 1 step" in on_disk["reason"]
    for path in run_dir.events_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            strict_load(line)


@pytest.mark.slow
def test_on_divergence_warn_trains_on_and_says_so(runs_dir: Path, run_reaper: None) -> None:
    done = ddptui(
        "run", "cpu-demo", *DIVERGING, "--set", "training.on_divergence=warn",
        "--runs-dir", str(runs_dir), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "warning: the training loss was not finite in epoch 1" in done.stdout
    run_dir = only_run(runs_dir)
    summary = strict_load(run_dir.summary_path.read_text())
    assert summary["status"] == "completed"
    assert summary["epochs"][0]["train_loss"] is None
    assert summary["warnings"] and "not finite" in summary["warnings"][0]
    assert "warning: training diverged at epoch 1 step" in run_dir.rank_log_path(0).read_text()
    shown = ddptui("show", run_dir.run_id, "--json", "--runs-dir", str(runs_dir))
    assert shown.returncode == 0, shown.stderr
    strict_load(shown.stdout)
    listed = ddptui("runs", "--json", "--runs-dir", str(runs_dir))
    strict_load(listed.stdout)
