"""The run directory: the one channel between the engine (writer) and the UI (reader).

Its layout, every path of a run, is ``engine.core.common.run_layout``'s (with the one rule for
what a run directory is); ``RunDir`` names those paths for its readers and reads and writes them.

Plain Python only. JSON files are replaced atomically (write to a temp file, then rename), so a
reader never sees half a file, and read back into the typed objects that wrote them (``RunInfo``,
``RunSummary``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from engine.core.common.config_error import ConfigError
from engine.core.common.run_files import (
    CONFIG_MAX_BYTES,
    DIR_MODE,
    PRIVATE_DIR_MODE,
    UnsafeRunFile,
    make_dirs,
    read_run_bytes,
    read_run_text,
    user_name,
    write_json_atomic,
)
from engine.core.common.run_layout import (
    NODE_EVENTS_PATTERN,
    RANK_EVENTS_PATTERN,
    RunLayout,
    holds_run,
    is_run_dir,
)
from engine.core.config.schema import RunConfig
from engine.core.config.toml_io import config_from_text
from engine.core.runs.run_info import RUN_SCHEMA_VERSION, RunInfo
from engine.core.runs.run_info import this_host as this_host  # where launchers have found it
from engine.core.runs.summary import RunSummary

DEFAULT_RUNS_DIR = Path("runs")
NAME_MAX = 255  # bytes in one path component (Linux, macOS)
# Kernel file systems: nothing can be made there, whatever the permissions say.
VIRTUAL_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))


class RunDirError(ValueError):
    """A run directory that cannot be used; the message is one sentence naming the path."""


def new_run_id(preset: str) -> str:
    """Sortable, unique and readable: ``20261202-105133-cpu-demo-3f9a``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{preset}-{secrets.token_hex(2)}"


def _read_versioned_json(run_path: Path, path: Path, what: str) -> dict[str, Any]:
    """A JSON file of the run directory ``run_path``, read through no planted link, only when it
    is the run directory owner's and within ``JSON_MAX_BYTES`` (else RunDirError naming why)."""
    try:
        data = json.loads(read_run_bytes(run_path, path).decode("utf-8"))
    except FileNotFoundError:
        raise RunDirError(f"{path}: no {what} here") from None
    except UnsafeRunFile as err:
        raise RunDirError(str(err)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunDirError(f"{path}: {what} is corrupt ({err})") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: {what} is corrupt (not a JSON object)")
    version = data.get("schema")
    if not isinstance(version, int):
        raise RunDirError(f"{path}: {what} is corrupt (no schema version)")
    if version > RUN_SCHEMA_VERSION:
        raise RunDirError(
            f"{path}: {what} was written by a newer ddptui (schema {version}, this one reads "
            f"{RUN_SCHEMA_VERSION}); upgrade ddptui to read it"
        )
    return data


class RunDir:
    """Paths and readers/writers of one run directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.layout = RunLayout(self.path)

    @property
    def run_id(self) -> str:
        return self.path.name

    # paths: the layout's (``engine.core.common.run_layout``), by the names readers know
    @property
    def config_path(self) -> Path:
        return self.layout.config

    @property
    def run_json_path(self) -> Path:
        return self.layout.run_json

    @property
    def summary_path(self) -> Path:
        return self.layout.summary

    @property
    def checkpoint_path(self) -> Path:
        return self.layout.checkpoint

    @property
    def rendezvous_path(self) -> Path:
        """The file store where the ranks of a single-node run meet (exists while it runs)."""
        return self.layout.rendezvous

    @property
    def events_dir(self) -> Path:
        return self.layout.events_dir

    @property
    def logs_dir(self) -> Path:
        return self.layout.logs_dir

    @property
    def stacks_dir(self) -> Path:
        """Stack dumps of the ranks (faulthandler) and the snapshots taken of them."""
        return self.layout.stacks_dir

    @property
    def flight_recorder_dir(self) -> Path:
        """torch's flight-recorder dumps, ``rank_<r>`` each."""
        return self.layout.flight_recorder_dir

    def flight_recorder_dumps(self) -> list[Path]:
        try:
            return sorted(p for p in self.flight_recorder_dir.glob("rank_*") if p.is_file())
        except OSError:
            return []

    def rank_events_path(self, rank: int) -> Path:
        return self.layout.rank_events(rank)

    @property
    def launcher_events_path(self) -> Path:
        return self.layout.launcher_events

    def launcher_event_paths(self) -> list[Path]:
        """The launcher's events, and each node launcher's of a run across nodes
        (``launcher-<node>.jsonl``, ``engine.core.runs.placement``)."""
        try:
            nodes = sorted(self.events_dir.glob(NODE_EVENTS_PATTERN))
        except OSError:
            nodes = []
        return [self.launcher_events_path, *nodes]

    def rank_log_path(self, rank: int) -> Path:
        return self.layout.rank_log(rank)

    @property
    def launcher_log_path(self) -> Path:
        return self.layout.launcher_log

    def rank_event_paths(self) -> dict[int, Path]:
        """Existing rank event files by rank."""
        found = {}
        for p in self.events_dir.glob(RANK_EVENTS_PATTERN):
            suffix = p.stem.removeprefix("rank-")
            if suffix.isdigit():
                found[int(suffix)] = p
        return dict(sorted(found.items()))

    def create(self) -> None:
        """Make the run directory (and the runs directory above it) with private modes
        (``engine.core.common.run_files``); raises RunDirError or OSError."""
        if self.path.exists():
            raise RunDirError(f"{self.path}: a run directory of that name exists already")
        make_dirs(self.path.parent)
        self.path.mkdir(mode=DIR_MODE)
        self.events_dir.mkdir(mode=DIR_MODE)
        self.logs_dir.mkdir(mode=PRIVATE_DIR_MODE)

    def make_missing_dirs(self) -> None:
        """The events and logs directories, where a launcher or a torchrun rank finds none."""
        make_dirs(self.events_dir, DIR_MODE)
        make_dirs(self.logs_dir, PRIVATE_DIR_MODE)

    # config.toml
    def load_config(self) -> RunConfig:
        """The run's config.toml, read as every run file is (no planted link, the owner's file,
        at most ``CONFIG_MAX_BYTES``); ConfigError names the file and what is wrong."""
        where = str(self.config_path)
        try:
            text = read_run_text(self.path, self.config_path, CONFIG_MAX_BYTES)
        except FileNotFoundError:
            raise ConfigError("no such config file", where=where) from None
        except OSError as err:
            raise ConfigError(
                f"cannot be read ({err})", where=where, reason="cannot be read"
            ) from None
        return config_from_text(text, where=where, name=None)

    # run.json
    def write_run_info(self, info: RunInfo) -> None:
        write_json_atomic(self.run_json_path, info.to_json())

    def read_run_info(self, path: Path | None = None) -> RunInfo:
        """run.json (``path``: another of the run directory's, an earlier attempt's)."""
        path = path or self.run_json_path
        data = _read_versioned_json(self.path, path, "run.json")
        try:
            return RunInfo.from_json(data)
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"{path}: run.json is corrupt ({err!r})") from None

    # summary.json
    def write_summary(self, summary: RunSummary) -> None:
        write_json_atomic(self.summary_path, {"schema": RUN_SCHEMA_VERSION, **summary.to_json()})

    def read_summary(self, path: Path | None = None) -> RunSummary | None:
        """The summary, or None while the run has not finished; RunDirError when it is corrupt,
        from a newer ddptui, too large, or not a file of the run directory's owner. ``path``:
        another of the run directory's summaries (an earlier attempt's)."""
        path = path or self.summary_path
        if not os.path.lexists(path):
            return None
        data = _read_versioned_json(self.path, path, "summary.json")
        try:
            return RunSummary.from_json(data)
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"{path}: summary.json is corrupt ({err!r})") from None


def check_run_id(run_id: str) -> None:
    """A run id names one directory inside the runs directory, never a path: RunDirError for an
    empty id, one with a slash or a NUL, and ``.`` / ``..``."""
    if not run_id:
        raise RunDirError("a run id cannot be empty; `ddptui runs` lists them")
    if "/" in run_id or "\0" in run_id or run_id in (".", ".."):
        raise RunDirError(
            f"{run_id!r} is not a run id: a run id names a directory inside --runs-dir, without "
            "'/' (use --runs-dir for another runs directory)"
        )


def check_runs_dir(runs_dir: Path, *, write: bool = False) -> None:
    """RunDirError, one sentence, when ``runs_dir`` cannot be a runs directory: a name longer than
    a file system allows, a place inside /proc, /sys or /dev, something that is not a directory,
    or (``write``) a directory this user cannot make runs in. A missing one is fine: it is made."""
    where = f"--runs-dir {runs_dir}"
    for part in runs_dir.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise RunDirError(
                f"{where[:80]}...: one of its names is {len(part)} characters long, and a file "
                f"system allows at most {NAME_MAX}"
            )
    resolved = Path(os.path.abspath(runs_dir))
    for root in VIRTUAL_ROOTS:
        if resolved == root or root in resolved.parents:
            raise RunDirError(
                f"{where} is inside {root}, a kernel file system that cannot hold run directories"
            )
    try:
        exists = runs_dir.exists()
        if exists and not runs_dir.is_dir():
            raise RunDirError(f"{where} is not a directory")
    except OSError as err:
        raise RunDirError(
            f"{where} cannot be reached by {user_name(os.getuid())} ({err.strerror})"
        ) from None
    if not write:
        return
    existing = runs_dir
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        user = user_name(os.getuid())
        how = "a read-only file system" if _read_only(existing) else f"not writable by {user}"
        raise RunDirError(
            f"{where} cannot hold new runs: {existing} is {how}; choose another with --runs-dir "
            "or $DDPTUI_RUNS_DIR"
        )


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


# run ids as ``new_run_id`` makes them: the preset's name between the time and the random suffix
_RUN_ID_SHAPE = re.compile(r"^\d{8}-\d{6}-(?P<preset>.+)-[0-9a-f]{4}$")
CANDIDATES_SHOWN = 10


def preset_of_run_id(run_id: str) -> str | None:
    """The preset name inside a run id ``new_run_id`` made, else None."""
    shape = _RUN_ID_SHAPE.match(run_id)
    return shape.group("preset") if shape else None


def find_run(runs_dir: Path, run_id: str) -> RunDir:
    """A run under ``runs_dir`` by its id or any unique part of one (a prefix of its date, its
    random suffix), or by a preset's name: that preset's newest run. RunDirError names what is
    missing, lists the runs an ambiguous part matches, or says why ``run_id`` is no run id."""
    check_run_id(run_id)
    check_runs_dir(runs_dir)
    exact = runs_dir / run_id
    if exact.is_symlink():
        raise RunDirError(
            f"{exact} is a symbolic link ({os.readlink(exact)}): a run directory is never "
            "followed through one"
        )
    if is_run_dir(exact):
        return RunDir(exact)
    if runs_dir.is_dir():
        matches = [n for n in run_names(runs_dir) if run_id in n]
        of_preset = [n for n in matches if preset_of_run_id(n) == run_id]
        if of_preset:  # ids sort by their start time: the last is the newest
            return RunDir(runs_dir / of_preset[-1])
        if len(matches) == 1:
            return RunDir(runs_dir / matches[0])
        if len(matches) > 1:
            shown = [f"  {n}" for n in matches[-CANDIDATES_SHOWN:]]
            more = len(matches) - len(shown)
            raise RunDirError(
                "\n".join(
                    [
                        f"{run_id!r} matches {len(matches)} runs in {runs_dir}; give more of one "
                        f"of these ids{f' (the newest {len(shown)} of them)' if more else ''}:",
                        *shown,
                    ]
                )
            )
    raise RunDirError(f"no run {run_id!r} in {runs_dir}")


def list_runs(runs_dir: Path) -> list[RunDir]:
    """Run directories under ``runs_dir``, oldest first; RunDirError when it cannot be read."""
    return [RunDir(runs_dir / name) for name in run_names(runs_dir)]


def run_names(runs_dir: Path, known: Collection[str] = ()) -> list[str]:
    """The names of the run directories under ``runs_dir`` (``is_run_dir``: the one rule),
    oldest first; a name in ``known`` is taken for a run without looking (a poller's runs stay runs).
    RunDirError when the directory cannot be read."""
    check_runs_dir(runs_dir)
    if not runs_dir.is_dir():
        return []
    try:
        # a symbolic link there is no run directory (it could point at any directory, /root
        # included); the entry's own type says so without another system call
        with os.scandir(runs_dir) as entries:
            names = sorted(e.name for e in entries if not e.is_symlink())
    except OSError as err:
        raise RunDirError(f"--runs-dir {runs_dir} cannot be listed ({err.strerror})") from None
    # Names and os.path, not a Path a file: this runs at every listing, over every run there is.
    where = os.fspath(runs_dir)
    return [name for name in names if name in known or holds_run(os.path.join(where, name))]


def run_dir_owner(run_dir: RunDir) -> str | None:
    """The user who owns ``run_dir`` or its run.json when that is not this user, else None. A run
    directory is the word of whoever wrote it: another user's run.json may name any process."""
    me = os.getuid()
    for path in (run_dir.path, run_dir.run_json_path):
        try:
            uid = path.lstat().st_uid
        except OSError:
            continue
        if uid != me:
            return user_name(uid)
    return None
