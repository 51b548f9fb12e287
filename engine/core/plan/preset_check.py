"""Whether each preset can run on this machine, and why not: the one check behind ``ddptui
presets`` (and its ``--json``), the launch screen's preset list and its ``o`` script entry.

Plain Python. A preset is read with ``engine.core.config.presets.load_preset_file`` (the loader
``ddptui run`` uses too), so a script it names by a relative path is the one beside the preset file,
wherever ddptui was started from; then it is planned for the machine (``plan_run``) and, when a
resource check is given, checked against the machine's cores, memory and GPUs as ``start_run``
checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.core.config.devices import DevicePlan, resolve_devices
from engine.core.config.presets import PresetFile, list_presets, load_preset_file
from engine.core.config.schema import ConfigError, RunConfig
from engine.core.plan.run_plan import RunPlan, plan_run

if TYPE_CHECKING:  # the launch screen, the app's first frame, needs no resource guard yet
    from engine.core.plan.resource_guard import ResourceCheck

    # What the caller checks a plan against beyond the plan itself (the resource guard, as the
    # caller binds it to its machine); it raises ConfigError (ResourceError) when it does not fit.
    ResourceRule = Callable[[RunPlan], ResourceCheck]


@dataclass(frozen=True)
class PresetCheck:
    """One preset: its config (None when the file cannot be read), its plan here (None when it
    cannot run here) and the reason it cannot, empty when it can: ``reason`` the whole sentence,
    ``short_reason`` its gist for a list that names the preset already (``ConfigError.reason``:
    "needs 4 GPUs, 2 here", "CIFAR-10 is not on disk")."""

    name: str
    path: Path
    bundled: bool
    config: RunConfig | None
    plan: RunPlan | None
    reason: str
    short_reason: str = ""
    resources: ResourceCheck | None = None  # when a resource rule was given and the plan fits

    @property
    def runnable(self) -> bool:
        return self.plan is not None

    @property
    def broken(self) -> bool:
        """The preset file itself is bad (not UTF-8, not TOML, a wrong key): no config at all."""
        return self.config is None

    def devices_asked(self, gpu_count: int) -> DevicePlan | None:
        """The devices the preset asks for on a machine with ``gpu_count`` GPUs, even when
        something else (missing data, a precision) stops it from running as it stands; None when
        its device spec cannot be met or the file cannot be read."""
        if self.plan is not None:
            return self.plan.devices
        if self.config is None:
            return None
        try:
            config = self.config
            return resolve_devices(config.devices.spec, config.strategy.name, gpu_count)
        except ConfigError:
            return None


def check_config(
    config: RunConfig,
    gpu_count: int,
    resources: ResourceRule | None = None,
    *,
    name: str,
    path: Path,
    bundled: bool = False,
) -> PresetCheck:
    """``config`` planned for a machine with ``gpu_count`` GPUs (and checked by ``resources``)."""
    try:
        plan = plan_run(config, gpu_count)
        fits = resources(plan) if resources is not None else None
    except ConfigError as err:
        return PresetCheck(name, path, bundled, config, None, str(err), err.reason)
    return PresetCheck(name, path, bundled, config, plan, "", resources=fits)


def check_preset(
    preset: PresetFile, gpu_count: int, resources: ResourceRule | None = None
) -> PresetCheck:
    """One preset file read, planned and (with ``resources``) checked; never raises ConfigError."""
    try:
        config = load_preset_file(preset)
    except ConfigError as err:  # the file itself is bad: the others are still listed
        return PresetCheck(
            preset.name, preset.path, preset.bundled, None, None, str(err), err.reason
        )
    return check_config(
        config, gpu_count, resources, name=preset.name, path=preset.path, bundled=preset.bundled
    )


def check_presets(gpu_count: int, resources: ResourceRule | None = None) -> list[PresetCheck]:
    """Every preset (``list_presets``' order), each with the reason it cannot run here, if any."""
    return [check_preset(preset, gpu_count, resources) for preset in list_presets()]


def plan_user_script(config: RunConfig, gpu_count: int) -> PresetCheck:
    """The user's own script (a config made by ``RunConfig.for_script``), listed as a preset is:
    named ``<name> (script)``, planned for this machine."""
    script = config.script
    where = Path(script.path) if script.path else Path(script.module)
    return check_config(config, gpu_count, name=f"{config.name} (script)", path=where)
