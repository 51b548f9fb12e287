"""What the Launch screen writes, as Rich text: a preset's entry in the list and its details, the
form's check (the plan here, the resource guard's figures and warnings, or why not), and a GPU's
line in the device picker. Pure functions of plain values; no widget is touched here."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.text import Text

from ddptui.launch_form import FormCheck
from ddptui.widgets.where_to_run import STARTING as SUBMITTING
from ddptui.widgets.where_to_run import describe_submission
from engine.core.common import formatting
from engine.core.config.schema import RunConfig
from engine.core.host.gpus import GpuSample
from engine.core.plan.preset_check import PresetCheck
from engine.core.plan.run_plan import RunPlan

if TYPE_CHECKING:
    from engine.core.plan.resource_guard import ResourceCheck


def preset_entry(check: PresetCheck, yours: bool) -> Any:
    """A preset in the list: a mark and its name (``(yours)`` for a user preset), and under it the
    gist of why it cannot run here."""
    name = Text(no_wrap=True, overflow="ellipsis")
    name.append("✓ " if check.runnable else "✗ ", style="green" if check.runnable else "red")
    name.append(check.name)
    if yours:
        name.append(" (yours)", style="cyan")
    if check.runnable:
        return name
    why = Text("  " + check.short_reason, "dim red", no_wrap=True, overflow="ellipsis")
    return Group(name, why)


def preset_details(check: PresetCheck) -> Text:
    """Above the form: what the preset is, or why it cannot be read or run."""
    if check.config is None:
        return Text(f"✗ {check.name} cannot be read: {check.reason}", style="red")
    text = describe_config(check.config)
    if check.plan is None:
        text.append(f"\n✗ as it is, it cannot run here: {check.reason}", style="red")
    return text


def describe_config(config: RunConfig) -> Text:
    """What the form below does not show: the description, model, pipeline, optimiser, faults."""
    text = Text()
    if config.description:
        text.append(config.description + "\n", style="italic")
    if config.script.given:
        text.append(config.script.label, style="bold")
        if config.script.args:
            text.append(" " + shlex.join(config.script.args))
        text.append(
            "\none process per device, started like torchrun; the script has its own "
            "epochs, batch and precision (its arguments below)",
            style="dim",
        )
        return text
    text.append(config.strategy.name, style="bold")
    text.append(f" · {config.model.name} · {config.data.pipeline} pipeline")
    text.append(f" · lr {config.optimizer.lr:g}")
    if config.optimizer.lr_scaling != "none":
        text.append(f" ({config.optimizer.lr_scaling} scaling)")
    if config.faults:
        text.append(f" · faults {', '.join(config.faults)}", style="yellow")
    return text


def describe_plan(plan: RunPlan, queued: bool = False) -> Text:
    text = Text("✓ queues here, starts when free: " if queued else "✓ runs here: ", style="green")
    what = plan.devices.describe()
    ranks = f"{what}, {plan.world_size} rank{'s' if plan.world_size != 1 else ''}"
    if plan.config.script.given:  # batch, backend and lr are the script's own
        text.append(ranks)
        return text
    text.append(
        f"{ranks}, global batch {plan.global_batch}"
        + (f", {plan.backend}" if plan.backend else "")
        + f", lr {plan.base_lr:g}"
    )
    return text


def describe_resources(resources: ResourceCheck) -> Text:
    """The resource guard's figures for a plan that fits, and its warnings."""
    estimate = resources.estimate
    text = Text(
        f"\n  host memory ~{formatting.gib(estimate.host_bytes)} of "
        f"{formatting.gib(resources.available_bytes)} GiB available",
        style="dim",
    )
    if resources.device_bytes_per_gpu:
        text.append(f", ~{formatting.gib(resources.device_bytes_per_gpu)} GiB per GPU", "dim")
    for warning in resources.warnings:
        text.append(f"\n  ⚠ {warning}", style="yellow")
    return text


def describe_form_check(checked: FormCheck) -> Text:
    """Under the form: the plan it makes here with the guard's figures and the overrides, and a
    warning when a GPU preset would run on the CPU; or the one sentence why it cannot start."""
    if checked.check is None or checked.check.config is None:
        return Text(f"✗ {checked.problem}", style="red")
    if checked.where and checked.plan is not None and checked.config is not None:
        return describe_submission(checked.plan, checked.config, checked.overrides)
    if checked.plan is None or checked.resources is None:
        return Text(f"✗ {checked.problem}", style="bold red")
    plan = checked.plan
    text = describe_plan(plan, checked.queued)
    if checked.queued:
        text.append(
            "\n  it waits in this machine's queue until its devices are free, then starts by "
            "itself (the Runs screen shows the line)",
            style="dim",
        )
    text.append_text(describe_resources(checked.resources))
    if checked.overrides:
        said = ", ".join(f"{k}={v}" for k, v in checked.overrides.items())
        text.append(f"\n  overrides: {said}", "cyan")
    if checked.gpu_preset_on_cpu:
        text.append(
            f"\n  ⚠ on the CPU ({plan.devices.describe()}), not on GPUs as the preset says: "
            "pick GPUs with space, or start and confirm",
            style="bold yellow",
        )
    return text


def starting_text(checked: FormCheck | None) -> Text:
    """What the form says while its run is being started, submitted or queued."""
    if checked is not None and checked.queued:
        return Text("queueing…", "bold")
    elsewhere = checked is not None and checked.where
    return Text(SUBMITTING if elsewhere else "starting the launcher…", "bold")


def holders_text(gpu: GpuSample, users: dict[int, str]) -> str:
    """Who holds a GPU, short enough for an 80-column picker: the process using the most memory
    by pid and user (just the pid when NVML names a process not visible here), and how many
    more."""
    first = max(gpu.processes, key=lambda p: p.used_memory_bytes or 0)
    text = f"pid {first.pid}" + (f" {users[first.pid]}" if first.pid in users else "")
    more = len(gpu.processes) - 1
    return text + (f" +{more}" if more else "")


def short_model(name: str) -> str:
    """``H100 80GB``, ``A100-SXM4``, ``RTX 4090``: nine columns of the model, the brand left out."""
    for brand in ("NVIDIA ", "GeForce ", "Tesla ", "Quadro "):
        name = name.removeprefix(brand)
    return name[:9].rstrip()


def gpu_label(gpu: GpuSample, users: dict[int, str]) -> Text:
    """One picker line, 44 columns with a 4-digit pid: ``GPU2 H100 80GB 70/80G 88% · pid 7200 bo``
    (or ``· free``); the GPUs screen has the rest."""
    if gpu.error is not None:
        return Text(f"GPU{gpu.index} not available: {gpu.error}", style="red")
    label = Text(f"GPU{gpu.index} {short_model(gpu.name)} ")
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    memory = f"{used / 2**30:.0f}/{total / 2**30:.0f}G" if used is not None and total else "?"
    label.append(f"{memory} {gpu.utilization_percent}%")
    if gpu.processes:
        label.append(f" · {holders_text(gpu, users)}", style="yellow")
    else:
        label.append(" · free", style="green")
    return label


def pick_mark(picked: bool) -> str:
    """A pick said in text, not only in colour."""
    return "[x] " if picked else "[ ] "
