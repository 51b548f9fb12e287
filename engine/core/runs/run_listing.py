"""Every run of a runs directory as one line each: ``ddptui runs``, the Runs screen, pruning.

An ended run does not change: it is read once, from its summary.json and run.json alone
(``RunListing.ended``: no events, no config), and kept while its
summary.json keeps its identity (device, inode, size, modification time). Only what can change
is read again at each listing: a run still going, through its own ``RunObserver`` (which reads
only what its ranks appended since), and one that ends meanwhile, once. A listing of 1,000 ended
runs costs a directory scan and a ``stat`` a run (``bench/runs_listing.py``). Plain Python.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.common.run_files import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    make_dirs,
    write_atomic,
)
from engine.core.common.run_layout import SUMMARY_NAME
from engine.core.common.statuses import RunStatus
from engine.core.runs.placement import PlacementView, watch_for
from engine.core.runs.rundir import RunDir, RunDirError, RunInfo, run_names

if TYPE_CHECKING:
    from engine.core.procs.process_identity import ProcessProbe
    from engine.core.runs.observer import RunObserver
    from engine.core.runs.run_state import RunState
    from engine.core.runs.settle import Settler

Clock = Callable[[], float]
FileIdentity = tuple[int, int, int, int]


@dataclass(frozen=True)
class RunListing:
    """One run in a list: what ``ddptui runs`` prints and the Runs screen shows of it. Equal
    listings draw the same row."""

    run_id: str
    path: Path
    preset: str
    status: RunStatus
    devices: str
    created: float
    elapsed: float | None  # an ended run's whole time; None while it goes (the clock's to tell)
    world_size: int = 0
    accuracy: float | None = None
    reason: str = ""  # why that status, one sentence
    problem: str = ""  # what could not be read
    unsaved: str = ""  # the lost summary could not be written, and why
    stalled_ranks: tuple[int, ...] = ()
    straggler_ranks: tuple[int, ...] = ()
    # Where another backend placed it: its label ("job 4242"), why it waits (a scheduler's
    # reason) and that backend's own keys (engine.core.runs.placement)
    placement: PlacementView | None = None
    attempt: int = 1  # its attempt (a restart or ``ddptui resume`` adds one)

    @property
    def waiting_for(self) -> str:
        """Why a pending run waits, as its backend's scheduler says ("" when it does not)."""
        placed = self.placement
        return placed.waiting_for if placed is not None and self.status == RunStatus.PENDING else ""

    @classmethod
    def of(cls, run: RunState) -> RunListing:
        return cls(
            run_id=run.run_id,
            path=run.path,
            preset=run.preset,
            status=run.status,
            devices=run.devices,
            created=run.created or 0.0,
            elapsed=run.elapsed if run.final else None,
            world_size=run.world_size,
            accuracy=run.accuracy,
            reason=run.reason,
            problem=run.problem,
            unsaved=run.unsaved,
            stalled_ranks=run.stalled_ranks,
            straggler_ranks=run.straggler_ranks,
            placement=run.placement,
            attempt=run.attempt,
        )

    @classmethod
    def ended(cls, run_dir: RunDir) -> RunListing | None:
        """A run that has a summary.json, read from it and run.json alone (no event, no config,
        no process asked): the summary says how a run ended, as ``RunObserver`` decides it. None
        without a readable summary, or for a script's run (what it reported is in its events):
        observe those."""
        try:
            summary = run_dir.read_summary()
        except RunDirError:
            return None
        if summary is None or summary.strategy == "script":
            return None
        info: RunInfo | None = None
        problem = ""
        try:
            info = run_dir.read_run_info()
        except RunDirError as err:
            if run_dir.run_json_path.exists():
                problem = str(err)
        return cls(
            run_id=run_dir.run_id,
            path=run_dir.path,
            preset=summary.preset or (info.preset if info else ""),
            status=summary.status,
            devices=(info.devices if info else "") or summary.devices,
            created=info.created if info else 0.0,
            elapsed=summary.elapsed_seconds,
            world_size=info.world_size if info else summary.world_size,
            accuracy=summary.test_accuracy,
            reason=summary.reason,
            problem=problem,
            placement=_placed(run_dir, info),
            attempt=summary.attempt,
        )

    @property
    def detail(self) -> str:
        return self.reason or self.problem

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "state": self.status,
            "reason": self.reason,
            "preset": self.preset,
            "created": self.created or None,
            "devices": self.devices,
            "world_size": self.world_size,
            "elapsed": self.elapsed,
            "accuracy": self.accuracy,
            "stalled_ranks": list(self.stalled_ranks),
            "straggler_ranks": list(self.straggler_ranks),
            "problem": self.problem,
            "unsaved": self.unsaved,
            "placement": self.placement.to_json() if self.placement else None,
            "attempt": self.attempt,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunListing:
        """The listing ``to_json`` wrote; KeyError, TypeError or ValueError when it is not one."""
        return cls(
            run_id=str(data["run_id"]),
            path=Path(data["path"]),
            preset=str(data["preset"]),
            status=RunStatus(data["state"]),
            devices=str(data["devices"]),
            created=float(data["created"] or 0.0),
            elapsed=None if data["elapsed"] is None else float(data["elapsed"]),
            world_size=int(data["world_size"]),
            accuracy=None if data["accuracy"] is None else float(data["accuracy"]),
            reason=str(data["reason"]),
            problem=str(data["problem"]),
            unsaved=str(data["unsaved"]),
            stalled_ranks=tuple(int(r) for r in data["stalled_ranks"]),
            straggler_ranks=tuple(int(r) for r in data["straggler_ranks"]),
            placement=PlacementView.from_json(data["placement"]),
            attempt=int(data["attempt"]),
        )


def _placed(run_dir: RunDir, info: RunInfo | None) -> PlacementView | None:
    """Where an ended run was, as its backend reads it from the run directory."""
    watch = watch_for(info)
    return watch.recorded(run_dir, info) if watch is not None and info is not None else None


def file_identity(path: str | Path) -> FileIdentity | None:
    """What tells one version of a file from another without reading it; None when absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


CACHE_SCHEMA = 4  # 2: a listing says its job; 3: its backend's placement; 4: and its attempt
CACHE_MAX_BYTES = 64 << 20


def listing_cache_path(runs_dir: Path) -> Path:
    """Where ``ddptui runs`` keeps what it read of a runs directory's ended runs, so the next
    listing reads none of them again: ``$DDPTUI_CACHE_DIR``, else ``$XDG_CACHE_HOME/ddptui``,
    else ``~/.cache/ddptui``; one file a runs directory."""
    base = os.environ.get("DDPTUI_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ddptui"
    )
    key = hashlib.sha256(os.fsencode(os.path.abspath(runs_dir))).hexdigest()[:16]
    return Path(base) / f"run-listings-{key}.json"


def load_listing_cache(path: Path, runs_dir: Path) -> dict[str, tuple[FileIdentity, RunListing]]:
    """The ended runs a cache file holds for ``runs_dir`` (read with a size bound, through no
    link); nothing when it is missing, unreadable, of another version or another directory."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(CACHE_MAX_BYTES + 1)
        data = json.loads(raw) if len(raw) <= CACHE_MAX_BYTES else None
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != CACHE_SCHEMA:
        return {}
    if data.get("runs_dir") != os.path.abspath(runs_dir):
        return {}
    found: dict[str, tuple[FileIdentity, RunListing]] = {}
    for run_id, entry in (data.get("runs") or {}).items():
        try:
            dev, ino, size, mtime = (int(v) for v in entry["identity"])
            listing = RunListing.from_json(entry["listing"])
        except (KeyError, TypeError, ValueError):
            continue
        if listing.run_id == run_id and listing.status.final:
            found[run_id] = ((dev, ino, size, mtime), listing)
    return found


def save_listing_cache(
    path: Path, runs_dir: Path, ended: dict[str, tuple[FileIdentity, RunListing]]
) -> None:
    """Write the cache (private to this user); a disk that refuses only costs the next listing
    a read of every ended run."""
    data = {
        "schema": CACHE_SCHEMA,
        "runs_dir": os.path.abspath(runs_dir),
        "runs": {
            run_id: {"identity": list(identity), "listing": listing.to_json()}
            for run_id, (identity, listing) in ended.items()
        },
    }
    with contextlib.suppress(OSError):
        make_dirs(path.parent, PRIVATE_DIR_MODE)
        write_atomic(path, json.dumps(data), mode=PRIVATE_FILE_MODE)


class RunCatalog:
    """The runs of one runs directory, listed again and again at the cost of what changed.

    ``settle``: the catalog writes down the summary of a run its observers find lost (the
    explicit ``engine.core.runs.settle.Settler``; the observers only read), for ``ddptui runs``
    and the UI's Runs screen (from its worker thread). ``cache_file`` (``listing_cache_path``) keeps the ended runs between processes, so
    a command run again reads none of them. Safe to call from one thread at a time; a lock makes a
    second caller wait."""

    def __init__(
        self,
        runs_dir: Path,
        *,
        clock: Clock = time.time,
        probe: ProcessProbe | None = None,
        settle: bool = False,
        cache_file: Path | None = None,
    ) -> None:
        self.runs_dir = runs_dir
        self.clock = clock
        self.probe = probe
        self.settle = settle
        self._settler: Settler | None = None  # made with the first run observed
        self.cache_file = cache_file
        self._ended: dict[str, tuple[FileIdentity, RunListing]] = (
            load_listing_cache(cache_file, runs_dir) if cache_file is not None else {}
        )
        self._observers: dict[str, RunObserver] = {}
        self._lock = threading.Lock()
        self._newly_ended = 0
        self.reads = 0  # runs read from their files (not from the cache) so far

    def list(self) -> list[RunListing]:
        """Every run, oldest first (RunDirError when the runs directory cannot be read)."""
        with self._lock:
            found = run_names(self.runs_dir, known=self._ended.keys() | self._observers.keys())
            ids = set(found)
            before = len(self._ended)
            for gone in [i for i in self._ended if i not in ids]:
                del self._ended[gone]
            for gone in [i for i in self._observers if i not in ids]:
                del self._observers[gone]
            self._newly_ended = 0
            listings = [self._listing(name) for name in found]
            changed = self._newly_ended or len(self._ended) != before
            if self.cache_file is not None and changed:
                save_listing_cache(self.cache_file, self.runs_dir, self._ended)
            return listings

    def _listing(self, name: str) -> RunListing:
        # An ended run costs one stat a listing: strings, not Paths, on this path.
        summary_path = os.path.join(self.runs_dir, name, SUMMARY_NAME)
        identity = file_identity(summary_path)
        cached = self._ended.get(name)
        if identity is not None and cached is not None and cached[0] == identity:
            return cached[1]
        self.reads += 1
        run_dir = RunDir(self.runs_dir / name)
        listing = RunListing.ended(run_dir) if identity is not None else None
        if listing is None:
            state = self._observer(run_dir).observe()
            listing = RunListing.of(self._settled(state) if self.settle else state)
            identity = file_identity(summary_path)  # it may have been written just now
        if listing.status.final and identity is not None:
            self._ended[run_dir.run_id] = (identity, listing)
            self._newly_ended += 1
            self._observers.pop(run_dir.run_id, None)
        return listing

    def _settled(self, state: RunState) -> RunState:
        if self._settler is None:
            from engine.core.runs.settle import Settler  # here: ended runs never need it

            self._settler = Settler()
        return self._settler.settle(state)

    def _observer(self, run_dir: RunDir) -> RunObserver:
        """The run's own observer, kept while it goes (it reads only what was appended)."""
        from engine.core.runs.observer import RunObserver  # here: ended runs never need it

        observer = self._observers.get(run_dir.run_id)
        if observer is None:
            if self.probe is None:  # one for every observer: it keeps each process it asked
                from engine.core.procs.process_identity import ProcessProbe

                self.probe = ProcessProbe()
            observer = RunObserver(run_dir, clock=self.clock, probe=self.probe)
            self._observers[run_dir.run_id] = observer
        return observer
