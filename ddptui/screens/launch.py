"""Launch: pick a preset (bundled or the user's own), see its settings and whether it can run here,
pick the devices, override epochs / max steps / batch / images / precision / data or any key
(``section.key=value``, as ``--set`` does), and start it. ``o`` adds the user's own script by its
path (or ``-m module``), to run like torchrun would; a preset that names a script is listed too,
with its arguments in the form instead of the engine's settings.

Presets that cannot run on this machine stay in the list, marked, with the reason. Starting a run
goes through ``engine.core.ops.run_start`` in a thread worker: the launcher runs in its own session, never in
the UI process.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.console import Group
from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import (
    Button,
    Footer,
    Header,
    Input,
    Label,
    OptionList,
    Select,
    SelectionList,
    Static,
)
from textual.widgets.option_list import Option
from textual.widgets.selection_list import Selection

from ddptui.messages import PresetsChecked, RunLaunched, WorkerProblem
from ddptui.widgets.confirm import ConfirmDialog
from ddptui.widgets.script_prompt import ScriptPrompt
from engine.core.common import formatting
from engine.core.config.devices import DevicePlan, resolve_devices
from engine.core.config.schema import DATASETS, PRECISIONS, ConfigError, RunConfig
from engine.core.config.toml_io import apply_overrides, parse_setting
from engine.core.host.gpus import GpuInventory, GpuSample
from engine.core.plan.run_plan import RunPlan, plan_run

if TYPE_CHECKING:
    from ddptui.app import DdptuiApp
    from engine.core.plan.resource_guard import ResourceCheck


@dataclass(frozen=True)
class PresetCheck:
    """One preset: its config (or why it cannot be read) and its plan here (or why it cannot run)."""

    name: str
    path: Path
    bundled: bool
    config: RunConfig | None
    plan: RunPlan | None
    reason: str  # empty when it can run here

    @property
    def runnable(self) -> bool:
        return self.plan is not None


def check_presets(gpu_count: int) -> list[PresetCheck]:
    """Every preset with the reason it cannot run on a machine with ``gpu_count`` GPUs, if any."""
    # Here, not at the top: the launch screen is the first frame, and these are not needed for it.
    from engine.core.config.presets import list_presets, load_preset_file

    checks = []
    for preset in list_presets():
        config: RunConfig | None = None
        plan: RunPlan | None = None
        reason = ""
        try:
            config = load_preset_file(preset)
            plan = plan_run(config, gpu_count)
        except ConfigError as err:
            reason = str(err)
        checks.append(PresetCheck(preset.name, preset.path, preset.bundled, config, plan, reason))
    return checks


def check_script(config: RunConfig, gpu_count: int) -> PresetCheck:
    """The user's script (from ``o``), listed as presets are: planned for this machine."""
    plan: RunPlan | None = None
    reason = ""
    try:
        plan = plan_run(config, gpu_count)
    except ConfigError as err:
        reason = str(err)
    where = Path(config.script.path) if config.script.path else Path(config.script.module)
    return PresetCheck(f"{config.name} (script)", where, False, config, plan, reason)


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


def describe_plan(plan: RunPlan) -> Text:
    text = Text("✓ runs here: ", style="green")
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


class NumberInput(Input):
    """A whole-number field that lets letters through to the screen's keys: ``s`` starts the run
    while the cursor is in it (it could never type a letter anyway)."""

    def check_consume_key(self, key: str, character: str | None) -> bool:
        return character is not None and (character.isdigit() or character in "+-")

    async def _on_key(self, event: events.Key) -> None:
        # Textual calls Input's own handler after this one unless the default is prevented.
        if event.is_printable and not self.check_consume_key(event.key, event.character):
            event.prevent_default()  # not a digit: it bubbles up to the screen's bindings


def preset_devices(check: PresetCheck, gpu_count: int) -> DevicePlan | None:
    """The devices a preset asks for on this machine, even when something else (missing data, a
    precision) stops it from running as it stands; None when its device spec cannot be met."""
    if check.plan is not None:
        return check.plan.devices
    if check.config is None:
        return None
    try:
        return resolve_devices(check.config.devices.spec, check.config.strategy.name, gpu_count)
    except ConfigError:
        return None


def pick_mark(picked: bool) -> str:
    """A pick said in text, not only in colour."""
    return "[x] " if picked else "[ ] "


OVERRIDE_FIELDS = (
    # (input id, dotted key, label)
    ("epochs", "training.epochs", "epochs"),
    ("max-steps", "training.max_steps", "max steps"),
    ("batch", "training.batch_size", "batch/rank"),
    ("train-size", "data.train_size", "images"),
)
# The fields that set the engine's own workload: a script run takes its own arguments instead.
ENGINE_FIELDS = (*(input_id for input_id, _, _ in OVERRIDE_FIELDS), "precision", "dataset")


class LaunchScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "start", "Start run"),
        Binding("o", "open_script", "Your script"),
        Binding("escape", "focus_presets", "Presets", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.checks: list[PresetCheck] = []
        self.script_checks: list[PresetCheck] = []  # the scripts added with ``o``, newest first
        self.current: PresetCheck | None = None
        self.effective: RunConfig | None = None
        self.effective_plan: RunPlan | None = None
        self.problem = ""
        self._gpu_count: int | None = None
        self._filling = False
        self._starting = False
        self._gpu_labels: list[tuple[int, str, bool]] = []
        self._users: dict[int, str] = {}  # of the GPU holders listed now, asked once per pid
        self._label_texts: dict[int, Text] = {}
        self._device_note = ""
        self._preset_devices: DevicePlan | None = None

    @property
    def ddptui(self) -> DdptuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="launch"):
            with Vertical(id="preset-pane"):
                yield Label("Presets", classes="section")
                yield OptionList(id="presets")
            # not a Tab stop itself: Tab goes from the preset list straight to a field
            with VerticalScroll(id="launch-form", can_focus=False):
                yield Static("", id="preset-info")
                yield Static("Devices sampling NVML…", id="devices-note", classes="section")
                yield SelectionList[int](id="gpu-picker")
                with Horizontal(classes="field"):
                    yield Label("CPU ranks", classes="field-label")
                    yield NumberInput(id="cpu-ranks", type="integer", compact=True, classes="num")
                yield Label("Overrides", classes="section")
                with Horizontal(classes="field"):
                    for input_id, _, label in OVERRIDE_FIELDS[:2]:
                        yield Label(label, classes="field-label")
                        yield NumberInput(id=input_id, type="integer", compact=True, classes="num")
                with Horizontal(classes="field"):
                    for input_id, _, label in OVERRIDE_FIELDS[2:]:
                        yield Label(label, classes="field-label")
                        yield NumberInput(id=input_id, type="integer", compact=True, classes="num")
                with Horizontal(classes="field"):
                    yield Label("precision", classes="field-label")
                    yield Select(
                        [(p, p) for p in PRECISIONS],
                        id="precision",
                        compact=True,
                        allow_blank=False,
                    )
                    yield Label("data", classes="field-label")
                    yield Select(
                        [(d, d) for d in DATASETS], id="dataset", compact=True, allow_blank=False
                    )
                with Horizontal(classes="field", id="script-args-row"):
                    yield Label("script args", classes="field-label")
                    yield Input(id="script-args", compact=True, classes="wide")
                with Horizontal(classes="field"):
                    yield Label("set", classes="field-label")
                    yield Input(
                        id="set-values",
                        compact=True,
                        classes="wide",
                        placeholder="section.key=value … (as --set)",
                    )
                yield Static("", id="launch-check")
                yield Button("Start run (s)", id="start", variant="success", compact=True)
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Launch"
        # Not at once: the form's nested fields are mounted by the next refresh, and an NVML
        # sample can already be there (a fast sampler) before they are.
        self.watch(self.ddptui, "gpu_inventory", self._gpus_changed, init=False)
        self.call_after_refresh(lambda: self._gpus_changed(self.ddptui.gpu_inventory))

    def on_screen_resume(self) -> None:
        self.query_one("#presets", OptionList).focus()

    def action_open_script(self) -> None:
        def chosen(config: RunConfig | None) -> None:
            if config is None:
                return
            check = check_script(config, self._gpu_count or 0)
            # The same script again replaces the one listed: its newer arguments win.
            others = [c for c in self.script_checks if c.name != check.name]
            self.script_checks = [check, *others]
            self._show_checks(self.checks)
            self.select_preset(check.name)
            self.query_one("#presets", OptionList).focus()

        self.app.push_screen(ScriptPrompt(), chosen)

    # -- presets ---------------------------------------------------------------------------------

    def _gpus_changed(self, inventory: GpuInventory | None) -> None:
        if inventory is None:
            return
        with self.app.batch_update():
            self._show_devices(inventory)
        if inventory.count != self._gpu_count:
            self._gpu_count = inventory.count
            self.check_presets(inventory.count)

    @work(thread=True, exclusive=True, exit_on_error=False, group="presets")
    def check_presets(self, gpu_count: int) -> None:
        try:
            checks = check_presets(gpu_count)
        except Exception as err:
            self.post_message(WorkerProblem("presets", f"{type(err).__name__}: {err}"))
            return
        self.post_message(PresetsChecked(checks))

    def on_worker_problem(self, message: WorkerProblem) -> None:
        self.query_one("#launch-check", Static).update(
            Text(f"{message.source}: {message.error}", style="bold red")
        )

    def on_presets_checked(self, message: PresetsChecked) -> None:
        with self.app.batch_update():  # one repaint for the list, the details and the form
            self._show_checks(message.checks)

    def _show_checks(self, checks: list[Any]) -> None:
        self.checks = list(checks)
        listed = self.listed
        options = self.query_one("#presets", OptionList)
        highlighted = self.current.name if self.current else None
        options.clear_options()
        added = []
        for check in listed:
            name = Text(no_wrap=True, overflow="ellipsis")
            name.append(
                "✓ " if check.runnable else "✗ ", style="green" if check.runnable else "red"
            )
            name.append(check.name)
            if not check.bundled and check not in self.script_checks:
                name.append(" (yours)", style="cyan")
            prompt: Any = name
            if not check.runnable:
                why = Text(
                    "  " + _short(check.reason), "dim red", no_wrap=True, overflow="ellipsis"
                )
                prompt = Group(name, why)
            added.append(Option(prompt, id=check.name))
        options.add_options(added)
        names = [c.name for c in listed]
        if highlighted not in names:
            highlighted = "cpu-demo" if "cpu-demo" in names else (names[0] if names else None)
        if highlighted is not None:
            options.highlighted = names.index(highlighted)
            self._select(listed[names.index(highlighted)])

    @property
    def listed(self) -> list[PresetCheck]:
        """What the preset list shows: the scripts added here, then the presets."""
        return [*self.script_checks, *self.checks]

    @on(OptionList.OptionHighlighted, "#presets")
    def _preset_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        check = next((c for c in self.listed if c.name == event.option.id), None)
        if check is not None and check is not self.current:
            self._select(check)

    @on(OptionList.OptionSelected, "#presets")
    def _preset_selected(self, event: OptionList.OptionSelected) -> None:
        self.query_one("#epochs", Input).focus()

    def select_preset(self, name: str) -> None:
        """Highlight and show a preset by name (what a click or the arrow keys do)."""
        listed = self.listed
        names = [c.name for c in listed]
        self.query_one("#presets", OptionList).highlighted = names.index(name)
        self._select(listed[names.index(name)])

    def _select(self, check: PresetCheck) -> None:
        self.current = check
        info = self.query_one("#preset-info", Static)
        if check.config is None:
            info.update(Text(f"✗ {check.name} cannot be read: {check.reason}", style="red"))
        else:
            text = describe_config(check.config)
            if check.plan is None:
                text.append(f"\n✗ as it is, it cannot run here: {check.reason}", style="red")
            info.update(text)
        self._fill_form(check)
        self._evaluate()

    # -- the form ----------------------------------------------------------------------------------

    def _fill_form(self, check: PresetCheck) -> None:
        config = check.config
        if config is None:
            return
        self._filling = True
        try:
            values = {
                "epochs": config.training.epochs,
                "max-steps": config.training.max_steps,
                "batch": config.training.batch_size,
                "train-size": config.data.train_size,
            }
            for input_id, value in values.items():
                self.query_one(f"#{input_id}", Input).value = str(value)
            self.query_one("#precision", Select).value = config.precision.mode
            self.query_one("#dataset", Select).value = config.data.dataset
            script = config.script.given
            for field_id in ENGINE_FIELDS:
                self.query_one(f"#{field_id}").disabled = script
            self.query_one("#script-args-row").display = script
            self.query_one("#script-args", Input).value = shlex.join(config.script.args)
            picker = self.query_one("#gpu-picker", SelectionList)
            picker.deselect_all()
            ranks = 2 if config.strategy.name == "ddp" else 1
            # What the preset asks for, even when it cannot run as it stands (no CIFAR-10 yet):
            # its GPUs stay picked, so fixing the data never turns it into a CPU run.
            devices = preset_devices(check, self._gpu_count or 0)
            self._preset_devices = devices
            if devices is not None and devices.kind == "cuda":
                offered = {picker.get_option_at_index(i).value for i in range(picker.option_count)}
                for index in devices.gpu_indices:
                    if index in offered:
                        picker.select(index)
            elif devices is not None:
                ranks = devices.cpu_ranks
            self.query_one("#cpu-ranks", Input).value = str(ranks)
        finally:
            self._filling = False
        self._show_picks()

    def _holder_users(self, pids: set[int]) -> dict[int, str]:
        """The users of ``pids``, the probe asked only for pids new to the list: the samples come
        every second, on the UI thread. A pid that left the list is forgotten, so a reused one is
        asked again."""
        known = {pid: user for pid, user in self._users.items() if pid in pids}
        self._users = known | self.ddptui.probe.users(pids - known.keys())
        return self._users

    def _show_devices(self, inventory: GpuInventory) -> None:
        note = self.query_one("#devices-note", Static)
        picker = self.query_one("#gpu-picker", SelectionList)
        if inventory.error is not None or inventory.count == 0:
            why = inventory.error or "NVML lists no GPU"
            self._note(
                note, Text.assemble(("Devices ", "bold"), (f"no GPU ({why}): CPU mode", "yellow"))
            )
            picker.display = False
            return
        picker.display = True
        users = self._holder_users({p.pid for gpu in inventory.gpus for p in gpu.processes})
        labels = [
            (gpu.index, gpu_label(gpu, users), gpu.error is not None) for gpu in inventory.gpus
        ]
        key = [(index, label.plain, bad) for index, label, bad in labels]
        if key == self._gpu_labels:
            self._show_picks()
            return
        self._gpu_labels = key
        self._label_texts = {index: label for index, label, _ in labels}
        selected = set(picker.selected)
        highlighted = picker.highlighted
        self._filling = True
        try:
            picker.clear_options()
            picker.add_options(
                [
                    Selection(
                        Text(pick_mark(index in selected)) + label,
                        index,
                        index in selected,
                        disabled=bad,
                    )
                    for index, label, bad in labels
                ]
            )
            if picker.option_count:
                # A highlighted option from the start, so Space picks without an arrow key first.
                picker.highlighted = min(highlighted or 0, picker.option_count - 1)
        finally:
            self._filling = False
        self._show_picks()

    def _show_picks(self) -> None:
        """Say the picked GPUs in words above the list, and mark each pick in its label."""
        picker = self.query_one("#gpu-picker", SelectionList)
        if not picker.display:
            return
        picked = sorted(int(i) for i in picker.selected)
        for i in range(picker.option_count):
            index = picker.get_option_at_index(i).value
            label = self._label_texts.get(index)
            if label is not None:
                picker.replace_option_prompt_at_index(i, Text(pick_mark(index in picked)) + label)
        if picked:
            said = Text.assemble(
                ("Devices ", "bold"),
                (f"picked: GPU {', '.join(map(str, picked))}", "cyan"),
                (" (space toggles)", "dim"),
            )
        else:
            said = Text.assemble(
                ("Devices ", "bold"), ("none picked: CPU ranks below (space picks GPUs)", "dim")
            )
        self._note(self.query_one("#devices-note", Static), said)

    def _note(self, note: Static, text: Text) -> None:
        if text.plain != self._device_note:  # NVML is sampled every second; redraw on change only
            self._device_note = text.plain
            note.update(text)

    @on(Input.Changed)
    @on(Select.Changed)
    @on(SelectionList.SelectedChanged)
    def _form_changed(self) -> None:
        if not self._filling:
            self._show_picks()
            self._evaluate()

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.query_one("#start", Button).focus()

    def overrides(self) -> dict[str, Any]:
        """The form's values that differ from the preset, as ``section.key`` overrides."""
        check = self.current
        if check is None or check.config is None:
            return {}
        config = check.config
        found: dict[str, Any] = {}
        for item in shlex.split(self.query_one("#set-values", Input).value):
            key, value = parse_setting(item)
            found[key] = value
        if config.script.given:
            args = tuple(shlex.split(self.query_one("#script-args", Input).value))
            if args != config.script.args:
                found["script.args"] = list(args)
        else:
            found.update(self._engine_overrides(config))
        spec = self._device_spec()
        preset = self._preset_devices
        if spec is not None and (preset is None or spec != preset.describe()):
            found["devices.spec"] = spec
        return found

    def _engine_overrides(self, config: RunConfig) -> dict[str, Any]:
        """The form's engine fields that differ from the preset."""
        found: dict[str, Any] = {}
        preset_values = {
            "training.epochs": config.training.epochs,
            "training.max_steps": config.training.max_steps,
            "training.batch_size": config.training.batch_size,
            "data.train_size": config.data.train_size,
        }
        for input_id, key, label in OVERRIDE_FIELDS:
            raw = self.query_one(f"#{input_id}", Input).value.strip()
            if not raw:
                raise ConfigError(f"{label} is empty; give a number")
            value = int(raw)
            if value != preset_values[key]:
                found[key] = value
        precision = self.query_one("#precision", Select).value
        if isinstance(precision, str) and precision != config.precision.mode:
            found["precision.mode"] = precision
        dataset = self.query_one("#dataset", Select).value
        if isinstance(dataset, str) and dataset != config.data.dataset:
            found["data.dataset"] = dataset
        return found

    def gpu_preset_on_cpu(self) -> bool:
        """The preset asks for GPUs, and the form (no GPU picked) would run it on the CPU."""
        preset, plan = self._preset_devices, self.effective_plan
        return (
            preset is not None
            and preset.kind == "cuda"
            and plan is not None
            and plan.devices.kind == "cpu"
        )

    def _device_spec(self) -> str | None:
        picker = self.query_one("#gpu-picker", SelectionList)
        picked = sorted(int(i) for i in picker.selected) if picker.display else []
        if picked:
            return "gpu:" + ",".join(str(i) for i in picked)
        raw = self.query_one("#cpu-ranks", Input).value.strip()
        if not raw:
            raise ConfigError("CPU ranks is empty; give a number")
        ranks = int(raw)
        if ranks < 1:
            raise ConfigError("CPU ranks must be at least 1")
        return f"cpu:{ranks}"

    def _evaluate(self) -> None:
        """Apply the form to the preset and plan it for this machine; show the result."""
        check = self.current
        out = self.query_one("#launch-check", Static)
        start = self.query_one("#start", Button)
        self.effective, self.effective_plan = None, None
        if check is None or check.config is None:
            out.update(Text("✗ pick a preset that can be read", style="red"))
            start.disabled = True
            return
        try:
            overrides = self.overrides()
            config = apply_overrides(check.config, overrides) if overrides else check.config
            plan = plan_run(config, self._gpu_count or 0)
            # The guard start_run applies too (ResourceError is a ConfigError): shown here first.
            resources = self.ddptui.resource_checker(plan, self.ddptui.gpu_inventory)
        except (ConfigError, ValueError) as err:  # ValueError: a quote left open, a non-number
            self.problem = str(err)
            out.update(Text(f"✗ {err}", style="bold red"))
            start.disabled = True
            return
        self.problem = ""
        self.effective, self.effective_plan = config, plan
        text = describe_plan(plan)
        text.append_text(describe_resources(resources))
        if overrides:
            text.append(
                "\n  overrides: " + ", ".join(f"{k}={v}" for k, v in overrides.items()), "cyan"
            )
        if self.gpu_preset_on_cpu():
            text.append(
                f"\n  ⚠ on the CPU ({plan.devices.describe()}), not on GPUs as the preset says: "
                "pick GPUs with space, or start and confirm",
                style="bold yellow",
            )
        out.update(text)
        start.disabled = self._starting

    # -- starting ----------------------------------------------------------------------------------

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            event.stop()
            self.action_start()

    def action_focus_presets(self) -> None:
        self.query_one("#presets", OptionList).focus()

    def action_start(self) -> None:
        if self._starting:
            return
        self._evaluate()
        if self.effective is None:
            self.notify(
                self.problem or "Pick a preset first.", title="Cannot start", severity="error"
            )
            return
        if self.gpu_preset_on_cpu():
            self._confirm_cpu(self.effective)
            return
        self._begin(self.effective)

    def _confirm_cpu(self, config: RunConfig) -> None:
        plan = self.effective_plan
        where = plan.devices.describe() if plan is not None else "the CPU"
        dialog = ConfirmDialog(
            f"Run {config.name} on the CPU?",
            f"{config.name} asks for GPUs, and no GPU is picked: it would run on {where}, "
            "much slower. Pick GPUs with space in the device list to run it there instead.",
            [("y", "Run on the CPU", "cpu")],
        )

        def chosen(answer: str | None) -> None:
            if answer == "cpu":
                self._begin(config)

        self.app.push_screen(dialog, chosen)

    def _begin(self, config: RunConfig) -> None:
        self._starting = True
        self.query_one("#start", Button).disabled = True
        self.query_one("#launch-check", Static).update(Text("starting the launcher…", "bold"))
        self.start_run(config, self._gpu_count or 0)

    @work(thread=True, exclusive=True, exit_on_error=False, group="start")
    def start_run(self, config: RunConfig, gpu_count: int) -> None:
        try:
            started = self.ddptui.actions.start_run(config, gpu_count)
        except Exception as err:  # ConfigError, OSError: shown, nothing started
            self.post_message(RunLaunched(None, error=str(err)))
            return
        self.post_message(RunLaunched(started.run_id, started=started))

    def on_run_launched(self, message: RunLaunched) -> None:
        self._starting = False
        self._evaluate()
        if message.error:
            self.query_one("#launch-check", Static).update(
                Text(f"✗ not started: {message.error}", style="bold red")
            )
            self.notify(message.error, title="Not started", severity="error")
            return
        self.ddptui.run_launched(message.started.run_dir, message.started)


def _short(reason: str) -> str:
    """The reason's gist for the list (the details pane shows all of it)."""
    first = reason.split(";")[0]
    # Drop the file path a ConfigError starts with: the list already names the preset.
    if ": " in first and first.split(": ", 1)[0].endswith(".toml"):
        first = first.split(": ", 1)[1]
    if first.startswith("CIFAR-10 is not at"):
        return "CIFAR-10 is not on disk"
    wanted = re.search(r"asks for (\d+) GPUs, but this machine has (\d+)", first)
    if wanted:
        return f"needs {wanted[1]} GPUs, {wanted[2]} here"
    if "asks for GPUs, but this machine has none" in first:
        return "needs a GPU, none here"
    for needs in ("needs CUDA", "needs CUDA GPUs"):
        if needs in first:
            return first.split(" needs", 1)[0] + " " + needs
    return first
