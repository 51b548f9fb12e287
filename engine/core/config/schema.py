"""Typed, frozen, validated run configuration: what a run is asked to be.

Plain Python only: the UI imports this module, so it must never import torch.

Every check happens where the value is made: a section dataclass refuses an impossible value in
``__post_init__``, a ``ConfigError`` whose message is one sentence naming the key (its ``key``
and ``reason`` fields say the same in parts). Reading and writing TOML (unknown keys, wrong
types, overrides, the file named in every error) is ``engine.core.config.toml_io``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from engine.core.common.config_error import ConfigError as ConfigError
from engine.core.config.backend_sections import section_types
from engine.core.config.checkpoint_every import (
    DEFAULT_CHECKPOINT_EVERY,
    CheckpointEvery,
    parse_checkpoint_every,
)
from engine.core.config.devices import parse_device_spec
from engine.core.config.faults import parse_fault

STRATEGIES = ("single", "dataparallel", "ddp")
PRECISIONS = ("fp32", "fp16", "bf16")
MODELS = ("small_cnn", "resnet18", "resnet34", "resnet50")
DATASETS = ("synthetic", "cifar10")
PIPELINES = ("tensor", "torchvision")
LR_SCALINGS = ("none", "linear")
OPTIMIZERS = ("sgd",)
BACKENDS = ("auto", "nccl", "gloo")
ON_DIVERGENCE = ("fail", "warn")

Section = TypeVar("Section")


def _one_of(section: str, key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(
            f"{section}.{key} is {value!r}; expected one of {', '.join(allowed)}",
            key=f"{section}.{key}",
            reason=f"unknown {section}.{key} {value!r}",
        )


def _positive(section: str, key: str, value: float, *, allow_zero: bool = False) -> None:
    check_finite(f"{section}.{key}", value)
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(
            f"{section}.{key} is {value!r}; it must be {bound}",
            key=f"{section}.{key}",
            reason=f"{section}.{key} must be {bound}",
        )


def check_finite(key: str, value: float) -> None:
    """ConfigError for a NaN or an infinity: refused in every float key, since a run with a NaN
    learning rate would "complete" having learnt nothing."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            f"{key} is {value!r}; it must be a finite number",
            key=key,
            reason=f"{key} is not a finite number",
        )


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
            "e.g. mymodels.resnet:build",
            key=f"{section}.factory",
            reason=f"{section}.factory is not package.module:callable",
        )


def _plain_values(section: str, key: str, values: dict[str, Any]) -> None:
    for name, value in values.items():
        if not isinstance(value, (bool, int, float, str)):
            raise ConfigError(
                f"{section}.{key}.{name} is {value!r}; expected true/false, a number or a string",
                key=f"{section}.{key}.{name}",
                reason=f"{section}.{key}.{name} is not true/false, a number or a string",
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
    # Between epoch ends (each of which writes one): steps ("500"), a time ("10m") or "epoch"
    # (engine.core.config.checkpoint_every). A resumed run goes on from the newest checkpoint.
    checkpoint_every: str = DEFAULT_CHECKPOINT_EVERY
    # Steps at the start of each epoch left out of steady-state throughput.
    warmup_steps: int = 5
    # Seconds between two step reports of one rank.
    report_interval: float = 0.25
    # Split each rank's steps into data wait, forward, backward, sync, optimizer and other, with
    # torch's global hooks (engine.train.step_timing); false leaves the hooks out.
    step_timing: bool = True
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
        parse_checkpoint_every(self.checkpoint_every)

    @property
    def checkpoint_interval(self) -> CheckpointEvery:
        return parse_checkpoint_every(self.checkpoint_every)


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


LEFTOVER_CHOICES = ("stop", "leave")


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
    # Processes carrying the run's marker still alive when its ranks have all ended (a script's
    # daemon): "stop" them (the launcher's way: SIGTERM, a grace, SIGKILL) or "leave" them; the
    # summary names each either way.
    leftovers: str = "stop"
    # A rank that fails, or stays stalled past the stall rule (its stacks taken first): stop every
    # rank and start again from the newest checkpoint (step 0 without one), this many times at
    # most, waiting restart_backoff_seconds before the first restart and twice as long before
    # each next one (engine.core.runs.restart_policy). 0: a failure ends the run.
    max_restarts: int = 0
    restart_backoff_seconds: float = 2.0

    def __post_init__(self) -> None:
        _one_of("supervision", "leftovers", self.leftovers, LEFTOVER_CHOICES)
        _positive("supervision", "max_restarts", self.max_restarts, allow_zero=True)
        _positive(
            "supervision", "restart_backoff_seconds", self.restart_backoff_seconds, allow_zero=True
        )
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
    # The option that makes the script go on from a checkpoint ("--resume"; "--resume=" joins the
    # path to it): a restarted or resumed attempt gets it followed by the newest file the script
    # wrote in $DDPTUI_CHECKPOINT_DIR (engine.core.runs.resume_point). "": never given.
    resume_arg: str = ""

    def __post_init__(self) -> None:
        if self.path and self.module:
            raise ConfigError(
                f"script.path ({self.path!r}) and script.module ({self.module!r}) are both set; "
                "give one",
                key="script.module",
                reason="script.path and script.module are both set",
            )
        if self.resume_arg and not re.match(r"^--?[\w][\w.-]*=?$", self.resume_arg):
            raise ConfigError(
                f"script.resume_arg is {self.resume_arg!r}; expected an option such as --resume "
                "(or --resume= to join the checkpoint's path to it)",
                key="script.resume_arg",
                reason="script.resume_arg is not an option such as --resume",
            )
        if self.module and not re.match(r"^[A-Za-z_][\w.]*$", self.module):
            raise ConfigError(
                f"script.module is {self.module!r}; expected package.module",
                key="script.module",
                reason="script.module is not package.module",
            )

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
    # Each backend's own section (``[NAME]``, ``engine.core.config.backend_sections``) as that
    # backend's type read it: how the run asks that backend for its place when it runs there. A
    # section its type's defaults fill is left out, so it is neither kept nor written.
    backend_sections: dict[str, Any] = field(default_factory=dict)
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

    def backend_section(self, name: str, section_type: type[Section]) -> Section:
        """This run's ``[name]`` section, as the backend that registered it reads it (its
        defaults when the preset has none)."""
        found = self.backend_sections.get(name)
        return found if isinstance(found, section_type) else section_type()

    def _keep_backend_sections(self) -> None:
        """Only registered sections of their own type; those at their defaults left out."""
        types = section_types()
        kept = {}
        for name, section in self.backend_sections.items():
            if name not in types or not isinstance(section, types[name]):
                raise ValueError(f"[{name}] is no registered backend section of that type")
            if section != types[name]():
                kept[name] = section
        object.__setattr__(self, "backend_sections", kept)

    def __post_init__(self) -> None:
        self._keep_backend_sections()
        for fault in self.faults:
            parse_fault(fault)
        if self.script.given and self.strategy.name != "ddp":
            raise ConfigError(
                f"a script runs one process per device like torchrun, but strategy.name is "
                f"{self.strategy.name!r}; leave it at ddp (the script chooses its own strategy)",
                key="strategy.name",
                reason="a script runs under strategy ddp only",
            )
        spec = parse_device_spec(self.devices.spec)
        if self.strategy.name == "single" and spec.kind == "cpu" and spec.count != 1:
            raise ConfigError(
                f"strategy single runs one process, but devices.spec is {self.devices.spec!r}; "
                "use ddp for several CPU ranks",
                key="devices.spec",
                reason="strategy single runs one process",
            )
