"""Presets: typed, validated where they are read, one clear sentence per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.core.config.devices import DevicePlan, resolve_devices
from engine.core.config.presets import list_presets, load_preset
from engine.core.config.schema import ConfigError, RunConfig
from engine.core.config.toml_io import apply_overrides, load_config, to_toml
from engine.core.plan.run_plan import lr_at_step, plan_run

BUNDLED = ["cpu-demo", "fast-ddp", "seed-dataparallel", "seed-ddp", "seed-ddp-amp", "seed-single"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


def test_every_bundled_preset_loads_and_round_trips_through_toml(tmp_path: Path) -> None:
    names = [p.name for p in list_presets()]
    assert set(BUNDLED) <= set(names)
    for name in BUNDLED:
        config = load_preset(name)
        assert config.description, f"{name} has no description"
        again = load_config(write(tmp_path, to_toml(config)), name=name)
        assert again == config


def test_seed_presets_are_the_tutorial_setups() -> None:
    for name in ("seed-single", "seed-dataparallel", "seed-ddp", "seed-ddp-amp"):
        c = load_preset(name)
        assert (c.model.name, c.model.imagenet_head) == ("resnet50", True)
        assert (c.optimizer.lr, c.optimizer.momentum, c.training.epochs) == (0.001, 0.9, 1)
        assert (c.data.dataset, c.data.pipeline) == ("cifar10", "torchvision")
    assert load_preset("seed-ddp").ddp.sync_batchnorm
    assert load_preset("seed-ddp-amp").precision.mode == "fp16"
    assert load_preset("seed-single").training.batch_size == 256
    # DataParallel: one process, the tutorial's 4 x 256 batch split over 4 GPUs
    dp = load_preset("seed-dataparallel")
    assert (dp.strategy.name, dp.training.batch_size, dp.devices.spec) == (
        "dataparallel",
        1024,
        "4",
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[training]\nepochz = 2\n", "unknown key training.epochz"),
        ("[trainig]\nepochs = 2\n", "unknown section or key 'trainig'"),
        ('[training]\nepochs = "two"\n', "training.epochs is 'two' (str); expected a whole number"),
        ("[training]\nbatch_size = 0\n", "training.batch_size is 0; it must be > 0"),
        (
            '[strategy]\nname = "horovod"\n',
            "strategy.name is 'horovod'; expected one of single, dataparallel, ddp",
        ),
        ('[devices]\nspec = "gpu0"\n', "devices.spec is 'gpu0'"),
        ("[model]\nchannels_last = 1\n", "model.channels_last is 1 (int); expected true or false"),
        ("[training\nepochs = 2\n", "not valid TOML"),
        ('faults = ["boom:0:1"]\n', "fault 'boom:0:1' is not KIND:RANK:STEP"),
    ],
)
def test_broken_preset_is_one_sentence_naming_file_and_key(
    tmp_path: Path, text: str, fragment: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    assert fragment in message
    assert "\n" not in message


def test_overrides_are_typed_and_validated() -> None:
    config = load_preset("cpu-demo")
    changed = apply_overrides(
        config,
        {
            "training.epochs": "3",
            "optimizer.lr": "0.2",
            "devices.spec": "cpu:4",
            "model.channels_last": "true",
        },
    )
    assert changed.training.epochs == 3
    assert changed.optimizer.lr == 0.2
    assert changed.devices.spec == "cpu:4"
    assert changed.model.channels_last is True
    assert config.training.epochs == 2  # frozen original untouched
    with pytest.raises(ConfigError, match=r"unknown key training\.epoch "):
        apply_overrides(config, {"training.epoch": "3"})
    with pytest.raises(ConfigError, match=r"training\.epochs is 'x'"):
        apply_overrides(config, {"training.epochs": "x"})
    with pytest.raises(ConfigError, match=r"expected section\.key"):
        apply_overrides(config, {"nosuch": "1"})


@pytest.mark.parametrize(
    ("spec", "strategy", "gpus", "expected"),
    [
        ("auto", "ddp", 0, DevicePlan("cpu", cpu_ranks=2)),
        ("auto", "single", 0, DevicePlan("cpu", cpu_ranks=1)),
        ("auto", "ddp", 4, DevicePlan("cuda", gpu_indices=(0, 1, 2, 3))),
        ("auto", "single", 4, DevicePlan("cuda", gpu_indices=(0,))),
        ("all", "ddp", 2, DevicePlan("cuda", gpu_indices=(0, 1))),
        ("2", "ddp", 4, DevicePlan("cuda", gpu_indices=(0, 1))),
        ("0,2", "ddp", 4, DevicePlan("cuda", gpu_indices=(0, 2))),
        ("gpu:1", "single", 4, DevicePlan("cuda", gpu_indices=(1,))),
        ("gpu:0,3", "ddp", 4, DevicePlan("cuda", gpu_indices=(0, 3))),
        ("cpu", "single", 4, DevicePlan("cpu", cpu_ranks=1)),
        ("cpu:3", "ddp", 0, DevicePlan("cpu", cpu_ranks=3)),
    ],
)
def test_device_specs_resolve(spec: str, strategy: str, gpus: int, expected: DevicePlan) -> None:
    plan = resolve_devices(spec, strategy, gpus)
    assert plan == expected
    assert resolve_devices(plan.describe(), strategy, gpus) == plan  # describe() is a spec


@pytest.mark.parametrize(
    ("spec", "gpus", "fragment"),
    [
        ("0,4", 4, "names GPU 4, but this machine has GPUs 0 to 3"),
        ("3", 2, "asks for 3 GPUs, but this machine has 2"),
        ("all", 0, "this machine has none visible to NVML"),
        ("1,1", 4, "names a GPU twice"),
        ("cpu:0", 0, "expected auto, all"),
    ],
)
def test_impossible_device_sets_are_refused(spec: str, gpus: int, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        resolve_devices(spec, "ddp", gpus)


def cfg(**overrides: str) -> RunConfig:
    return apply_overrides(load_preset("cpu-demo"), overrides)


def test_plan_refuses_what_cannot_run_here() -> None:
    with pytest.raises(ConfigError, match="fp16 needs CUDA"):
        plan_run(cfg(**{"precision.mode": "fp16"}), gpu_count=0)
    with pytest.raises(ConfigError, match="dataparallel needs CUDA"):
        plan_run(cfg(**{"strategy.name": "dataparallel", "devices.spec": "auto"}), gpu_count=0)
    with pytest.raises(ConfigError, match="batch_size 250 does not divide by the 4 GPUs"):
        plan_run(
            cfg(
                **{
                    "strategy.name": "dataparallel",
                    "devices.spec": "4",
                    "training.batch_size": "250",
                }
            ),
            gpu_count=4,
        )
    with pytest.raises(ConfigError, match="single uses one device"):
        plan_run(cfg(**{"strategy.name": "single", "devices.spec": "2"}), gpu_count=4)
    with pytest.raises(ConfigError, match="nccl needs CUDA"):
        plan_run(cfg(**{"ddp.backend": "nccl"}), gpu_count=0)


def test_missing_cifar_names_the_path_and_the_alternatives(tmp_path: Path) -> None:
    config = cfg(**{"data.dataset": "cifar10", "data.root": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError) as err:
        plan_run(config, gpu_count=0)
    assert str(tmp_path / "nowhere" / "cifar-10-batches-py") in str(err.value)
    assert "--data synthetic" in str(err.value)
    # asking to download is allowed: the check is left to the download
    plan_run(apply_overrides(config, {"data.download": "true"}), gpu_count=0)


def test_plan_figures_and_linear_lr_scaling() -> None:
    plan = plan_run(cfg(), gpu_count=0)
    assert (plan.world_size, plan.global_batch, plan.backend) == (2, 256, "gloo")
    dp = plan_run(
        cfg(**{"strategy.name": "dataparallel", "devices.spec": "2", "training.batch_size": "512"}),
        2,
    )
    assert (dp.world_size, dp.global_batch, dp.backend) == (1, 512, None)
    scaled = plan_run(
        cfg(
            **{
                "optimizer.lr_scaling": "linear",
                "optimizer.reference_batch": "128",
                "optimizer.warmup_steps": "4",
            }
        ),
        gpu_count=0,
    )
    assert scaled.base_lr == pytest.approx(0.05 * 256 / 128)
    assert [lr_at_step(scaled, s) for s in range(5)] == pytest.approx(
        [0.025, 0.05, 0.075, 0.1, 0.1]
    )
    assert lr_at_step(plan, 0) == 0.05


def test_sync_batchnorm_on_cpu_ranks_is_refused_before_launch() -> None:
    with pytest.raises(ConfigError, match=r"ddp\.sync_batchnorm needs CUDA"):
        plan_run(cfg(**{"ddp.sync_batchnorm": "true"}), gpu_count=0)
    assert (
        plan_run(cfg(**{"ddp.sync_batchnorm": "true", "devices.spec": "2"}), gpu_count=2).backend
        == "nccl"
    )


@pytest.mark.parametrize(
    "plan",
    [
        DevicePlan("cpu", cpu_ranks=1),
        DevicePlan("cpu", cpu_ranks=3),
        DevicePlan("cuda", gpu_indices=(0,)),
        DevicePlan("cuda", gpu_indices=(0, 2)),
    ],
)
def test_a_described_device_set_reads_back_through_the_one_parser(plan: DevicePlan) -> None:
    assert DevicePlan.from_description(plan.describe()) == plan


@pytest.mark.parametrize("text", ["auto", "all", "2", "0,2", "", "gpu:", "gpu:x", "cpu:0", "tpu:1"])
def test_what_is_not_a_described_device_set_is_none(text: str) -> None:
    # run.json / summary.json hold what describe() wrote; anything else is not guessed at
    assert DevicePlan.from_description(text) is None


def test_readers_of_a_runs_devices_use_the_parser() -> None:
    from engine.core.common.statuses import RunStatus
    from engine.core.runs.run_state import RunState

    state = RunState(run_id="r", path=Path("r"), status=RunStatus.RUNNING, devices="gpu:1,3")
    assert state.gpu_indices == (1, 3)
    assert RunState(run_id="r", path=Path("r"), status=RunStatus.RUNNING).gpu_indices == ()


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("[training]\nepochz = 2\n", "training.epochz", "unknown key training.epochz"),
        (
            '[training]\nepochs = "two"\n',
            "training.epochs",
            "training.epochs is not a whole number",
        ),
        ("[training]\nbatch_size = 0\n", "training.batch_size", "training.batch_size must be > 0"),
        ("[optimizer]\nlr = nan\n", "optimizer.lr", "optimizer.lr is not a finite number"),
        ('[strategy]\nname = "horovod"\n', "strategy.name", "unknown strategy.name 'horovod'"),
        ('[devices]\nspec = "gpu0"\n', "devices.spec", "devices.spec 'gpu0' is not a device set"),
        ("[devices]\nspec = true\n", "devices.spec", "devices.spec is not a string"),
        (
            '[model]\nfactory = "x"\n',
            "model.factory",
            "model.factory is not package.module:callable",
        ),
        (
            'faults = ["boom:0:1"]\n',
            "faults",
            "fault 'boom:0:1' is not KIND:RANK:STEP[:ATTEMPTS]",
        ),
        ("[training\nepochs = 2\n", "", "not valid TOML"),
    ],
)
def test_a_config_error_names_its_file_key_and_reason_apart(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert (err.value.where, err.value.key, err.value.reason) == (str(path), key, reason)
    assert str(err.value).startswith(f"{path}: ")  # the sentence is whole, as before


def test_a_refused_plan_and_override_carry_the_short_reason_the_preset_list_shows() -> None:
    config = load_preset("cpu-demo")
    cases = [
        (apply_overrides(config, {"devices.spec": "3"}), 2, "devices.spec", "needs 3 GPUs, 2 here"),
        (
            apply_overrides(config, {"devices.spec": "all"}),
            0,
            "devices.spec",
            "needs a GPU, none here",
        ),
        (
            apply_overrides(config, {"strategy.name": "dataparallel", "devices.spec": "cpu:1"}),
            0,
            "strategy.name",
            "strategy dataparallel needs CUDA",
        ),
        (
            apply_overrides(config, {"data.dataset": "cifar10", "data.root": "/nonexistent"}),
            0,
            "data.root",
            "CIFAR-10 is not on disk",
        ),
    ]
    for refused, gpus, key, reason in cases:
        with pytest.raises(ConfigError) as err:
            plan_run(refused, gpus)
        assert (err.value.where, err.value.key, err.value.reason) == ("", key, reason)
        assert reason not in ("", str(err.value))
    with pytest.raises(ConfigError) as err:
        apply_overrides(config, {"training.epoch": "3"})
    assert err.value.where == "override training.epoch=3"
    assert (err.value.key, err.value.reason) == ("training.epoch", "unknown key training.epoch")
    with pytest.raises(ConfigError) as err:
        apply_overrides(config, {"training.epochs": "0"})
    assert (err.value.where, err.value.key) == ("overrides", "training.epochs")


def test_a_config_error_said_of_an_outer_place_keeps_its_parts() -> None:
    import pickle

    inner = ConfigError(
        "devices.spec is 'x'; expected ...", where="a.toml", key="devices.spec", reason="bad"
    )
    outer = inner.within("suite.toml: row 'r'")
    assert str(outer) == "suite.toml: row 'r': a.toml: devices.spec is 'x'; expected ..."
    assert (outer.where, outer.key, outer.reason) == ("a.toml", "devices.spec", "bad")
    bare = ConfigError("no presets given").within("suite x")
    assert (bare.where, bare.reason) == ("suite x", "no presets given")
    again = pickle.loads(pickle.dumps(outer))  # it may cross a process boundary
    assert (str(again), again.where, again.key, again.reason) == (
        str(outer),
        outer.where,
        outer.key,
        outer.reason,
    )


def test_an_unknown_key_is_one_sentence_naming_it_and_the_known_ones() -> None:
    from engine.core.config.known_keys import check_known_keys

    check_known_keys(["a"], ("a", "b"), where="f.toml")  # known: nothing raised
    cases = [
        ({}, "unknown key 'c' (known keys: a, b)", "c"),
        ({"section": "s"}, "unknown key s.c (known keys: a, b)", "s.c"),
        ({"section": "rows", "entry": "rows entry 2"}, "unknown key 'c' in rows entry 2", "rows.c"),
        ({"what": "section or key"}, "unknown section or key 'c' (known: a, b)", "c"),
    ]
    for options, sentence, key in cases:
        with pytest.raises(ConfigError) as err:
            check_known_keys(["a", "c"], ("a", "b"), where="f.toml", **options)
        assert str(err.value).startswith("f.toml") and sentence in str(err.value)
        assert err.value.key == key
