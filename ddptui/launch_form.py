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
from engine.core.config.toml_io import apply_overrides, parse_setting, to_mapping
from engine.core.host.gpus import GpuInventory
from engine.core.plan.preset_check import PresetCheck
from engine.core.plan.run_plan import RunPlan, plan_run

if TYPE_CHECKING:  # the app's first frame needs no resource guard yet
    from engine.core.plan.resource_guard import ResourceCheck

    ResourceChecker = Callable[[RunPlan, GpuInventory | None], ResourceCheck]
    # A config to run with another backend (its name), checked as ``ddptui run`` with that
    # backend's flag checks it: each node's plan.
    PlacementChecker = Callable[[str, RunConfig], RunPlan]
    # A config and its plan, checked for the machine's queue as ``ddptui run --queue`` does.
    QueueChecker = Callable[[RunConfig, RunPlan], None]

NOW = "now"
WHEN_FREE = "free"  # queued: it starts when its devices are free (``ddptui run --queue``)
QUEUE_ELSEWHERE = "when free is for this machine; elsewhere, the scheduler queues the run itself"


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
    # Where to run: "" (this machine) or the name of the backend that places the run on other
    # machines, with the where row's fields (ddptui.widgets.where_to_run) as the config keys
    # they set, each as typed; the devices are then each node's.
    where: str = ""
    where_fields: Mapping[str, str] = field(default_factory=dict)
    when: str = NOW  # NOW, or WHEN_FREE: wait in this machine's queue for the devices

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
    )


def device_spec(form: LaunchForm) -> str:
    """``gpu:0,2`` for the picked GPUs, else ``cpu:N`` from the CPU ranks field. On other
    machines the devices are each node's, and their scheduler picks a node's GPUs: as many as
    are picked here."""
    picked = sorted(form.picked_gpus) if form.gpus_offered else []
    if picked:
        return str(len(picked)) if form.where else "gpu:" + ",".join(str(i) for i in picked)
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
    if form.where:
        found.update(where_overrides(config, form))
    return found


def where_overrides(config: RunConfig, form: LaunchForm) -> dict[str, Any]:
    """The where row's fields that differ from the preset's section of that backend: a number
    where the preset has one, else the text as typed, without the spaces around it."""
    found: dict[str, Any] = {}
    preset = to_mapping(config)
    for key, typed in form.where_fields.items():
        section, _, name = key.partition(".")
        value: Any = typed.strip()
        if isinstance(preset[section][name], int):
            if not value:
                raise ConfigError(f"{name} is empty; give a number")
            value = int(value)
        if value != preset[section][name]:
            found[key] = value
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
    where: str = ""  # checked for the backend of that name: ``plan`` is each node's, no guard
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
    elsewhere: PlacementChecker | None = None,
    queue: QueueChecker | None = None,
) -> FormCheck:
    """Apply ``form`` to the preset of ``check`` and plan it for a machine with ``gpu_count`` GPUs
    (``inventory`` as last sampled), with the guard ``start_run`` applies too; or, to run with
    another backend, check it as ``ddptui run`` with its flag does (``elsewhere``: what that
    backend asks of its scheduler). A form that waits for free devices is also checked as
    ``ddptui run --queue`` checks it (``queue``: the devices it waits for, the claim store). Never
    raises for what the user typed."""
    if check is None or check.config is None:
        return FormCheck(check, form, problem="pick a preset that can be read")
    preset_devices = check.devices_asked(gpu_count)
    try:
        overrides = form_overrides(check.config, form, preset_devices)
        config = apply_overrides(check.config, overrides) if overrides else check.config
        if form.where and form.queued:
            raise ConfigError(QUEUE_ELSEWHERE)
        if form.where:
            if elsewhere is None:
                raise ConfigError(f"{form.where} cannot be asked from here")
            plan = elsewhere(form.where, config)
            return FormCheck(check, form, config, plan, None, overrides, where=form.where)
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
