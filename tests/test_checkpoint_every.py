"""``training.checkpoint_every``: steps, a time or epoch ends, refused with one sentence otherwise."""

from __future__ import annotations

import pytest

from engine.core.config.checkpoint_every import CheckpointEvery, parse_checkpoint_every
from engine.core.config.schema import ConfigError, RunConfig
from engine.core.config.toml_io import apply_overrides, load_config, to_toml


@pytest.mark.parametrize(
    ("text", "every"),
    [
        ("500", CheckpointEvery(steps=500)),
        ("90s", CheckpointEvery(seconds=90.0)),
        ("10m", CheckpointEvery(seconds=600.0)),
        ("1.5h", CheckpointEvery(seconds=5400.0)),
        ("epoch", CheckpointEvery()),
    ],
)
def test_each_form_means_its_interval(text: str, every: CheckpointEvery) -> None:
    assert parse_checkpoint_every(text) == every


@pytest.mark.parametrize("text", ["", "0", "-5", "2.5", "10 minutes", "every epoch", "0m"])
def test_anything_else_is_one_sentence_naming_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_checkpoint_every(text)
    assert caught.value.key == "training.checkpoint_every"
    assert str(caught.value).startswith("training.checkpoint_every is ")


def test_the_default_is_by_time_and_an_override_of_steps_round_trips(tmp_path) -> None:
    assert RunConfig().training.checkpoint_interval == CheckpointEvery(seconds=600.0)
    config = apply_overrides(RunConfig(), {"training.checkpoint_every": 250})
    assert config.training.checkpoint_interval.steps == 250
    path = tmp_path / "config.toml"
    path.write_text(to_toml(config), encoding="utf-8")
    assert load_config(path).training.checkpoint_every == "250"
    with pytest.raises(ConfigError, match=r"training\.checkpoint_every"):
        apply_overrides(RunConfig(), {"training.checkpoint_every": "soon"})


def test_a_whole_number_in_a_file_means_steps(tmp_path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('name = "x"\n[training]\ncheckpoint_every = 300\n', encoding="utf-8")
    assert load_config(path).training.checkpoint_interval == CheckpointEvery(steps=300)
