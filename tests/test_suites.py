"""Suite files: the bundled ones load and plan; bad ones are one sentence naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.config.schema import ConfigError
from engine.core.config.suites import (
    list_suites,
    load_suite,
    row_config,
    suite_of_presets,
)
from engine.core.plan.suite_plan import resolve_rows


def write(tmp_path: Path, text: str, name: str = "mine.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_bundled_suites_are_listed_and_load() -> None:
    names = {s.name for s in list_suites()}
    assert {"seed-table", "cpu-scaling"} <= names
    for name in names:
        assert load_suite(name).rows


def test_seed_table_has_the_tutorials_five_rows() -> None:
    suite = load_suite("seed-table")
    assert [r.label for r in suite.rows] == [
        "single",
        "DataParallel x4",
        "DDP x2",
        "DDP x4",
        "DDP x4 + AMP",
    ]
    assert suite.baseline == "single"
    configs = {r.label: row_config(suite, r) for r in suite.rows}
    assert configs["DDP x2"].devices.spec == "2"
    assert configs["DataParallel x4"].strategy.name == "dataparallel"
    assert configs["DDP x4 + AMP"].precision.mode == "fp16"
    assert all(c.model.name == "resnet50" for c in configs.values())


def test_seed_table_on_a_machine_without_gpus_skips_every_row_with_the_reason() -> None:
    rows = resolve_rows(load_suite("seed-table"), gpu_count=0)
    assert all(r.plan is None for r in rows)
    assert all("this machine has none visible to NVML" in r.skipped for r in rows)


def test_seed_table_on_two_gpus_skips_only_the_four_gpu_rows() -> None:
    rows = resolve_rows(load_suite("seed-table"), gpu_count=2, extra={"data.dataset": "synthetic"})
    runnable = {r.label: r.plan for r in rows if r.plan is not None}
    skipped = {r.label: r.skipped for r in rows if r.plan is None}
    assert set(runnable) == {"single", "DDP x2"}
    assert runnable["DDP x2"] is not None and runnable["DDP x2"].global_batch == 512
    assert set(skipped) == {"DataParallel x4", "DDP x4", "DDP x4 + AMP"}
    assert all("asks for 4 GPUs, but this machine has 2" in s for s in skipped.values())


def test_seed_table_plans_all_five_rows_on_four_gpus() -> None:
    rows = resolve_rows(load_suite("seed-table"), gpu_count=4, extra={"data.dataset": "synthetic"})
    plans = {r.label: r.plan for r in rows}
    assert all(p is not None for p in plans.values())
    assert {label: p.global_batch for label, p in plans.items() if p} == {
        "single": 256,
        "DataParallel x4": 1024,
        "DDP x2": 512,
        "DDP x4": 1024,
        "DDP x4 + AMP": 1024,
    }


def test_cpu_scaling_runs_on_a_cpu_machine_at_one_global_batch() -> None:
    rows = resolve_rows(load_suite("cpu-scaling"), gpu_count=0)
    assert [r.skipped for r in rows] == ["", "", "", ""]
    shapes = {r.label: (r.plan.world_size, r.plan.global_batch) for r in rows if r.plan}
    assert shapes == {
        "1 rank fp32": (1, 128),
        "2 ranks fp32": (2, 128),
        "1 rank bf16": (1, 128),
        "2 ranks bf16": (2, 128),
    }
    assert {r.config.precision.mode for r in rows} == {"fp32", "bf16"}


def test_overrides_apply_preset_then_suite_then_row_then_command_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
baseline = "a"
[set]
"training.epochs" = 3
"training.seed" = 7
[[rows]]
label = "a"
preset = "cpu-demo"
set = { training = { epochs = 4 } }
""",
    )
    suite = load_suite(str(path))
    config = row_config(suite, suite.rows[0], {"training.seed": "9"})
    assert config.training.epochs == 4  # row beats suite
    assert config.training.seed == 9  # command line beats suite
    assert config.model.name == "small_cnn"  # from the preset


def test_presets_on_the_command_line_make_a_suite_with_the_first_as_baseline() -> None:
    suite = suite_of_presets(["cpu-demo", "cpu-demo"])
    assert [r.label for r in suite.rows] == ["cpu-demo", "cpu-demo #2"]
    assert suite.baseline == "cpu-demo"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('colour = "red"\n[[rows]]\npreset = "cpu-demo"', "unknown key 'colour'"),
        ('[[rows]]\npreset = "cpu-demo"\nlable = "x"', "unknown key 'lable' in rows entry 1"),
        ("description = 'x'", "no rows"),
        ('[[rows]]\nlabel = "a"', "rows entry 1 needs preset"),
        ('baseline = "z"\n[[rows]]\npreset = "cpu-demo"', "baseline 'z' is not a row label"),
        ('baseline = 3\n[[rows]]\npreset = "cpu-demo"', "baseline must be a string"),
        (
            '[[rows]]\npreset = "cpu-demo"\n[[rows]]\npreset = "cpu-demo"',
            "two rows are labelled 'cpu-demo'",
        ),
        ('set = 3\n[[rows]]\npreset = "cpu-demo"', "set must be a table"),
        ('[[rows]]\npreset = "cpu-demo"\nset = { epochs = 2 }', "key 'epochs' is not section.key"),
        ("rows = 3", "rows must be an array of tables"),
        ("rows = [", "not valid TOML"),
    ],
)
def test_a_bad_suite_file_is_one_sentence_naming_the_file_and_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_suite(str(path))
    message = str(err.value)
    assert message.startswith(str(path)), message
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ('preset = "no-such-preset"', "row 'no-such-preset': no preset named 'no-such-preset'"),
        (
            'preset = "cpu-demo"\nset = { "training.epoks" = 2 }',
            "unknown key training.epoks",
        ),
        (
            'preset = "cpu-demo"\nset = { "precision.mode" = "fp8" }',
            "precision.mode is 'fp8'",
        ),
    ],
)
def test_a_row_that_cannot_make_a_config_names_the_suite_file_and_row(
    tmp_path: Path, row: str, expected: str
) -> None:
    path = write(tmp_path, f"[[rows]]\n{row}\n")
    suite = load_suite(str(path))
    with pytest.raises(ConfigError) as err:
        resolve_rows(suite, gpu_count=0)
    assert str(err.value).startswith(str(path))
    assert expected in str(err.value)


def test_an_unknown_suite_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"no suite named 'nope'; known suites: .*cpu-scaling"):
        load_suite("nope")


def test_a_user_suite_shadows_a_bundled_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDPTUI_PRESETS", str(tmp_path))
    (tmp_path / "suites").mkdir()
    write(tmp_path / "suites", '[[rows]]\npreset = "cpu-demo"\n', name="cpu-scaling.toml")
    suite = load_suite("cpu-scaling")
    assert [r.label for r in suite.rows] == ["cpu-demo"]
