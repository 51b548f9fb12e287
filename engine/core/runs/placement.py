"""Where a run's ranks are placed, as the layers below the backends know it: run.json's
``placement`` (``Placement``: a backend's name and its own keys), and what a backend that places
runs elsewhere observes of one of them (``PlacementWatch``: pending with the scheduler's reason,
how its job ended, the node each rank is on), which the run observer asks through ``watch_for``
without knowing which backend it is.

A backend registers its watch as ``engine.core`` is first imported
(``engine.core.backends.import_backends``), or when it is registered later
(``engine.core.backends.registry.register``). A run whose placement names no registered watch is
observed as a run of this machine's launcher. Plain Python; this module stays light, since it
is imported as ``engine.core`` starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.core.common.statuses import RunStatus

if TYPE_CHECKING:
    from engine.core.procs.process_identity import ProcessProbe
    from engine.core.runs.run_info import RunInfo
    from engine.core.runs.rundir import RunDir
    from engine.core.runs.summary import RunSummary


@dataclass(frozen=True)
class Placement:
    """run.json's ``placement``: the backend a run belongs to (``engine.core.backends``) and the
    keys that backend keeps of it, as it wrote them (its own type reads them). A run without one
    is this machine's."""

    backend: str
    keys: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.keys, "backend": self.backend}

    @classmethod
    def from_json(cls, data: Any) -> Placement | None:
        if not isinstance(data, dict) or not isinstance(data.get("backend"), str):
            return None
        return cls(data["backend"], {k: v for k, v in data.items() if k != "backend"})

    @classmethod
    def in_run_json(cls, data: dict[str, Any]) -> Placement | None:
        """The placement a run.json holds: its ``placement``, else (a run.json written before
        there was one) the keys a registered backend kept under its own name."""
        found = cls.from_json(data.get("placement"))
        if found is not None:
            return found
        for name in _WATCHES:
            kept = data.get(name)
            if isinstance(kept, dict):
                return cls(name, dict(kept))
        return None


@dataclass(frozen=True)
class PlacementView:
    """What a backend observed of where its run is, at one moment: the words every reader may
    show, the backend's own keys (``ddptui show --json``'s ``placement``), and its own typed view
    (``detail``) for its ``describe`` and ``stop``."""

    backend: str
    label: str = ""  # where, in a few words a list shows beside the devices ("job 4242")
    waiting_for: str = ""  # a pending run: the scheduler's reason ("Resources")
    keys: dict[str, Any] = field(default_factory=dict)
    rank_nodes: dict[int, str] = field(default_factory=dict)  # each global rank's node
    across_nodes: bool = False  # its ranks are elsewhere: each node's GPUs, no usage read here
    detail: object = field(default=None, compare=False)

    @property
    def where(self) -> str:
        """Its nodes and its label, for a record of where an attempt ran: "n1, n2 (job 4242)"."""
        nodes = ", ".join(sorted(set(self.rank_nodes.values())))
        if nodes and self.label:
            return f"{nodes} ({self.label})"
        return nodes or self.label

    def to_json(self) -> dict[str, Any]:
        return {
            **self.keys,
            "backend": self.backend,
            "label": self.label,
            "waiting_for": self.waiting_for,
            "across_nodes": self.across_nodes,
        }

    @classmethod
    def from_json(cls, data: Any) -> PlacementView | None:
        """The view ``to_json`` wrote (what a listing keeps: no rank's node, no ``detail``)."""
        if not isinstance(data, dict) or not isinstance(data.get("backend"), str):
            return None
        own = ("backend", "label", "waiting_for", "across_nodes")
        return cls(
            backend=data["backend"],
            label=str(data.get("label") or ""),
            waiting_for=str(data.get("waiting_for") or ""),
            keys={k: v for k, v in data.items() if k not in own},
            across_nodes=bool(data.get("across_nodes")),
        )


@dataclass(frozen=True)
class PlacementVerdict:
    """A backend's decision of its run's status while the run has no summary."""

    view: PlacementView
    status: RunStatus | None = None  # None: decide it as for a run of this machine's launcher
    reason: str = ""
    ended: bool = False  # nothing of it runs any more: its summary can be built
    launcher_alive: bool | None = None  # its launchers (one a node), as far as it can tell


class PlacementWatch(Protocol):
    """What a backend that places runs elsewhere tells the run observer of one of them."""

    name: str  # the backend's: run.json's placement.backend of its runs
    # Its own files of one attempt (paths below the run directory): moved below attempts/<n>/
    # with the attempt's events as the next attempt begins (engine.core.runs.attempts)
    attempt_files: tuple[str, ...]

    def observe(
        self, run_dir: RunDir, info: RunInfo, now: float, probe: ProcessProbe
    ) -> PlacementVerdict:
        """Its run now, asked of whatever the backend asks (a scheduler, its records)."""
        ...

    def recorded(self, run_dir: RunDir, info: RunInfo) -> PlacementView:
        """Where the run is as its run directory records it, nothing else asked (its scheduler
        is not): a run that ended, a label to print."""
        ...

    def summary(self, run_dir: RunDir, verdict: PlacementVerdict) -> RunSummary:
        """The summary of its run, ended as ``verdict`` (one with ``ended``) says."""
        ...


_WATCHES: dict[str, PlacementWatch] = {}


def register_watch(watch: PlacementWatch) -> None:
    """Make ``watch`` the one the observer asks of every run placed by its backend; ValueError
    when another has its name."""
    known = _WATCHES.get(watch.name)
    if known is not None and known is not watch:
        raise ValueError(f"a placement watch named {watch.name!r} is registered already")
    _WATCHES[watch.name] = watch


def unregister_watch(watch: PlacementWatch) -> None:
    if _WATCHES.get(watch.name) is watch:
        del _WATCHES[watch.name]


def watch_for(info: RunInfo | None) -> PlacementWatch | None:
    """The watch of the backend that placed this run; None for a run of this machine (or of a
    backend that registered none)."""
    if info is None or info.placement is None:
        return None
    return _WATCHES.get(info.placement.backend)
