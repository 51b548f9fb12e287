"""The launch form's "where to run": this machine, or Slurm with its partition (from ``sinfo``),
its nodes and a time limit. With Slurm, the devices above are each node's. The one UI module that
knows Slurm: the rest of the form takes the row's values as a backend's name and the config keys
its fields set (``ddptui.launch_form.LaunchForm``), and what the check under the form says of a
run Slurm would be asked for comes from here (``describe_submission``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, Select

from ddptui.messages import WhereChoicesRead
from ddptui.widgets.number_input import NumberInput
from engine.core.backends.slurm.config import SECTION, SlurmConfig
from engine.core.config.schema import RunConfig
from engine.core.plan.run_plan import RunPlan

HERE = ""  # this machine
SLURM = "slurm"  # the Slurm backend's name
DEFAULT_PARTITION = ""  # Slurm's default partition
Partition = tuple[str, bool, int, str]  # name, default, nodes, max time
STARTING = "submitting to Slurm…"


def read_slurm_partitions() -> list[Partition]:
    """Slurm's partitions (``sinfo``): (name, default, nodes, max time) each; SlurmUnavailable
    (one sentence) when Slurm cannot be asked from here."""
    from engine.core.backends.slurm.cluster import read_cluster  # not while the app starts

    cluster = read_cluster()
    return [(p.name, p.default, len(p.nodes), p.max_time) for p in cluster.partitions]


class WhereToRun(Vertical):
    DEFAULT_CSS = """
    WhereToRun { height: auto; }
    WhereToRun #slurm-fields { display: none; }
    WhereToRun.slurm #slurm-fields { display: block; }
    """

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self.offered: list[tuple[str, str]] = [("(its default)", DEFAULT_PARTITION)]
        self._asked = False

    def compose(self) -> ComposeResult:
        with Horizontal(classes="field"):
            yield Label("where", classes="field-label")
            yield Select(
                [("this machine", HERE), ("Slurm", SLURM)],
                id="where",
                compact=True,
                allow_blank=False,
                value=HERE,
            )
        with Horizontal(classes="field", id="slurm-fields"):
            yield Label("partition", classes="field-label")
            yield Select(
                self.offered,
                id="partition",
                compact=True,
                allow_blank=False,
                value=DEFAULT_PARTITION,
            )
            yield Label("nodes", classes="field-label")
            yield NumberInput(id="nodes", type="integer", compact=True, classes="num")
            yield Label("time", classes="field-label")
            yield Input(id="time-limit", compact=True, classes="num", placeholder="30, 1:00:00")

    @property
    def on_slurm(self) -> bool:
        return self.query_one("#where", Select).value == SLURM

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "where":
            self.set_class(event.value == SLURM, "slurm")
            if event.value == SLURM and not self._asked:
                self._asked = True
                self.ask_partitions()

    @work(thread=True, exclusive=True, exit_on_error=False, group="slurm-partitions")
    def ask_partitions(self) -> None:
        try:
            found = read_slurm_partitions()  # asked once Slurm is chosen
        except Exception as err:  # no Slurm here: the form's check says why
            self.post_message(WhereChoicesRead([], problem=str(err)))
            return
        self.post_message(WhereChoicesRead(found))

    def on_where_choices_read(self, message: WhereChoicesRead) -> None:
        self._asked = not message.problem  # asked again when Slurm is chosen again
        self.show_partitions(message.choices)

    def show_partitions(self, partitions: list[Partition]) -> None:
        """Offer Slurm's partitions: (name, default, nodes, max time) each."""
        select = self.query_one("#partition", Select)
        chosen = select.value
        self.offered = [("(its default)", DEFAULT_PARTITION)] + [
            (f"{name}{'*' if default else ''} ({nodes} nodes, {limit})", name)
            for name, default, nodes, limit in partitions
        ]
        select.set_options(self.offered)
        if any(value == chosen for _, value in self.offered):
            select.value = chosen

    def fill(self, config: RunConfig) -> None:
        """The preset's [slurm] values (where to run stays as chosen)."""
        slurm = SlurmConfig.of(config)
        select = self.query_one("#partition", Select)
        if slurm.partition not in [value for _, value in self.offered]:
            self.offered = [*self.offered, (slurm.partition, slurm.partition)]
            select.set_options(self.offered)
        select.value = slurm.partition
        self.query_one("#nodes", Input).value = str(slurm.nodes)
        self.query_one("#time-limit", Input).value = slurm.time

    def values(self) -> dict[str, Any]:
        """The row as ``LaunchForm`` takes it: the backend's name ("" here) and the config keys
        its fields set, each field as typed."""
        partition = self.query_one("#partition", Select).value
        return {
            "where": SLURM if self.on_slurm else HERE,
            "where_fields": {
                f"{SECTION}.partition": partition if isinstance(partition, str) else "",
                f"{SECTION}.nodes": self.query_one("#nodes", Input).value,
                f"{SECTION}.time": self.query_one("#time-limit", Input).value,
            },
        }


def describe_submission(plan: RunPlan, config: RunConfig, overrides: Mapping[str, Any]) -> Text:
    """A run the form would submit to Slurm: its nodes, each node's devices, the job's limits."""
    slurm = SlurmConfig.of(config)
    nodes = slurm.nodes
    text = Text("✓ submits to Slurm: ", style="green")
    text.append(
        f"{nodes} node{'s' if nodes != 1 else ''} × {plan.devices.describe()}, "
        f"{plan.world_size * nodes} ranks"
        + ("" if config.script.given else f", global batch {plan.global_batch * nodes}")
    )
    text.append(
        f"\n  partition {slurm.partition or '(its default)'}, time limit "
        f"{slurm.time or '(the partition default)'}; the run directory must be on storage "
        "every node sees",
        style="dim",
    )
    if overrides:
        said = ", ".join(f"{k}={v}" for k, v in overrides.items())
        text.append(f"\n  overrides: {said}", "cyan")
    return text
