"""Launch: pick a preset (bundled or the user's own), see its settings and whether it can run here,
pick the devices, override epochs / max steps / batch / images / precision / data or any key
(``section.key=value``, as ``--set`` does), and start it. ``o`` adds the user's own script by its
path (or ``-m module``), to run like torchrun would; a preset that names a script is listed too,
with its arguments in the form instead of the engine's settings.

Presets that cannot run on this machine stay in the list, marked, with the reason
(``engine.core.plan.preset_check``, as ``ddptui presets`` says it). The form is read into plain
values on the UI thread and checked (``ddptui.launch_form``: the overrides, the plan, the resource
guard's reading of /proc and cgroup files) in a thread worker, a burst of keystrokes giving one
check. Starting a run goes through ``engine.core.backends.local.start`` in a thread worker: the launcher
runs in its own session, never in the UI process. "when free" queues it instead
(``engine.core.queue``): it starts by itself once its devices are free.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
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
from textual.worker import get_current_worker

from ddptui.launch_form import (
    ENGINE_FIELDS,
    NUMBER_FIELDS,
    FormCheck,
    LaunchForm,
    check_form,
    form_for,
)
from ddptui.messages import FormChecked, PresetsChecked, RunLaunched
from ddptui.screens.base import DdptuiScreen
from ddptui.widgets.confirm import ConfirmDialog
from ddptui.widgets.gpu_picker import GpuPicker
from ddptui.widgets.launch_texts import (
    describe_form_check,
    preset_details,
    preset_entry,
    starting_text,
)
from ddptui.widgets.number_input import NumberInput
from ddptui.widgets.script_prompt import ScriptPrompt
from ddptui.widgets.when_to_start import WhenToStart
from ddptui.widgets.where_to_run import WhereToRun
from engine.core.config.schema import DATASETS, PRECISIONS, RunConfig
from engine.core.host.gpus import GpuInventory
from engine.core.plan import preset_check
from engine.core.plan.preset_check import PresetCheck
from engine.core.plan.run_plan import RunPlan

# How long the form is left alone before it is checked: typing a number is one check, not three.
CHECK_DELAY_SECONDS = 0.15


class LaunchScreen(DdptuiScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "start", "Start run"),
        Binding("o", "open_script", "Your script"),
        Binding("escape", "focus_presets", "Presets", show=False),
    ]
    PROBLEM_AT = "#launch-check"

    def __init__(self) -> None:
        super().__init__()
        self.checks: list[PresetCheck] = []
        self.script_checks: list[PresetCheck] = []  # the scripts added with ``o``, newest first
        self.current: PresetCheck | None = None
        self.form_check: FormCheck | None = None  # the latest check of the form as it was then
        self._gpu_count: int | None = None
        self._filling = False
        self._starting = False
        self._start_when_checked = False  # s was pressed while the form's check was on its way
        self._checks_asked = 0  # checks of the form asked for so far; only the latest is shown
        self._users: dict[int, str] = {}  # of the GPU holders listed now, asked once per pid
        self._device_note = ""

    @property
    def effective(self) -> RunConfig | None:
        """The config the form makes, when it can run here (as last checked)."""
        return self.form_check.config if self.form_check is not None else None

    @property
    def effective_plan(self) -> RunPlan | None:
        return self.form_check.plan if self.form_check is not None else None

    @property
    def problem(self) -> str:
        """Why the form, as last checked, cannot start; empty when it can."""
        return self.form_check.problem if self.form_check is not None else ""

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
                yield GpuPicker(id="gpu-picker")
                with Horizontal(classes="field"):
                    yield Label("CPU ranks", classes="field-label")
                    yield NumberInput(id="cpu-ranks", type="integer", compact=True, classes="num")
                yield WhereToRun(id="where-to-run")
                yield WhenToStart(id="when-to-start", classes="field")
                yield Label("Overrides", classes="section")
                for pair in (NUMBER_FIELDS[:2], NUMBER_FIELDS[2:]):
                    with Horizontal(classes="field engine-fields"):
                        for number in pair:
                            yield Label(number.label, classes="field-label")
                            yield NumberInput(
                                id=number.input_id, type="integer", compact=True, classes="num"
                            )
                with Horizontal(classes="field engine-fields"):
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
        self._gpus_changed(self.ddptui.gpu_inventory)  # what was sampled while it was hidden

    def action_open_script(self) -> None:
        def chosen(config: RunConfig | None) -> None:
            if config is None:
                return
            check = preset_check.plan_user_script(config, self._gpu_count or 0)
            # The same script again replaces the one listed: its newer arguments win.
            others = [c for c in self.script_checks if c.name != check.name]
            self.script_checks = [check, *others]
            self._show_checks(self.checks)
            self.select_preset(check.name)
            self.query_one("#presets", OptionList).focus()

        self.app.push_screen(ScriptPrompt(), chosen)

    # -- presets ---------------------------------------------------------------------------------

    def _gpus_changed(self, inventory: GpuInventory | None) -> None:
        # Only while shown (as the other screens): a hidden screen's widgets may be gone, as
        # at the app's exit, when a late sample still lands; showing it again catches up.
        if inventory is None or not self.is_current:
            return
        with self.app.batch_update():
            self._show_devices(inventory)
        if inventory.count != self._gpu_count:
            self._gpu_count = inventory.count
            self.check_presets(inventory.count)

    @work(thread=True, exclusive=True, exit_on_error=False, group="presets")
    def check_presets(self, gpu_count: int) -> None:
        self.post_read("presets", lambda: preset_check.check_presets(gpu_count), PresetsChecked)

    def on_presets_checked(self, message: PresetsChecked) -> None:
        with self.app.batch_update():  # one repaint for the list, the details and the form
            self._show_checks(message.checks)

    def _show_checks(self, checks: list[PresetCheck]) -> None:
        self.checks = list(checks)
        listed = self.listed
        options = self.query_one("#presets", OptionList)
        highlighted = self.current.name if self.current else None
        options.clear_options()
        options.add_options(
            [
                Option(preset_entry(c, not c.bundled and c not in self.script_checks), id=c.name)
                for c in listed
            ]
        )
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
        self._start_when_checked = False  # s pressed for the preset shown before: not this one
        self.query_one("#preset-info", Static).update(preset_details(check))
        if check.config is not None:
            offered = self.query_one(GpuPicker).offered
            devices = check.devices_asked(self._gpu_count or 0)
            self._fill_form(check.config, form_for(check.config, devices, offered))
        self._evaluate()

    # -- the form ----------------------------------------------------------------------------------

    def _fill_form(self, config: RunConfig, form: LaunchForm) -> None:
        """Show ``form`` in the fields, with the engine's fields or the script's as ``config``
        has them."""
        self._filling = True
        try:
            for number in NUMBER_FIELDS:
                self.query_one(f"#{number.input_id}", Input).value = form.numbers[number.key]
            self.query_one("#precision", Select).value = form.precision
            self.query_one("#dataset", Select).value = form.dataset
            script = config.script.given
            for field_id in ENGINE_FIELDS:
                self.query_one(f"#{field_id}").disabled = script
            for row in self.query(".engine-fields"):  # a script has its own epochs, batch, data
                row.display = not script
            self.query_one("#script-args-row").display = script
            self.query_one("#script-args", Input).value = form.script_args
            picker = self.query_one(GpuPicker)
            picker.deselect_all()
            for index in form.picked_gpus:
                picker.select(index)
            self.query_one("#cpu-ranks", Input).value = form.cpu_ranks
            self.query_one(WhereToRun).fill(config)
        finally:
            self._filling = False
        self._show_picks()

    def read_form(self) -> LaunchForm:
        """What the fields say now."""
        picker = self.query_one(GpuPicker)
        precision = self.query_one("#precision", Select).value
        dataset = self.query_one("#dataset", Select).value
        return LaunchForm(
            numbers={n.key: self.query_one(f"#{n.input_id}", Input).value for n in NUMBER_FIELDS},
            precision=precision if isinstance(precision, str) else None,
            dataset=dataset if isinstance(dataset, str) else None,
            script_args=self.query_one("#script-args", Input).value,
            set_values=self.query_one("#set-values", Input).value,
            gpus_offered=bool(picker.display),
            picked_gpus=tuple(picker.picked),
            cpu_ranks=self.query_one("#cpu-ranks", Input).value,
            **self.query_one(WhereToRun).values(),
            when=self.query_one(WhenToStart).chosen(),
        )

    def _holder_users(self, pids: set[int]) -> dict[int, str]:
        """The users of ``pids``, the probe asked only for pids new to the list: the samples come
        every second, on the UI thread. A pid that left the list is forgotten, so a reused one is
        asked again."""
        known = {pid: user for pid, user in self._users.items() if pid in pids}
        self._users = known | self.ddptui.probe.users(pids - known.keys())
        return self._users

    def _show_devices(self, inventory: GpuInventory) -> None:
        note = self.query_one("#devices-note", Static)
        picker = self.query_one(GpuPicker)
        if inventory.error is not None or inventory.count == 0:
            why = inventory.error or "NVML lists no GPU"
            self._note(
                note, Text.assemble(("Devices ", "bold"), (f"no GPU ({why}): CPU mode", "yellow"))
            )
            picker.display = False
            return
        picker.display = True
        users = self._holder_users({p.pid for gpu in inventory.gpus for p in gpu.processes})
        picker.show_gpus(inventory, users)
        self._show_picks()

    def _show_picks(self) -> None:
        """Say the picked GPUs in words above the list, and mark each pick in its label."""
        picker = self.query_one(GpuPicker)
        if not picker.display:
            return
        picker.mark_picks()
        picked = picker.picked
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

    def gpu_preset_on_cpu(self) -> bool:
        """The preset asks for GPUs, and the form (no GPU picked) would run it on the CPU."""
        return self.form_check is not None and self.form_check.gpu_preset_on_cpu

    def _evaluate(self) -> None:
        """Check the form as it is now against the current preset, in a thread worker; a newer
        check replaces one still on its way."""
        self._checks_asked += 1
        self.check_form_soon(
            self._checks_asked,
            self.current,
            self.read_form(),
            self._gpu_count or 0,
            self.ddptui.gpu_inventory,
        )

    @work(thread=True, exclusive=True, exit_on_error=False, group="check-form")
    def check_form_soon(
        self,
        asked: int,
        check: PresetCheck | None,
        form: LaunchForm,
        gpu_count: int,
        inventory: GpuInventory | None,
    ) -> None:
        time.sleep(CHECK_DELAY_SECONDS)
        if get_current_worker().is_cancelled:
            return  # the form changed again: the newer check is the one that counts
        try:
            actions = self.ddptui.actions
            checkers = (self.ddptui.resource_checker, actions.check_placement, actions.check_queue)
            checked = check_form(check, form, gpu_count, inventory, *checkers)
        except Exception as err:  # an unreadable /proc or cgroup file: said, not a crash
            checked = FormCheck(check, form, problem=f"{type(err).__name__}: {err}")
        if not get_current_worker().is_cancelled:
            self.post_message(FormChecked(checked, asked))

    def _is_checked(self) -> bool:
        """The latest check is of the form as it is now, for the preset shown now."""
        checked = self.form_check
        return (
            checked is not None
            and checked.check is self.current
            and checked.form == self.read_form()
        )

    def on_form_checked(self, message: FormChecked) -> None:
        if message.asked != self._checks_asked:
            return  # an older form's check that ended late: a newer one is on its way
        checked = message.checked
        self.form_check = checked
        self.query_one("#launch-check", Static).update(describe_form_check(checked))
        self.query_one("#start", Button).disabled = self._starting or not checked.ok
        if self._start_when_checked and self._is_checked():
            self._start_checked()

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
        if not self._is_checked():  # typed a moment ago: start once the check is in
            self._start_when_checked = True
            self._evaluate()
            return
        self._start_checked()

    def _start_checked(self) -> None:
        """Start what the form, as checked, makes: after a question when a GPU preset would run
        on the CPU; never when it cannot run."""
        self._start_when_checked = False
        config = self.effective
        if config is None:
            self.notify(
                self.problem or "Pick a preset first.", title="Cannot start", severity="error"
            )
            return
        if self.gpu_preset_on_cpu():
            self._confirm_cpu(config)
            return
        self._begin(config)

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
        checked = self.form_check
        self.query_one("#launch-check", Static).update(starting_text(checked))
        self.start_run(config, self._gpu_count or 0, checked)

    @work(thread=True, exclusive=True, exit_on_error=False, group="start")
    def start_run(self, config: RunConfig, gpu_count: int, checked: FormCheck | None) -> None:
        where, queue = (checked.where, checked.queued) if checked else ("", False)
        try:
            started = self.ddptui.actions.start_run(config, gpu_count, where=where, queue=queue)
        except Exception as err:  # ConfigError, OSError: shown, nothing started
            self.post_message(RunLaunched(None, error=str(err)))
            return
        self.post_message(RunLaunched(started.run_id, started=started))

    def on_run_launched(self, message: RunLaunched) -> None:
        self._starting = False
        checked = self.form_check
        self.query_one("#start", Button).disabled = checked is None or not checked.ok
        if message.error:
            self.query_one("#launch-check", Static).update(
                Text(f"✗ not started: {message.error}", style="bold red")
            )
            self.notify(message.error, title="Not started", severity="error")
            return
        if checked is not None:
            self.query_one("#launch-check", Static).update(describe_form_check(checked))
        self.ddptui.run_launched(message.started.run_dir, message.started)
