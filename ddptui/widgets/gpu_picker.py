"""The Launch screen's device picker: one line per GPU (``gpu_label``: model, memory, use, who
holds it), each pick marked ``[x]`` in text as well as in colour, a failing GPU listed but not
pickable."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import SelectionList
from textual.widgets.selection_list import Selection

from ddptui.widgets.launch_texts import gpu_label, pick_mark
from engine.core.host.gpus import GpuInventory


class GpuPicker(SelectionList[int]):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: list[tuple[int, str, bool]] = []  # (index, label, not pickable) listed now
        self._labels: dict[int, Text] = {}

    @property
    def picked(self) -> list[int]:
        return sorted(int(i) for i in self.selected)

    @property
    def offered(self) -> set[int]:
        """The GPUs listed, pickable or not."""
        return {self.get_option_at_index(i).value for i in range(self.option_count)}

    def show_gpus(self, inventory: GpuInventory, users: dict[int, str]) -> None:
        """List the inventory's GPUs (holders named by ``users``), keeping the picks and the
        highlighted line; nothing is redrawn when every line reads as it did."""
        labels = [
            (gpu.index, gpu_label(gpu, users), gpu.error is not None) for gpu in inventory.gpus
        ]
        shown = [(index, label.plain, bad) for index, label, bad in labels]
        if shown != self._shown:
            self._shown = shown
            self._labels = {index: label for index, label, _ in labels}
            selected = set(self.selected)
            highlighted = self.highlighted
            self.clear_options()
            self.add_options(
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
            if self.option_count:
                # A highlighted option from the start, so Space picks without an arrow key first.
                self.highlighted = min(highlighted or 0, self.option_count - 1)
        self.mark_picks()

    def mark_picks(self) -> None:
        """Mark each picked GPU's line ``[x]`` and the others ``[ ]``."""
        picked = self.picked
        for i in range(self.option_count):
            index = self.get_option_at_index(i).value
            label = self._labels.get(index)
            if label is not None:
                self.replace_option_prompt_at_index(i, Text(pick_mark(index in picked)) + label)
