"""The launch form's "where to run": this machine, or Slurm with its partition (from ``sinfo``),
its nodes and a time limit. With Slurm, the devices above are each node's."""

from __future__ import annotations

from collections.abc import Callable

from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, Select

from ddptui.launch_form import LaunchForm
from ddptui.messages import SlurmPartitionsRead
from ddptui.widgets.number_input import NumberInput

HERE = "here"
SLURM = "slurm"
DEFAULT_PARTITION = ""  # Slurm's default partition
Partition = tuple[str, bool, int, str]  # name, default, nodes, max time


class WhereToRun(Vertical):
    DEFAULT_CSS = """
    WhereToRun { height: auto; }
    WhereToRun #slurm-fields { display: none; }
    WhereToRun.slurm #slurm-fields { display: block; }
    """

    def __init__(self, read_partitions: Callable[[], list[Partition]], *, id: str) -> None:
        super().__init__(id=id)
        self.read_partitions = read_partitions  # Slurm's, asked once Slurm is chosen
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
            found = self.read_partitions()
        except Exception as err:  # no Slurm here: the form's check says why
            self.post_message(SlurmPartitionsRead([], problem=str(err)))
            return
        self.post_message(SlurmPartitionsRead(found))

    def on_slurm_partitions_read(self, message: SlurmPartitionsRead) -> None:
        self._asked = not message.problem  # asked again when Slurm is chosen again
        self.show_partitions(message.partitions)

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

    def fill(self, form: LaunchForm) -> None:
        """The preset's [slurm] values (where to run stays as chosen)."""
        select = self.query_one("#partition", Select)
        if form.partition not in [value for _, value in self.offered]:
            self.offered = [*self.offered, (form.partition, form.partition)]
            select.set_options(self.offered)
        select.value = form.partition
        self.query_one("#nodes", Input).value = form.nodes
        self.query_one("#time-limit", Input).value = form.time_limit

    def values(self) -> dict[str, str]:
        """The fields as ``LaunchForm`` takes them."""
        partition = self.query_one("#partition", Select).value
        return {
            "where": SLURM if self.on_slurm else HERE,
            "partition": partition if isinstance(partition, str) else DEFAULT_PARTITION,
            "nodes": self.query_one("#nodes", Input).value,
            "time_limit": self.query_one("#time-limit", Input).value,
        }
