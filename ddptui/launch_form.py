"""The Launch screen's form as plain values, and what it makes of a preset.

Plain Python (no textual): the screen reads its fields into a ``LaunchForm`` on the UI thread and
hands it to ``check_form`` in a thread worker, which applies it to the preset and plans the result
for this machine (reading /proc and cgroup files through the resource guard). ``form_for`` is the
other way: the values a preset fills the form with.

A field left as the preset has it is no override; only what differs from the preset becomes one,
so the overrides the screen shows are the ones the user made.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.core.config.devices import DevicePlan
from engine.core.config.schema import ConfigError, RunConfig
from engine.core.config.toml_io import apply_overrides, parse_setting
from engine.core.host.gpus import GpuInventory
from engine.core.plan.preset_check import PresetCheck
from engine.core.plan.run_plan import RunPlan, plan_run

if TYPE_CHECKING:  # the app's first frame needs no resource guard yet
    from engine.core.plan.resource_guard import ResourceCheck

    ResourceChecker = Callable[[RunPlan, GpuInventory | None], ResourceCheck]
    # A config to run on Slurm, checked as ``ddptui run --slurm`` checks it: each node's plan.
    SlurmChecker = Callable[[RunConfig], RunPlan]
    # A config and its plan, checked for the machine's queue as ``ddptui run --queue`` does.
    QueueChecker = Callable[[RunConfig, RunPlan], None]

NOW = "now"
WHEN_FREE = "free"  # queued: it starts when its devices are free (``ddptui run --queue``)
QUEUE_ON_SLURM = "when free is for this machine; on Slurm, Slurm queues the job"


@dataclass(frozen=True)
class NumberField:
    """A whole-number field of the form: the widget's id, the config key it sets, its label."""

    input_id: str
    key: str
    label: str


NUMBER_FIELDS = (
    NumberField("epochs", "training.epochs", "epochs"),
    NumberField("max-steps", "training.max_steps", "max steps"),
    NumberField("batch", "training.batch_size", "batch/rank"),
    NumberField("train-size", "data.train_size", "images"),
)
# The fields that set the engine's own workload: a script run takes its own arguments instead.
ENGINE_FIELDS = (*(f.input_id for f in NUMBER_FIELDS), "precision", "dataset")


@dataclass(frozen=True)
class LaunchForm:
    """What the form's fields say, as typed (numbers are text until they are checked)."""

    numbers: Mapping[str, str] = field(default_factory=dict)  # config key -> its field's text
    precision: str | None = None
    dataset: str | None = None
    script_args: str = ""
    set_values: str = ""  # section.key=value items, as --set takes them
    gpus_offered: bool = False  # NVML lists GPUs, so the picker is shown
    picked_gpus: tuple[int, ...] = ()
    cpu_ranks: str = ""
    # Where to run: "here" (this machine) or "slurm", with Slurm's partition ("" its default),
    # nodes and time limit ("" the partition's); the devices are then each node's.
    where: str = "here"
    partition: str = ""
    nodes: str = "1"
    time_limit: str = ""
    when: str = NOW  # NOW, or WHEN_FREE: wait in this machine's queue for the devices

    @property
    def on_slurm(self) -> bool:
        return self.where == "slurm"

    @property
    def queued(self) -> bool:
        return self.when == WHEN_FREE


def preset_numbers(config: RunConfig) -> dict[str, int]:
    """The preset's values of the number fields, by config key."""
    return {
        "training.epochs": config.training.epochs,
        "training.max_steps": config.training.max_steps,
        "training.batch_size": config.training.batch_size,
        "data.train_size": config.data.train_size,
    }


def form_for(config: RunConfig, devices: DevicePlan | None, offered: set[int]) -> LaunchForm:
    """The form as a preset fills it: its values, its GPUs picked (those of ``offered``) even when
    it cannot run as it stands (so fixing its data never turns it into a CPU run), else its CPU
    ranks (two for DDP, one otherwise, when its device spec cannot be met)."""
    picked: tuple[int, ...] = ()
    ranks = 2 if config.strategy.name == "ddp" else 1
    if devices is not None and devices.kind == "cuda":
        picked = tuple(i for i in devices.gpu_indices if i in offered)
    elif devices is not None:
        ranks = devices.cpu_ranks
    return LaunchForm(
        numbers={key: str(value) for key, value in preset_numbers(config).items()},
        precision=config.precision.mode,
        dataset=config.data.dataset,
        script_args=shlex.join(config.script.args),
        gpus_offered=bool(offered),
        picked_gpus=picked,
        cpu_ranks=str(ranks),
        partition=config.slurm.partition,
        nodes=str(config.slurm.nodes),
        time_limit=config.slurm.time,
    )


def device_spec(form: LaunchForm) -> str:
    """``gpu:0,2`` for the picked GPUs, else ``cpu:N`` from the CPU ranks field. On Slurm the
    devices are each node's, and Slurm picks a node's GPUs: as many as are picked here."""
    picked = sorted(form.picked_gpus) if form.gpus_offered else []
    if picked:
        return str(len(picked)) if form.on_slurm else "gpu:" + ",".join(str(i) for i in picked)
    raw = form.cpu_ranks.strip()
    if not raw:
        raise ConfigError("CPU ranks is empty; give a number")
    ranks = int(raw)
    if ranks < 1:
        raise ConfigError("CPU ranks must be at least 1")
    return f"cpu:{ranks}"


def engine_overrides(config: RunConfig, form: LaunchForm) -> dict[str, Any]:
    """The engine fields that differ from the preset, as ``section.key`` overrides."""
    found: dict[str, Any] = {}
    preset = preset_numbers(config)
    for number in NUMBER_FIELDS:
        raw = form.numbers.get(number.key, "").strip()
        if not raw:
            raise ConfigError(f"{number.label} is empty; give a number")
        value = int(raw)
        if value != preset[number.key]:
            found[number.key] = value
    if form.precision is not None and form.precision != config.precision.mode:
        found["precision.mode"] = form.precision
    if form.dataset is not None and form.dataset != config.data.dataset:
        found["data.dataset"] = form.dataset
    return found


def form_overrides(
    config: RunConfig, form: LaunchForm, preset_devices: DevicePlan | None
) -> dict[str, Any]:
    """Every field that differs from the preset, as ``section.key`` overrides: the ``set`` items
    first, then the fields (which win), then the devices. Raises ConfigError, or ValueError for a
    quote left open or a number that is not one."""
    found: dict[str, Any] = {}
    for item in shlex.split(form.set_values):
        key, value = parse_setting(item)
        found[key] = value
    if config.script.given:
        args = tuple(shlex.split(form.script_args))
        if args != config.script.args:
            found["script.args"] = list(args)
    else:
        found.update(engine_overrides(config, form))
    spec = device_spec(form)
    if preset_devices is None or spec != preset_devices.describe():
        found["devices.spec"] = spec
    if form.on_slurm:
        found.update(slurm_overrides(config, form))
    return found


def slurm_overrides(config: RunConfig, form: LaunchForm) -> dict[str, Any]:
    """The where-to-run fields that differ from the preset's [slurm] section."""
    found: dict[str, Any] = {}
    raw = form.nodes.strip()
    if not raw:
        raise ConfigError("nodes is empty; give a number")
    if int(raw) != config.slurm.nodes:
        found["slurm.nodes"] = int(raw)
    if form.partition != config.slurm.partition:
        found["slurm.partition"] = form.partition
    if form.time_limit.strip() != config.slurm.time:
        found["slurm.time"] = form.time_limit.strip()
    return found


@dataclass(frozen=True)
class FormCheck:
    """What a form makes of a preset: the config to start with its plan here and the resource
    guard's figures, or the one sentence why not (``problem``)."""

    check: PresetCheck | None
    form: LaunchForm
    config: RunConfig | None = None
    plan: RunPlan | None = None
    resources: ResourceCheck | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    problem: str = ""
    gpu_preset_on_cpu: bool = False  # the preset asks for GPUs, and this would run on the CPU
    on_slurm: bool = False  # checked for Slurm: ``plan`` is each node's, no guard here
    queued: bool = False  # checked for the machine's queue: it starts when its devices are free

    @property
    def ok(self) -> bool:
        return self.config is not None


def check_form(
    check: PresetCheck | None,
    form: LaunchForm,
    gpu_count: int,
    inventory: GpuInventory | None,
    resources: ResourceChecker,
    slurm: SlurmChecker | None = None,
    queue: QueueChecker | None = None,
) -> FormCheck:
    """Apply ``form`` to the preset of ``check`` and plan it for a machine with ``gpu_count`` GPUs
    (``inventory`` as last sampled), with the guard ``start_run`` applies too; or, to run on
    Slurm, check it as ``ddptui run --slurm`` does (``slurm``: its partition and nodes asked of
    Slurm). A form that waits for free devices is also checked as ``ddptui run --queue`` checks
    it (``queue``: the devices it waits for, the claim store). Never raises for what the user
    typed."""
    if check is None or check.config is None:
        return FormCheck(check, form, problem="pick a preset that can be read")
    preset_devices = check.devices_asked(gpu_count)
    try:
        overrides = form_overrides(check.config, form, preset_devices)
        config = apply_overrides(check.config, overrides) if overrides else check.config
        if form.on_slurm and form.queued:
            raise ConfigError(QUEUE_ON_SLURM)
        if form.on_slurm:
            if slurm is None:
                raise ConfigError("Slurm cannot be asked from here")
            plan = slurm(config)
            return FormCheck(check, form, config, plan, None, overrides, on_slurm=True)
        plan = plan_run(config, gpu_count)
        fits = resources(plan, inventory)  # ResourceError is a ConfigError
        if form.queued:
            if queue is None:
                raise ConfigError("the machine's queue cannot be asked from here")
            queue(config, plan)  # ClaimStoreError is a ConfigError
    except (ConfigError, ValueError) as err:  # ValueError: a quote left open, a non-number
        return FormCheck(check, form, problem=str(err))
    on_cpu = preset_devices is not None and preset_devices.kind == "cuda"
    return FormCheck(
        check,
        form,
        config,
        plan,
        fits,
        overrides,
        gpu_preset_on_cpu=on_cpu and plan.devices.kind == "cpu",
        queued=form.queued,
    )
