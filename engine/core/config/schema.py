"""Typed, frozen, validated run configuration read from TOML presets.

Plain Python only: the UI imports this module, so it must never import torch.

Every check happens where the value is made: a section dataclass refuses an impossible value in
``__post_init__``; the loader refuses unknown sections and keys and wrong types. Each refusal is a
``ConfigError`` whose message is one sentence naming the file (or override) and the key.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_origin, get_type_hints

from engine.core.common.config_error import ConfigError as ConfigError
from engine.core.config.devices import parse_device_spec
from engine.core.config.faults import parse_fault

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

STRATEGIES = ("single", "dataparallel", "ddp")
PRECISIONS = ("fp32", "fp16", "bf16")
MODELS = ("small_cnn", "resnet18", "resnet34", "resnet50")
DATASETS = ("synthetic", "cifar10")
PIPELINES = ("tensor", "torchvision")
LR_SCALINGS = ("none", "linear")
OPTIMIZERS = ("sgd",)
BACKENDS = ("auto", "nccl", "gloo")
ON_DIVERGENCE = ("fail", "warn")


def _one_of(section: str, key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{section}.{key} is {value!r}; expected one of {', '.join(allowed)}")


def _positive(section: str, key: str, value: float, *, allow_zero: bool = False) -> None:
    _finite(f"{section}.{key}", value)
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{section}.{key} is {value!r}; it must be {bound}")


def _finite(key: str, value: float) -> None:
    """NaN and infinity are refused in every float key: a run with a NaN learning rate would
    "complete" having learnt nothing."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} is {value!r}; it must be a finite number")


@dataclass(frozen=True)
class StrategyConfig:
    name: str = "ddp"

    def __post_init__(self) -> None:
        _one_of("strategy", "name", self.name, STRATEGIES)


@dataclass(frozen=True)
class DevicesConfig:
    # auto | all | N | "0,2" | cpu | cpu:N  (GPU indices are NVML / PCI bus order)
    spec: str = "auto"
    # Allow more than engine.core.plan.resource_guard.CPU_RANKS_PER_CORE CPU ranks per usable core.
    oversubscribe: bool = False

    def __post_init__(self) -> None:
        parse_device_spec(self.spec)


@dataclass(frozen=True)
class PrecisionConfig:
    mode: str = "fp32"

    def __post_init__(self) -> None:
        _one_of("precision", "mode", self.mode, PRECISIONS)


_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _factory(section: str, value: str) -> None:
    if value and not _FACTORY.match(value):
        raise ConfigError(
            f"{section}.factory is {value!r}; expected package.module:callable, "
            "e.g. mymodels.resnet:build"
        )


def _plain_values(section: str, key: str, values: dict[str, Any]) -> None:
    for name, value in values.items():
        if not isinstance(value, (bool, int, float, str)):
            raise ConfigError(
                f"{section}.{key}.{name} is {value!r}; expected true/false, a number or a string"
            )


@dataclass(frozen=True)
class ModelConfig:
    name: str = "small_cnn"
    # Keep torchvision's 1,000-class ImageNet head, as the tutorial did, instead of the dataset's classes.
    imagenet_head: bool = False
    channels_last: bool = False
    # The data set's classes: every model's head (1,000 with imagenet_head).
    num_classes: int = 10
    # Your own model instead of ``name``: "package.module:callable" returning an nn.Module, called
    # with num_classes (when it takes it) and factory_args as keyword arguments.
    factory: str = ""
    factory_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _one_of("model", "name", self.name, MODELS)
        _positive("model", "num_classes", self.num_classes)
        _factory("model", self.factory)
        _plain_values("model", "factory_args", self.factory_args)

    @property
    def label(self) -> str:
        """What a summary and a table call this model."""
        return self.factory or self.name


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "synthetic"
    root: str = "~/.cache/ddptui/cifar10"
    download: bool = False
    pipeline: str = "tensor"
    num_workers: int = 2
    pin_memory: bool = True
    train_size: int = 50_000
    test_size: int = 10_000
    # Your own data instead of ``dataset``: "package.module:callable" returning (train, test)
    # data sets of (input tensor, label) pairs, called with factory_args as keyword arguments.
    # Its batches come through a DataLoader (num_workers, pin_memory), sampled as the built-ins.
    factory: str = ""
    factory_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _factory("data", self.factory)
        _plain_values("data", "factory_args", self.factory_args)
        _one_of("data", "dataset", self.dataset, DATASETS)
        _one_of("data", "pipeline", self.pipeline, PIPELINES)
        _positive("data", "num_workers", self.num_workers, allow_zero=True)
        _positive("data", "train_size", self.train_size)
        _positive("data", "test_size", self.test_size)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 0.001
    momentum: float = 0.9
    weight_decay: float = 0.0
    # linear: lr * global_batch / reference_batch, reached after warmup_steps.
    lr_scaling: str = "none"
    reference_batch: int = 256
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        _one_of("optimizer", "name", self.name, OPTIMIZERS)
        _one_of("optimizer", "lr_scaling", self.lr_scaling, LR_SCALINGS)
        _positive("optimizer", "lr", self.lr)
        _positive("optimizer", "momentum", self.momentum, allow_zero=True)
        _positive("optimizer", "weight_decay", self.weight_decay, allow_zero=True)
        _positive("optimizer", "reference_batch", self.reference_batch)
        _positive("optimizer", "warmup_steps", self.warmup_steps, allow_zero=True)


@dataclass(frozen=True)
class TrainingConfig:
    epochs: int = 1
    # Per process: what each rank's DataLoader yields. dataparallel splits it across its GPUs.
    batch_size: int = 256
    # Steps per epoch for quick runs; 0 means the whole epoch.
    max_steps: int = 0
    seed: int = 0
    evaluate: bool = True
    checkpoint: bool = True
    # Steps at the start of each epoch left out of steady-state throughput.
    warmup_steps: int = 5
    # Seconds between two step reports of one rank.
    report_interval: float = 0.25
    # A loss that becomes NaN or infinite: "fail" ends the run (training diverged at epoch E step
    # S on rank R); "warn" says so in the log and the summary and trains on.
    on_divergence: str = "fail"

    def __post_init__(self) -> None:
        _positive("training", "epochs", self.epochs)
        _positive("training", "batch_size", self.batch_size)
        _positive("training", "max_steps", self.max_steps, allow_zero=True)
        _positive("training", "seed", self.seed, allow_zero=True)
        _positive("training", "warmup_steps", self.warmup_steps, allow_zero=True)
        _positive("training", "report_interval", self.report_interval, allow_zero=True)
        _one_of("training", "on_divergence", self.on_divergence, ON_DIVERGENCE)


@dataclass(frozen=True)
class DdpConfig:
    backend: str = "auto"
    sync_batchnorm: bool = False
    gradient_as_bucket_view: bool = True
    # A collective that waits this long fails the rank (init_process_group's timeout) instead of
    # hanging for the backend's default (10-30 minutes); the stacks taken before the stop name
    # the rank it waited for.
    timeout_seconds: float = 300.0

    def __post_init__(self) -> None:
        _one_of("ddp", "backend", self.backend, BACKENDS)
        _positive("ddp", "timeout_seconds", self.timeout_seconds)


@dataclass(frozen=True)
class SupervisionConfig:
    # A rank silent this long is reported stalled. 0 (the default) follows the run's own pace:
    # stall_pace_multiple times the rank's recent gap between reports, never below
    # stall_floor_seconds; during a known slow phase (setup, the first steps of an epoch,
    # evaluation, checkpointing) slow_phase_seconds.
    stall_seconds: float = 0.0
    stall_floor_seconds: float = 10.0
    stall_pace_multiple: float = 10.0
    slow_phase_seconds: float = 600.0
    # A rank whose step time exceeds this multiple of the median of the others is a straggler.
    straggler_factor: float = 2.0
    # Kill the whole run once a rank has been stalled this long; 0 disables.
    kill_stalled_after: float = 0.0
    # After one rank fails, the others get this long to exit before they are killed.
    failure_grace_seconds: float = 5.0

    def __post_init__(self) -> None:
        _positive("supervision", "stall_seconds", self.stall_seconds, allow_zero=True)
        _positive("supervision", "stall_floor_seconds", self.stall_floor_seconds)
        _positive("supervision", "stall_pace_multiple", self.stall_pace_multiple)
        _positive("supervision", "slow_phase_seconds", self.slow_phase_seconds)
        _positive("supervision", "straggler_factor", self.straggler_factor)
        _positive("supervision", "kill_stalled_after", self.kill_stalled_after, allow_zero=True)
        _positive("supervision", "failure_grace_seconds", self.failure_grace_seconds)


@dataclass(frozen=True)
class ScriptConfig:
    """Your own training script instead of the engine's workload, started like torchrun would:
    one process per device, with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT."""

    path: str = ""  # a .py file, run as __main__
    module: str = ""  # or a module, as python -m runs it
    args: tuple[str, ...] = ()  # its command-line arguments

    def __post_init__(self) -> None:
        if self.path and self.module:
            raise ConfigError(
                f"script.path ({self.path!r}) and script.module ({self.module!r}) are both set; "
                "give one"
            )
        if self.module and not re.match(r"^[A-Za-z_][\w.]*$", self.module):
            raise ConfigError(f"script.module is {self.module!r}; expected package.module")

    @property
    def given(self) -> bool:
        return bool(self.path or self.module)

    @property
    def label(self) -> str:
        return self.path or f"-m {self.module}"


@dataclass(frozen=True)
class RunConfig:
    """One fully resolved run: a preset with every override applied."""

    name: str = "custom"
    description: str = ""
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    ddp: DdpConfig = field(default_factory=DdpConfig)
    supervision: SupervisionConfig = field(default_factory=SupervisionConfig)
    script: ScriptConfig = field(default_factory=ScriptConfig)
    # Fault injections "KIND:RANK:STEP" for tests (engine.train.faults).
    faults: tuple[str, ...] = ()

    @classmethod
    def for_script(cls, script: ScriptConfig) -> RunConfig:
        """The run of the user's script as it stands: named after the file or the module."""
        name = Path(script.path).stem if script.path else script.module.rsplit(".", 1)[-1]
        return cls(name=name, description=f"your script {script.label}", script=script)

    @property
    def workload(self) -> tuple[str, str]:
        """(model, data) as a summary and a table name them: the built-in ones, the user's
        factories, or the user's script."""
        if self.script.given:
            return self.script.label, "-"
        return self.model.label, self.data.factory or self.data.dataset

    def __post_init__(self) -> None:
        for fault in self.faults:
            parse_fault(fault)
        if self.script.given and self.strategy.name != "ddp":
            raise ConfigError(
                f"a script runs one process per device like torchrun, but strategy.name is "
                f"{self.strategy.name!r}; leave it at ddp (the script chooses its own strategy)"
            )
        if self.strategy.name == "single" and self.devices.spec.startswith("cpu:"):
            count = self.devices.spec.split(":", 1)[1]
            if count != "1":
                raise ConfigError(
                    f"strategy single runs one process, but devices.spec is {self.devices.spec!r}; "
                    "use ddp for several CPU ranks"
                )


SECTION_TYPES: dict[str, type] = {
    name: hint
    for name, hint in get_type_hints(RunConfig).items()
    if name not in ("name", "description", "faults")
}
TOP_LEVEL_KEYS = ("description", "faults")


def _coerce(where: str, key: str, value: Any, expected: Any) -> Any:
    """Check one TOML value against the dataclass field type; ints are accepted for floats."""
    origin = get_origin(expected)
    if origin is dict:
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return dict(value)
        raise ConfigError(f"{where}: {key} is {value!r}; expected a table like {{ width = 32 }}")
    if origin is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{where}: {key} is {value!r}; expected a list of strings")
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif expected is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                _finite(key, float(value))
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}") from None
            return float(value)
    elif expected is str:
        if isinstance(value, str):
            return value
        if key == "spec" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # devices.spec = 2 means two devices
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
    raise ConfigError(
        f"{where}: {key} is {value!r} ({type(value).__name__}); expected {names.get(expected, expected)}"
    )


def _build_section(where: str, section: str, cls: type, values: Mapping[str, Any]) -> Any:
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in hints:
            known = ", ".join(hints)
            raise ConfigError(f"{where}: unknown key {section}.{key} (known keys: {known})")
        kwargs[key] = _coerce(
            where, f"{section}.{key}" if key != "spec" else key, value, hints[key]
        )
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def config_from_mapping(data: Mapping[str, Any], *, name: str, where: str) -> RunConfig:
    """Build a RunConfig from parsed TOML. ``where`` names the file in every error."""
    sections: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTION_TYPES:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: [{key}] must be a table of keys")
            sections[key] = _build_section(where, key, SECTION_TYPES[key], value)
        elif key not in TOP_LEVEL_KEYS:
            known = ", ".join([*TOP_LEVEL_KEYS, *SECTION_TYPES])
            raise ConfigError(f"{where}: unknown section or key {key!r} (known: {known})")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{where}: description must be a string")
    faults = data.get("faults", [])
    if not isinstance(faults, list) or not all(isinstance(f, str) for f in faults):
        raise ConfigError(f"{where}: faults must be a list of strings like 'crash:1:3'")
    try:
        return RunConfig(name=name, description=description, faults=tuple(faults), **sections)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def read_toml_file(path: Path, what: str) -> dict[str, Any]:
    """Parse one TOML file; a missing, unreadable or malformed file is a ConfigError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what} file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
            "TOML files are UTF-8"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None


def load_config(path: Path, *, name: str | None = None) -> RunConfig:
    """Read and validate one preset file (or a run directory's config.toml)."""
    data = read_toml_file(path, "preset")
    preset_name = name or str(data.pop("name", path.stem))
    data.pop("name", None)
    return config_from_mapping(data, name=preset_name, where=str(path))


def parse_setting(item: str) -> tuple[str, str]:
    """One ``SECTION.KEY=VALUE`` as given to ``--set`` (or the launch form's set field)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{item!r} is not SECTION.KEY=VALUE")
    return key.strip(), value.strip()


def _parse_override_value(raw: str) -> Any:
    """``--set`` values are TOML literals; a bare word that is not one is a string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def apply_overrides(config: RunConfig, overrides: Mapping[str, Any]) -> RunConfig:
    """Return a copy with ``section.key`` overrides applied and re-validated.

    Values may be strings from the command line (parsed as TOML literals) or typed values.
    """
    data = to_mapping(config)
    for dotted, raw in overrides.items():
        where = f"override {dotted}={raw}"
        section, _, key = dotted.partition(".")
        value = _parse_override_value(raw) if isinstance(raw, str) else raw
        if section in TOP_LEVEL_KEYS and not key:
            data[section] = value
            continue
        if section not in SECTION_TYPES or not key:
            known = ", ".join(SECTION_TYPES)
            raise ConfigError(f"{where}: expected section.key with a section among {known}")
        hints = get_type_hints(SECTION_TYPES[section])
        if key not in hints:
            raise ConfigError(f"{where}: unknown key {dotted} (known keys: {', '.join(hints)})")
        if hints[key] is str and not isinstance(value, str):
            value = str(value) if not isinstance(value, bool) else value
        data[section][key] = value
    name = data.pop("name")
    return config_from_mapping(data, name=name, where="overrides")


def to_mapping(config: RunConfig) -> dict[str, Any]:
    """Plain nested dict (TOML-ready) of a config."""
    data = dataclasses.asdict(config)
    data["faults"] = list(config.faults)
    return data


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        pairs = ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + pairs + " }" if pairs else "{}"
    raise TypeError(f"cannot write {value!r} as TOML")


def to_toml(config: RunConfig) -> str:
    """The resolved config as TOML; ``load_config`` reads it back to an equal RunConfig."""
    data = to_mapping(config)
    lines = [f"name = {_toml_value(data.pop('name'))}"]
    for key in TOP_LEVEL_KEYS:
        lines.append(f"{key} = {_toml_value(data.pop(key))}")
    for section, values in data.items():
        lines.append(f"\n[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
    return "\n".join(lines) + "\n"
