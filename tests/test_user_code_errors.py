"""A user's factory that goes wrong is one sentence naming the key and what it returned, checked
on the data sets' first samples before any training (issue 21, item 11): real factory modules,
and a real run whose model module calls sys.exit as it is imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.config.schema import ConfigError, DataConfig
from engine.core.runs.rundir import list_runs
from tests.fixtures.live_runs import ddptui
from tests.fixtures.repo import REPO_ROOT

BYO = REPO_ROOT / "tests" / "fixtures" / "byo"


@pytest.mark.parametrize(
    ("factory", "sentence"),
    [
        ("float_labels", "its train set's sample 0 has a torch.float32 tensor of shape () as its "
                         "label; expected one integer class"),
        ("string_labels", "its train set's sample 0 has a str ('cat') as its label; expected an "
                          "integer class"),
        ("mismatched_shapes", "its test set's sample 0 has an input of shape (8,), the first "
                              "train sample (16,); every input must have one shape"),
        ("tuple_inputs", "its train set's sample 0 has a tuple of 2 as its input; expected a "
                         "tensor"),
        ("labels_out_of_range", "its train set's sample 0 has label 7, outside 0..3 "
                                "(model.num_classes = 4)"),
    ],
)  # fmt: skip
def test_a_data_factory_returning_the_wrong_samples_names_the_key(
    byo_path: None, factory: str, sentence: str
) -> None:
    from engine.train.user_factories import user_datasets

    with pytest.raises(ConfigError) as err:
        user_datasets(DataConfig(factory=f"mymodels.data:{factory}"), 4)
    assert str(err.value) == f"data.factory = 'mymodels.data:{factory}': {sentence}"


@pytest.mark.slow
def test_a_model_module_calling_sys_exit_at_import_names_the_key(
    runs_dir: Path, byo_path: None
) -> None:
    done = ddptui(
        "run", str(BYO / "blobs.toml"), "--set", "model.factory=mymodels.exits:build",
        "--set", "model.factory_args={}", "--runs-dir", str(runs_dir), timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    (run_dir,) = list_runs(runs_dir)
    summary = run_dir.read_summary()
    assert summary is not None and summary.failure is not None
    assert summary.failure.error.endswith(
        "ConfigError: model.factory = 'mymodels.exits:build': importing mymodels.exits called "
        "sys.exit(3); a module the engine imports must not exit"
    ), summary.failure.error
    assert "SIGTERM" not in summary.reason
